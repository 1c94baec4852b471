"""The fleet over a real etcd (Debian's etcd-server, started and stopped by the test): three
edge routers, each with its own XDP data path and edged, share one table.

        client ── upstream (static route to one router at a time) ─┬─ r0 (XDP, edged) ─┐
                                                                   ├─ r1               ─┼─ sw ─┬─ b0, b1
                                                                   └─ r2               ─┘  etcd (198.18.64.250)

etcd listens on the backend LAN's bridge (the switch namespace), which every router reaches.
Every edged probes both backends (http, 50 ms) and reports; one is elected leader and publishes
snapshots; every node applies each version and reports its Maglev table's digest in its event.

- a backend that stops answering (its process SIGSTOPped: probes time out, every node takes it
  down) changes the weights, and every node applies the same version with the same table
  (digests equal); figures: the leader's trigger report -> applied on all nodes;
- the leader is killed (SIGKILL, by pid) and another takes over within the lease TTL;
- etcd is stopped: every node says so, keeps its snapshot and forwards (a GET through each).
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from controlplane.testbed.daemon import EdgedProc, env_with_package
from controlplane.testbed.ecmp import _RouterNet
from controlplane.testbed.router import Router
from controlplane.testbed.fleet import SWITCH, FleetNet, FleetTopo
from controlplane.testbed.registry import Etcd
from controlplane.testbed.traffic import http_get, wait_until

ETCD_ADDR = "198.18.64.250"
ETCD_PORT = 2379
LEASE_TTL_S = 2
PROBE_MS = 50


def _fleet_doc(net: FleetNet, i: int) -> dict:
    service = net.service("web", health={"probe": {"kind": "http", "path": "/health", "interval_ms": PROBE_MS,
                                                            "timeout_ms": 40, "fall": 2}},
                          weights={"policy": "latency_inverse", "rtt_offset_ms": 1, "decay_ms": 100})
    doc = net.edged_config(i, [service])
    del doc["node"]["bgp"]
    doc["node"]["fleet"] = {"etcd": [f"{ETCD_ADDR}:{ETCD_PORT}"], "name": f"r{i}", "lease_ttl_s": LEASE_TTL_S,
                            "report_ms": 500, "stale_ms": 3000, "timeout_ms": 1000, "retry_ms": 200}
    return doc


class Fleet3:
    """Three routers with edged in a fleet, two backends, etcd on the LAN."""

    def __init__(self, routers: int = 3):
        self.net = FleetNet(FleetTopo(routers=routers, backends=2)).build()
        self.edgeds: list[EdgedProc] = []
        self.etcd: Etcd | None = None
        try:
            self.net.start_backends()
            sw = self.net.ns[SWITCH]
            sw.run(["ip", "addr", "add", f"{ETCD_ADDR}/24", "dev", f"{self.net.prefix}-br"])
            (self.net.tmp / "etcd").mkdir()
            self.etcd = Etcd(sw, self.net.tmp / "etcd", ETCD_PORT, host=ETCD_ADDR).start()
            self.edgeds = [EdgedProc.start(self.net.router(i), _fleet_doc(self.net, i), self.net.router_iface(i),
                                           wait_deployed=False) for i in range(routers)]
            for e in self.edgeds:
                e.wait_for(lambda ev: ev["kind"] == "deployed", 240.0, "edged to deploy")
        except BaseException:
            self.close()
            raise

    def applied(self, i: int, pred=lambda e: True, after: int = 0, timeout_s: float = 30.0) -> dict:
        return self.edgeds[i].wait_for(lambda e: e["kind"] == "fleet" and pred(e), timeout_s,
                                       f"r{i} to apply a snapshot", after=after)

    def leader(self) -> int:
        """The router whose edged last said it leads (every node agrees on the name)."""
        names = set()
        for e in self.edgeds:
            ev = [x for x in e.events if x["kind"] == "fleet-leader"]
            names.add(ev[-1]["leader"] if ev else None)
        assert len(names) == 1 and None not in names, names
        return int(names.pop()[1:])

    def freeze_backend(self, j: int) -> None:
        """Backend j's server stops answering (SIGSTOP): connections are accepted by the kernel,
        HTTP probes time out."""
        self.net.servers[j].proc.send_signal(signal.SIGSTOP)

    def thaw_backend(self, j: int) -> None:
        self.net.servers[j].proc.send_signal(signal.SIGCONT)

    def fleet_status(self, i: int) -> dict:
        """`edgectl fleet status --json` in router i's namespace."""
        out = self.net.router(i).run([sys.executable, "-m", "controlplane", "fleet", "status", "--etcd",
                                      f"{ETCD_ADDR}:{ETCD_PORT}", "--json"], env=env_with_package())
        return json.loads(out.stdout)

    def get_through(self, i: int):
        """One GET to the VIP from the client, routed by the upstream through router i."""
        net = self.net
        net.upstream.run(["ip", "route", "replace", f"{net.vip}/32", "via", str(net.topo.router_up_addr(i).ip)])
        return http_get(net.client, net.vip, 8000)

    def close(self) -> None:
        try:
            for e in self.edgeds:
                e.stop()
            for i in range(self.net.topo.routers):
                Router(_RouterNet(self.net.router(i)), self.net.router_iface(i)).undeploy(check=False)
            if self.etcd is not None:
                self.etcd.stop()
        finally:
            self.net.close()

    def __enter__(self) -> "Fleet3":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@pytest.fixture(scope="module")
def fleet():
    with Fleet3() as f:
        yield f


