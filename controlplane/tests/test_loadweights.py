"""Load against capacity (controlplane/loadweights.py) and how latency_inverse weighs it: the per-slot
speed from the progress counter and capacity shares."""

from __future__ import annotations

import pytest

from controlplane import abi, loadweights as lw, weights as wp
from controlplane.config import Weights
from controlplane.samples import Load
from controlplane.tests.test_weights_policy import scrape
from controlplane.tests.weightsstage import METRICS, MS, T0, service, steady

S = 1000 * MS


def busy(tr: wp.Tracker, w: Weights, t0: int, seconds: float, slots: int, per_slot: float, waiting=0.0, step=100 * MS):
    """Scrapes every step for seconds of an engine with slots running, each making per_slot tokens/s."""
    t, progress = t0, 0.0 if tr.load is None else tr.load.progress or 0.0
    while t <= t0 + seconds * S:
        scrape(tr, w, t, waiting=waiting, running=slots, progress=progress)
        t += step
        progress += slots * per_slot * step / S
    return t


def test_speed_is_the_progress_rate_per_running_request_and_idle_or_reset_teach_nothing():
    sp = lw.Speed()
    prev = Load(t_ns=T0, ok=True, running=4, progress=1000)
    lw.observe(sp, prev, Load(t_ns=T0 + 100 * MS, ok=True, running=4, progress=1016))
    assert sp.per_slot == pytest.approx(40.0)  # 16 tokens in 0.1 s over 4 running
    before = sp.per_slot
    lw.observe(sp, Load(t_ns=T0, ok=True, running=0, progress=0), Load(t_ns=T0 + S, ok=True, running=0, progress=0))
    lw.observe(sp, Load(t_ns=T0, ok=True, running=4, progress=50), Load(t_ns=T0 + S, ok=True, running=4, progress=3))
    lw.observe(sp, Load(t_ns=T0, ok=True, running=4), Load(t_ns=T0 + S, ok=True, running=4))
    assert sp.per_slot == before
    # smoothed: one scrape interval of a third of the speed moves it by 1 - exp(-0.1) of the way
    lw.observe(sp, prev, Load(t_ns=T0 + 100 * MS, ok=True, running=4, progress=1000 + 16 / 3))
    assert 36.0 < sp.per_slot < 38.0


def test_shares_are_capacity_over_the_largest_with_unknown_ones_at_the_median():
    assert lw.shares({"fast": 160.0, "slow": 40.0, "new": None}) == {"fast": 1.0, "slow": 0.25, "new": 0.625}
    assert lw.shares({"a": None, "b": None}) == {"a": 1.0, "b": 1.0}
    assert lw.shares({"fast": 160.0, "dead": 0.0})["dead"] == lw.SHARE_MIN
    assert lw.capacity(lw.Speed(20.0), 2) == 40.0 and lw.capacity(lw.Speed(), 4) is None


def fleet_at(w: Weights, waiting_fast: float, waiting_slow: float):
    """A fast engine (4 slots, 40 tokens/s each) and a slow one (2 slots at 20 tokens/s: a quarter
    of the capacity), both full, with the queues given; the decision one scrape after."""
    svc = service([("fast", 1), ("slow", 1)], w, metrics=METRICS)
    trs = {"fast": steady(w, 0.002), "slow": steady(w, 0.002)}
    busy(trs["fast"], w, T0, 3, 4, 40.0, waiting=waiting_fast)
    end = busy(trs["slow"], w, T0, 3, 2, 20.0, waiting=waiting_slow)
    return wp.decide(svc, trs, None, end), trs


def test_a_slow_engine_gets_its_share_of_capacity_not_of_the_backends():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, slow_start_ms=0)
    # 2 waiting on 2 slots is as loaded as 4 on 4: the same queue factor, so capacity alone tells them apart
    d, trs = fleet_at(w, 4, 2)
    assert wp.load_factor(trs["fast"].load, 4) == pytest.approx(wp.load_factor(trs["slow"].load, 2))
    assert d.weights["slow"] / d.weights["fast"] == pytest.approx(0.25, rel=0.02)
    assert d.reasons["slow"].endswith("capacity x0.25") and "capacity" not in d.reasons["fast"]
    # the weights as they were (load_model queue): equal
    old, _ = fleet_at(Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, slow_start_ms=0,
                              load_model="queue"), 4, 2)  # fmt: skip
    assert old.weights["slow"] == old.weights["fast"]


def test_a_throttled_engine_loses_two_thirds_of_its_share_within_two_seconds():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1)], w, metrics=METRICS)
    trs = {"a": steady(w, 0.002), "b": steady(w, 0.002)}
    busy(trs["a"], w, T0, 5, 4, 40.0)
    busy(trs["b"], w, T0, 2, 4, 40.0)
    end = busy(trs["b"], w, T0 + 2 * S + 100 * MS, 2, 4, 40.0 / 3)  # tpot x 3 from 2 s on
    d = wp.decide(svc, trs, None, end)
    assert 0.33 < d.weights["b"] / d.weights["a"] < 0.45


def test_without_a_progress_counter_nothing_changes():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1)], w, metrics=METRICS)
    trs = {"a": steady(w, 0.002), "b": steady(w, 0.002)}
    for t in range(10):
        for n in trs:
            wp.observe_load(trs[n], Load(t_ns=T0 + t * 100 * MS, ok=True, waiting=0, running=2), w)
    d = wp.decide(svc, trs, None, T0 + S)
    assert d.weights["a"] == d.weights["b"] and trs["a"].speed.per_slot is None


def test_open_extras_weigh_open_connections_per_slot():
    """least_loaded's scales (select.h, open_cost): the largest slots get OPEN_SCALE_ONE (extra 0), half
    the slots twice that, an engine never seen busy the median's, and none beyond SHARE_MIN of the largest."""
    one = abi.OPEN_SCALE_ONE
    got = lw.open_extras({"fast": 4.0, "fast2": 4.0, "slow": 2.0, "new": 0.0, "tiny": 0.1})
    assert got["fast"] == got["fast2"] == 0
    assert got["slow"] == one  # scale 2 x ONE: its 2 open weigh as a fast one's 4
    assert got["new"] == round(one * 4 / 3) - one  # the median of the known (4, 4, 2, 0.1) is 3
    assert got["tiny"] == round(one / lw.SHARE_MIN) - one <= abi.OPEN_SCALE_MASK
    assert lw.open_extras({"a": 0.0, "b": 0.0}) == {"a": 0, "b": 0}  # nothing known: all alike


def test_open_extras_scale_as_the_model_chooses():
    """2 open on a 2-slot engine weigh more than 3 on a 4-slot one (select.h compares count x scale)."""
    one = abi.OPEN_SCALE_ONE
    x = lw.open_extras({"fast": 4.0, "slow": 2.0})
    assert 2 * (one + x["slow"]) > 3 * (one + x["fast"])
    assert 2 * (one + x["slow"]) < 5 * (one + x["fast"])
