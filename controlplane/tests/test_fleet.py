"""The fleet's pure parts without etcd: digests, the leader's median of reports, hysteresis
and versioning of snapshots, the decision to apply, the status rows."""

from __future__ import annotations

from dataclasses import replace

from controlplane.config import parse_config
from controlplane.fleet import snapshot as fs


def cfg(weight_b=1, policy="latency_inverse"):
    return parse_config(
        {
            "version": 1,
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "weights": {"policy": policy},
                    "backends": [
                        {"name": "a", "address": "198.18.1.2", "port": 8000},
                        {"name": "b", "address": "198.18.1.3", "port": 8000, "weight": weight_b},
                    ],
                }
            ],
        }
    )


def rep(node, a, b, t=100.0, svc=None, version=0):
    s = svc or cfg().services[0]
    return fs.report(node, t, version, True, [s], {"chat": {"a": a, "b": b}}, {"chat": {"a": "up", "b": "up"}})


def test_digest_follows_what_makes_tables_comparable():
    s = cfg().services[0]
    assert fs.digest(s) == fs.digest(cfg().services[0])
    assert fs.digest(s) != fs.digest(cfg(weight_b=2).services[0])
    assert fs.digest(s) != fs.digest(replace(s, vip=cfg().services[0].backends[0].address))


def test_leader_takes_the_median_of_fresh_agreeing_reports():
    s = cfg().services[0]
    reports = [
        rep("n1", 10000, 5000),
        rep("n2", 10000, 100),
        rep("n3", 9000, 6000),
        rep("old", 1, 1, t=0.0),
        rep("other", 1, 1, svc=cfg(weight_b=3).services[0]),
    ]
    assert fs.combine(s, reports, now=101.0, stale_s=5) == {"a": 10000, "b": 5000}
    assert fs.combine(s, [rep("old", 1, 1, t=0.0)], now=101.0, stale_s=5) is None


def test_snapshots_are_versioned_and_follow_hysteresis():
    c = cfg()
    first = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5)
    assert first["version"] == 1 and first["services"]["chat"]["weights"] == {"a": 10000, "b": 5000}
    assert first["services"]["chat"]["backends"] == [["a", "198.18.1.2", 8000], ["b", "198.18.1.3", 8000]]
    # a move inside the hysteresis publishes nothing; one past it a new version
    assert fs.next_snapshot(c.services, [rep("n1", 10000, 5050)], first, "n1", 102.0, 5) is None
    second = fs.next_snapshot(c.services, [rep("n1", 10000, 2000)], first, "n2", 102.0, 5)
    assert second["version"] == 2 and second["leader"] == "n2"
    assert second["services"]["chat"]["weights"] == {"a": 10000, "b": 2000}
    # nobody reports: the last weights stay, no new version
    assert fs.next_snapshot(c.services, [], second, "n2", 103.0, 5) is None


def test_a_node_applies_newer_versions_of_services_it_agrees_on():
    c = cfg()
    snap = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5)
    got = fs.to_apply(snap, c.services, applied=0)
    assert got.version == 1 and got.weights == {"chat": {"a": 10000, "b": 5000}} and not got.skipped
    assert fs.to_apply(snap, c.services, applied=1) is None
    other = fs.to_apply(snap, cfg(weight_b=3).services, applied=0)
    assert other.weights == {} and "differs" in other.skipped["chat"]


def test_documents_round_trip_and_garbage_is_named():
    doc = rep("n1", 1, 2)
    assert fs.decode(fs.encode(doc), "nodes/n1") == doc
    for bad in (b"{", b"[]", b'{"x": 1}'):
        try:
            fs.decode(bad, "nodes/n1")
        except ValueError as e:
            assert str(e).startswith("nodes/n1: ")
        else:
            raise AssertionError(bad)


def test_status_rows():
    c = cfg()
    snap = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5)
    rows = fs.status_rows("n1", snap, [rep("n2", 1, 0, t=99.0, version=0), rep("n1", 1, 1, t=100.5, version=1)], 101.0)
    assert [r["node"] for r in rows] == ["n1", "n2"]
    assert rows[0]["leader"] and rows[0]["current"] and rows[0]["report_age_s"] == 0.5
    assert not rows[1]["leader"] and not rows[1]["current"]


