"""Load against capacity, which latency_inverse weighs under load_model capacity (weights.py calls
these): each engine's speed per slot learned from its progress counter (Speed, observe) and the
capacity shares of a service's backends (shares). Pure: no clock reads, no I/O; times come in
as CLOCK_MONOTONIC ns.

Why. The queue factor (weights.load_factor) compares outstanding work with an engine's slots, so a
2-slot engine with 2 waiting is as loaded as a 4-slot one with 4. But a weighted split holds the
servers' queues level only if each one's share of new flows is its share of the fleet's capacity:
with the same base weight a 2-slot engine at twice the tpot (a quarter of a fast one's capacity)
got an eighth of the flows, and the queue factor pulled it back only once its queue was long.
Capacity = slots (the most requests seen running at once) x tokens a second per running request
(the progress counter's rate over the requests running while it moved), so a thermal throttle
(tpot x 3) takes a third of its share within a few scrapes, and a hung engine's falls towards 0
before weights.hung_ms calls it hung.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Optional

from controlplane import abi
from controlplane.samples import Load

SPEED_TAU_NS = 1_000_000_000  # smoothing of the per-slot speed: a throttle shows within a second or two
MIN_RUNNING = 0.5  # a stretch with fewer requests running on average teaches nothing about speed
SHARE_MIN = 0.05  # an engine's capacity share never counts below this (weights.max_ratio bounds it too)


@dataclass
class Speed:
    """One engine's tokens per second per running request, smoothed; None before it was seen busy."""

    per_slot: Optional[float] = None


def observe(sp: Speed, prev: Optional[Load], l: Load) -> None:
    """Feed one good scrape l after the previous good one prev: the progress counter's rate over
    the requests running across the two (their mean), smoothed with tau SPEED_TAU_NS. A counter
    that went back (a restart), an idle stretch or a missing counter teach nothing."""
    if prev is None or prev.progress is None or l.progress is None or not prev.ok:
        return
    dt_ns = l.t_ns - prev.t_ns
    running = ((prev.running or 0.0) + (l.running or 0.0)) / 2
    if dt_ns <= 0 or running < MIN_RUNNING or l.progress < prev.progress:
        return
    x = (l.progress - prev.progress) / (dt_ns / 1e9) / running
    if sp.per_slot is None:
        sp.per_slot = x
        return
    alpha = 1.0 - math.exp(-dt_ns / SPEED_TAU_NS)
    sp.per_slot += alpha * (x - sp.per_slot)


def capacity(sp: Speed, slots: float) -> Optional[float]:
    """Tokens a second the engine makes with every slot busy; None while its speed is unknown."""
    if sp.per_slot is None or slots <= 0:
        return None
    return max(sp.per_slot, 0.0) * slots


def shares(caps: Mapping[str, Optional[float]]) -> dict[str, float]:
    """Each backend's capacity over the largest (1 for the largest), at least SHARE_MIN. A backend
    whose capacity is unknown (never seen busy) counts the median of the known ones: a new engine
    gets a typical share, not the best's nor none. All unknown: 1 for all (weights follow base)."""
    known = [c for c in caps.values() if c is not None]
    if not known or max(known) <= 0:
        return {n: 1.0 for n in caps}
    fill = statistics.median(known)
    top = max(known)
    return {n: max(SHARE_MIN, (fill if c is None else c) / top) for n, c in caps.items()}


def open_extras(slots: Mapping[str, float]) -> dict[str, int]:
    """new_flows least_loaded's scale of each backend from its learned slots (Tracker.peak_running;
    0 = never seen busy): what edged writes in edge_inflight's third part, the scale less
    abi.OPEN_SCALE_ONE. The data path weighs a backend's open connections by OPEN_SCALE_ONE +
    this (select.h, open_cost): OPEN_SCALE_ONE x (the largest slots / its own), so the fewest
    open connections per slot wins, as an ideal join-the-shortest-queue chooses (jsq.py) and as
    blind least-connections cannot. Slots, not capacity: in the model (policymodel.least_loaded)
    the capacity share scaled too far (a 2-slot engine at twice the tpot counted as a quarter,
    its second slot idle while fast engines queued). An unknown backend counts the median of
    the known (shares), one never below SHARE_MIN of the largest."""
    sh = shares({n: (s if s > 0 else None) for n, s in slots.items()})
    return {n: min(abi.OPEN_SCALE_MASK, round(abi.OPEN_SCALE_ONE / x) - abi.OPEN_SCALE_ONE) for n, x in sh.items()}
