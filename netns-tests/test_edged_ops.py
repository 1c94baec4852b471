"""Operating edged: a hitless restart (kill -9 under traffic), reloads (a bad config is refused,
a good one applied as a diff with removed backends draining), and pins of another ABI version.

        client ──veth── router (XDP, edged) ──veth── b0, b1, b2 (testbed HTTP backends)
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path

from controlplane import abi
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.traffic import backends_seen, close_all, http_get, open_connections, wait_until

PORT = 8000
ROUNDS = 10  # requests on every kept-alive connection in each phase of the kill -9 test (a round ~0.1 s)


def doc(router, tmp_path: Path, backends=(0, 1, 2), policy: str = "latency_inverse", **service_extra) -> dict:
    service = router.service("web", backends=list(backends), **service_extra)
    service["health"] = {"probe": {"kind": "tcp", "interval_ms": 50, "timeout_ms": 40, "window": 10}}
    # hysteresis 50 %: RTT noise on veths does not push; the tests look at what edged adopts
    service["weights"] = {"policy": policy, "hysteresis_pct": 50, "max_ratio": 4}
    return router.config(
        [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"}
    )


class Traffic(threading.Thread):
    """Requests on long-lived connections and on new ones, for a bounded time; records every answer."""

    def __init__(self, net, conns, seconds: float):
        super().__init__(daemon=True)
        self.net, self.conns, self.deadline = net, conns, time.monotonic() + seconds
        self.answers: list[list[str]] = [[] for _ in conns]
        self.new_flows: Counter = Counter()
        self.errors: list[str] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while time.monotonic() < self.deadline and not self.stop_flag.is_set():
            for i, conn in enumerate(self.conns):
                try:
                    self.answers[i].append(conn.request().backend)
                except OSError as e:
                    self.errors.append(f"conn {i}: {e}")
            try:
                self.new_flows[http_get(self.net.client, self.net.vip, PORT, timeout_s=1.0).backend] += 1
            except OSError as e:
                self.errors.append(f"new flow: {e}")
            self.stop_flag.wait(0.01)  # pace: leave the CPUs to the router between rounds

    def progress(self) -> tuple[int, int]:
        """(rounds every connection answered, the fewest of any; new flows answered)."""
        return min(len(a) for a in self.answers), sum(self.new_flows.values())

    def went_on(self, since: tuple[int, int], rounds: int) -> bool:
        """Every connection answered `rounds` more rounds since `since` (a progress()), and new
        flows were answered meanwhile."""
        now = self.progress()
        return now[0] >= since[0] + rounds and now[1] > since[1]


def test_kill_9_and_restart_loses_nothing_and_moves_nothing(net, router, tmp_path):
    """Under steady traffic (40 kept-alive connections and a stream of new ones), edged is killed
    with SIGKILL and started again: no request fails, no connection changes backend, the restarted
    edged adopts the table's weights (no jump back to the config's), and nothing was dropped."""
    config = doc(router, tmp_path)
    first = EdgedProc.start(net.router, config, router.iface)
    try:
        pushed = first.wait_for(lambda e: e["kind"] == "weights", 20.0, "a first computed weight push")
        before_weights = pushed["weights"]
        conns = open_connections(net.client, net.vip, PORT, 40)
        traffic = Traffic(net, conns, seconds=90.0)  # ended by stop_flag below; the bound if not
        traffic.start()
        wait_until(
            lambda: traffic.went_on((0, 0), ROUNDS), 20.0, "traffic under the first edged", observe=traffic.progress
        )
        os.kill(first.proc.pid, signal.SIGKILL)
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
        at_kill = traffic.progress()
        wait_until(
            lambda: traffic.went_on(at_kill, ROUNDS),
            20.0,
            "traffic with no edged (the data path alone)",
            observe=traffic.progress,
        )
        # a push may have landed between the wait above and the kill: the table holds the last one
        last = first.latest_weights("web")
    finally:
        first.stop()
    second = EdgedProc.start(net.router, config, router.iface)
    try:
        deployed = (
            second.events[-1]
            if second.events[-1]["kind"] == "deployed"
            else second.wait_for(lambda e: e["kind"] == "deployed", 5.0, "deployed")
        )
        assert deployed["adopted"] is True
        assert deployed["weights"]["web"] == last, (before_weights, last, deployed["weights"])
        at_adopt = traffic.progress()
        wait_until(
            lambda: traffic.went_on(at_adopt, ROUNDS),
            20.0,
            "traffic under the restarted edged",
            observe=traffic.progress,
        )
        traffic.stop_flag.set()
        traffic.join(timeout=10)
        drops = router.counters()["drops"]
    finally:
        second.stop()
        close_all(conns)
    assert traffic.errors == []
    moved = [i for i, seen in enumerate(traffic.answers) if len(set(seen)) != 1]
    assert moved == [], f"connections that changed backend: {[(i, traffic.answers[i]) for i in moved][:5]}"
    assert sum(len(a) for a in traffic.answers) > 40 * 5
    assert sum(traffic.new_flows.values()) > 20
    assert sum(drops.values()) == 0, drops


def test_reload_rejects_a_bad_config_and_applies_a_good_one_as_a_diff(net, router, tmp_path):
    """SIGHUP with an invalid config: edged says why in one event and keeps the running config.
    SIGHUP with b1 removed and b2 added: b2 gets new flows, b1 none, b1's open connections still
    answer from b1 (draining), and once they close b1 is removed as idle."""
    config = doc(router, tmp_path, backends=(0, 1), policy="static", drain_timeout_ms=60000)
    edged = EdgedProc.start(net.router, config, router.iface)
    try:
        conns = open_connections(net.client, net.vip, PORT, 30)
        before = [c.request().backend for c in conns]
        assert set(before) == {"b0", "b1"}

        bad = doc(router, tmp_path, backends=(0, 1), policy="static")
        bad["services"][0]["port"] = 70000
        edged.rewrite_config(bad)
        mark = len(edged.events)
        edged.signal(signal.SIGHUP)
        rejected = edged.wait_for(
            lambda e: e["kind"] in ("reload-rejected", "reload"), 20.0, "reload answer", after=mark
        )
        assert rejected["kind"] == "reload-rejected"
        assert "services[0].port: 70000 is not a port" in rejected["text"]
        assert [c.request().backend for c in conns] == before

        good = doc(router, tmp_path, backends=(0, 2), policy="static", drain_timeout_ms=60000)
        edged.rewrite_config(good)
        mark = len(edged.events)
        edged.signal(signal.SIGHUP)
        done = edged.wait_for(lambda e: e["kind"] in ("reload-rejected", "reload"), 60.0, "reload answer", after=mark)
        assert done["kind"] == "reload", done["text"]
        assert "web/b1" in done["draining_backends"]
        assert "web/b2" in done["added_backends"]

        seen = backends_seen(net.client, net.vip, PORT, 600)
        assert set(seen) == {"b0", "b2"}, seen
        assert [c.request().backend for c in conns] == before  # b1's connections drain, not reset

        close_all(conns)
        removed = edged.wait_for(lambda e: e["kind"] == "removed", 20.0, "b1 removed once idle", after=mark)
        assert removed["backend"] == "b1" and removed["why"] == "idle"
    finally:
        edged.stop()
        close_all(conns)
    names = [b["name"] for b in router.status()["services"][0]["backends"]]
    assert sorted(names) == ["b0", "b2"]


def test_pins_of_another_abi_are_refused_with_a_way_out(net, router):
    """A deployment whose pins carry another ABI version is never read: deploy refuses it naming
    the version and the command that migrates; that undeploy removes it completely."""
    router.deploy([router.service("web")])
    current = router.pin_path
    older = current.parent.parent / f"v{abi.ABI_VERSION - 1}" / current.name
    older.parent.mkdir(exist_ok=True)
    os.rename(current, older)  # bpffs renames within one mount: now it looks like an older build's
    try:
        done = router.deploy([router.service("web")], check=False)
        assert done.returncode != 0
        err = done.stderr.strip()
        assert err.count("\n") == 0
        assert f"ABI v{abi.ABI_VERSION - 1}" in err and f"edgectl undeploy --iface {router.iface}" in err, err
        shown = router.edgectl("status", "--maps")
        assert shown.returncode == 0 and "nothing deployed" in shown.stdout
        assert f"pins of ABI v{abi.ABI_VERSION - 1}" in shown.stdout
        assert f"edgectl undeploy --iface {router.iface}" in shown.stdout, shown.stdout

        router.undeploy()
        assert not older.exists()
        state = router.iface_state(router.iface)
        assert state.xdp_prog_id is None
        for i in range(3):
            assert not [f for f in router.iface_state(net.backend_iface(i)).ingress_filters if f.name]
    finally:
        if older.exists():  # the test failed before undeploy: put it back for the fixture's teardown
            os.rename(older, current)


def test_edged_talks_to_systemd_through_notify_socket(net, router, tmp_path):
    """With NOTIFY_SOCKET and WATCHDOG_USEC set as systemd sets them, edged sends STATUS= while it
    deploys, READY=1 once it steers, WATCHDOG=1 about every half interval, RELOADING=1 then READY=1
    around a SIGHUP reload, and STOPPING=1 on SIGTERM."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    got: list[tuple[float, str]] = []

    def drain(until_s: float) -> None:
        end = time.monotonic() + until_s
        while time.monotonic() < end:
            try:
                data = sock.recv(4096)
            except socket.timeout:
                continue
            got.extend((time.monotonic(), line) for line in data.decode().splitlines())

    config = doc(router, tmp_path, policy="static")
    edged = EdgedProc.start(
        net.router, config, router.iface, env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"}
    )
    try:
        drain(1.5)
        edged.signal(signal.SIGHUP)
        drain(1.5)
        edged.stop()
        drain(0.3)
    finally:
        edged.stop()
        sock.close()
    lines = [line for _, line in got]
    assert any(line.startswith("STATUS=deploying on ") for line in lines), lines[:5]
    assert "READY=1" in lines
    pings = [line for line in lines if line == "WATCHDOG=1"]
    assert len(pings) >= 4, lines  # every 0.2 s for about 3 s
    reloading = lines.index("RELOADING=1")
    ready_again = lines.index("READY=1", reloading)
    assert "WATCHDOG=1" in lines[ready_again:], lines  # the watchdog goes on after a reload
    assert lines[-1] == "STOPPING=1" or "STOPPING=1" in lines[-3:], lines[-5:]


