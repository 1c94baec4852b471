"""The open-connection counts (edge_inflight) and conntrack's open entries, for edged's
reconciliation (controlplane/openfix.py says why). edge_inflight holds max_backends counts the
data path adds to atomically, then max_backends fixes only user space writes (maps.h); the data
path chooses by count minus fix. Part of the maps package (the only code that knows map
layouts); Maps mixes this in."""

from __future__ import annotations

import time

from controlplane import abi

CENSUS_BATCH = 1024  # entries between deadline checks


class OpenCounts:
    """Read the counts and their fixes, count conntrack's open TCP entries, write a fix."""

    def open_fix_slot(self, bid: int) -> int:
        return bid + len(self.t[abi.MAP_INFLIGHT]) // 2  # type: ignore[attr-defined]

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
        (CLOCK_MONOTONIC) before the end."""
        found: dict[int, int] = {}
        for name, ct in ((abi.MAP_CT, lambda v: v), (abi.MAP_HALF_OPEN, lambda v: v.ct)):
            t = self.t[name]  # type: ignore[attr-defined]
            for n, k in enumerate(t, 1):
                if deadline_ns is not None and n % CENSUS_BATCH == 0 and time.monotonic_ns() > deadline_ns:
                    return found, False
                try:
                    v = ct(t[k])
                except KeyError:  # gone between the key and its value
                    continue
                if v.flags & abi.CT_F_OPEN:
                    found[v.backend_id] = found.get(v.backend_id, 0) + 1
        return found, True
