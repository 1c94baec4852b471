"""controlplane.samples: the Window's RTTs and the quantiles status reads from it, against
their plain definitions over the window's samples."""

from __future__ import annotations

import gc

from hypothesis import given, strategies as st

from controlplane.samples import Sample, Window, quantile, quantiles

samples = st.builds(
    Sample, t_ns=st.integers(0, 10**12), ok=st.booleans(), rtt_s=st.none() | st.floats(0, 1, allow_nan=False)
)
steps = st.lists(st.one_of(samples, st.integers(1, 12)), max_size=60)  # a sample to add, or a size


@given(steps, st.integers(1, 12))
def test_the_windows_rtts_are_those_of_its_samples_that_passed(ops, size):
    w = Window(size)
    for op in ops:
        if isinstance(op, Sample):
            w.add(op)
        else:
            w.resize(op)
        assert len(w.samples) <= w.size
        assert w.rtts() == [s.rtt_s for s in w.samples if s.ok and s.rtt_s is not None]
        assert (w.p50(), w.p99()) == quantiles(w.rtts(), 0.50, 0.99)


@given(st.lists(st.floats(0, 1, allow_nan=False), max_size=30))
def test_quantiles_from_one_sort_are_each_quantile(values):
    assert quantiles(values, 0.5, 0.99, 0.0, 1.0) == tuple(quantile(values, q) for q in (0.5, 0.99, 0.0, 1.0))
    assert quantiles([], 0.5) == (None,)


def test_a_window_gives_back_its_samples_and_keeps_rows_the_collector_untracks():
    """What a window returns is what it was given (equal Samples, newest last); it keeps each as a
    tuple of atoms, which the collector stops tracking at the first collection (a Sample kept was
    walked by every young collection: tens of thousands at 10,000 backends)."""
    given_ = [Sample(1, True, 0.01), Sample(2, False, None, "refused"), Sample(3, True, 0.02, None, True)]
    w = Window(2)
    for s in given_:
        w.add(s)
    assert w.samples == given_[1:] and w.last() == given_[-1] and w.kept() == 2
    newest = w.newest()
    assert w.newest() is newest  # the same row until another sample comes (status's quantile cache)
    gc.collect()
    assert not gc.is_tracked(newest)
