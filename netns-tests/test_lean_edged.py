"""edged without bcc: it compiles the data path in a child process and opens the pins with
bpf(2) alone, so neither libbcc nor LLVM is ever mapped into it; and a reload that puts a
backend behind a backend-facing interface the data path does not use yet takes it into
service with the programs edged holds, without a compile (the programs running before the
reload keep running, the new interface gets the same return-path program).

        client ──veth── router (XDP, edged) ──veth── b0, b1 (each behind its own link)
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from controlplane import abi
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.foreign import foreign_xdp
from controlplane.lab.traffic import backends_seen

PORT = 8000
COMPILERS = ("libbcc", "libLLVM", "libclang")
STOP_WITHIN_S = 2.0  # what systemd's stop waits for before it has to SIGKILL


def compilers_mapped(pid: int) -> set[str]:
    text = Path(f"/proc/{pid}/maps").read_text()
    return {name for name in COMPILERS if name in text}


def programs(net, ifname: str) -> tuple[int | None, int | None]:
    """(XDP program id, our return-path tc program id) on a router interface (bpftool's view)."""
    (dev,) = json.loads(net.router.run(["bpftool", "-j", "net", "show", "dev", ifname]).stdout)
    xdp = [p["id"] for p in dev.get("xdp", [])]
    tc = [p["id"] for p in dev.get("tc", []) if p.get("kind") == "clsact/ingress" and p.get("name") == abi.PROG_RETURN]
    return (xdp[0] if xdp else None), (tc[0] if tc else None)


def config(router, tmp_path, backends: list[int]) -> dict:
    service = router.service("web", backends=backends)
    return router.config([service], node={"api_socket": str(tmp_path / "edged.sock"), "reply_xdp": "auto"})


def test_edged_never_maps_bcc_or_llvm_and_reads_its_maps(net, router, tmp_path):
    edged = EdgedProc.start(net.router, config(router, tmp_path, [0, 1]), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
        assert compilers_mapped(edged.proc.pid) == set()
        done = router.edgectl("status", "--json", "--socket", str(tmp_path / "edged.sock"))
        assert done.returncode == 0, done.stderr
        (snap,) = json.loads(done.stdout)
        assert [b["name"] for b in snap["services"][0]["backends"]] == ["b0", "b1"]
        assert compilers_mapped(edged.proc.pid) == set()
    finally:
        edged.stop()


def test_a_reload_puts_a_backend_behind_a_new_link_into_service_without_a_compile(net, router, tmp_path):
    edged = EdgedProc.start(net.router, config(router, tmp_path, [0]), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
        seen = backends_seen(net.client, net.vip, PORT, 40)
        assert seen == {"b0": 40}, seen
        ingress, b0_link, b1_link = router.iface, net.backend_iface(0), net.backend_iface(1)
        before = {name: programs(net, name) for name in (ingress, b0_link)}
        assert programs(net, b1_link)[1] is None  # nothing of ours on b1's link yet

        mark = len(edged.events)
        edged.rewrite_config(config(router, tmp_path, [0, 1]))
        done = router.edgectl("reload", "--json", "--socket", str(tmp_path / "edged.sock"))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["added_backends"] == ["web/b1"], done.stdout

        seen = backends_seen(net.client, net.vip, PORT, 200)
        assert seen["b0"] > 0 and seen["b1"] > 0 and sum(seen.values()) == 200, seen
        # no compile: what ran before runs still, and b1's link got the very same return-path program
        assert {name: programs(net, name) for name in (ingress, b0_link)} == before
        assert programs(net, b1_link)[1] == before[b0_link][1]
        assert not [e for e in edged.events[mark:] if "compiling the data path" in e.get("text", "")]
        status = router.status()
        assert status["return_ifaces"] == [b0_link, b1_link], status["return_ifaces"]
        assert b1_link in status["reply_xdp_ifaces"], status["reply_xdp_ifaces"]
    finally:
        edged.stop()
    assert programs(net, b1_link)[1] == before[b0_link][1]  # a stopped edged leaves the data path forwarding


def test_a_new_link_that_cannot_take_the_replies_fast_path_leaves_nothing_behind(net, router, tmp_path):
    """node.reply_xdp on, and a foreign XDP program holds b1's link: the reload adding b1 is refused
    in one line, and the return path it had put on b1's link comes off again (no clsact, no filter),
    the node record and the maps are as before, and b0 keeps serving."""
    b1_link = net.backend_iface(1)
    one = config(router, tmp_path, [0])
    one["node"]["reply_xdp"] = "on"
    with foreign_xdp(router, b1_link) as foreign:
        edged = EdgedProc.start(net.router, one, router.iface)
        try:
            edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
            before = router.iface_state(b1_link)
            two = config(router, tmp_path, [0, 1])
            two["node"]["reply_xdp"] = "on"
            edged.rewrite_config(two)
            done = router.edgectl("reload", "--socket", str(tmp_path / "edged.sock"))
            assert done.returncode != 0
            assert done.stderr.count("\n") == 1 and "reply_xdp" in done.stderr and b1_link in done.stderr, done.stderr
            assert router.iface_state(b1_link) == before and before.xdp_prog_id == foreign and not before.clsact
            status = router.status()
            assert status["return_ifaces"] == [net.backend_iface(0)], status["return_ifaces"]
            assert [b["name"] for b in status["services"][0]["backends"]] == ["b0"]
            seen = backends_seen(net.client, net.vip, PORT, 40)
            assert seen == {"b0": 40}, seen
        finally:
            edged.stop()


def compile_children(pid: int) -> list[int]:
    """The compile child processes (controlplane.compilechild) of process pid."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"controlplane.compilechild" in cmdline:
                found.append(int(child))
    return found


def test_a_sigterm_while_the_data_path_compiles_ends_the_compile_and_edged(net, router, tmp_path):
    """SIGTERM while edged's first deploy compiles in its child: edged used to wait for the
    compile (seconds), attach the data path and only then stop. Now the child is ended at once,
    the deploy is rolled back (no XDP program left on the interface), and edged exits 0 within
    the bound systemd's stop waits for."""
    edged = EdgedProc.start(net.router, config(router, tmp_path, [0]), router.iface, wait_deployed=False)
    try:
        edged.wait_for(lambda e: "compiling the data path" in e.get("text", ""), 60.0, "the compile to start")
        deadline = time.monotonic() + 10
        while not (children := compile_children(edged.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert children, "no compile child seen"
        t0 = time.monotonic()
        edged.signal(signal.SIGTERM)
        edged.proc.wait(timeout=30)
        took = time.monotonic() - t0
        print(f"\nfigure: SIGTERM while compiling -> edged exited in {took * 1000:.0f} ms")
        assert edged.proc.returncode == 0, edged.other_lines[-5:]
        assert not Path(f"/proc/{children[0]}").exists()  # the compile ended with edged
        assert not any(e["kind"] == "deployed" for e in edged.events)
        assert programs(net, router.iface)[0] is None  # the deploy was rolled back
        assert took < STOP_WITHIN_S, f"edged took {took:.1f} s to stop while compiling"
    finally:
        edged.stop()
