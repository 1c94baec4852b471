"""controlplane.wiresignals on rows: Windows keeps a service's backends as rows of int64 and computes
their signals at once. These tests hold it to the per-backend rule it replaced (a deque of
WireStats per key, signal(difference(newest, oldest))), float for float. Pure: no root."""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings, strategies as st

from controlplane import abi, wiresignals
from controlplane.maps.records import WireStats

MS = 1_000_000
N = abi.WIRE_BUCKETS


class PerKeyWindows:
    """The rule as written per key before rows: the reference."""

    def __init__(self, window_ns: int, min_samples: int):
        self.window_ns, self.min_samples = window_ns, min_samples
        self.seen: dict = {}

    def observe(self, now_ns, stats):
        for key in set(self.seen) - set(stats):
            del self.seen[key]
        start = now_ns - self.window_ns
        for key, s in stats.items():
            q = self.seen.setdefault(key, deque())
            q.append((now_ns, s))
            while len(q) > 1 and q[1][0] <= start:
                q.popleft()

    def signals(self):
        out = {}
        for key, q in self.seen.items():
            (t0, old), (t1, new) = q[0], q[-1]
            window = wiresignals.difference(new, old) if len(q) > 1 else WireStats()
            out[key] = wiresignals.signal(window, (t1 - t0) / 1e9, new.active, self.min_samples)
        return out


histogram = st.lists(st.integers(0, 50), min_size=N, max_size=N)


@given(st.lists(histogram, min_size=1, max_size=20), st.sampled_from([0.0, 0.01, 0.5, 0.99, 1.0]))
def test_quantiles_of_rows_are_the_quantile_of_each_row(rows, q):
    got = wiresignals.quantiles(np.array(rows, np.int64), q).tolist()
    want = [wiresignals.quantile(r, q) for r in rows]
    assert [None if x != x else x for x in got] == want


def test_a_row_is_the_record_field_by_field():
    s = WireStats(handshake=tuple(range(N)), first_byte=(7,) * N, handshake_ns=5, first_byte_ns=6, opened=9, closed=2)
    r = wiresignals.row(s)
    assert r.shape == (wiresignals.ROW_LEN,) and list(r[wiresignals.HANDSHAKE]) == list(range(N))
    assert list(r[wiresignals.FIRST_BYTE]) == [7] * N
    assert (
        r[wiresignals.HANDSHAKE_NS],
        r[wiresignals.FIRST_BYTE_NS],
        r[wiresignals.OPENED],
        r[wiresignals.CLOSED],
    ) == (5, 6, 9, 2)


# one step: ms since the last, then per key present (in this order): counts added to three
# buckets, connections opened and closed, and whether the map was made again (counts restart)
key_step = st.tuples(
    st.sampled_from(["b0", "b1", "b2", "b3"]),
    st.lists(st.integers(0, 4), min_size=3, max_size=3),
    st.integers(0, 5),
    st.integers(0, 5),
    st.booleans(),
)
step = st.tuples(
    st.sampled_from([0, 100, 250, 999, 1000, 1001, 2500]),
    st.lists(key_step, max_size=5),
    st.sampled_from([None, None, None, 500, 1000, 3000]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=1, max_size=25), st.integers(1, 6))
def test_windows_on_rows_give_every_key_the_per_key_rule_signal(steps, min_samples):
    rows, per_key = wiresignals.Windows(1000 * MS, min_samples), PerKeyWindows(1000 * MS, min_samples)
    cumulative: dict[str, WireStats] = {}
    now = 0
    for dt_ms, keys, window_ms in steps:
        now += dt_ms * MS
        if window_ms is not None:
            rows.signals()  # cached: a new min_samples must not find the old answer
            min_samples = min_samples % 6 + 1
            rows.reconfigure(window_ms * MS, min_samples)
            per_key.window_ns, per_key.min_samples = window_ms * MS, min_samples
        stats = {}
        for key, adds, opened, closed, restart in keys:
            if key in stats:
                continue
            old = WireStats() if restart else cumulative.get(key, WireStats())
            hs = list(old.handshake)
            fb = list(old.first_byte)
            hs[3] += adds[0]
            hs[N - 1] += adds[1]
            fb[10] += adds[2]
            stats[key] = cumulative[key] = WireStats(
                handshake=tuple(hs),
                first_byte=tuple(fb),
                handshake_ns=old.handshake_ns + 1000 * adds[0],
                opened=old.opened + opened,
                closed=old.closed + closed,
            )
        rows.observe(now, stats)
        per_key.observe(now, stats)
        want = per_key.signals()
        assert rows.fresh_p50s() == {k: s.handshake_p50_s for k, s in want.items() if s.fresh}
        assert rows.signals() == want