def test_a_weight_change_reaches_every_node_with_the_same_table(fleet, record_property):
    """Every node applies a first snapshot; then b1 stops answering, every node's probes take it
    down, the leader publishes new weights, and every node applies that version with an
    identical Maglev table; b1 back, the same again."""
    firsts = [fleet.applied(i, timeout_s=60.0) for i in range(3)]
    assert all(f["tables"] for f in firsts)
    # let the weights settle (idle LAN: both backends alike), then mark where we are
    marks = [len(e.events) for e in fleet.edgeds]
    t_delay = time.time()
    fleet.freeze_backend(1)

    def slowed(e):
        w = e["weights"].get("web", {})
        return w.get("b1") == 0 and w.get("b0", 0) > 0

    got = [fleet.applied(i, slowed, after=marks[i], timeout_s=30.0) for i in range(3)]
    version = max(g["version"] for g in got)
    # every node on the same (newest) version: the same weights and the same table
    finals = [fleet.applied(i, lambda e: e["version"] == version, after=marks[i], timeout_s=10.0) for i in range(3)]
    assert len({json.dumps(f["weights"], sort_keys=True) for f in finals}) == 1, [f["weights"] for f in finals]
    assert len({f["tables"]["web"] for f in finals}) == 1, [f["tables"] for f in finals]
    applied = [f["applied_t"] for f in got]
    figures = {
        "report_to_applied_on_all_ms": round((max(applied) - got[0]["trigger_t"]) * 1000, 1),
        "published_to_applied_on_all_ms": round((max(applied) - got[0]["published_t"]) * 1000, 1),
        "backend_stopped_to_applied_on_all_ms": round((max(applied) - t_delay) * 1000, 1),
        "probe_interval_ms": PROBE_MS,
        "weights": finals[0]["weights"], "version": version,
    }
    record_property("fleet_propagation", json.dumps(figures))
    print("fleet propagation:", json.dumps(figures))
    marks = [len(e.events) for e in fleet.edgeds]
    fleet.thaw_backend(1)
    back = [fleet.applied(i, lambda e: e["weights"]["web"]["b1"] > 0, after=marks[i]) for i in range(3)]
    version = max(b["version"] for b in back)
    finals = [fleet.applied(i, lambda e: e["version"] == version, after=marks[i], timeout_s=10.0) for i in range(3)]
    assert len({f["tables"]["web"] for f in finals}) == 1, [f["tables"] for f in finals]


def test_the_leader_is_killed_and_another_takes_over(fleet, record_property):
    old = fleet.leader()
    marks = [len(e.events) for e in fleet.edgeds]
    t_kill = time.time()
    fleet.edgeds[old].signal(signal.SIGKILL)
    fleet.edgeds[old].proc.wait(10)
    others = [i for i in range(3) if i != old]
    took = [fleet.edgeds[i].wait_for(lambda e: e["kind"] == "fleet-leader" and e["leader"] != f"r{old}",
                                     LEASE_TTL_S * 5, f"r{i} to see a new leader", after=marks[i]) for i in others]
    new = {t["leader"] for t in took}
    assert len(new) == 1, new
    new_leader = new.pop()
    failover_s = max(t["t"] for t in took) - t_kill
    record_property("leader_failover_s", round(failover_s, 3))
    print(f"leader failover: r{old} killed, {new_leader} leads after {failover_s * 1000:.0f} ms (lease TTL {LEASE_TTL_S} s)")
    assert failover_s < LEASE_TTL_S * 2  # within the lease TTL (etcd rounds a lease up to a whole second or so)
    # `edgectl fleet status` (from etcd): the survivors, the new leader; the dead node's report
    # went with its lease
    status = fleet.fleet_status(others[0])
    assert status["leader"] == new_leader
    assert sorted(r["node"] for r in status["nodes"]) == [f"r{i}" for i in others]
    assert [r["node"] for r in status["nodes"] if r["leader"]] == [new_leader]
    # the killed router's data path keeps forwarding without its edged
    assert fleet.get_through(old).status == 200
    # the new leader still publishes: a weight change after the failover reaches both survivors
    marks = [len(e.events) for e in fleet.edgeds]
    fleet.freeze_backend(0)
    try:
        for i in others:
            fleet.applied(i, lambda e: e["weights"]["web"]["b0"] == 0, after=marks[i])
    finally:
        fleet.thaw_backend(0)
    for i in others:
        fleet.applied(i, lambda e: e["weights"]["web"]["b0"] > 0, after=marks[i])


def test_etcd_stopped_every_node_keeps_its_snapshot_and_forwards(fleet):
    alive = [i for i, e in enumerate(fleet.edgeds) if e.proc.poll() is None]
    marks = [len(e.events) for e in fleet.edgeds]
    fleet.etcd.stop()
    lost_at = {}
    for i in alive:
        lost = fleet.edgeds[i].wait_for(lambda e: e["kind"] == "fleet-lost", 15.0, f"r{i} to say etcd is lost",
                                        after=marks[i])
        assert "keeping snapshot v" in lost["text"]
        lost_at[i] = fleet.edgeds[i].events.index(lost)
    for i in range(3):  # every data path, with or without its edged
        replies = [fleet.get_through(i) for _ in range(4)]
        assert all(r.status == 200 for r in replies), (i, replies)
    # nothing was written to the tables since etcd went: the snapshot's weights stay
    for i in alive:
        later = fleet.edgeds[i].events[lost_at[i]:]
        assert not [e for e in later if e["kind"] == "weights"], later
    # etcd back: the nodes resume
    fleet.etcd.start()
    for i in alive:
        fleet.edgeds[i].wait_for(lambda e: e["kind"] == "fleet-recovered", 20.0, f"r{i} to reconnect",
                                 after=marks[i])
