"""maps.apply on an in-memory model of the maps (memtables.py): membership changes
(replace, rename, VIP moves, capacity edges) leave what a fresh deploy of the same
config leaves, never expose a half state to a packet, and a failed apply leaves
the maps byte-identical (but for the reverse-NAT generation, which only rises)."""

from __future__ import annotations

import contextlib

import pytest

from controlplane.config import parse_config
from controlplane.errors import MapError
from controlplane.tests.memtables import MemMaps, RnatCopies, canonical, half_states, vip_keys

M = 1009


def be(name, last, port=8000, weight=1, **kw):
    return {"name": name, "address": f"198.18.1.{last}", "port": port, "weight": weight, **kw}


def svc(name, vip_last, *backends, port=80, **kw):
    return {"name": name, "vip": f"198.19.0.{vip_last}", "port": port, "backends": list(backends), **kw}


def config(*services, max_services=4, max_backends=8):
    return parse_config(
        {
            "version": 1,
            "node": {"maglev_m": M, "max_services": max_services, "max_backends": max_backends},
            "services": list(services),
        }
    )


def fresh(cfg):
    mem = MemMaps(M, cfg.node.max_services, cfg.node.max_backends)
    mem.maps().apply(cfg)
    return canonical(mem)


@pytest.fixture
def mem():
    mem = MemMaps(M, 4, 8)
    yield mem
    mem.close()


def watch(mem, cfg=None):
    """Records every half state a packet could see while the maps are written."""
    seen = []
    target = vip_keys(cfg) if cfg else None
    mem.faults.on_write = lambda: seen.extend(half_states(mem, target))
    return seen


def test_replacing_a_backend_leaves_the_new_one_serving(mem):
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b1", 11))))
    seen = watch(mem)
    new = config(svc("chat", 1, be("b0", 10), be("b2", 12)))
    maps.apply(new)
    assert half_states(mem) == []
    assert canonical(mem) == fresh(new)
    assert seen == []


def test_replacing_the_only_backend(mem):
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b1", 11))))
    seen = watch(mem)
    new = config(svc("chat", 1, be("b2", 12)))
    maps.apply(new)
    assert canonical(mem) == fresh(new)
    assert seen == []


def test_renaming_a_service_on_the_same_vip_keeps_it_answering(mem):
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b1", 11))))
    seen = watch(mem)
    new = config(svc("chat-v2", 1, be("b0", 10), be("b1", 11)))
    maps.apply(new)
    assert canonical(mem) == fresh(new)
    assert seen == []


def test_renaming_a_service_and_moving_its_vip(mem):
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b0", 10)), svc("code", 2, be("c0", 20))))
    seen = watch(mem)
    new = config(svc("chat-v2", 3, be("b0", 10)), svc("code", 2, be("c0", 20)))
    maps.apply(new)
    assert canonical(mem) == fresh(new)
    assert seen == []


def test_moving_a_vip_at_max_services():
    mem = MemMaps(M, 2, 8)
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b0", 10)), svc("code", 2, be("c0", 20)), max_services=2))
    seen = watch(mem)
    new = config(svc("chat", 3, be("b0", 10)), svc("code", 2, be("c0", 20)), max_services=2)
    maps.apply(new)
    assert canonical(mem) == fresh(new)
    assert seen == []


def test_replacing_backends_at_max_backends():
    mem = MemMaps(M, 2, 3)
    maps = mem.maps()
    maps.apply(
        config(svc("chat", 1, be("b0", 10), be("b1", 11)), svc("code", 2, be("c0", 20)), max_services=2, max_backends=3)
    )
    seen = watch(mem)
    new = config(
        svc("chat", 1, be("b0", 10), be("b2", 12)), svc("code", 2, be("c0", 20)), max_services=2, max_backends=3
    )
    maps.apply(new)
    assert canonical(mem) == fresh(new)
    assert seen == []


def test_an_update_that_cannot_fit_fails_in_one_line_and_changes_nothing():
    mem = MemMaps(M, 2, 3)
    maps = mem.maps()
    maps.apply(
        config(svc("chat", 1, be("b0", 10), be("b1", 11)), svc("code", 2, be("c0", 20)), max_services=2, max_backends=3)
    )
    before = mem.image()
    # four backends where three fit (the config's own check is bypassed: sizes differ)
    too_many = config(svc("chat", 1, be("b0", 10), be("b1", 11), be("b2", 12)), svc("code", 2, be("c0", 20)))
    with pytest.raises(MapError) as e:
        maps.apply(too_many)
    assert "\n" not in str(e.value) and "backends" in str(e.value)
    assert mem.image() == before


@pytest.mark.parametrize("k", range(1, 40))
def test_a_write_failing_midway_is_rolled_back_byte_for_byte(mem, k):
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b1", 11)), svc("code", 2, be("c0", 20))))
    before = mem.image()
    mem.faults.writes, mem.faults.fail_at = 0, k
    new = config(svc("chat-v2", 3, be("b0", 10), be("b2", 12, weight=3)), svc("code", 2, be("c1", 21)))
    try:
        maps.apply(new)
    except MapError as e:
        assert "\n" not in str(e)
        assert mem.image() == before
        mem.faults.fail_at = None
        maps.apply(new)  # the same change goes through once the fault is gone
    assert canonical(mem) == fresh(new)


def _named_vips(mem):
    """Service id -> the VIP key its config names for the fast path (service_cfg.vip_*)."""
    t = mem.tables["edge_svc_cfg"]
    return {
        vid: (t[vid].vip_addr, t[vid].vip_port, t[vid].vip_proto)
        for vid in range(mem.max_services)
        if (t[vid].vip_addr, t[vid].vip_port, t[vid].vip_proto) != (0, 0, 0)
    }


