"""The fleet over a real etcd (Debian's etcd-server, started and stopped by the test): three
edge routers, each with its own XDP data path and edged, share one table
(controlplane/lab/fleet_etcd.py builds it: etcd on the backend LAN, which every router
reaches; the upstream routes the VIP to one router at a time).

- a backend that stops answering (SIGSTOP: probes time out, every node takes it down) changes
  the weights; every node applies the same version with the same Maglev table (digests of the
  active table, slot by slot, equal); so again when it comes back;
- an operator drains a backend on one node (`edgectl drain`, fleet-wide): every node applies a
  snapshot where it owns no slot, with the same table, and `edgectl fleet status` shows the
  mark; undrain gives it back everywhere. A drain with --local acts on that node only, and its
  status and `edgectl fleet status` say its table differs;
- garbage under the prefix (wrong types, nesting too deep) as snapshot, reports and a mark:
  every edged refuses it and runs on with one leader, and the fleet works once it is gone;
- the leader's edged is killed (SIGKILL, by pid): another node leads within the lease TTL,
  `edgectl fleet status` shows it, the killed node's data path still forwards, and the new
  leader's snapshots reach the survivors;
- etcd is stopped: every node says so (event, edged's status), keeps its snapshot, writes no other weights, and every
  router forwards; etcd back, they reconnect.
"""

from __future__ import annotations

import json

import pytest

from controlplane.api.client import Client
from controlplane.lab.fleet_etcd import EtcdFleet
from controlplane.lab.traffic import wait_until

LEASE_TTL_S = 2


@pytest.fixture(scope="module")
def fleet():
    with EtcdFleet(routers=3, probe_ms=50, lease_ttl_s=LEASE_TTL_S) as f:
        yield f


def test_a_weight_change_reaches_every_node_with_the_same_table(fleet, record_property):
    firsts = [fleet.applied(i, timeout_s=60.0) for i in range(3)]
    assert all(f["tables"].get("web") for f in firsts)
    figures = fleet.weight_change(1)
    record_property("fleet_propagation", json.dumps(figures))
    print("fleet propagation:", json.dumps(figures))
    assert figures["nodes"] == 3
    assert figures["same_weights"] and figures["same_table"] and figures["same_table_after_return"], figures
    assert figures["weights"]["b1"] == 0 and figures["weights"]["b0"] > 0


def test_an_operator_drain_reaches_every_node_and_undrain_restores_it(fleet, record_property):
    figures = fleet.operator_drain(1, "b1")
    record_property("fleet_operator_drain", json.dumps(figures))
    print("fleet operator drain:", json.dumps(figures))
    assert figures["said"] == (
        "drained web/b1 on every node of the fleet (the leader's next snapshot applies it): "
        "no new flows; established flows stay"
    )
    assert figures["nodes"] == 3 and figures["same_table"] and figures["same_table_after_undrain"], figures
    assert set(figures["slots"].values()) == {0}, figures["slots"]
    assert all(figures["fleet_drained"].values()), figures["fleet_drained"]
    assert [(m["service"], m["backend"], m["drain"], m["node"]) for m in figures["fleet_status_marks"]] == [
        ("web", "b1", True, "r1")
    ]
    assert all(figures["has_slots_after_undrain"].values()), figures["has_slots_after_undrain"]
    assert fleet.fleet_status(0)["operator"] == []


def test_a_local_drain_acts_on_one_node_and_says_its_table_differs(fleet):
    out = fleet.edgectl(2, "drain", "web", "b0", "--local")
    assert (out.returncode, out.stdout) == (
        0,
        "drained web/b0 on this node only: no new flows; established flows stay\n",
    )
    assert fleet.backends(2)["b0"]["slots"] == 0
    assert fleet.backends(0)["b0"]["slots"] > 0 and fleet.backends(1)["b0"]["slots"] > 0
    status = fleet.edgectl(2, "status").stdout
    assert "b0: drained by an operator on this node only, so its table differs from the fleet's" in status, status
    wait_until(
        lambda: fleet.fleet_status(0)["nodes"][2]["local"] == {"web/b0": "drained"},
        10.0,
        "r2's report to name its local drain",
        observe=lambda: fleet.fleet_status(0)["nodes"],
    )
    out = fleet.edgectl(2, "undrain", "web", "b0")  # fleet-wide: there is no such drain
    assert out.returncode != 0 and "drained on this node only: edgectl undrain --local" in out.stderr, out.stderr
    assert fleet.backends(2)["b0"]["slots"] == 0
    out = fleet.edgectl(2, "undrain", "web", "b0", "--local")
    assert out.returncode == 0, out.stderr
    assert fleet.backends(2)["b0"]["slots"] > 0