def test_status_text_marks_the_leader_and_nodes_behind():
    c = cfg()
    snap = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5)
    rows = fs.status_rows("n1", snap, [rep("n2", 1, 0, t=99.0, version=0), rep("n1", 1, 1, t=100.5, version=1)], 101.0)
    text = fs.format_status({"leader": "n1", "version": 1, "nodes": rows})
    lines = text.splitlines()
    assert lines[0] == "leader n1, snapshot v1"
    assert lines[2].split()[:3] == ["n1", "leader", "v1"]
    assert lines[3].split()[:3] == ["n2", "-", "v0*"]
    assert lines[-1] == "* not on the current snapshot yet"


def test_the_nodes_fleet_view_survives_the_api_and_reads_as_one_line():
    from controlplane.api import convert
    from controlplane.statusview import fmt_fleet as _fmt_fleet

    view = {
        "name": "r1",
        "leader": "r0",
        "is_leader": False,
        "connected": False,
        "problem": "etcd 198.18.64.250:2379: no answer in 1000 ms",
        "version": 9,
        "applied_age_s": 2.5,
        "services": ["web"],
    }
    back = convert.status_from_proto(convert.status_to_proto({"iface": "eth0", "fleet": view}))
    assert back["fleet"] == view
    assert "fleet" not in convert.status_from_proto(convert.status_to_proto({"iface": "eth0"}))
    assert _fmt_fleet(view) == (
        "fleet: r1, leader r0, snapshot v9 applied 2.5s ago; etcd LOST (etcd "
        "198.18.64.250:2379: no answer in 1000 ms): keeping the snapshot, forwarding"
    )
    assert (
        _fmt_fleet({**view, "is_leader": True, "connected": True, "version": 0})
        == "fleet: r1, leader, no snapshot yet (local weights)"
    )


def test_a_node_steers_by_the_snapshot_with_its_operator_weights_on_top():
    from controlplane import weights as policy
    from controlplane.fleet.member import Hooks, Member

    c = parse_config(
        {
            "version": 1,
            "node": {"fleet": {"etcd": ["127.0.0.1:2379"], "name": "n1"}},
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "weights": {"policy": "latency_inverse"},
                    "backends": [
                        {"name": "a", "address": "198.18.1.2", "port": 8000},
                        {"name": "b", "address": "198.18.1.3", "port": 8000},
                    ],
                }
            ],
        }
    )
    s = c.services[0]
    m = Member(c.node.fleet, Hooks(lambda: c.services, lambda got: {}, lambda *a, **k: None))
    own = policy.Decision(
        weights={"a": 10000, "b": 9000},
        computed={"a": 10000, "b": 9000},
        states={"a": "up", "b": "up"},
        reasons={},
        push=True,
    )
    # no snapshot yet: the node's own decision, recorded for its report
    assert m.steer(s, own, None) is own and m.computed["chat"] == {"a": 10000, "b": 9000}
    m.shared = {"chat": {"a": 10000, "b": 2000}}
    d = m.steer(s, own, {"a": 10000, "b": 9000})
    assert d.weights == {"a": 10000, "b": 2000} and d.push
    assert not m.steer(s, own, {"a": 10000, "b": 2000}).push  # already in the table
    d = m.steer(s, own, {"a": 10000, "b": 2000}, forced={"a": 0})  # drained here, on this node only
    assert d.weights == {"a": 0, "b": 2000} and d.push


def test_reports_carry_each_backends_wire_signals_and_fleet_status_shows_them():
    s = cfg().services[0]
    wire = {
        "chat": {
            "a": {"handshake_p50_s": 0.0001, "first_byte_p50_s": 0.39, "active": 3, "fresh": True},
            "b": {"handshake_p50_s": None, "first_byte_p50_s": None, "active": None},
        }
    }
    r = fs.report("n1", 100.0, 1, True, [s], {"chat": {"a": 1, "b": 1}}, {"chat": {"a": "up", "b": "up"}}, wire=wire)
    # only the report's keys, and none for a backend without signals
    assert r["services"]["chat"]["wire"] == {"a": {"handshake_p50_s": 0.0001, "first_byte_p50_s": 0.39, "active": 3}}
    assert "wire" not in rep("n2", 1, 1)["services"]["chat"]
    r = fs.decode(fs.encode(r), "report")
    rows = fs.status_rows("n1", None, [r, rep("n2", 1, 1)], 101.0)
    assert rows[0]["wire"] == {"chat/a": {"handshake_p50_s": 0.0001, "first_byte_p50_s": 0.39, "active": 3}}
    assert rows[1]["wire"] == {}
    lines = fs.format_status({"leader": "n1", "version": 0, "nodes": rows}).splitlines()
    assert lines[3].strip() == "wire (handshake/first byte p50, active): chat/a 0.10ms/390.00ms 3"
    assert lines[4].split()[0] == "n2"
