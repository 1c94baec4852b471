"""controlplane.maps: the wire signals record (struct wire_stats of abi.h, edge_wire) and
Maps.wire_stats() and Maps.wire_rows(), which sum it over CPUs. Unprivileged: the maps are in memory
(tests/memtables.py builds them from abi.h and maps.h)."""

from __future__ import annotations

import ctypes

from controlplane import abi, wiresignals
from controlplane.config import parse_config
from controlplane.maps.records import WireStats, unpack_wire
from controlplane.tests.memtables import MemMaps, c_struct

WIRE = c_struct("wire_stats")


def test_the_record_has_the_size_abi_h_asserts_and_the_buckets_abi_py_says():
    assert ctypes.sizeof(WIRE) == 416
    assert len(WIRE().handshake) == len(WIRE().first_byte) == abi.WIRE_BUCKETS


def test_active_flows_are_opened_minus_closed_and_never_negative():
    assert WireStats(opened=5, closed=2).active == 3
    # a connection that began before the map was made (or moved in) can close here
    assert WireStats(opened=1, closed=3).active == 0


def test_records_add_field_by_field():
    a = WireStats(handshake=(1,) + (0,) * 23, first_byte=(0,) * 23 + (2,), handshake_ns=5, opened=1)
    b = WireStats(handshake=(3,) + (0,) * 23, first_byte_ns=7, closed=1)
    total = a + b
    assert total.handshake[0] == 4 and total.first_byte[-1] == 2
    assert (total.handshake_ns, total.first_byte_ns, total.opened, total.closed) == (5, 7, 1, 1)


def cfg():
    return parse_config(
        {
            "version": 1,
            "node": {"max_backends": 8, "max_services": 2, "maglev_m": 1009},
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "backends": [
                        {"name": "b0", "address": "198.18.1.2", "port": 8000},
                        {"name": "b1", "address": "198.18.2.2", "port": 8000},
                    ],
                }
            ],
        }
    )


def test_maps_sum_every_cpu_of_every_valid_backend():
    mem = MemMaps(1009, 2, 8)
    maps = mem.maps()
    try:
        maps.apply(cfg())
        _, bids = maps.ids("chat")
        t = mem.tables[abi.MAP_WIRE]
        per_cpu = t.Leaf()
        for cpu, v in enumerate(per_cpu):
            v.handshake[3] = 2 + cpu  # 8..16 us
            v.first_byte[10] = 1
            v.handshake_ns = 10_000 * (cpu + 1)
            v.opened, v.closed = 4, cpu
        t[t.Key(bids["b1"])] = per_cpu
        got = maps.wire_stats()
        assert set(got) == set(bids.values())
        assert got[bids["b0"]] == WireStats()
        b1 = got[bids["b1"]]
        assert b1.handshake[3] == 5 and b1.first_byte[10] == 2 and b1.handshake_ns == 30_000
        assert (b1.opened, b1.closed, b1.active) == (8, 1, 7)
        assert maps.wire_stats([bids["b1"]]) == {bids["b1"]: b1}
        assert unpack_wire(per_cpu[0]).handshake[3] == 2
        rows = maps.wire_rows([bids["b1"], bids["b0"]])  # what edged's steps read
        assert rows.tolist() == [wiresignals.row(b1).tolist(), wiresignals.row(WireStats()).tolist()]
        assert maps.wire_rows([]).shape == (0, wiresignals.ROW_LEN)
    finally:
        maps.close()
        mem.close()
