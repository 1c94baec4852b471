"""Wire signals in plain terms: the data path's cumulative per-backend histograms
(edge_wire, maps.WireStats) turned into windows, quantiles and freshness.

A window is the difference of two cumulative snapshots; quantiles are read from its
log2 buckets (bucket i = [2^i, 2^(i+1)) microseconds, bucket 0 from 0, the last one
open-ended) by linear interpolation inside the bucket, as Prometheus'
histogram_quantile does. A backend's signal is fresh while its window holds at least
min_samples handshakes. Pure: no I/O, no clock reads (times come in as CLOCK_MONOTONIC
ns), no kernel; edged reads the maps and feeds Windows. Windows works on a service's
backends at once, as rows of int64 (numpy; ROW_LEN columns, see row()): edged reads a
few thousand backends a second, too many for a tuple per bucket.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Optional, Sequence

import numpy as np

from controlplane.abi import WIRE_BUCKETS

if TYPE_CHECKING:
    from controlplane.maps.records import WireStats

_NS_PER_MS = 1_000_000

# One backend's cumulative counts as a row (the same fields as WireStats, in its order).
HANDSHAKE = slice(0, WIRE_BUCKETS)
FIRST_BYTE = slice(WIRE_BUCKETS, 2 * WIRE_BUCKETS)
HANDSHAKE_NS, FIRST_BYTE_NS, OPENED, CLOSED = range(2 * WIRE_BUCKETS, 2 * WIRE_BUCKETS + 4)
ROW_LEN = 2 * WIRE_BUCKETS + 4


def bucket_bounds_s(i: int) -> tuple[float, float]:
    """[low, high) of bucket i in seconds; the last bucket's high is infinite."""
    low = 0.0 if i == 0 else 2.0**i / 1e6
    high = float("inf") if i >= WIRE_BUCKETS - 1 else 2.0 ** (i + 1) / 1e6
    return low, high


def upper_bounds_s() -> list[float]:
    """The finite upper bound of every bucket but the last, in seconds (Prometheus' le)."""
    return [bucket_bounds_s(i)[1] for i in range(WIRE_BUCKETS - 1)]


_LOW_S = np.array([bucket_bounds_s(i)[0] for i in range(WIRE_BUCKETS)])
_HIGH_S = np.array([bucket_bounds_s(i)[1] for i in range(WIRE_BUCKETS)])


def row(s: WireStats) -> np.ndarray:
    """s as a row (int64, ROW_LEN columns)."""
    out = np.zeros(ROW_LEN, np.int64)
    out[HANDSHAKE], out[FIRST_BYTE] = s.handshake, s.first_byte
    out[[HANDSHAKE_NS, FIRST_BYTE_NS, OPENED, CLOSED]] = s.handshake_ns, s.first_byte_ns, s.opened, s.closed
    return out


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


def quantiles(buckets: np.ndarray, q: float) -> np.ndarray:
    """quantile() of every row of buckets (int64, one histogram a row) at once, with the same
    arithmetic in the same order, so the same floats; NaN for a row without samples."""
    n = buckets.sum(axis=1)
    cum = buckets.cumsum(axis=1)
    rank = q * n.astype(np.float64)
    at = ((buckets > 0) & (cum >= rank[:, None])).argmax(axis=1)
    rows = np.arange(len(buckets))
    count = buckets[rows, at]
    seen = cum[rows, at] - count
    low, high = _LOW_S[at], _HIGH_S[at]
    with np.errstate(invalid="ignore", divide="ignore"):
        inside = low + (high - low) * np.maximum(0.0, rank - seen) / count
    out = np.where(np.isinf(high), low, inside)
    out[n <= 0] = np.nan
    return out


def difference(new: WireStats, old: WireStats) -> WireStats:
    """What happened between two cumulative snapshots; new itself when the counts went
    back (the map was made again: a redeploy)."""
    cls = type(new)
    values: dict[str, Any] = {}
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
        window_s=window_s,
        handshakes=hs,
        first_bytes=fb,
        handshake_p50_s=quantile(window.handshake, 0.5),
        handshake_p99_s=quantile(window.handshake, 0.99),
        first_byte_p50_s=quantile(window.first_byte, 0.5),
        first_byte_p99_s=quantile(window.first_byte, 0.99),
        active=active,
        fresh=hs >= min_samples,
    )


def summary(s: Optional[Signal]) -> dict:
    """A Signal as status shows it (JSON-able); an absent one as all None."""
    keys = (
        "window_s",
        "handshakes",
        "first_bytes",
        "handshake_p50_s",
        "handshake_p99_s",
        "first_byte_p50_s",
        "first_byte_p99_s",
        "active",
        "fresh",
    )
    return {k: getattr(s, k) if s is not None else None for k in keys}


def _window(newest: np.ndarray, oldest: np.ndarray) -> np.ndarray:
    """Rows newest minus oldest; newest alone where a count went back (the map was made
    again), as difference() does for one key."""
    d = newest - oldest
    back = (d < 0).any(axis=1)
    d[back] = newest[back]
    return d


def _signals(keys: Sequence, newest: np.ndarray, d: np.ndarray, window_s: Sequence[float], min_samples: int) -> dict:
    """Key -> Signal of window rows d, as signal(difference(new, old), ...) gives for one key."""
    hs, fb = d[:, HANDSHAKE], d[:, FIRST_BYTE]
    hs_n, fb_n = hs.sum(axis=1).tolist(), fb.sum(axis=1).tolist()
    qs = [[None if math.isnan(x) else x for x in quantiles(h, q).tolist()] for h in (hs, fb) for q in (0.5, 0.99)]
    active = np.maximum(0, newest[:, OPENED] - newest[:, CLOSED]).tolist()
    return {
        key: Signal(
            window_s=window_s[i],
            handshakes=hs_n[i],
            first_bytes=fb_n[i],
            handshake_p50_s=qs[0][i],
            handshake_p99_s=qs[1][i],
            first_byte_p50_s=qs[2][i],
            first_byte_p99_s=qs[3][i],
            active=active[i],
            fresh=hs_n[i] >= min_samples,
        )
        for i, key in enumerate(keys)
    }