GARBAGE = (
    ("snapshot", '{"version":[],"services":{}}'),
    ("nodes/evil", '{"node":"evil","t":[],"version":1,"serving":true,"services":{}}'),
    ("operator/web/b0", "[" * 100000),
    ("nodes/deep", "[" * 50000 + "]" * 50000),
)


def test_garbage_in_etcd_stops_no_edged_and_the_fleet_works_once_it_is_gone(fleet):
    """Well-formed JSON of the wrong types and nesting too deep, as snapshot, reports and an
    operator mark: every edged refuses them and keeps running, one leader stays, and once the
    keys are gone a weight change reaches every node with the same table."""
    marks = fleet.marks()
    prefix = fleet.config(0)["node"]["fleet"].get("prefix", "/edge/fleet/")
    for key, value in GARBAGE:
        fleet.etcd.put(prefix + key, value)
    for i in range(3):  # the snapshot reaches every node: each refuses it, and runs on
        fleet.edgeds[i].wait_for(
            lambda e: e["kind"] == "fleet-refused" and e["key"] == prefix + "snapshot",
            15.0,
            f"r{i} to refuse the snapshot",
            after=marks[i],
        )
    leader = fleet.leader()
    for key, _ in GARBAGE[1:]:  # the leader reads every report and mark: it refuses each
        fleet.edgeds[leader].wait_for(
            lambda e, k=prefix + key: e["kind"] == "fleet-refused" and e["key"] == k,
            15.0,
            f"the leader to refuse {key}",
            after=marks[leader],
        )
    views = []
    for i in range(3):
        with Client(fleet.config(i)["node"]["api_socket"]) as c:
            views.append(c.status()["fleet"])
    assert fleet.alive() == [0, 1, 2]
    assert all(v["connected"] for v in views) and sum(v["is_leader"] for v in views) == 1, views
    for key, _ in GARBAGE[1:]:
        fleet.etcd.delete(prefix + key)
    figures = fleet.weight_change(1)
    assert figures["nodes"] == 3 and figures["same_table"] and figures["same_table_after_return"], figures
    assert fleet.leader() == leader


def test_the_leader_is_killed_and_another_takes_over(fleet, record_property):
    got = fleet.kill_leader()
    record_property("leader_failover", json.dumps(got))
    print("leader failover:", json.dumps(got))
    assert got["agree"], got
    assert got["failover_ms"] < LEASE_TTL_S * 2000  # within the lease TTL (plus etcd's expiry tick)
    others = got["survivors"]
    # `edgectl fleet status` (from etcd): the survivors and the new leader; the dead node's report
    # went with its lease
    status = fleet.fleet_status(others[0])
    assert status["leader"] == got["new_leader"]
    assert sorted(r["node"] for r in status["nodes"]) == [f"r{i}" for i in others]
    assert [r["node"] for r in status["nodes"] if r["leader"]] == [got["new_leader"]]
    # the killed router's data path keeps forwarding without its edged
    assert fleet.get_through(int(got["killed"][1:])).status == 200
    # the new leader publishes: a weight change reaches both survivors, with the same table
    figures = fleet.weight_change(0)
    assert figures["nodes"] == 2 and figures["same_table"] and figures["same_table_after_return"], figures


def test_etcd_stopped_every_node_keeps_its_snapshot_and_forwards(fleet):
    alive = fleet.alive()
    marks = fleet.marks()
    fleet.etcd.stop()
    lost_at = {}
    for i in alive:
        lost = fleet.edgeds[i].wait_for(
            lambda e: e["kind"] == "fleet-lost", 15.0, f"r{i} to say etcd is lost", after=marks[i]
        )
        assert "keeping snapshot v" in lost["text"]
        lost_at[i] = fleet.edgeds[i].events.index(lost)
        with Client(fleet.config(i)["node"]["api_socket"]) as c:  # edgectl status says so too
            view = c.status()["fleet"]
        assert view["connected"] is False and view["version"] > 0 and view["problem"], view
    for i in range(3):  # every data path, with or without its edged
        replies = [fleet.get_through(i) for _ in range(4)]
        assert all(r.status == 200 for r in replies), (i, replies)
    # nothing was written to the tables since etcd went: the snapshot's weights stay
    for i in alive:
        later = fleet.edgeds[i].events[lost_at[i] :]
        assert not [e for e in later if e["kind"] == "weights"], later
    fleet.etcd.start()
    for i in alive:
        fleet.edgeds[i].wait_for(lambda e: e["kind"] == "fleet-recovered", 20.0, f"r{i} to reconnect", after=marks[i])
