"""A restart of edged while its discovery source is down keeps what worked: real etcd (and
dnsmasq) in the router namespace, a discovery-only service, long-lived connections open and new
ones arriving the whole time. edged stops within STOP_WITHIN_S whatever the source does, starts
again while the source is still down, adopts the discovered backends it finds in the pinned
maps as its last known good set, and no connection, old or new, is lost.

        client ──veth── router (XDP, edged, etcd/dnsmasq on lo) ──veth── b0, b1, b2
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.registry import Dnsmasq, Etcd
from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000
PREFIX = "/edge/services/web/"
STOP_WITHIN_S = 2.0  # what systemd's stop waits for before it has to SIGKILL (issue: > 15 s)


class Arrivals:
    """New flows to the VIP from a thread, a few at a time, until stopped (at most 3,000 flows
    or 180 s); counts backends and failures."""

    def __init__(self, net, vip):
        self.net, self.vip, self.seen = net, vip, Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arrivals", daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 180
        while not self._stop.is_set() and sum(self.seen.values()) < 3000 and time.monotonic() < deadline:
            self.seen.update(backends_seen(self.net.client, self.vip, PORT, 6, concurrency=3, deadline_s=10))
            self._stop.wait(0.05)

    def __enter__(self) -> "Arrivals":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def failures(self) -> dict:
        return {k: n for k, n in self.seen.items() if k.startswith("error:")}


def _stop_timed(edged: EdgedProc) -> float:
    """SIGTERM; how long edged took to exit (killed after 20 s)."""
    t0 = time.monotonic()
    edged.signal(signal.SIGTERM)
    try:
        edged.proc.wait(timeout=20)
    finally:
        took = time.monotonic() - t0
        edged.stop()
    return took


def _restart_during_outage(
    net, router, tmp_path, service: dict, outage, expect: set[str], node: dict | None = None
) -> None:
    doc = router.config(
        [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470", **(node or {})}
    )
    edged = EdgedProc.start(net.router, doc, router.iface)
    conns, again = [], None
    try:
        (svc,) = router.status()["services"]
        assert {b["name"] for b in svc["backends"]} == expect
        conns = open_connections(net.client, net.vip, PORT, 10)
        before = [c.request().backend for c in conns]
        with Arrivals(net, net.vip) as arrivals:
            mark = len(edged.events)
            outage()
            edged.wait_for(lambda e: e["kind"] == "discovery-failed", 20.0, "the source down", after=mark)

            took = _stop_timed(edged)
            print(f"\nfigure: SIGTERM during the outage -> exited: {took * 1000:.0f} ms")
            assert took < STOP_WITHIN_S, f"edged took {took:.1f} s to stop during the outage"

            again = EdgedProc.start(net.router, doc, router.iface)
            ev = again.wait_for(lambda e: e["kind"] == "discovery-adopted", 5.0, "backends adopted")
            assert set(ev["backends"]) == expect, ev["text"]
            (svc,) = router.status()["services"]
            assert {b["name"] for b in svc["backends"] if b["weight"] > 0} == expect
            assert [c.request().backend for c in conns] == before  # established ones live on
            seen = backends_seen(net.client, net.vip, PORT, 60)
            names = {f"{net.backend_addr(i)}-{PORT}": f"b{i}" for i in range(3)}
            assert set(seen) == {names[n] for n in expect}, seen
            status = router.edgectl("status", "--socket", tmp_path / "edged.sock")
            assert (
                f"discovery: etcd stale, {len(expect)} backends" in status.stdout
                or f"discovery: dns stale, {len(expect)} backends" in status.stdout
            ), status.stdout
        assert arrivals.failures() == {}, arrivals.seen
        assert sum(arrivals.seen.values()) > 0
        assert [c.request().backend for c in conns] == before
    finally:
        close_all(conns)
        if again is not None:
            again.stop()
        edged.stop()


def test_restart_while_etcd_is_down_keeps_the_discovered_backends(net, router, tmp_path):
    etcd = Etcd(net.router, tmp_path).start()
    addr = [str(net.backend_addr(i)) for i in range(2)]
    for i, a in enumerate(addr):
        etcd.put(f"{PREFIX}b{i}", {"address": a, "port": PORT})
    s = {
        "name": "web",
        "vip": str(net.vip),
        "port": PORT,
        "discovery": {"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": PREFIX, "timeout_ms": 1000}, "retry_ms": 200},
    }
    fleet = {"fleet": {"etcd": ["127.0.0.1:2379"], "name": "n1"}}  # the fleet's etcd goes down with it
    try:
        _restart_during_outage(net, router, tmp_path, s, etcd.stop, {f"{a}-{PORT}" for a in addr}, fleet)
    finally:
        etcd.stop()


def test_a_stop_while_starting_during_an_etcd_outage_ends_within_the_bound(net, router, tmp_path):
    """SIGTERM while edged waits for its sources at start (etcd hung: it takes connections and
    answers nothing; the fleet on it too): edged used to wait the sources out, compile and
    start everything, and then hang in its stop (a cancelled gRPC call taken for a fault and
    retried), past 25 s, so systemd had to SIGKILL it. Now it stops at once, and the data path
    of the first start forwards on."""
    etcd = Etcd(net.router, tmp_path).start()
    etcd.put(f"{PREFIX}b0", {"address": str(net.backend_addr(0)), "port": PORT})
    s = {
        "name": "web",
        "vip": str(net.vip),
        "port": PORT,
        "discovery": {"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": PREFIX, "timeout_ms": 4000}, "retry_ms": 200},
    }
    doc = router.config(
        [s],
        node={
            "api_socket": str(tmp_path / "edged.sock"),
            "metrics_listen": "127.0.0.1:9470",
            "fleet": {"etcd": ["127.0.0.1:2379"], "name": "n1"},
        },
    )
    edged = EdgedProc.start(net.router, doc, router.iface)
    again = None
    try:
        edged.stop()
        etcd.proc.send_signal(signal.SIGSTOP)  # hung: connections queue, nothing answers
        again = EdgedProc.start(net.router, doc, router.iface, wait_deployed=False)
        again.wait_for(lambda e: e["kind"] == "discovery-waiting", 60.0, "edged waiting for its sources")
        took = _stop_timed(again)
        print(f"\nfigure: SIGTERM while starting during the outage -> exited: {took * 1000:.0f} ms")
        assert took < STOP_WITHIN_S, f"edged took {took:.1f} s to stop while starting"
        assert again.proc.returncode == 0
        assert not any(e["kind"] == "deployed" for e in again.events)
        assert set(backends_seen(net.client, net.vip, PORT, 30)) == {"b0"}
    finally:
        if again is not None:
            again.stop()
        edged.stop()
        if etcd.proc is not None:
            etcd.proc.send_signal(signal.SIGCONT)
        etcd.stop()


def test_restart_while_dns_is_down_keeps_the_discovered_backends(net, router, tmp_path):
    name = "web.disc.test"
    addr = [str(net.backend_addr(i)) for i in range(2)]
    dm = Dnsmasq(net.router, tmp_path, ttl_s=1)
    dm.set_hosts([(a, name) for a in addr], reload=False)
    dm.start()
    s = {
        "name": "web",
        "vip": str(net.vip),
        "port": PORT,
        "discovery": {
            "dns": {
                "servers": ["127.0.0.1:53"],
                "name": name,
                "type": "A",
                "port": PORT,
                "timeout_ms": 500,
                "min_ttl_ms": 100,
                "max_ttl_ms": 2000,
            },
            "retry_ms": 200,
        },
    }
    try:
        _restart_during_outage(net, router, tmp_path, s, dm.stop, {f"{a}-{PORT}" for a in addr})
    finally:
        dm.stop()