@dataclass
class Windows:
    """Cumulative snapshots per key (a backend) over the last window_ns, and their signals.
    Per key, observe() keeps the newest snapshot taken at or before the window's start and
    everything after it, so the window's counts are newest minus oldest. A key seen for the
    first time (or again, after an observe() without it) starts a history of its own."""

    window_ns: int
    min_samples: int
    _keys: list = field(default_factory=list)  # the row order of every snapshot
    _snaps: deque = field(default_factory=deque)  # (number, time ns, rows), oldest first
    _first: dict = field(default_factory=dict)  # key -> number of its oldest snapshot in the window
    _count: int = 0
    _cache: Optional[tuple] = None  # _windows() of the last observe()
    _signals: Optional[dict] = None  # signals() of the last observe()

    def observe(self, now_ns: int, stats: Mapping[Hashable, WireStats]) -> None:
        """Snapshots taken now; keys absent from stats are forgotten."""
        rows = np.array([row(s) for s in stats.values()], np.int64).reshape(len(stats), ROW_LEN)
        self.observe_rows(now_ns, list(stats), rows)

    def observe_rows(self, now_ns: int, keys: Sequence[Hashable], rows: np.ndarray) -> None:
        """Snapshots taken now: rows[i] (see row()) is keys[i]'s; keys absent are forgotten."""
        keys = list(keys)
        if keys != self._keys:
            self._realign(keys)
        number = self._count
        self._count += 1
        self._cache = self._signals = None
        self._snaps.append((number, now_ns, np.array(rows, np.int64)))
        start = now_ns - self.window_ns
        moved = {}
        for first in set(self._first.values()):  # the keys' histories: few (one unless keys came and went)
            moved[first] = self._trimmed(first, start)
        for key, first in self._first.items():
            self._first[key] = moved[first]
        oldest = min(self._first.values(), default=number)
        while self._snaps[0][0] < oldest:
            self._snaps.popleft()

    def _trimmed(self, first: int, start: int) -> int:
        """The oldest snapshot a history starting at `first` keeps: the newest at or before
        start, if a later one exists."""
        at = first
        for i, (n, _t, _) in enumerate(self._snaps):
            if n < first:
                continue
            if i + 1 < len(self._snaps) and self._snaps[i + 1][1] <= start:
                at = self._snaps[i + 1][0]
            else:
                break
        return at

    def _realign(self, keys: list) -> None:
        """Snapshots re-ordered to keys: a key no longer there is forgotten, a new one starts
        with the next snapshot (its rows before it are zeros that no window reads)."""
        old = {key: i for i, key in enumerate(self._keys)}
        take = [old.get(key, -1) for key in keys]
        for j, (n, t, rows) in enumerate(self._snaps):
            moved = np.zeros((len(keys), ROW_LEN), np.int64)
            for i, src in enumerate(take):
                if src >= 0:
                    moved[i] = rows[src]
            self._snaps[j] = (n, t, moved)
        self._first = {key: self._first[key] if key in self._first else self._count for key in keys}
        self._keys = keys

    def _windows(self) -> tuple[np.ndarray, np.ndarray, list[float]]:
        """(newest rows, window rows, window_s per key) as of the last observe(); cached."""
        if self._cache is not None:
            return self._cache
        _, t1, newest = self._snaps[-1]
        by_number = {n: (t, rows) for n, t, rows in self._snaps}
        histories: dict[int, list[int]] = {}  # oldest snapshot -> the rows of the keys it starts
        for i, key in enumerate(self._keys):
            histories.setdefault(self._first[key], []).append(i)
        oldest = np.empty_like(newest)
        window_s = [0.0] * len(self._keys)
        for first, at in histories.items():
            t0, rows = by_number[first]
            oldest[at] = rows[at]
            for i in at:
                window_s[i] = (t1 - t0) / 1e9
        self._cache = (newest, _window(newest, oldest), window_s)
        return self._cache

    def signals(self) -> dict[Hashable, Signal]:
        """Key -> its signal over the window (newest minus oldest snapshot); the same dict
        until the next observe() or a change of min_samples: do not change it."""
        if not self._snaps:
            return {}
        if self._signals is None:
            newest, d, window_s = self._windows()
            self._signals = _signals(self._keys, newest, d, window_s, self.min_samples)
        return self._signals

    def fresh_p50s(self) -> dict[Hashable, float]:
        """Key -> its handshake p50 (s), for the keys whose signal is fresh: what signals()
        says of them, for a fraction of its work (edged asks after every read)."""
        if not self._snaps:
            return {}
        _, d, _ = self._windows()
        hs = d[:, HANDSHAKE]
        fresh = np.flatnonzero(hs.sum(axis=1) >= self.min_samples)
        p50s = quantiles(hs[fresh], 0.5).tolist()
        return {self._keys[i]: p50 for i, p50 in zip(fresh.tolist(), p50s)}

    def reconfigure(self, window_ns: int, min_samples: int) -> None:
        if min_samples != self.min_samples:
            self._signals = None
        self.window_ns, self.min_samples = window_ns, min_samples


def fresh_keys(signals: Mapping[Hashable, Signal]) -> set:
    """The keys whose signal is fresh."""
    return {k for k, s in signals.items() if s.fresh}