def test_a_restart_in_the_middle_of_a_drain_keeps_draining(net, router, tmp_path):
    """A reload removes b1 while 30 connections are open; edged is killed (-9) and started again
    on the new config: it keeps b1 draining out (its connections still answer from b1, new flows
    avoid it) and removes it once idle, as the first edged would have."""
    config = doc(router, tmp_path, policy="static", drain_timeout_ms=60000)
    first = EdgedProc.start(net.router, config, router.iface)
    conns = []
    try:
        conns = open_connections(net.client, net.vip, PORT, 30)
        before = [c.request().backend for c in conns]
        assert "b1" in before
        without_b1 = doc(router, tmp_path, backends=(0, 2), policy="static", drain_timeout_ms=60000)
        first.rewrite_config(without_b1)
        mark = len(first.events)
        first.signal(signal.SIGHUP)
        done = first.wait_for(lambda e: e["kind"] in ("reload", "reload-rejected"), 60.0, "reload", after=mark)
        assert done["kind"] == "reload" and "web/b1" in done["draining_backends"], done["text"]
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=10)
        first.stop()

        second = EdgedProc.start(net.router, without_b1, router.iface)
        try:
            adopted = second.wait_for(lambda e: e["kind"] == "adopted", 10.0, "the drain adopted")
            assert adopted["leaving"] == ["web/b1"], adopted["text"]
            after = []
            for c in conns:
                try:
                    after.append(c.request().backend)
                except OSError as e:
                    after.append(f"error: {e}")
            assert after == before, [(b, a) for b, a in zip(before, after) if a != b]
            seen = backends_seen(net.client, net.vip, PORT, 300)
            assert seen["b1"] == 0 and seen["b0"] > 0 and seen["b2"] > 0, seen
            close_all(conns)
            removed = second.wait_for(lambda e: e["kind"] == "removed", 20.0, "b1 removed once idle")
            assert (removed["backend"], removed["why"]) == ("b1", "idle")
        finally:
            second.stop()
    finally:
        first.stop()
        close_all(conns)
