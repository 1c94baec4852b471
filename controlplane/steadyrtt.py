"""The steady RTT of one backend's probes, which latency_inverse weighs (weights.py): the window
of regular probe RTTs and the mean of its faster half, jumps that restart it, the window before
a slowdown that a burst's end brings back, what confirmation probes veto, and what holds a push
of RTTs alone (held): host stalls across a service's backends, and moves within the band of the
service's probe noise. Pure: works on weights.Tracker fields, no clock, no I/O; the rules are in
weights.decide()'s docstring ("steady", "hysteresis")."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Iterable, Mapping

from controlplane import config

if TYPE_CHECKING:
    from controlplane.weights import Tracker

_NS_PER_MS = 1_000_000


def lower_median(xs: Iterable[float]) -> float:
    ordered = sorted(xs)
    return ordered[(len(ordered) - 1) // 2]


def steady(xs: Iterable[float]) -> float:
    """The mean of the faster half of xs (up to their lower median): the slow half holds
    the noise, which only ever adds delay."""
    ordered = sorted(xs)
    half = ordered[: (len(ordered) - 1) // 2 + 1]
    return sum(half) / len(half)


def jumped(tr: Tracker, w: config.Weights) -> str:
    """Whether the newest spike_filter samples (tr.recent) are a jump off tr.history: "up" when
    their lower median is more than jump_pct above the window's fastest sample while they agree
    (the slowest within sqrt(1 + jump_pct %) of it), and no confirmation probe taken since the
    oldest of them (tr.checks) came back more than that factor faster than their lower median
    (noise only adds delay: a fast second look disproves the level, a slower one is noise on
    top of it); "down" when it is sqrt(1 + jump_pct %) below the window's steady RTT, else "". Noise
    only ever adds delay, so a slowdown must clear the fastest and agree with itself, while a
    speedup is evidence already."""
    if w.jump_pct == 0 or not tr.history:
        return ""
    band = 1 + w.jump_pct / 100
    now = lower_median(tr.recent)
    root = math.sqrt(band)
    if now > min(tr.history) * band and max(tr.recent) <= now * root and all(x >= now / root for _, x in tr.checks):
        return "up"
    return "down" if now * math.sqrt(band) < steady(tr.history) else ""


def restart(tr: Tracker, jump: str, w: config.Weights) -> None:
    """Restart the steady window at a jump from the jump's samples that agree with its level
    (within sqrt(1 + jump_pct %) of their lower median; a speedup's recent samples still hold
    the slow level it left). A speedup back to the level before the last slowdown (within
    1 + jump_pct % of that window's steady RTT) ends a burst: the window before it comes back,
    so a burst the jump took for a step costs two pushes, not a settling of a fresh window
    (kept until the new level fills half the window)."""
    root = math.sqrt(1 + w.jump_pct / 100)
    now = lower_median(tr.recent)
    agree = [x for x in tr.recent if x <= now * root]
    fresh: list = []
    if jump == "up":
        tr.before = tr.before or deque(tr.history)  # a burst inside a burst: the level before both
    elif tr.before and now <= steady(tr.before) * (1 + w.jump_pct / 100):
        fresh, tr.before = list(tr.before), deque()
    tr.history.clear()
    tr.history.extend(fresh + agree)


def stalled(service: config.Service, trackers: Mapping[str, Tracker], computed: Mapping[str, int], now_ns: int) -> bool:
    """Whether the host stalls: of the two or more backends with weight whose newest regular probe
    came within two probe intervals, at least half found more than jump_pct % slower than their
    window's fastest (or the level before their last slowdown). Host noise slows every backend
    probed in the same moment; a real step slows one."""
    w, health = service.weights, service.health
    if w.jump_pct == 0 or health is None or health.probe is None:
        return False
    band, fresh_ns = 1 + w.jump_pct / 100, 2 * health.probe.interval_ms * _NS_PER_MS
    live = [
        tr
        for n, v in computed.items()
        if v > 0
        and (tr := trackers.get(n)) is not None
        and tr.history
        and tr.recent_ns
        and now_ns - tr.recent_ns[-1] <= fresh_ns
    ]
    slow = sum(1 for tr in live if tr.recent[-1] > min(tr.before or tr.history) * band)
    return len(live) >= 2 and 2 * slow >= len(live)


def slow(tr: Tracker, x: float, w: config.Weights) -> bool:
    """Whether an RTT is more than jump_pct % over the fastest of tr's window: worth a second
    look (weights.confirm_due)."""
    return bool(tr.history) and x > min(tr.history) * (1 + w.jump_pct / 100)


NOISE_K = 3.0  # a move must clear this many times the service's probe noise (noise())
NOISE_CAP = math.log(1.4)  # the band never holds a move this large: a 2x step (1.89x measured) clears it


def noise(tr: Tracker) -> float:
    """A backend's probe noise, as a log ratio: how far its window's lower median sits above its
    fastest sample (0 for a tight window; 0.18 when half the samples are 20 % over the floor)."""
    if len(tr.history) < 2:
        return 0.0
    return math.log(lower_median(tr.history) / max(min(tr.history), 1e-9))


def within_noise(
    trackers: Mapping[str, Tracker], computed: Mapping[str, int], pushed: Mapping[str, int], w: config.Weights
) -> bool:
    """Whether a change of weights is no more than the service's probe noise: every backend
    weighted both before and now moved off its pushed weight by at most NOISE_K x the largest
    noise() of the service's weighted backends (as a log ratio; a down one's timeouts are no
    noise), never more than NOISE_CAP. A window's noise is itself noisy: a backend's own would
    swing between tight and loose sample by sample, so the service's largest is the band."""
    if w.jump_pct == 0:
        return False
    moves = [abs(math.log(computed[n] / pushed[n])) for n, v in computed.items() if v > 0 and pushed.get(n, 0) > 0]
    if not moves:
        return False
    noisiest = max((noise(tr) for n, v in computed.items() if v > 0 and (tr := trackers.get(n))), default=0.0)
    return max(moves) <= min(NOISE_CAP, NOISE_K * noisiest)


def held(
    service: config.Service,
    trackers: Mapping[str, Tracker],
    computed: Mapping[str, int],
    pushed: Mapping[str, int],
    now_ns: int,
) -> bool:
    """Whether a push that only RTTs would make waits: the host stalls (stalled()) or the change is
    within the service's probe noise (within_noise())."""
    return stalled(service, trackers, computed, now_ns) or within_noise(trackers, computed, pushed, service.weights)
