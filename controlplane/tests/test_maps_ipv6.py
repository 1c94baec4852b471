"""maps.apply with IPv6 services next to IPv4 ones, on the in-memory model of the maps
(memtables.py): an IPv6 service's VIP, address count, backends' addresses and reverse NAT go to
the IPv6 maps (abi.h: edge_vips6, edge_vip_addrs6, edge_backends6, edge_rnat6), its ids, Maglev
table and per-id records are shared with IPv4's, status shows it, and removing it leaves what a
fresh deploy without it leaves."""

from __future__ import annotations

from ipaddress import IPv6Address

import pytest

from controlplane import abi
from controlplane.config import parse_config
from controlplane.maps import token_of_key
from controlplane.maps.records import addr_of, from_be16
from controlplane.tests.memtables import MemMaps, canonical

M = 1009
V4 = {
    "name": "chat",
    "vip": "198.19.0.1",
    "port": 80,
    "backends": [{"name": "a", "address": "198.18.1.10", "port": 8000}],
}


def v6(name="chat6", vip="2001:2:0:ff::1", port=80, backends=("2001:2:0:1::10", "2001:2:0:1::11"), **kw):
    return {
        "name": name,
        "vip": vip,
        "port": port,
        "backends": [{"name": f"b{i}", "address": a, "port": 8000} for i, a in enumerate(backends)],
        **kw,
    }


def config(*services):
    return parse_config(
        {"version": 1, "node": {"maglev_m": M, "max_services": 4, "max_backends": 8}, "services": list(services)}
    )


def ipv6_maps(mem) -> dict:
    """The IPv6 maps' contents, readable."""
    t = mem.tables
    vips = {(str(addr_of(k.addr)), from_be16(k.port), k.proto): int(v.id) for k, v in t[abi.MAP_VIPS6].items()}
    addrs = {str(addr_of(k)): int(v.value) for k, v in t[abi.MAP_VIP_ADDRS6].items()}
    rnat = {
        (str(addr_of(k.addr)), from_be16(k.port)): (str(addr_of(v.vip_addr)), from_be16(v.vip_port), int(v.backend_id))
        for k, v in t[abi.MAP_RNAT6].items()
    }
    backends = {
        bid: str(addr_of(t[abi.MAP_BACKENDS6][bid])) for bid in range(8) if any(bytes(t[abi.MAP_BACKENDS6][bid]))
    }
    return {"vips": vips, "addrs": addrs, "rnat": rnat, "backends": backends}


@pytest.fixture
def mem():
    mem = MemMaps(M, 4, 8)
    yield mem
    mem.close()


def test_ipv6_service_goes_to_the_ipv6_maps_and_shows_in_status(mem):
    maps = mem.maps()
    maps.apply(config(V4, v6()))
    vid, bids = maps.ids("chat6")
    got = ipv6_maps(mem)
    assert got["vips"] == {("2001:2:0:ff::1", 80, 6): vid}
    assert got["addrs"] == {"2001:2:0:ff::1": 1}
    assert got["backends"] == {bids["b0"]: "2001:2:0:1::10", bids["b1"]: "2001:2:0:1::11"}
    assert got["rnat"] == {
        ("2001:2:0:1::10", 8000): ("2001:2:0:ff::1", 80, bids["b0"]),
        ("2001:2:0:1::11", 8000): ("2001:2:0:ff::1", 80, bids["b1"]),
    }
    # IPv4's maps hold only the IPv4 service; the IPv6 backends' edge_backends entries have addr 0
    assert [k.addr for k in mem.tables[abi.MAP_VIPS].keys()] != [] and len(mem.tables[abi.MAP_VIPS]) == 1
    assert len(mem.tables[abi.MAP_RNAT]) == 1
    assert {int(mem.tables[abi.MAP_BACKENDS][b].addr) for b in bids.values()} == {0}
    # the shared Maglev table names both IPv6 backends
    half = mem.tables[abi.MAP_VIPS6][next(iter(mem.tables[abi.MAP_VIPS6].keys()))].table
    assert set(maps.read_table(vid, half).tolist()) == set(bids.values())
    snap = maps.snapshot()
    chat6 = next(s for s in snap["services"] if s["name"] == "chat6")
    assert (chat6["vip"], chat6["port"]) == ("2001:2:0:ff::1", 80)
    assert [b["address"] for b in chat6["backends"]] == ["2001:2:0:1::10", "2001:2:0:1::11"]
    assert [b.address for b, _ in maps.deployed_backends(config(V4, v6()).services[1])] == [
        IPv6Address("2001:2:0:1::10"),
        IPv6Address("2001:2:0:1::11"),
    ]


def test_ipv6_changes_and_removal_leave_what_a_fresh_deploy_leaves(mem):
    maps = mem.maps()
    maps.apply(config(V4, v6()))
    maps.apply(config(V4, v6(backends=("2001:2:0:1::11", "2001:2:0:1::12"))))  # one replaced
    moved = config(V4, v6(vip="2001:2:0:ff::2"))
    maps.apply(moved)  # the VIP moves
    got = ipv6_maps(mem)
    assert set(got["vips"]) == {("2001:2:0:ff::2", 80, 6)}
    assert got["addrs"] == {"2001:2:0:ff::2": 1}
    assert set(got["rnat"]) == {("2001:2:0:1::10", 8000), ("2001:2:0:1::11", 8000)}
    assert sorted(got["backends"].values()) == ["2001:2:0:1::10", "2001:2:0:1::11"]
    fresh = MemMaps(M, 4, 8)
    try:
        fresh.maps().apply(moved)
        assert ipv6_maps(fresh)["vips"].keys() == got["vips"].keys()
        maps.apply(config(V4))
        gone = MemMaps(M, 4, 8)
        try:
            gone.maps().apply(config(V4))
            assert canonical(mem) == canonical(gone)
            assert ipv6_maps(mem) == {"vips": {}, "addrs": {}, "rnat": {}, "backends": {}}
        finally:
            gone.close()
    finally:
        fresh.close()


