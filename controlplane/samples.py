"""What the prober hands to the weight policy: one probe result (Sample), one
scrape of a backend's load signals (Load), and the window of recent samples
kept per backend. Plain data, no I/O: the prober (probe/) makes these, weights.py and
status read them.

Times are CLOCK_MONOTONIC nanoseconds (time.monotonic_ns(), the clock the data
path uses), so they compare directly with what the maps hold.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe of one backend. A failed probe is a data point, not an error:
    ok is False, rtt_s is None and error says why in a few words. Slots: a thousand a
    second live in windows for seconds, and one object each (no dict) halves what the
    garbage collector walks for them."""

    t_ns: int
    ok: bool
    rtt_s: Optional[float] = None
    error: Optional[str] = None
    extra: bool = False  # a confirmation round off the schedule (Prober.confirm), not a regular one


@dataclass(frozen=True)
class Load:
    """One scrape of a backend's metrics endpoint. ok is False when the scrape
    failed (refused, timed out, 404, unparsable); a signal the backend does not
    export is None. kv_usage is a fraction 0..1. progress is a counter that
    grows while the engine serves (generated tokens, or finished requests when
    tokens are not exported); a hung engine stops it."""

    t_ns: int
    ok: bool
    waiting: Optional[float] = None
    running: Optional[float] = None
    kv_usage: Optional[float] = None
    progress: Optional[float] = None
    error: Optional[str] = None


def quantile(values: Iterable[float], q: float) -> Optional[float]:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    return _ranked(sorted(values), q)


def quantiles(values: Iterable[float], *qs: float) -> tuple[Optional[float], ...]:
    """quantile(values, q) for each q, from one sorted copy."""
    ordered = sorted(values)
    return tuple(_ranked(ordered, q) for q in qs)


def _ranked(ordered: list, q: float) -> Optional[float]:
    if not ordered:
        return None
    rank = min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[rank]


class Window:
    """The last `size` samples of one backend, newest last."""

    def __init__(self, size: int = 10):
        if size < 1:
            raise ValueError("window size must be at least 1")
        # each sample as a plain tuple of its fields (atoms: the collector untracks such a tuple
        # at the first collection it survives, where it walks a Sample every time; at 10,000
        # backends the young collection after a status call walked the windows' Samples)
        self._rows: deque[tuple] = deque(maxlen=size)
        # each sample's RTT if it passed, else None: status reads every window once a second,
        # and a few floats are cheaper to walk than as many Samples (their fields in dicts)
        self._rtts: deque[Optional[float]] = deque(maxlen=size)

    @property
    def size(self) -> int:
        return self._rows.maxlen or 0

    @property
    def samples(self) -> list[Sample]:
        """The samples kept, oldest first (a new list of new Samples)."""
        return [Sample(*row) for row in self._rows]

    def kept(self) -> int:
        """How many samples the window holds."""
        return len(self._rows)

    def newest(self) -> Optional[tuple]:
        """The newest sample's row (the same object until another sample is added), or None."""
        return self._rows[-1] if self._rows else None

    def add(self, sample: Sample) -> None:
        self._rows.append((sample.t_ns, sample.ok, sample.rtt_s, sample.error, sample.extra))
        self._rtts.append(sample.rtt_s if sample.ok else None)

    def resize(self, size: int) -> None:
        if size != self.size:
            self._rows = deque(self._rows, maxlen=size)
            self._rtts = deque(self._rtts, maxlen=size)

    def rtts(self) -> list[float]:
        """The RTTs of the samples that passed, oldest first."""
        return [r for r in self._rtts if r is not None]

    def p50(self) -> Optional[float]:
        return quantile(self.rtts(), 0.50)

    def p99(self) -> Optional[float]:
        return quantile(self.rtts(), 0.99)

    def last(self) -> Optional[Sample]:
        return Sample(*self._rows[-1]) if self._rows else None
