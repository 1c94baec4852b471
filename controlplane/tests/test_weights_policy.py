"""controlplane.weights: the policy's promises as properties (order by RTT, bounds,
noise without pushes, drains, unknown load, hung engines) and worked examples
(slow start, fall/rise, fail-open, smoothing, static, hysteresis, missing data).

Pure and unprivileged; every test builds its own trackers and feeds them explicit
times in ns, so nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import math
from typing import Optional

import pytest
from hypothesis import given, strategies as st

from controlplane import weights as wp
from controlplane.config import MetricsScrape, Weights
from controlplane.samples import Load, Sample
from controlplane.tests.weightsstage import METRICS, MS, PROBE, T0, probes, quick, service, steady
from controlplane.weights import Tracker, decide, describe, observe_load, observe_sample


def scrape(tr: Tracker, w: Weights, t_ns: int, waiting=0.0, running=0.0, kv=0.1, progress=0.0, ok=True) -> None:
    if ok:
        observe_load(tr, Load(t_ns=t_ns, ok=True, waiting=waiting, running=running, kv_usage=kv, progress=progress), w)
    else:
        observe_load(tr, Load(t_ns=t_ns, ok=False, error="connection refused"), w)


def lower_bound(d: wp.Decision, w: Weights) -> int:
    return max(w.floor, math.ceil(max(d.weights.values()) / w.max_ratio))


# ---- strategies ----

rtt_st = st.floats(min_value=1e-4, max_value=0.05)  # within the probe timeout of 50 ms
names = [f"b{i}" for i in range(8)]


@st.composite
def weights_cfg(draw, policy="latency_inverse", **fixed):
    kw = dict(
        policy=policy,
        floor=draw(st.integers(1, 100)),
        max_ratio=draw(st.integers(1, 1000)),
        hysteresis_pct=draw(st.integers(0, 100)),
        smoothing=draw(st.sampled_from(["ewma", "peak_ewma"])),
        decay_ms=draw(st.integers(1, 5000)),
        load_aware=draw(st.booleans()),
        hung_ms=draw(st.integers(200, 5000)),
        slow_start_ms=draw(st.sampled_from([0, 1000, 5000])),
        steady_window=draw(st.integers(1, 40)),
        jump_pct=draw(st.sampled_from([0, 5, 20, 50, 80, 200])),
    )
    kw.update(fixed)
    return Weights(**kw)


load_st = st.builds(
    dict,
    waiting=st.floats(0, 1000),
    running=st.floats(0, 256),
    kv=st.one_of(st.none(), st.floats(0, 1)),
)


@st.composite
def history(draw, w: Weights, metrics: Optional[MetricsScrape]):
    """A tracker after an arbitrary run of probes and scrapes; returns (tracker, last time)."""
    tr = Tracker()
    t = T0
    for _ in range(draw(st.integers(0, 12))):
        t += draw(st.integers(1, 3000)) * MS
        if metrics is not None and draw(st.booleans()):
            if draw(st.integers(0, 4)) == 0:
                scrape(tr, w, t, ok=False)
            else:
                sig = draw(load_st)
                scrape(tr, w, t, sig["waiting"], sig["running"], sig["kv"], progress=float(draw(st.integers(0, 3))))
        else:
            ok = draw(st.integers(0, 3)) > 0
            s = Sample(t_ns=t, ok=True, rtt_s=draw(rtt_st)) if ok else Sample(t_ns=t, ok=False, error="refused")
            observe_sample(tr, s, w, PROBE)
    return tr, t


# ---- properties ----


@quick
@given(data=st.data(), rtts=st.lists(rtt_st, min_size=2, max_size=6), base=st.integers(1, 65535))
def test_lower_rtt_never_gets_a_lower_weight(data, rtts, base):
    w = data.draw(weights_cfg())
    metrics = data.draw(st.sampled_from([None, METRICS]))
    sig = data.draw(load_st)
    svc = service([(names[i], base) for i in range(len(rtts))], w, metrics=metrics)
    trackers = {}
    for i, rtt in enumerate(rtts):
        tr = steady(w, rtt)
        if metrics:
            scrape(tr, w, T0, sig["waiting"], sig["running"], sig["kv"])
        trackers[names[i]] = tr
    d = decide(svc, trackers, None, T0 + 1000 * MS)
    for i, ri in enumerate(rtts):
        for j, rj in enumerate(rtts):
            if ri < rj:
                assert d.weights[names[i]] >= d.weights[names[j]], (ri, rj, d)


@quick
@given(data=st.data(), n=st.integers(1, 6))
def test_weights_stay_within_bounds_for_any_inputs(data, n):
    w = data.draw(weights_cfg(floor=data.draw(st.integers(1, 65535)), max_ratio=data.draw(st.integers(1, 65535))))
    metrics = data.draw(st.sampled_from([None, METRICS]))
    bases = data.draw(st.lists(st.integers(0, 65535), min_size=n, max_size=n))
    standby = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    svc = service([(names[i], bases[i], standby[i]) for i in range(n)], w, metrics=metrics)
    trackers, end = {}, T0
    for i in range(n):
        if data.draw(st.integers(0, 5)) > 0:  # sometimes no tracker at all: a new backend
            trackers[names[i]], t = data.draw(history(w, metrics))
            end = max(end, t)
    d = decide(svc, trackers, None, end + data.draw(st.integers(0, 10_000)) * MS)

    assert d.push and d.weights == d.computed
    lo = lower_bound(d, w)
    for b in svc.backends:
        wt, state = d.weights[b.name], d.states[b.name]
        assert isinstance(wt, int) and 0 <= wt <= 65535
        if b.weight == 0:
            assert (wt, state) == (0, "draining")
        elif state == "down":
            assert wt == 0
        elif state == "hung":
            assert wt == w.floor
        elif state == "slow-start":
            assert w.floor <= wt <= 65535
        else:
            assert state in ("up", "fail-open", "unknown-load", "no-metrics"), state
            assert lo <= wt <= 65535, (lo, d)


@quick
@given(
    data=st.data(),
    rtts=st.lists(rtt_st, min_size=1, max_size=6),
    pct=st.integers(1, 100),
)
def test_noise_within_a_quarter_of_the_hysteresis_after_a_push_pushes_nothing(data, rtts, pct):
    # max_ratio <= 20 keeps every weight >= 500 (SCALE / 20), where rounding to
    # integers is small next to the threshold.
    w = data.draw(weights_cfg(hysteresis_pct=pct, max_ratio=data.draw(st.integers(1, 20)), slow_start_ms=0))
    svc = service([(names[i], 1) for i in range(len(rtts))], w)
    trackers = {names[i]: steady(w, rtt, n=3) for i, rtt in enumerate(rtts)}
    first = decide(svc, trackers, None, T0 + 300 * MS)
    assert first.push

    noise = st.floats(1 - pct / 400, 1 + pct / 400)
    t = T0 + 300 * MS
    for i, rtt in enumerate(rtts):
        probes(trackers[names[i]], w, [rtt * data.draw(noise) for _ in range(3)], t)
    later = decide(svc, trackers, first.weights, t + 300 * MS)

    assert not later.push, (first.weights, later.computed)
    assert later.weights == first.weights


@quick
@given(data=st.data(), n=st.integers(2, 5))
def test_a_drained_backend_always_gets_0(data, n):
    policy = data.draw(st.sampled_from(["static", "latency_inverse"]))
    w = data.draw(weights_cfg(policy=policy))
    metrics = data.draw(st.sampled_from([None, METRICS]))
    drained = data.draw(st.integers(0, n - 1))
    svc = service(
        [(names[i], 0 if i == drained else data.draw(st.integers(1, 100))) for i in range(n)], w, metrics=metrics
    )
    trackers, end = {}, T0
    for i in range(n):
        trackers[names[i]], t = data.draw(history(w, metrics))
        end = max(end, t)
    first = decide(svc, trackers, None, end)
    for i in range(n):  # more events, then a decision against what was pushed
        probes(trackers[names[i]], w, data.draw(st.lists(st.one_of(st.none(), rtt_st), max_size=4)), end + MS)
    later = decide(svc, trackers, first.weights, end + 1000 * MS)

    for d in (first, later):
        assert d.weights[names[drained]] == 0
        assert d.computed[names[drained]] == 0
        assert d.states[names[drained]] == "draining"


@quick
@given(
    data=st.data(),
    rtt_b=rtt_st,
    slower=st.floats(0.25, 4.0),
    floor=st.integers(1, 50),
    max_ratio=st.integers(20, 1000),
)
def test_unknown_load_lands_strictly_between_saturated_and_idle(data, rtt_b, slower, floor, max_ratio):
    # Bounds chosen so the max_ratio lift cannot meet the unknown weight: A's RTT
    # is within 4x of B's, so A's unknown weight is >= SCALE / 4 * 0.5 = 1250, and
    # the lift is at most max(50, SCALE / 20) = 500.
    w = data.draw(
        weights_cfg(
            policy="latency_inverse", floor=floor, max_ratio=max_ratio, load_aware=True, slow_start_ms=0, hung_ms=5000
        )
    )
    svc = service([("a", 1), ("b", 1)], w, metrics=METRICS)
    now = T0 + 10_000 * MS
    stale_t = now - METRICS.stale_ms * MS - data.draw(st.integers(0, 60_000)) * MS
    old = data.draw(load_st)
    failing = data.draw(st.booleans())

    def weight_of_a(how: str) -> tuple[int, str]:
        a, b = steady(w, rtt_b * slower), steady(w, rtt_b)
        scrape(b, w, now - 1 * MS)  # b is fresh and idle
        if how == "saturated":
            running = data.draw(st.floats(1, 256))
            scrape(
                a,
                w,
                now - 1 * MS,
                waiting=running * data.draw(st.floats(10, 1000)),
                running=running,
                kv=data.draw(st.floats(0.95, 1.0)),
                progress=1.0,
            )
            scrape(a, w, now, waiting=running * 10, running=running, kv=1.0, progress=2.0)
        elif how == "idle":
            scrape(a, w, now - 1 * MS)
        elif how == "stale":
            scrape(a, w, stale_t, old["waiting"], old["running"], old["kv"])
            if failing:
                scrape(a, w, now - 1 * MS, ok=False)
        d = decide(svc, {"a": a, "b": b}, None, now)
        return d.weights["a"], d.states["a"]

    saturated, _ = weight_of_a("saturated")
    idle, state_idle = weight_of_a("idle")
    stale, state_stale = weight_of_a("stale")
    never, state_never = weight_of_a("never")

    assert state_idle == "up"
    assert (state_stale, state_never) == ("unknown-load", "no-metrics")
    assert saturated < stale < idle
    assert saturated < never < idle


@quick
@given(
    data=st.data(),
    stall_ms=st.integers(0, 3000),
    waiting=st.integers(0, 64),
    running=st.integers(0, 64),
)
def test_a_hung_engine_gets_exactly_the_floor(data, stall_ms, waiting, running):
    floor = data.draw(st.one_of(st.integers(1, 10), st.integers(1, 65535)))
    w = data.draw(weights_cfg(floor=floor, hung_ms=data.draw(st.integers(200, 2000))))
    svc = service([("a", data.draw(st.integers(1, 65535))), ("b", 1)], w, metrics=METRICS)
    a, b = steady(w, data.draw(rtt_st), n=30), steady(w, data.draw(rtt_st), n=30)  # probes say up throughout
    t = T0
    scrape(a, w, t, waiting=0, running=0, progress=7.0)  # idle before: the clock starts at the first busy scrape
    first = t = t + 100 * MS
    while True:  # busy scrapes 100 ms apart until hung_ms + stall_ms have passed since the first
        scrape(a, w, t, waiting=waiting, running=running, progress=7.0)
        scrape(b, w, t, progress=float(t))
        if t - first >= (w.hung_ms + stall_ms) * MS:
            break
        t += 100 * MS
    t += 50 * MS
    d = decide(svc, {"a": a, "b": b}, None, t)

    if waiting + running > 0:
        assert (d.weights["a"], d.states["a"]) == (w.floor, "hung")
        assert d.reasons["a"].startswith(f"hung: {waiting} waiting, {running} running, no progress for")
        assert describe(a, t, METRICS)["hung"]
    else:  # nothing outstanding: an idle engine makes no progress either, and is fine
        assert d.states["a"] != "hung"


# ---- examples ----


def test_slow_start_ramps_in_quarter_steps_from_the_floor_after_rise():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, floor=10, max_ratio=20, slow_start_ms=1000)
    svc = service([("a", 1), ("b", 1)], w)
    a, b = Tracker(), Tracker()
    t = probes(a, w, [0.01, None, None, None], T0)  # fall = 3: down
    probes(b, w, [0.01] * 4, T0)
    assert decide(svc, {"a": a, "b": b}, None, t).states["a"] == "down"
    t0 = t + 100 * MS  # the second good probe (rise = 2) brings it back
    probes(a, w, [0.01] * 12, t)  # RTT back to 10 ms like b's; the failure penalty still decaying
    full = decide(svc, {"a": a, "b": b}, None, t0 + 5000 * MS).weights["a"]
    # a's smoothed RTT is still settling just after t0; compare with its own target at each time
    seen = []
    for frac in (0.0, 0.25, 0.5, 0.75):
        now = t0 + int(frac * 1000) * MS
        d = decide(svc, {"a": a, "b": b}, None, now)
        target = decide(svc, {"a": a, "b": b}, None, now + 10**12).weights["a"]  # ramp over, same RTTs
        assert d.states["a"] == "slow-start"
        assert d.weights["a"] == wp._round(10 + (target - 10) * frac)
        seen.append(d.weights["a"])
    assert seen[0] == 10 and seen == sorted(seen)
    done = decide(svc, {"a": a, "b": b}, None, t0 + 1000 * MS)
    assert done.states["a"] == "up" and done.weights["a"] == full


def test_fall_takes_a_backend_out_and_rise_brings_it_back():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1)], w)
    a, b = steady(w, 0.01), steady(w, 0.01)
    t = T0 + 500 * MS

    t = probes(a, w, [None, None], t)  # fall - 1 failures: still up
    d = decide(svc, {"a": a, "b": b}, None, t)
    assert d.states["a"] == "up" and d.weights["a"] > 0
    t = probes(a, w, [None], t)  # the third: down
    d = decide(svc, {"a": a, "b": b}, d.weights, t)
    assert (d.weights["a"], d.states["a"], d.push) == (0, "down", True)
    assert d.reasons["a"] == "3 failed probes in a row: timeout after 0.05s"
    assert describe(a, t)["health"] == "down"

    t = probes(a, w, [0.01], t)  # rise - 1 good probes: still down
    d = decide(svc, {"a": a, "b": b}, d.weights, t)
    assert d.weights["a"] == 0
    t = probes(a, w, [0.01], t)
    d = decide(svc, {"a": a, "b": b}, d.weights, t)
    assert d.states["a"] == "up" and d.weights["a"] > 0 and d.push


def test_fail_open_when_every_backend_is_down():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1), ("off", 0)], w)
    a, b = steady(w, 0.002), steady(w, 0.004)
    t = T0 + 500 * MS
    probes(a, w, [None] * 3, t)
    d = decide(svc, {"a": a, "b": b}, None, t + 300 * MS)
    assert d.states == {"a": "down", "b": "up", "off": "draining"}
    assert d.weights["a"] == 0

    probes(b, w, [None] * 3, t)
    d = decide(svc, {"a": a, "b": b}, None, t + 300 * MS)
    assert d.states == {"a": "fail-open", "b": "fail-open", "off": "draining"}
    assert d.weights["a"] > 0 and d.weights["b"] > 0 and d.weights["off"] == 0
    assert "failing open" in d.reasons["a"]
    # weights still come from the last (penalised) smoothed RTTs
    ra, rb = a.rtt_s, b.rtt_s
    assert d.weights["a"] >= d.weights["b"] if ra <= rb else d.weights["a"] <= d.weights["b"]


def test_no_fail_open_while_a_standby_is_up():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1), ("spare", 1, True)], w)
    a, b, spare = steady(w, 0.002), steady(w, 0.002), steady(w, 0.003)
    probes(a, w, [None] * 3, T0 + 500 * MS)
    probes(b, w, [None] * 3, T0 + 500 * MS)
    d = decide(svc, {"a": a, "b": b, "spare": spare}, None, T0 + 900 * MS)
    assert d.weights == {"a": 0, "b": 0, "spare": wp.SCALE}
    assert d.states == {"a": "down", "b": "down", "spare": "up"}


def test_standbys_are_weighted_like_primaries():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000)
    svc = service([("a", 1), ("spare", 1, True)], w)
    d = decide(svc, {"a": steady(w, 0.002), "spare": steady(w, 0.004)}, None, T0 + 500 * MS)
    assert d.weights == {"a": wp.SCALE, "spare": wp.SCALE // 2}


def test_one_stray_sample_is_ignored_and_a_real_change_counts_from_its_second():
    """The spike filter: with spike_filter 2, the smaller of the last 2 samples feeds the smoother."""
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, smoothing="peak_ewma", max_ratio=1000, spike_filter=2)
    a = steady(w, 0.010, n=20)
    t = probes(a, w, [0.050], T0 + 2000 * MS)  # one stray sample
    assert a.rtt_s == pytest.approx(0.010)
    t = probes(a, w, [0.010, 0.010], t)
    assert a.rtt_s == pytest.approx(0.010)
    probes(a, w, [0.050, 0.050], t)  # a real slowdown: two in a row
    assert a.rtt_s == 0.050

    every = Weights(policy="latency_inverse", rtt_offset_ms=0, smoothing="peak_ewma", spike_filter=1)
    b = steady(every, 0.010, n=20)
    probes(b, every, [0.050], T0 + 2000 * MS)  # spike_filter 1: every sample counts
    assert b.rtt_s == 0.050


@pytest.mark.parametrize("smoothing, at_once", [("peak_ewma", True), ("ewma", False)])
def test_peak_ewma_takes_a_slowdown_at_once_and_ewma_takes_several_samples(smoothing, at_once):
    # jump_pct 0: the weights follow the smoothed RTT (with a jump band they follow the window's steady RTT)
    w = Weights(
        policy="latency_inverse",
        rtt_offset_ms=0,
        smoothing=smoothing,
        decay_ms=500,
        max_ratio=1000,
        spike_filter=2,
        jump_pct=0,
    )
    svc = service([("a", 1), ("b", 1)], w)
    a, b = steady(w, 0.010, n=20), steady(w, 0.010, n=20)
    t = T0 + 2000 * MS
    probes(b, w, [0.010] * 20, t)

    t = probes(a, w, [0.050, 0.050], t)  # 5x slower from here (the second sample passes the filter)
    d = decide(svc, {"a": a, "b": b}, None, t)
    if at_once:
        assert a.rtt_s == 0.050
        assert d.weights["a"] == wp.SCALE // 5
    else:
        # alpha = 1 - exp(-100/500) = 0.18: the average moves 18% of the way
        assert a.rtt_s == pytest.approx(0.010 + 0.040 * (1 - math.exp(-0.2)))
        assert d.weights["a"] > wp.SCALE // 2
        n = 1
        while a.rtt_s < 0.045:
            t = probes(a, w, [0.050], t)
            n += 1
        assert n >= 10  # (1 - alpha)^n * 40 ms < 5 ms needs n >= 11

    # faster samples decay in with the same alpha for both, from the second one on
    t = probes(a, w, [0.010], t)
    before = a.rtt_s
    probes(a, w, [0.010], t)
    assert a.rtt_s == pytest.approx(before + (0.010 - before) * (1 - math.exp(-0.2)))


def test_the_steady_rtt_ignores_bursts_takes_a_lasting_change_and_a_jump_at_once():
    """jump_pct 80, steady_window 20: the weights follow the mean of the faster half of the
    window; a lasting change counts once it fills half of it, a jump (2x, two samples that
    agree; or a speedup) at once; two samples that disagree are no jump."""
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, steady_window=20, jump_pct=80)
    tr = steady(w, 0.010, n=20)
    t = probes(tr, w, [0.017, 0.017, 0.010], T0 + 2000 * MS)  # a burst of two at 1.7x
    assert wp.probe_rtt(tr, w) == pytest.approx(0.010)
    seen = []
    for _ in range(20):  # 1.5x from here, lasting
        t = probes(tr, w, [0.015], t)
        seen.append(wp.probe_rtt(tr, w))
    assert all(x == pytest.approx(0.010) for x in seen[:8]) and seen[-1] == pytest.approx(0.015)
    assert seen == sorted(seen)  # on its way up, never past the new RTT
    t = probes(tr, w, [0.030, 0.031], t)  # 2x: a jump at the second sample
    assert wp.probe_rtt(tr, w) == pytest.approx(0.030)
    t = probes(tr, w, [0.015], t)  # a speedup counts at its first sample
    assert wp.probe_rtt(tr, w) == pytest.approx(0.015)
    t = probes(tr, w, [0.015] * 20 + [0.030, 0.060], t)  # 2x and 4x: they disagree, no jump
    assert wp.probe_rtt(tr, w) == pytest.approx(0.015)
    off = Weights(policy="latency_inverse", rtt_offset_ms=0, jump_pct=0)
    assert wp.probe_rtt(tr, off) == tr.rtt_s  # jump_pct 0: the smoothed RTT


def test_a_failed_probe_counts_as_the_timeout():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, smoothing="peak_ewma")
    tr = steady(w, 0.001)
    probes(tr, w, [None, None], T0 + 500 * MS)
    assert tr.rtt_s == PROBE.timeout_ms / 1000 and tr.fails == 2 and not tr.down


def test_static_policy_uses_the_configured_weights_and_ignores_rtts():
    w = Weights(policy="static")
    svc = service([("a", 3), ("b", 1), ("c", 0)], w)
    a, b = steady(w, 0.001), steady(w, 0.040)  # b 40 times slower: static doesn't care
    probes(b, w, [None] * (PROBE.fall - 1), T0 + 500 * MS)  # nor about failures short of fall
    d = decide(svc, {"a": a, "b": b}, None, T0 + 1000 * MS)
    assert d.weights == {"a": 3, "b": 1, "c": 0} and d.push
    assert d.states == {"a": "static", "b": "static", "c": "draining"}
    assert not decide(svc, {"a": a, "b": b}, d.weights, T0 + 2000 * MS).push
    d2 = decide(svc, {"a": a, "b": b}, {"a": 3, "b": 2, "c": 0}, T0 + 2000 * MS)
    assert d2.push and d2.weights == {"a": 3, "b": 1, "c": 0}


def test_hysteresis_pushes_big_changes_and_crossings_of_zero_only():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, hysteresis_pct=10, max_ratio=20, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1)], w)
    trs = {"a": steady(w, 0.010), "b": steady(w, 0.010)}
    now = T0 + 1000 * MS
    assert decide(svc, trs, None, now).weights == {"a": 10000, "b": 10000}
    # threshold: 10% of the pushed weight (910 of 9100, 900 of 9000)
    assert not decide(svc, trs, {"a": 10000, "b": 9100}, now).push
    assert decide(svc, trs, {"a": 10000, "b": 9000}, now).push
    # weights near the floor: threshold is 10% of 10000 / 20 = 50, not 10% of 1
    quiet = decide(svc, trs, {"a": 10000, "b": 9960}, now)
    assert not quiet.push and quiet.weights == {"a": 10000, "b": 9960}
    # a new backend, a removed one, or a crossing of 0 always pushes
    assert decide(svc, trs, {"a": 10000}, now).push
    assert decide(svc, trs, {"a": 10000, "b": 10000, "gone": 5}, now).push
    probes(trs["b"], w, [None] * 3, now)
    d = decide(svc, trs, {"a": 10000, "b": 10000}, now + 300 * MS)
    assert d.push and d.weights["b"] == 0


def test_a_backend_without_probe_data_gets_the_median_rtt():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1), ("c", 1), ("new", 1)], w)
    trs = {"a": steady(w, 0.001), "b": steady(w, 0.002), "c": steady(w, 0.004)}
    d = decide(svc, trs, None, T0 + 1000 * MS)
    assert d.weights["new"] == d.weights["b"] == wp.SCALE // 2
    assert d.reasons["new"].startswith("no probe data: median rtt 2.00 ms")


def test_without_any_probe_data_weights_follow_the_configured_ones():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000)
    svc = service([("a", 4), ("b", 1), ("c", 2)], w, probe=None)
    d = decide(svc, {}, None, T0)
    assert d.weights == {"a": 10000, "b": 2500, "c": 5000}
    assert set(d.states.values()) == {"up"}


def test_load_scales_by_queue_and_kv_cache_and_not_before_anyone_has_metrics():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1)], w, metrics=METRICS)
    a, b = steady(w, 0.002), steady(w, 0.002)
    now = T0 + 1000 * MS
    d = decide(svc, {"a": a, "b": b}, None, now)
    assert d.weights == {"a": 10000, "b": 10000} and d.states["a"] == "no-metrics"

    scrape(a, w, now - MS, running=4)  # 4 slots seen busy at once: its capacity, learned
    scrape(a, w, now, waiting=4, running=4, kv=0.5)  # queue factor 1/(1 + 8/4)^4 = 1/81
    scrape(b, w, now, waiting=0, running=2, kv=0.9)  # full: 1/(1 + 2/2)^4 = 1/16; kv 1 - 0.9 * 0.5 = 0.55
    d = decide(svc, {"a": a, "b": b}, None, now)
    assert d.weights == {"a": 123, "b": 344}
    assert d.reasons["a"] == "rtt 2.00 ms, 4 waiting, 4 running, kv 50%: load x0.01"
    info = describe(a, now, METRICS)
    assert info["load_state"] == "fresh" and info["waiting"] == 4 and info["load_factor"] == pytest.approx(1 / 81)
    scrape(a, w, now + MS, waiting=0, running=1, kv=0.5)  # one of its 4 slots busy: 1/(1 + 1/4)^4
    assert describe(a, now + MS, METRICS)["load_factor"] == pytest.approx(0.4096)

    d = decide(svc, {"a": a, "b": b}, None, now + 1 * MS + METRICS.stale_ms * MS)
    assert d.states == {"a": "unknown-load", "b": "unknown-load"}
    assert d.weights == {"a": 5000, "b": 5000}


def test_a_hung_engine_that_makes_progress_again_ramps_up():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, floor=3, hung_ms=1000, slow_start_ms=1000, max_ratio=1000)
    svc = service([("a", 1), ("b", 1)], w, metrics=METRICS)
    a, b = steady(w, 0.002, n=40), steady(w, 0.002, n=40)
    t = T0
    for _ in range(12):  # 1.1 s of 8 waiting and no progress
        scrape(a, w, t, waiting=8, running=2, progress=100.0)
        scrape(b, w, t, progress=100.0)
        t += 100 * MS
    d = decide(svc, {"a": a, "b": b}, None, t)
    assert (d.weights["a"], d.states["a"]) == (3, "hung")
    assert d.reasons["a"] == "hung: 8 waiting, 2 running, no progress for 1.1 s"

    scrape(a, w, t, waiting=0, running=0, progress=150.0)  # it caught up: idle
    d = decide(svc, {"a": a, "b": b}, d.weights, t)
    assert (d.weights["a"], d.states["a"]) == (3, "slow-start")
    d = decide(svc, {"a": a, "b": b}, d.weights, t + 500 * MS)
    assert d.states["a"] == "slow-start" and d.weights["a"] == wp._round(3 + (10000 - 3) * 0.5)
    d = decide(svc, {"a": a, "b": b}, d.weights, t + 1000 * MS)
    assert d.states["a"] == "up" and d.weights["a"] == 10000


def test_a_busy_engine_after_an_idle_spell_is_not_hung_at_once():
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, hung_ms=1000)
    tr = steady(w, 0.002)
    scrape(tr, w, T0, waiting=0, running=0, progress=5.0)
    scrape(tr, w, T0 + 900 * MS, waiting=0, running=0, progress=5.0)
    scrape(tr, w, T0 + 1000 * MS, waiting=3, running=1, progress=5.0)  # work just arrived
    assert not tr.hung
    scrape(tr, w, T0 + 2000 * MS, waiting=3, running=1, progress=5.0)
    assert tr.hung


def test_rtt_offset_makes_sub_millisecond_jitter_small_against_real_differences():
    """rtt_offset_ms is added to every smoothed RTT: 1 ms and 3 ms weigh as 2:4, not 1:3, and a
    0.3 ms wobble of the 1 ms backend moves the other's weight by half as much as without it."""
    w = Weights(policy="latency_inverse", rtt_offset_ms=1, max_ratio=1000)
    svc = service([("a", 1), ("b", 1)], w)
    t = T0 + 500 * MS
    d = decide(svc, {"a": steady(w, 0.001), "b": steady(w, 0.003)}, None, t)
    assert d.weights == {"a": wp.SCALE, "b": wp.SCALE // 2}
    wobble = decide(svc, {"a": steady(w, 0.0013), "b": steady(w, 0.003)}, None, t)
    with_offset = abs(wobble.weights["b"] - d.weights["b"]) / d.weights["b"]
    without = Weights(policy="latency_inverse", rtt_offset_ms=0, max_ratio=1000)
    svc0 = service([("a", 1), ("b", 1)], without)
    d0 = decide(svc0, {"a": steady(without, 0.001), "b": steady(without, 0.003)}, None, t)
    w0 = decide(svc0, {"a": steady(without, 0.0013), "b": steady(without, 0.003)}, None, t)
    unsoftened = abs(w0.weights["b"] - d0.weights["b"]) / d0.weights["b"]
    assert with_offset == pytest.approx(0.15, abs=0.01) and unsoftened == pytest.approx(0.30, abs=0.01)


def test_a_standby_takes_over_when_every_primary_is_hung():
    """Two primaries hung, a standby up: the hung ones get 0 (the data path then serves from the
    standby); with one primary still serving, a hung one keeps the floor and the standby waits."""
    w = Weights(policy="latency_inverse", rtt_offset_ms=0, floor=3, hung_ms=500, slow_start_ms=0)
    svc = service([("a", 1), ("b", 1), ("spare", 1, True)], w, metrics=METRICS)
    trs = {name: steady(w, 0.002, n=10) for name in ("a", "b", "spare")}
    t = T0
    for _ in range(10):  # 1 s of scrapes: a and b busy without progress, the spare idle
        for name in ("a", "b"):
            scrape(trs[name], w, t, waiting=4, running=2, progress=5.0)
        scrape(trs["spare"], w, t, progress=0.0)
        t += 100 * MS
    d = decide(svc, trs, None, t)
    assert d.states == {"a": "hung", "b": "hung", "spare": "up"}, d.reasons
    assert d.weights["a"] == d.weights["b"] == 0 and d.weights["spare"] > 0
    assert d.reasons["a"].endswith("the standby serves")

    scrape(trs["b"], w, t, waiting=4, running=2, progress=50.0)  # b makes progress again
    d = decide(svc, trs, None, t + 10 * MS)
    assert d.states["a"] == "hung" and d.weights["a"] == w.floor
    assert d.states["b"] != "hung" and d.weights["b"] > w.floor