def test_weights_of_an_ipv6_service_flip_its_table(mem):
    maps = mem.maps()
    cfg = config(V4, v6())
    maps.apply(cfg)
    slots = maps.set_weights(cfg.services[1], {"b0": 0})
    assert slots == {"b0": 0, "b1": M}
    assert cfg.services[1].name in {s["name"] for s in maps.snapshot()["services"]}


HB = {"heartbeat": {"port": 7946, "timeout_ms": 500}}


def hb_entries(mem, name) -> dict:
    """edge_hb or edge_hb6, readable: (address, service port, heartbeat port) -> (token, health id)."""
    return {
        (str(addr_of(k.addr)), from_be16(k.port), from_be16(k.hb_port)): (token_of_key(v.key), int(v.health_id))
        for k, v in mem.tables[name].items()
    }


def heartbeat_service(name, vip, addresses, first_token):
    return {
        "name": name,
        "vip": vip,
        "port": 80,
        "health": HB,
        "backends": [
            {"name": f"b{i}", "address": a, "port": 8000, "token": hex(first_token + i)}
            for i, a in enumerate(addresses)
        ],
    }


def test_heartbeats_of_ipv6_backends_register_in_edge_hb6_and_read_back(mem):
    """An IPv6 service with heartbeats registers its backends in edge_hb6 (keyed by the IPv6
    address), an IPv4 one in edge_hb; deployed_backends reads each backend's token back (it raised
    AttributeError for any heartbeat service before: it read a field hb_target does not have), and
    removing the IPv6 service empties edge_hb6."""
    maps = mem.maps()
    hb4 = heartbeat_service("chat", "198.19.0.1", ["198.18.1.10"], 0x5EED0100)
    hb6 = heartbeat_service("chat6", "2001:2:0:ff::1", ["2001:2:0:1::10", "2001:2:0:1::11"], 0x5EED0000)
    cfg = config(hb4, hb6)
    maps.apply(cfg)
    got6 = hb_entries(mem, abi.MAP_HB6)
    assert {k: token for k, (token, _) in got6.items()} == {
        ("2001:2:0:1::10", 8000, 7946): 0x5EED0000,
        ("2001:2:0:1::11", 8000, 7946): 0x5EED0001,
    }
    assert {k: token for k, (token, _) in hb_entries(mem, abi.MAP_HB).items()} == {
        ("198.18.1.10", 8000, 7946): 0x5EED0100
    }
    assert len({hid for _, hid in got6.values()}) == 2  # each its own health record
    for s in cfg.services:
        assert [(str(b.address), b.token) for b, _ in maps.deployed_backends(s)] == [
            (str(b.address), b.token) for b in s.backends
        ]
    maps.apply(config(hb4))
    assert hb_entries(mem, abi.MAP_HB6) == {}
    assert len(hb_entries(mem, abi.MAP_HB)) == 1


def test_a_new_backend_on_a_reused_id_finds_no_cached_ipv6_dsr_hop(mem):
    """edge_hop6 caches the way to an IPv6 DSR backend by id (encap6.h) for a minute; a backend
    that replaces another on the same id must not be sent to the old one's interface and MACs:
    apply zeroes its entry, as edge_nexthop's (it kept the old entry before)."""
    maps = mem.maps()
    dsr = {"forwarding": "dsr", "port": 8000}
    maps.apply(config(V4, v6(backends=("2001:2:0:1::10",), **dsr)))
    _, bids = maps.ids("chat6")
    hop6 = mem.tables[abi.MAP_HOP6]
    stale = hop6.Leaf()
    for cpu in range(len(stale)):
        stale[cpu].ifindex, stale[cpu].expires = 7, 1 << 40
    hop6[hop6.Key(bids["b0"])] = stale
    maps.apply(config(V4, v6(backends=("2001:2:0:1::20",), **dsr)))  # b0 is a new backend now
    _, after = maps.ids("chat6")
    assert after["b0"] == bids["b0"]  # the same id, reused
    assert {int(v.ifindex) for v in hop6[hop6.Key(after["b0"])]} == {0}


def _named6(mem, vid: int) -> tuple[str, int, int] | None:
    """The IPv6 VIP key service id vid's config names for ingress6.h's established6, or None."""
    c = mem.tables[abi.MAP_SVC_CFG][vid]
    if not any(c.vip_addr6.w):
        return None
    return str(addr_of(c.vip_addr6)), from_be16(c.vip_port), int(c.vip_proto)


def test_ipv6_service_config_names_its_vip_for_the_shortcut_and_forgets_it(mem):
    """established6 (ingress6.h) forwards an edge_ct6 hit to the VIP key the service's config
    names without the edge_vips6 lookup: named once the VIP entry is the service's, renamed when
    the VIP moves, cleared before it goes (memtables checks the entry exists after every write)."""
    maps = mem.maps()
    maps.apply(config(V4, v6()))
    vid, _ = maps.ids("chat6")
    assert _named6(mem, vid) == ("2001:2:0:ff::1", 80, 6)
    assert int(mem.tables[abi.MAP_SVC_CFG][vid].vip_addr) == 0
    v4id, _ = maps.ids("chat")
    assert _named6(mem, v4id) is None  # an IPv4 service names its VIP in vip_addr only
    maps.apply(config(V4, v6(vip="2001:2:0:ff::2", port=443)))
    assert _named6(mem, vid) == ("2001:2:0:ff::2", 443, 6)
    maps.apply(config(V4))
    assert _named6(mem, vid) is None
