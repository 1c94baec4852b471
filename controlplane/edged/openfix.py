"""edged's reconciliation of the data path's open-connection counts with conntrack (controlplane/
openfix.py says why and how a fix moves): every OPEN_FIX_EVERY_S, while a service chooses new
flows by those counts (new_flows two_choices or least_loaded), a census of conntrack's open
entries on a worker thread (stopped after CENSUS_BUDGET_S: then nothing changes), then the fixes
written between applies, for backends whose ids the census saw unchanged. An "open-fix" event
says what moved."""

from __future__ import annotations

import asyncio
import time

from controlplane.edged.changes import off_loop
from controlplane.edged.state import State
from controlplane.errors import EdgeError
from controlplane.openfix import Reconciler

OPEN_FIX_EVERY_S = 10.0
CENSUS_BUDGET_S = 2.0


def counted_ids(state: State) -> dict[int, str]:
    """Backend id -> 'service/backend' of the services that choose by open counts."""
    out: dict[int, str] = {}
    if state.maps is None:  # closing
        return out
    for s in state.cfg.services:
        if s.new_flows != "maglev":
            _, bids = state.maps.ids(s.name)
            out.update({bid: f"{s.name}/{name}" for name, bid in bids.items()})
    return out


async def step(state: State, rec: Reconciler) -> dict[str, tuple[int, int]]:
    """One census and the fixes it agrees on: 'service/backend' -> (old fix, new fix)."""
    ids = counted_ids(state)
    if not ids:
        rec.pending.clear()
        return {}
    maps = state.maps
    assert maps is not None  # counted_ids found ids
    deadline = time.monotonic_ns() + int(CENSUS_BUDGET_S * 1e9)
    walked, complete = await off_loop(state, lambda: maps.open_in_conntrack(deadline))
    if not complete:
        return {}
    await state.maps_idle.wait()
    async with state.apply_lock:
        if counted_ids(state) != ids:  # an apply renumbered: the next census starts over
            rec.pending.clear()
            return {}
        counts = maps.open_counts(ids)
        fixes = rec.step(counts, walked)
        for bid, fix in fixes.items():
            maps.set_open_fix(bid, fix)
    return {ids[b]: (counts[b][1], f) for b, f in fixes.items()}


async def run(state: State) -> None:
    rec, failing = Reconciler(), None
    while True:
        await asyncio.sleep(OPEN_FIX_EVERY_S)
        try:
            moved = await step(state, rec)
            failing = None
        except EdgeError as e:
            failing = state.failed(f"open counts: {e}", e, failing)
            continue
        if moved:
            state.events.emit(
                "open-fix",
                "open counts held to conntrack: "
                + ", ".join(f"{k} fix {a}->{b}" for k, (a, b) in sorted(moved.items())),
                fixes={k: b for k, (a, b) in moved.items()},
            )
