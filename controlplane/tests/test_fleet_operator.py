"""Fleet-wide operator actions without etcd: the marks an action leaves, the leader folding them
into snapshots (drain -> 0, override -> its weight, a new version for every change, the policy's
weights back after undrain), nodes taking them, what status shows, and what edged's API records
or refuses (Operations.operate, driven alone over a State on in-memory maps)."""

from __future__ import annotations

import pytest

from controlplane.config import parse_config
from controlplane.fleet import operator as op, snapshot as fs


def cfg_doc():
    return {
        "version": 1,
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


def cfg():
    return parse_config(cfg_doc())


def rep(node, a, b, t=100.0):
    return fs.report(node, t, 0, True, cfg().services, {"chat": {"a": a, "b": b}}, {"chat": {"a": "up", "b": "up"}})


def marks(**by_backend):
    return {"chat": {name: {"drain": drain, "weight": weight} for name, (drain, weight) in by_backend.items()}}


def test_an_action_changes_one_mark_and_an_empty_mark_goes():
    drained = op.change(None, "drain", None, "r1", 5.0)
    assert drained == {"drain": True, "weight": None, "node": "r1", "t": 5.0}
    both = op.change(drained, "weight", 7, "r2", 6.0)
    assert both == {"drain": True, "weight": 7, "node": "r2", "t": 6.0}
    assert op.change(both, "undrain", None, "r2", 7.0)["weight"] == 7
    assert op.change(op.change(both, "undrain", None, "r2", 7.0), "weight", None, "r2", 8.0) is None
    assert op.change(None, "undrain", None, "r1", 5.0) is None  # undrain of nothing: still nothing
    with pytest.raises(ValueError):
        op.change(None, "cordon", None, "r1", 5.0)


def test_keys_and_marks_round_trip_and_garbage_is_refused():
    k = op.key("/edge/fleet/", "chat", "h100-a.1")
    assert k == b"/edge/fleet/operator/chat/h100-a.1"
    assert op.split_key("/edge/fleet/", k) == ("chat", "h100-a.1")
    assert op.split_key("/edge/fleet/", b"/edge/fleet/nodes/r1") is None
    assert op.split_key("/edge/fleet/", b"/edge/fleet/operator/chat") is None
    mark = op.change(None, "weight", 9, "r1", 1.5)
    assert op.decode(fs.encode(mark)) == mark
    for bad in (b"{", b"[]", b'{"weight": 70000}', b'{"weight": "7"}', b'{"weight": true}'):
        with pytest.raises(ValueError):
            op.decode(bad)


def test_the_leader_folds_a_drain_into_a_new_version_and_undrain_gives_the_weights_back():
    c = cfg()
    first = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5)
    # the same reports, b drained fleet-wide: a new version with b at 0, the policy's weights kept
    drained = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], first, "n1", 102.0, 5, marks(b=(True, None)))
    chat = drained["services"]["chat"]
    assert drained["version"] == 2 and chat["weights"] == {"a": 10000, "b": 0}
    assert chat["operator"] == {"b": {"drain": True, "weight": None}}
    assert chat["computed"] == {"a": 10000, "b": 5000}
    # nothing changed: no new version
    assert (
        fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], drained, "n1", 103.0, 5, marks(b=(True, None))) is None
    )
    # undrained: the policy's weight back, no marks left in the snapshot
    back = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], drained, "n1", 104.0, 5, {})
    assert back["version"] == 3 and back["services"]["chat"]["weights"] == {"a": 10000, "b": 5000}
    assert "operator" not in back["services"]["chat"] and "computed" not in back["services"]["chat"]


def test_an_override_beats_the_policy_and_a_drain_beats_the_override():
    c = cfg()
    snap = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5, marks(a=(False, 7)))
    assert snap["services"]["chat"]["weights"] == {"a": 7, "b": 5000}
    snap = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], snap, "n1", 102.0, 5, marks(a=(True, 7)))
    assert snap["services"]["chat"]["weights"] == {"a": 0, "b": 5000}
    # the hysteresis is judged on the policy's weights, not on the folded ones
    assert fs.next_snapshot(c.services, [rep("n1", 10000, 5050)], snap, "n1", 103.0, 5, marks(a=(True, 7))) is None


def test_marks_of_unknown_backends_wait_and_a_service_nobody_reports_still_gets_them():
    c = cfg()
    assert fs.next_snapshot(c.services, [], None, "n1", 101.0, 5, marks(zz=(True, None))) is None
    snap = fs.next_snapshot(c.services, [], None, "n1", 101.0, 5, marks(b=(True, None)))
    assert snap["services"]["chat"]["weights"] == {"a": 1, "b": 0}  # the configured weights, b drained


def test_marks_of_backends_no_config_and_no_fresh_report_names_are_unknown():
    c = cfg()
    found = {
        b"k-b": ("chat", "b", {"drain": True}),
        b"k-gone": ("chat", "gone", {"drain": True}),
        b"k-svc": ("old", "a", {"weight": 3}),
        b"k-new": ("chat", "new", {"drain": True}),
    }
    newer = fs.report(
        "n2",
        100.0,
        0,
        True,
        [
            parse_config(
                {
                    "version": 1,
                    "services": [
                        {
                            "name": "chat",
                            "vip": "198.18.255.1",
                            "port": 8000,
                            "weights": {"policy": "latency_inverse"},
                            "backends": [{"name": "new", "address": "198.18.1.4", "port": 8000}],
                        }
                    ],
                }
            ).services[0]
        ],
        {"chat": {"new": 1}},
        {"chat": {"new": "up"}},
    )
    # n2 runs a config with "new" and reports it: its mark stays while the report is fresh
    assert sorted(op.unknown(found, c.services, [newer], 101.0, 5)) == [b"k-gone", b"k-svc"]
    assert sorted(op.unknown(found, c.services, [newer], 106.0, 5)) == [b"k-gone", b"k-new", b"k-svc"]
    assert op.unknown({b"k-b": found[b"k-b"]}, c.services, [], 101.0, 5) == []
    # chat's discovery has said nothing yet: none of its marks is unknown; old's still is
    assert op.unknown(found, c.services, [], 106.0, 5, unsettled={"chat"}) == [b"k-svc"]


