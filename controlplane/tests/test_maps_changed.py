"""The weights-only apply (maps/changed.py, writer._write_changed): a change of weights or
standby flags writes the services that changed and no other, leaves what a fresh deploy of
the same config leaves, shows no packet a half state, rewrites a service set_weights wrote
since, and a failure in it leaves the maps byte-identical; any other change takes the full
apply."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.config import parse_config
from controlplane.errors import MapError
from controlplane.maps.changed import changed_services
from controlplane.tests.memtables import MemMaps, canonical, half_states, vip_keys

M = 1009


def be(name, last, weight=1, **kw):
    return {"name": name, "address": f"198.18.1.{last}", "port": 8000, "weight": weight, **kw}


def svc(name, vip_last, *backends, protocol="tcp"):
    return {"name": name, "vip": f"198.19.0.{vip_last}", "port": 80, "protocol": protocol, "backends": list(backends)}


def config(*services):
    return parse_config(
        {"version": 1, "node": {"maglev_m": M, "max_services": 8, "max_backends": 16}, "services": list(services)}
    )


def fresh(cfg):
    mem = MemMaps(M, cfg.node.max_services, cfg.node.max_backends)
    try:
        mem.maps().apply(cfg)
        return canonical(mem)
    finally:
        mem.close()


def services(n, weight_of_first=1, **kw):
    """n services of two backends each; the first backend of the first has weight_of_first."""
    out = [
        svc(f"s{i}", i + 1, be("b0", 10 + 2 * i, weight=weight_of_first if i == 0 else 1), be("b1", 11 + 2 * i, **kw))
        for i in range(n)
    ]
    return config(*out)


def writes_for_one_reweight(n: int) -> int:
    mem = MemMaps(M, 8, 16)
    try:
        maps = mem.maps()
        maps.apply(services(n))
        mem.faults.writes = 0
        maps.apply(services(n, weight_of_first=3))
        assert canonical(mem) == fresh(services(n, weight_of_first=3))
        return mem.faults.writes
    finally:
        mem.close()


def test_one_weight_changed_writes_as_much_whatever_the_node_holds():
    # failed before: every apply rewrote every service (10 writes at 1 service, 64 at 7)
    assert writes_for_one_reweight(7) == writes_for_one_reweight(1)


def test_weights_only_apply_shows_no_half_state_and_ends_as_a_fresh_deploy():
    mem = MemMaps(M, 8, 16)
    try:
        maps = mem.maps()
        maps.apply(services(3))
        for cfg in (services(3, weight_of_first=0), services(3, standby=True), services(3, weight_of_first=5)):
            target = vip_keys(cfg)
            seen = []
            mem.faults.on_write = lambda t=target, seen=seen: seen.extend(half_states(mem, t))
            maps.apply(cfg)
            assert seen == []
            assert canonical(mem) == fresh(cfg)
    finally:
        mem.close()


def test_a_service_set_weights_wrote_is_rewritten_by_the_next_apply():
    mem = MemMaps(M, 8, 16)
    try:
        maps = mem.maps()
        cfg = services(2)
        maps.apply(cfg)
        maps.set_weights(cfg.services[1], {"b0": 0, "b1": 9})
        maps.apply(cfg)
        assert canonical(mem) == fresh(cfg)
    finally:
        mem.close()


def test_a_failing_weights_only_apply_changes_nothing_and_the_next_one_works():
    mem = MemMaps(M, 8, 16)
    try:
        maps = mem.maps()
        maps.apply(services(3))
        before = mem.image()
        mem.faults.writes, mem.faults.fail_at = 0, 3
        with pytest.raises(MapError):
            maps.apply(services(3, weight_of_first=4))
        mem.faults.fail_at = None
        assert mem.image() == before
        maps.apply(services(3, weight_of_first=4))
        assert canonical(mem) == fresh(services(3, weight_of_first=4))
    finally:
        mem.close()


def test_only_weights_and_standby_take_the_short_way():
    cfg = services(2)
    last = (cfg, {})
    assert changed_services(None, cfg, {}, set()) is None
    assert changed_services(last, cfg, {}, set()) == []
    assert changed_services(last, cfg, {}, {"s1"}) == [cfg.services[1]]
    reweighted = services(2, weight_of_first=2)
    assert changed_services(last, reweighted, {}, set()) == [reweighted.services[0]]
    assert [s.name for s in changed_services(last, services(2, standby=True), {}, set())] == ["s0", "s1"]
    s0 = cfg.services[0]
    other_token = replace(
        cfg, services=(replace(s0, backends=(replace(s0.backends[0], token=7), s0.backends[1])), cfg.services[1])
    )
    assert changed_services(last, other_token, {}, set()) is None
    added = config(
        *[svc(f"s{i}", i + 1, be("b0", 10 + 2 * i), be("b1", 11 + 2 * i)) for i in range(2)], svc("s2", 3, be("b0", 20))
    )
    assert changed_services(last, added, {}, set()) is None
    assert changed_services(last, replace(cfg, node=replace(cfg.node, ct_size=2048)), {}, set()) is None
    assert changed_services(last, cfg, {cfg.services[0].backends[0].address: 3}, set()) is None


def with_extra(n, extra_last=None, drop_b1=False):
    """services(n) with, in the first, a backend b2 at 198.18.1.<extra_last> and/or without b1."""
    out = []
    for i in range(n):
        bes = [be("b0", 10 + 2 * i)] + ([] if drop_b1 and i == 0 else [be("b1", 11 + 2 * i)])
        if i == 0 and extra_last is not None:
            bes.append(be("b2", extra_last))
        out.append(svc(f"s{i}", i + 1, *bes))
    return config(*out)


def writes_for(n: int, first, then) -> int:
    mem = MemMaps(M, 8, 16)
    try:
        maps = mem.maps()
        maps.apply(first)
        target, seen = vip_keys(then), []
        mem.faults.on_write = lambda: seen.extend(half_states(mem, target))
        mem.faults.writes = 0
        maps.apply(then)
        assert seen == []
        assert canonical(mem) == fresh(then)
        return mem.faults.writes
    finally:
        mem.close()


def test_one_backend_added_or_removed_writes_as_much_whatever_the_node_holds():
    # failed before: the full apply rewrote every service
    assert writes_for(7, with_extra(7), with_extra(7, 40)) == writes_for(1, with_extra(1), with_extra(1, 40))
    assert writes_for(7, with_extra(7, 40), with_extra(7)) == writes_for(1, with_extra(1, 40), with_extra(1))
    assert writes_for(5, with_extra(5), with_extra(5, drop_b1=True)) == writes_for(
        1, with_extra(1), with_extra(1, drop_b1=True)
    )


def test_members_that_change_owner_or_collide_still_end_as_a_fresh_deploy():
    writes_for(3, with_extra(3, 40), with_extra(3, 11, drop_b1=True))  # b2 takes b1's endpoint: a rename
    writes_for(3, with_extra(3, drop_b1=True), with_extra(3, 11, drop_b1=True))


def test_a_failing_members_apply_changes_nothing():
    for k in range(1, 12):
        mem = MemMaps(M, 8, 16)
        try:
            maps = mem.maps()
            maps.apply(with_extra(3, 40))
            before = mem.image()
            mem.faults.writes, mem.faults.fail_at = 0, k
            try:
                maps.apply(with_extra(3, 41, drop_b1=True))
            except MapError:
                assert mem.image() == before
            mem.faults.fail_at = None
            maps.apply(with_extra(3, 41, drop_b1=True))
            assert canonical(mem) == fresh(with_extra(3, 41, drop_b1=True))
        finally:
            mem.close()


def test_an_endpoint_another_protocol_shares_keeps_its_health_when_one_service_drops_it():
    both = config(svc("t", 1, be("b0", 10), be("b1", 11)), svc("u", 1, be("b0", 10), protocol="udp"))
    one = config(svc("t", 1, be("b1", 11)), svc("u", 1, be("b0", 10), protocol="udp"))
    writes_for(2, both, one)
    writes_for(2, one, both)


def test_weights_known_from_the_last_apply_and_set_weights_are_what_the_maps_hold():
    mem = MemMaps(M, 8, 16)
    try:
        maps = mem.maps()

        def agrees():
            for s in ("s0", "s1"):
                assert maps.weights(s) == mem.maps().weights(s)  # a new Maps reads them from the maps

        maps.apply(services(2, weight_of_first=3))
        agrees()
        maps.set_weights(services(2).services[1], {"b0": 7})
        agrees()
        mem.faults.writes, mem.faults.fail_at = 0, 2
        with pytest.raises(MapError):
            maps.apply(services(2, weight_of_first=5))
        mem.faults.fail_at = None
        agrees()
        maps.apply(services(2, weight_of_first=5))
        agrees()
        with pytest.raises(MapError):
            maps.weights("s9")
    finally:
        mem.close()
