"""new_flows: two_choices, the parts without a kernel: the config key, the service flag the
writer sets (abi.SVC_F_TWO_CHOICES), and the open-connection counts (edge_inflight) a new
backend id starts from. The choice itself is the data path's (netns-tests/test_two_choices.py)."""

from __future__ import annotations

import pytest

from controlplane import abi
from controlplane.config import parse_config
from controlplane.errors import ConfigError
from controlplane.tests.memtables import MemMaps

M = 1009


def be(name, last):
    return {"name": name, "address": f"198.18.1.{last}", "port": 8000}


def svc(name, vip_last, *backends, **kw):
    return {"name": name, "vip": f"198.19.0.{vip_last}", "port": 80, "backends": list(backends), **kw}


def config(*services):
    return parse_config(
        {"version": 1, "node": {"maglev_m": M, "max_services": 4, "max_backends": 8}, "services": list(services)}
    )


def test_new_flows_defaults_to_maglev_without_scrapes_and_takes_two_choices():
    cfg = config(svc("a", 1, be("b0", 10)), svc("b", 2, be("b0", 11), new_flows="two_choices"))
    assert [s.new_flows for s in cfg.services] == ["maglev", "two_choices"]


def test_a_bad_new_flows_names_the_field():
    with pytest.raises(ConfigError, match=r"^services\[0\]\.new_flows: "):
        config(svc("a", 1, be("b0", 10), new_flows="least_conn"))


def test_the_flag_is_set_for_the_services_that_ask_and_cleared_again():
    mem = MemMaps(M, 4, 8)
    try:
        maps = mem.maps()
        maps.apply(config(svc("a", 1, be("b0", 10)), svc("b", 2, be("b1", 11), new_flows="two_choices")))
        flags = {name: mem.tables[abi.MAP_SVC_CFG][maps.ids(name)[0]].flags for name in ("a", "b")}
        assert not flags["a"] & abi.SVC_F_TWO_CHOICES
        assert flags["b"] & abi.SVC_F_TWO_CHOICES
        maps.apply(config(svc("a", 1, be("b0", 10)), svc("b", 2, be("b1", 11))))
        assert not mem.tables[abi.MAP_SVC_CFG][maps.ids("b")[0]].flags & abi.SVC_F_TWO_CHOICES
    finally:
        mem.close()


def test_a_new_backend_id_starts_with_no_open_connections():
    """An id another backend had keeps that one's count until the writer zeroes it: a stale
    count would turn new flows away from the new backend for as long as it lasted."""
    mem = MemMaps(M, 4, 8)
    try:
        counts = mem.tables[abi.MAP_INFLIGHT]
        for i in range(8):
            counts[counts.Key(i)] = counts.Leaf(7)
        maps = mem.maps()
        maps.apply(config(svc("a", 1, be("b0", 10), be("b1", 11), new_flows="two_choices")))
        used = set(maps.ids("a")[1].values())
        assert {i: counts[counts.Key(i)].value for i in used} == {i: 0 for i in used}
        assert all(counts[counts.Key(i)].value == 7 for i in set(range(8)) - used)
    finally:
        mem.close()


def test_a_new_backend_id_starts_without_a_fix_or_a_scale_and_status_subtracts_the_fix():
    """edge_inflight holds counts, then fixes, then least_loaded's scales (maps.h): a reused id's
    fix and scale are zeroed, and open_count (status's wire.open) is count less the fix, read at
    the fix's own slot (a third of the way in), never a scale."""
    mem = MemMaps(M, 4, 8)
    try:
        t = mem.tables[abi.MAP_INFLIGHT]
        assert len(t) == 3 * 8
        for i in range(len(t)):
            t[t.Key(i)] = t.Leaf(7)
        maps = mem.maps()
        maps.apply(config(svc("a", 1, be("b0", 10), be("b1", 11), new_flows="least_loaded")))
        bid = maps.ids("a")[1]["b0"]
        assert (t[t.Key(bid + 8)].value, t[t.Key(bid + 16)].value) == (0, 0)
        t[t.Key(bid)] = t.Leaf(10)
        maps.set_open_fix(bid, 3)
        maps.set_open_scale(bid, 1024)
        assert maps.open_count(bid) == 7
        assert maps.open_counts([bid]) == {bid: (10, 3)} and maps.open_scales([bid]) == {bid: 1024}
    finally:
        mem.close()
