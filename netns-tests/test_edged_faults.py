"""Faults of the node under edged: the data path cannot be compiled (kernel headers gone after
a kernel change), and the data path goes away under a running edged (its client-facing
interface or a backend-facing one deleted and made again; its bpffs unmounted).

        client ──veth── router (XDP, edged) ──veth── b0, b1, b2 (testbed HTTP backends)
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

import pytest

from controlplane import abi
from controlplane.api.client import Client
from controlplane.edged import cli as edged_module
from controlplane.lab import heartbeats as hb
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.traffic import http_get, udp_answers

PORT = 8000
TOKEN = 0x5EED0001


def doc(router, tmp_path, **node) -> dict:
    service = router.service("web", backends=[0, 1, 2])
    return router.config(
        [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470", **node}
    )


def test_a_data_path_that_cannot_compile_is_one_line_and_a_distinct_exit(net, router, tmp_path):
    """Kernel headers missing (bcc's BCC_KERNEL_SOURCE pointed at nothing, as after a kernel
    update without its headers): edged says so in one line and exits with the status the unit
    tells systemd not to restart on; nothing is attached."""
    proc = EdgedProc.start(
        net.router,
        doc(router, tmp_path),
        router.iface,
        wait_deployed=False,
        env={"BCC_KERNEL_SOURCE": str(tmp_path / "no-headers")},
    )
    try:
        code = proc.proc.wait(timeout=120)
        proc._reader.join(10)
    finally:
        proc.stop()
    lines = proc.other_lines + [e["text"] for e in proc.events if e["kind"] == "fatal"]
    assert code == edged_module.EXIT_CANNOT_COMPILE == 3, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("cannot compile the data path for kernel "), lines
    assert "kernel headers" in lines[0], lines
    assert [e["severity"] for e in proc.events if e["kind"] == "fatal"] == ["error"]
    assert router.pinned_ifaces() == []
    assert router.iface_state(router.iface).xdp_prog_id is None


def health(tmp_path) -> str:
    with Client(str(tmp_path / "edged.sock"), timeout_s=10) as c:
        return c.health()


def wait_for_http(net, attempts: int = 50) -> str:
    """The backend answering a new connection through the VIP; bounded tries."""
    last = None
    for _ in range(attempts):
        try:
            return http_get(net.client, net.vip, PORT, timeout_s=1.0).backend
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise AssertionError(f"no answer through the VIP after {attempts} tries: {last}")


def metric(net, name: str) -> float | None:
    """One unlabelled sample from edged's /metrics, read inside the router namespace."""
    with net.router.enter():
        text = urllib.request.urlopen("http://127.0.0.1:9470/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_client_interface_deleted_and_made_again_is_attached_again(net, router, tmp_path):
    """The client-facing NIC goes away and comes back (new ifindex, no XDP): edged notices,
    says NOT_SERVING while XDP is missing, attaches it again from the programs it holds, and
    traffic through the VIP flows again; health, status, events and the metric agree."""
    edged = EdgedProc.start(net.router, doc(router, tmp_path), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
        assert wait_for_http(net)
        assert health(tmp_path) == "SERVING" and metric(net, "edge_datapath_up") == 1.0
        mark = len(edged.events)
        net.recreate_client_link()
        lost = edged.wait_for(
            lambda e: e["kind"] == "datapath" and not e["serving"], 10.0, "edged to notice XDP is gone", after=mark
        )
        assert router.iface in lost["text"], lost["text"]
        back = edged.wait_for(
            lambda e: e["kind"] == "datapath" and e["serving"], 30.0, "edged to attach XDP again", after=mark
        )
        assert "attached XDP" in back["text"], back["text"]
        assert router.iface_state(router.iface).xdp_prog_id is not None
        assert wait_for_http(net) in ("b0", "b1", "b2")
        assert health(tmp_path) == "SERVING" and metric(net, "edge_datapath_up") == 1.0
        status = router.status()
        assert status["xdp"]["attached"], status["xdp"]
    finally:
        edged.stop()


def test_undeploy_under_edged_stays_undeployed(net, router, tmp_path):
    """`edgectl undeploy` under a running edged, the stop button: edged says NOT_SERVING naming
    the undeploy and puts nothing back (no pins, no XDP on either side, no return path) until
    it is restarted; the restart deploys again and traffic flows."""
    edged = EdgedProc.start(net.router, doc(router, tmp_path), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
        assert wait_for_http(net)
        mark = len(edged.events)
        router.undeploy()
        said = edged.wait_for(
            lambda e: e["kind"] == "datapath" and "undeployed" in e["text"],
            10.0,
            "edged to say the data path was undeployed",
            after=mark,
        )
        assert not said["serving"], said
        time.sleep(2.5)  # two more rounds of the watch (1 s): still nothing put back
        assert [e["text"] for e in edged.events[mark:] if e["kind"] == "datapath" and e["serving"]] == []
        assert router.pinned_ifaces() == []
        assert router.iface_state(router.iface).xdp_prog_id is None
        for i in range(3):
            state = router.iface_state(net.backend_iface(i))
            assert (state.xdp_prog_id, state.ingress_filters) == (None, ()), (i, state)
        assert health(tmp_path) == "NOT_SERVING" and metric(net, "edge_datapath_up") == 0.0
    finally:
        edged.stop()
    edged = EdgedProc.start(net.router, doc(router, tmp_path), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API again")
        assert wait_for_http(net) in ("b0", "b1", "b2")
        assert health(tmp_path) == "SERVING"
    finally:
        edged.stop()


def test_bpffs_unmounted_under_edged_is_not_serving_until_it_can_pin_again(net, router, tmp_path):
    """The bpffs holding the pins is unmounted (a bpffs of the test's own, mounted at a test
    directory, never the host's): forwarding goes on (the kernel keeps what is attached), but
    a restarted edged or edgectl would find nothing, so edged reports NOT_SERVING (health, status,
    event, metric). Mounted again, edged pins the maps it holds there again and serves."""
    mnt = tmp_path / "bpffs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(mnt)], check=True, timeout=30)
    mounted = True
    try:
        edged = EdgedProc.start(net.router, doc(router, tmp_path, pin_dir=str(mnt)), router.iface)
        try:
            edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
            assert health(tmp_path) == "SERVING" and metric(net, "edge_datapath_up") == 1.0
            assert wait_for_http(net)
            mark = len(edged.events)
            subprocess.run(["umount", str(mnt)], check=True, timeout=30)
            mounted = False
            lost = edged.wait_for(
                lambda e: e["kind"] == "datapath" and not e["serving"],
                10.0,
                "edged to notice the pins are gone",
                after=mark,
            )
            assert str(mnt) in lost["text"], lost["text"]
            assert health(tmp_path) == "NOT_SERVING"
            assert metric(net, "edge_datapath_up") == 0.0
            shown = router.edgectl("status", "--socket", tmp_path / "edged.sock")
            assert shown.returncode == 0, shown.stderr
            assert "NOT SERVING: " in shown.stdout, shown.stdout
            assert wait_for_http(net)  # what is attached keeps forwarding

            subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(mnt)], check=True, timeout=30)
            mounted = True
            back = edged.wait_for(
                lambda e: e["kind"] == "datapath" and e["serving"], 30.0, "edged to pin its maps again", after=mark
            )
            assert "pinned" in back["text"], back["text"]
            assert health(tmp_path) == "SERVING" and metric(net, "edge_datapath_up") == 1.0
            pinned = [p.name for p in (mnt / f"v{abi.ABI_VERSION}").iterdir()]
            assert len(pinned) == 1 and sorted(os.listdir(mnt / f"v{abi.ABI_VERSION}" / pinned[0])) == sorted(
                abi.MAP_NAMES
            )
        finally:
            edged.stop()
            if mounted:  # undeploy what this edged left pinned on the test's bpffs
                router.edgectl("-q", "undeploy", "--iface", router.iface, "--pin-dir", mnt)
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], timeout=30)


