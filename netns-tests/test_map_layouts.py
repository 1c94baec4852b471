"""The pinned maps opened without bcc (controlplane/pinned.py, bpfmap.py, typed by
maps/layouts.py) against bcc's view of the same pins: every key and value type has bcc's
fields, offsets, sizes and kinds, and every entry of a deployed instance reads the same
through both. What edged and `edgectl status` read rests on this."""

from __future__ import annotations

import ctypes as ct

import numpy as np

from controlplane import abi, deploy, loader
from controlplane.maps import ProbeStatus, layouts


def shape(t: type):
    """A ctypes type as plain data: fields with offsets and sizes, arrays by length, scalars by code."""
    if issubclass(t, ct.Structure):
        return [(name, getattr(t, name).offset, getattr(t, name).size, shape(ft)) for name, ft, *_ in t._fields_]
    if issubclass(t, ct.Array):
        return ("array", t._length_, shape(t._type_))
    return (t._type_, ct.sizeof(t))


def test_the_layouts_are_bccs_and_read_the_same_entries(net, router):
    router.deploy([router.service("web")])
    pin_path = router.pin_path
    bcc = loader.compile_datapath(pin_path, loader.pinned_params(pin_path), text=loader.maps_text())
    ours = loader.open_pinned(pin_path)
    try:
        theirs, mine = bcc.tables(), ours.tables()
        for name in abi.MAP_NAMES:
            t, m = theirs[name], mine[name]
            assert shape(m.Key) == shape(t.Key), name
            assert shape(m.Leaf) == shape(t.Leaf), name
            if layouts.layouts()[name].percpu:
                assert shape(m.sLeaf) == shape(t.sLeaf), name
            if name == abi.MAP_TAILS:
                continue  # a program array reads back program ids only through bcc's own lookup rules
            if name in (abi.MAP_CT, abi.MAP_HALF_OPEN, abi.MAP_DIRECT, abi.MAP_MAGLEV):
                assert len(m) == len(t), name  # walks of what traffic or size make large
                continue
            assert {bytes(k): bytes(v) for k, v in m.items()} == {bytes(k): bytes(v) for k, v in t.items()}, name
            if m.array:  # read whole in batches (status's walk: maps/rows.py), the same entries
                assert bytes(m.rows(chunk=100)) == b"".join(bytes(v) for _, v in t.items()), name
        maps = deploy.open_maps(ours)  # status's walk over arrays read in batches, and entry by entry
        try:
            assert maps.snapshot() == maps._snapshot()
            wire = mine[abi.MAP_WIRE]  # distinct counts in every backend's every CPU's signals
            words = ct.sizeof(wire.Leaf) // 8
            for bid in range(len(wire)):
                wire[wire.Key(bid)] = wire.Leaf.from_buffer_copy(
                    np.arange(bid * words, (bid + 1) * words, dtype=np.uint64).tobytes()
                )
            records = [(bid, ProbeStatus(updated_ns=bid + 1, config_weight=bid, state=f"s{bid}")) for bid in (4, 2, 9)]
            maps.write_statuses(records)  # one batched write
            assert [maps.read_status(bid) for bid, _ in records] == [r for _, r in records]
            for bids in ([3, 1, 2, 0, 7], [5, 9, 6], list(range(40)), [0, len(wire) - 1]):  # ranged or not
                one_by_one = np.vstack([maps.wire_rows([b]) for b in bids])
                assert (maps.wire_rows(bids) == one_by_one).all() and one_by_one.any(), bids
        finally:
            maps.close()
        node = mine[abi.MAP_NODE][0]
        assert node.max_backends == loader.pinned_params(pin_path).max_backends and node.n_return >= 1
        backends = [v for _, v in mine[abi.MAP_BACKENDS].items() if v.flags & abi.BE_F_VALID]
        assert len(backends) == len(router.service("web")["backends"])
    finally:
        ours.close()
        bcc.close()