def test_nodes_take_the_folded_weights_and_the_marks():
    c = cfg()
    snap = fs.next_snapshot(c.services, [rep("n1", 10000, 5000)], None, "n1", 101.0, 5, marks(b=(True, None)))
    got = fs.to_apply(snap, c.services, applied=0)
    assert got.weights == {"chat": {"a": 10000, "b": 0}}
    assert got.operator == {"chat": {"b": {"drain": True, "weight": None}}}


def test_fleet_status_shows_fleet_wide_marks_and_nodes_whose_table_differs():
    r = fs.report(
        "r2", 100.0, 3, True, cfg().services, {"chat": {"a": 1, "b": 1}}, {}, local={"chat": {"a": "weight 7"}}
    )
    rows = fs.status_rows("r1", {"version": 3}, [r], 101.0)
    assert rows[0]["local"] == {"chat/a": "weight 7"}
    text = fs.format_status(
        {
            "leader": "r1",
            "version": 3,
            "nodes": rows,
            "operator": [{"service": "chat", "backend": "b", "drain": True, "weight": None, "node": "r1", "t": 99.0}],
        }
    )
    assert "fleet-wide: chat/b drained (set on r1)" in text
    assert "r2: chat/a weight 7 on this node only: its table differs from the fleet's" in text


class _Etcd:
    """The member's operate() over a dict, as etcd would keep the marks (this test is about what
    edged decides, netns-tests/test_fleet_etcd.py runs the real one)."""

    def __init__(self):
        self.marks: dict[tuple[str, str], dict] = {}
        self.down = False

    async def operate(self, service, backend, kind, weight=None):
        if self.down:
            raise ConnectionError("etcd not reachable (no answer in 1000 ms)")
        before = self.marks.get((service, backend))
        after = op.change(before, kind, weight, "r1", 1.0)
        if after is None:
            self.marks.pop((service, backend), None)
        else:
            self.marks[(service, backend)] = after
        return before, after


def _operations(c):
    """edged's Operations alone, over a State whose maps are the in-memory model of the pinned
    maps (memtables) with c applied, its fleet member _Etcd, and a drain of chat/a set on this
    node only (--local). Call on a running loop (the steering's prober lives on one)."""
    from controlplane.edged.operations import Operations
    from controlplane.edged.state import State
    from controlplane.edged.status import Status
    from controlplane.edged.steer import Steering
    from controlplane.tests.memtables import MemMaps

    mem = MemMaps(c.node.maglev_m, c.node.max_services, c.node.max_backends)
    state = State.new(c, "edge-t0")
    state.maps = mem.maps()
    state.maps.apply(c)
    state.fleet = _Etcd()
    steering = Steering(state)
    steering.targets = lambda cfg: []  # nothing is probed
    steering.set_services(c)
    state.drained.add(("chat", "a"))
    return Operations(state, steering, Status(state, steering.prober)), mem


def test_edged_records_fleet_marks_and_refuses_what_it_cannot():
    import asyncio

    from controlplane.errors import EdgeError

    async def main():
        c = parse_config({**cfg_doc(), "node": {"maglev_m": 1009, "max_services": 4, "max_backends": 8}})
        ops, mem = _operations(c)
        fleet, before = ops.state.fleet, ops.state.maps.weights("chat")
        try:
            await scenario(ops, fleet)
            return before, ops.state.maps.weights("chat")
        finally:
            await ops.steering.prober.close()
            mem.close()

    async def scenario(d, fleet):
        assert await d.operate("drain", "chat", "b") == "fleet"
        assert fleet.marks[("chat", "b")]["drain"] is True
        assert await d.operate("weight", "chat", "b", 7) == "fleet"
        with pytest.raises(LookupError):  # no such backend here: nothing is recorded
            await d.operate("drain", "chat", "zz")
        assert ("chat", "zz") not in fleet.marks
        fleet.marks[("chat", "zz")] = op.change(None, "drain", None, "r2", 1.0)  # from a node that has zz
        assert await d.operate("undrain", "chat", "zz") == "fleet"  # removable from here all the same
        assert ("chat", "zz") not in fleet.marks
        with pytest.raises(LookupError):
            await d.operate("undrain", "chat", "zz")
        with pytest.raises(EdgeError, match="drained on this node only: edgectl undrain --local"):
            await d.operate("undrain", "chat", "a")  # a is drained with --local, not fleet-wide
        fleet.down = True
        with pytest.raises(EdgeError, match="nothing recorded"):
            await d.operate("undrain", "chat", "b")
        assert fleet.marks[("chat", "b")] == {"drain": True, "weight": 7, "node": "r1", "t": 1.0}

    before, after = asyncio.run(main())
    assert after == before  # fleet-wide marks reach this node's table through a snapshot, not at once
