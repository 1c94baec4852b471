"""Wire signals in plain terms: the data path's cumulative per-backend histograms
(edge_wire, maps.WireStats) turned into windows, quantiles and freshness.

A window is the difference of two cumulative snapshots; quantiles are read from its
log2 buckets (bucket i = [2^i, 2^(i+1)) microseconds, bucket 0 from 0, the last one
open-ended) by linear interpolation inside the bucket, as Prometheus'
histogram_quantile does. A backend's signal is fresh while its window holds at least
min_samples handshakes. Pure: no I/O, no clock reads (times come in as CLOCK_MONOTONIC
ns), no kernel; edged reads the maps and feeds Windows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Hashable, Mapping, Optional, Sequence

from controlplane.abi import WIRE_BUCKETS

if TYPE_CHECKING:
    from controlplane.maps.records import WireStats

_NS_PER_MS = 1_000_000


def bucket_bounds_s(i: int) -> tuple[float, float]:
    """[low, high) of bucket i in seconds; the last bucket's high is infinite."""
    low = 0.0 if i == 0 else 2.0 ** i / 1e6
    high = float("inf") if i >= WIRE_BUCKETS - 1 else 2.0 ** (i + 1) / 1e6
    return low, high


def upper_bounds_s() -> list[float]:
    """The finite upper bound of every bucket but the last, in seconds (Prometheus' le)."""
    return [bucket_bounds_s(i)[1] for i in range(WIRE_BUCKETS - 1)]


def quantile(buckets: Sequence[int], q: float) -> Optional[float]:
    """The q-quantile (0..1) of a log2 histogram in seconds, interpolated linearly inside
    its bucket; the open-ended last bucket gives its lower bound. None without samples."""
    n = sum(buckets)
    if n <= 0:
        return None
    rank = q * n
    seen = 0
    for i, count in enumerate(buckets):
        if count > 0 and seen + count >= rank:
            low, high = bucket_bounds_s(i)
            if high == float("inf"):
                return low
            return low + (high - low) * max(0.0, rank - seen) / count
        seen += count
    return bucket_bounds_s(len(buckets) - 1)[0]


def difference(new: WireStats, old: WireStats) -> WireStats:
    """What happened between two cumulative snapshots; new itself when the counts went
    back (the map was made again: a redeploy)."""
    cls = type(new)
    values = {}
    for f in fields(new):
        a, b = getattr(new, f.name), getattr(old, f.name)
        if isinstance(a, tuple):
            d = tuple(x - y for x, y in zip(a, b))
            if any(x < 0 for x in d):
                return new
        else:
            d = a - b
            if d < 0:
                return new
        values[f.name] = d
    return cls(**values)


@dataclass(frozen=True)
class Signal:
    """One backend's wire signals over a window."""

    window_s: float  # the time the window covers (shorter while edged has just started)
    handshakes: int  # handshake samples in the window
    first_bytes: int
    handshake_p50_s: Optional[float]
    handshake_p99_s: Optional[float]
    first_byte_p50_s: Optional[float]
    first_byte_p99_s: Optional[float]
    active: int  # connections open now (cumulative opened - closed)
    fresh: bool  # handshakes >= min_samples: the weight policy may use handshake_p50_s


def signal(window: WireStats, window_s: float, active: int, min_samples: int) -> Signal:
    """The signals of one window's counts."""
    hs, fb = sum(window.handshake), sum(window.first_byte)
    return Signal(
        window_s=window_s, handshakes=hs, first_bytes=fb,
        handshake_p50_s=quantile(window.handshake, 0.5), handshake_p99_s=quantile(window.handshake, 0.99),
        first_byte_p50_s=quantile(window.first_byte, 0.5), first_byte_p99_s=quantile(window.first_byte, 0.99),
        active=active, fresh=hs >= min_samples,
    )


def summary(s: Optional[Signal]) -> dict:
    """A Signal as status shows it (JSON-able); an absent one as all None."""
    keys = ("window_s", "handshakes", "first_bytes", "handshake_p50_s", "handshake_p99_s", "first_byte_p50_s",
            "first_byte_p99_s", "active", "fresh")
    return {k: getattr(s, k) if s is not None else None for k in keys}


@dataclass
class Windows:
    """Cumulative snapshots per key (a backend) over the last window_ns, and their signals.
    observe() keeps, per key, the newest snapshot taken at or before the window's start
    and everything after it, so the window's counts are newest minus oldest."""

    window_ns: int
    min_samples: int
    _seen: dict[Hashable, deque] = field(default_factory=dict)

    def observe(self, now_ns: int, stats: Mapping[Hashable, WireStats]) -> None:
        """Snapshots taken now; keys absent from stats are forgotten."""
        for key in set(self._seen) - set(stats):
            del self._seen[key]
        start = now_ns - self.window_ns
        for key, s in stats.items():
            q = self._seen.setdefault(key, deque())
            q.append((now_ns, s))
            while len(q) > 1 and q[1][0] <= start:
                q.popleft()

    def signals(self) -> dict[Hashable, Signal]:
        """Key -> its signal over the window (newest minus oldest snapshot)."""
        out = {}
        for key, q in self._seen.items():
            (t0, old), (t1, new) = q[0], q[-1]
            window = difference(new, old) if len(q) > 1 else type(new)()
            out[key] = signal(window, (t1 - t0) / 1e9, new.active, self.min_samples)
        return out

    def reconfigure(self, window_ns: int, min_samples: int) -> None:
        self.window_ns, self.min_samples = window_ns, min_samples


def fresh_keys(signals: Mapping[Hashable, Signal]) -> set:
    """The keys whose signal is fresh."""
    return {k for k, s in signals.items() if s.fresh}