def udp_replies(net, n: int, attempts: int = 20) -> list[tuple[str, str]]:
    """n answers from the VIP, retried while the path is still being put back; bounded tries."""
    last = None
    for _ in range(attempts):
        try:
            return udp_answers(net.client, net.vip, PORT, n)
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise AssertionError(f"no UDP answers through the VIP after {attempts} tries: {last}")


@pytest.mark.parametrize("reply_xdp", ["auto", "off"])
def test_backend_interface_made_again_gets_the_return_path_and_the_reply_fast_path_again(
    net, router, tmp_path, reply_xdp
):
    """The NIC towards b0 goes away and comes back (new ifindex, no tc, no XDP): edged attaches the
    return path (tc) and, as deploy would (node.reply_xdp), the XDP fast path of replies (edge_reply)
    there again: b0's replies are counted by return_xdp again, not only by tc (with "off": tc alone,
    as before). b0's heartbeats, which must arrive on the interface the maps name, keep it usable."""
    xdp = 20 if reply_xdp == "auto" else 0  # of 20 replies, how many XDP carries
    service = router.service(
        "dns",
        protocol="udp",
        backends=[0],
        health={  # every reply crosses rt-b0
            "heartbeat": {"port": hb.DEFAULT_HB_PORT, "interval_ms": 10, "timeout_ms": 500, "rise": 3}
        },
    )
    service["backends"][0]["token"] = hex(TOKEN)
    agent = hb.start_heartbeats(net, 0, token=TOKEN, interval_ms=10)
    try:
        edged = EdgedProc.start(
            net.router,
            router.config(
                [service],
                node={
                    "api_socket": str(tmp_path / "edged.sock"),
                    "metrics_listen": "127.0.0.1:9470",
                    "reply_xdp": reply_xdp,
                },
            ),
            router.iface,
        )
        try:
            edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
            udp_replies(net, 10)  # the first replies resolve the client's neighbour (tc)
            before = router.status()["verdicts"]["return_xdp"]
            assert {src for _, src in udp_replies(net, 20)} == {f"{net.vip}:{PORT}"}
            assert router.status()["verdicts"]["return_xdp"] - before == xdp

            mark = len(edged.events)
            net.recreate_backend_link(0)
            back = edged.wait_for(
                lambda e: e["kind"] == "datapath" and e["serving"],
                30.0,
                "edged to attach the return path again",
                after=mark,
            )
            assert ("reply fast path" in back["text"]) == bool(xdp), back["text"]
            status = router.status()
            assert status["return_ifaces"][-1:] == [net.backend_iface(0)], status["return_ifaces"]
            assert status["reply_xdp_ifaces"] == [net.backend_iface(0)] * bool(xdp), status["reply_xdp_ifaces"]

            udp_replies(net, 10, attempts=50)  # b0 up again (rise 3 heartbeats), its neighbour resolved
            before = router.status()
            assert {src for _, src in udp_replies(net, 20)} == {f"{net.vip}:{PORT}"}
            after = router.status()
            assert after["verdicts"]["return_xdp"] - before["verdicts"]["return_xdp"] == xdp
            assert after["drops"]["spoofed_heartbeat"] == before["drops"]["spoofed_heartbeat"]
            assert after["services"][0]["backends"][0]["health"]["usable"]
            assert health(tmp_path) == "SERVING"
        finally:
            edged.stop()
    finally:
        agent.stop()
