"""The open-connection counts (edge_inflight) and conntrack's open entries, for edged's
reconciliation (controlplane/openfix.py says why), and least_loaded's scales. edge_inflight holds
max_backends counts the data path adds to atomically, then max_backends fixes and max_backends
scales only user space writes (maps.h); least_loaded chooses by (count minus fix) x scale. Part of the maps package (the only code that knows map
layouts); Maps mixes this in."""

from __future__ import annotations

import ctypes
import time

import numpy as np

from controlplane import abi

CENSUS_BATCH = 4096  # entries a batched read returns at most


class OpenCounts:
    """Read the counts and their fixes, count conntrack's open TCP entries, write a fix."""

    def open_fix_slot(self, bid: int) -> int:
        return bid + len(self.t[abi.MAP_INFLIGHT]) // 3  # type: ignore[attr-defined]

    def open_scale_slot(self, bid: int) -> int:
        return bid + 2 * (len(self.t[abi.MAP_INFLIGHT]) // 3)  # type: ignore[attr-defined]

    def open_scales(self, bids) -> dict[int, int]:
        """Backend id -> least_loaded's scale as the data path reads it (0: unset, counts as abi.OPEN_SCALE_ONE)."""
        t = self.t[abi.MAP_INFLIGHT]  # type: ignore[attr-defined]
        return {b: int(t[t.Key(self.open_scale_slot(b))].value) for b in bids}

    def set_open_scale(self, bid: int, scale: int) -> None:
        t = self.t[abi.MAP_INFLIGHT]  # type: ignore[attr-defined]
        t[t.Key(self.open_scale_slot(bid))] = t.Leaf(scale)

    def open_counts(self, bids) -> dict[int, tuple[int, int]]:
        """Backend id -> (the data path's count, its fix)."""
        t = self.t[abi.MAP_INFLIGHT]  # type: ignore[attr-defined]
        return {b: (int(t[t.Key(b)].value), int(t[t.Key(self.open_fix_slot(b))].value)) for b in bids}

    def set_open_fix(self, bid: int, fix: int) -> None:
        t = self.t[abi.MAP_INFLIGHT]  # type: ignore[attr-defined]
        t[t.Key(self.open_fix_slot(bid))] = t.Leaf(fix)

    def open_in_conntrack(self, deadline_ns: int | None = None) -> tuple[dict[int, int], bool]:
        """Backend id -> conntrack entries (edge_ct and edge_half_open, IPv4: the data path counts
        no other) marked open; complete: False when the walk stopped at deadline_ns
        (CLOCK_MONOTONIC) before the end. Batched reads (bpfmap.Table.value_chunks), the values
        parsed as arrays: a census of 65,536 entries took 3.8 s entry by entry on a loaded 2-core VM."""
        found: dict[int, int] = {}
        for name in (abi.MAP_CT, abi.MAP_HALF_OPEN):
            t = self.t[name]  # type: ignore[attr-defined]
            size = ctypes.sizeof(t.Leaf)
            # flow_info (abi.h) starts edge_ct's value and half_open's: backend_id u32 at 0, flags u32 at 8
            for raw, n in t.value_chunks(CENSUS_BATCH):
                words = np.frombuffer(raw, dtype=np.uint32).reshape(n, size // 4)
                bids = words[:, 0][(words[:, 2] & abi.CT_F_OPEN) != 0]
                for bid, c in zip(*np.unique(bids, return_counts=True)):
                    found[int(bid)] = found.get(int(bid), 0) + int(c)
                if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
                    return found, False
        return found, True