def test_service_configs_name_their_vips_and_forget_removed_ones(mem):
    """The fast path forwards a conntrack hit to the VIP key a service's config names without
    looking the VIP up: named once the VIP entry is the service's, cleared before it goes."""
    maps = mem.maps()
    cfg = config(svc("chat", 1, be("b0", 10)), svc("code", 2, be("c0", 20)))
    maps.apply(cfg)
    assert sorted(_named_vips(mem).values()) == sorted(vip_keys(cfg))
    seen = watch(mem)
    maps.apply(config(svc("code", 2, be("c0", 20))))
    assert list(_named_vips(mem).values()) == [k for k, n in vip_keys(cfg).items() if n == "code"]
    assert seen == []


NODE = dict(
    maglev_m=M,
    max_services=4,
    max_backends=8,
    ct_size=1024,
    ingress_ifindex=3,
    xdp_flags=2,
    ip_forward_was=0,
    return_ifindex=[4],
    return_clsact_added=[True],
)


def test_the_reverse_nat_generation_rises_with_every_change_of_edge_rnat(mem):
    """edge_reply uses its per-CPU copy of an edge_rnat entry while node_info.rnat_gen is the
    one it was copied under: every apply that changes edge_rnat gives it a new value before
    any other map is written, one that changes nothing leaves it, and the node record's
    writer gives it a new one too (never an old one back)."""
    maps = mem.maps()
    maps.write_node(**NODE)
    copies = RnatCopies(mem)
    mem.faults.on_write = copies.after_write
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b1", 11)), svc("code", 2, be("c0", 20))))
    first = mem.rnat_gen()
    assert first > 0
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b1", 11)), svc("code", 2, be("c0", 20))))
    assert mem.rnat_gen() == first  # nothing changed
    maps.write_node(**{**NODE, "ingress_ifindex": 5})  # edged's watch: the interface was made again
    second = mem.rnat_gen()
    assert second > first
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b2", 12)), svc("code", 3, be("c0", 20))))
    assert mem.rnat_gen() > second
    maps.apply(config(svc("code", 3, be("c0", 20))))
    assert copies.settled() == []


@pytest.mark.parametrize("k", range(1, 40))
def test_a_failed_apply_leaves_no_copy_of_edge_rnat_in_use_that_it_made_stale(mem, k):
    """A write failing midway: edge_rnat is put back, which is a change too, so the
    generation moves on again and never returns to one that copies of its changes have."""
    maps = mem.maps()
    maps.apply(config(svc("chat", 1, be("b0", 10), be("b1", 11)), svc("code", 2, be("c0", 20))))
    copies = RnatCopies(mem)
    mem.faults.on_write = copies.after_write
    mem.faults.writes, mem.faults.fail_at = 0, k
    with contextlib.suppress(MapError):
        maps.apply(config(svc("chat-v2", 3, be("b0", 10), be("b2", 12, weight=3)), svc("code", 2, be("c1", 21))))
    assert copies.settled() == []


def be6(name, last, port=8000, weight=1, **kw):
    return {"name": name, "address": f"2001:2:0:1::{last:x}", "port": port, "weight": weight, **kw}


def svc6(name, vip_last, *backends, port=80, **kw):
    return {"name": name, "vip": f"2001:2:0:ff::{vip_last:x}", "port": port, "backends": list(backends), **kw}


def test_the_reverse_nat_generation_rises_with_every_change_of_edge_rnat6(mem):
    """edge_reply's IPv6 side (reply6.h) keeps per-CPU copies of edge_rnat6 entries under the
    same node_info.rnat_gen: an endpoint that comes, goes or moves to another VIP gives it a new
    value before any other map is written; an apply that changes nothing leaves it."""
    maps = mem.maps()
    maps.write_node(**NODE)
    copies = RnatCopies(mem)
    mem.faults.on_write = copies.after_write
    maps.apply(config(svc6("chat", 1, be6("b0", 10), be6("b1", 11)), svc("code", 2, be("c0", 20))))
    first = mem.rnat_gen()
    maps.apply(config(svc6("chat", 1, be6("b0", 10), be6("b1", 11)), svc("code", 2, be("c0", 20))))
    assert mem.rnat_gen() == first  # nothing changed
    maps.apply(config(svc6("chat", 1, be6("b0", 10), be6("b2", 12)), svc("code", 2, be("c0", 20))))
    second = mem.rnat_gen()
    assert second > first  # b1's entry went, b2's came: IPv6 only
    maps.apply(config(svc6("chat", 1, be6("b0", 10)), svc("code", 2, be("c0", 20))))
    assert mem.rnat_gen() > second  # b2's went (the quick path)
    maps.apply(config(svc6("chat", 3, be6("b0", 10)), svc("code", 2, be("c0", 20))))
    maps.apply(config(svc("code", 2, be("c0", 20))))
    assert copies.settled() == []


@pytest.mark.parametrize("k", range(1, 40))
def test_a_failed_apply_leaves_no_copy_of_edge_rnat6_in_use_that_it_made_stale(mem, k):
    """As for edge_rnat: an IPv6 endpoint's entry put back by a rollback is a change too."""
    maps = mem.maps()
    maps.apply(config(svc6("chat", 1, be6("b0", 10), be6("b1", 11)), svc("code", 2, be("c0", 20))))
    copies = RnatCopies(mem)
    mem.faults.on_write = copies.after_write
    mem.faults.writes, mem.faults.fail_at = 0, k
    with contextlib.suppress(MapError):
        maps.apply(config(svc6("chat-v2", 3, be6("b0", 10), be6("b2", 12, weight=3)), svc("code", 2, be("c1", 21))))
    assert copies.settled() == []
