"""controlplane.weights: the operator's forced weights (drains, reload removals,
overrides) against the policy: forced() and decide(..., forced=...).

Pure and unprivileged, like test_weights_policy.py, whose helpers it uses.
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from controlplane.config import Weights
from controlplane.tests.weightsstage import T0, quick, service, steady
from controlplane.weights import decide, forced

W = Weights(policy="latency_inverse", rtt_offset_ms=0, hysteresis_pct=10)
NAMES = ("b0", "b1", "b2", "b3")


def after(pushed, d):
    """What the data path holds after edged acts on decision d."""
    return dict(d.weights) if d.push else pushed


def test_forced_zeroes_drained_names_and_keeps_overrides_of_the_others():
    s = service([("b0", 100), ("b1", 100), ("b2", 100)])
    assert forced(s, ["b0", "gone"], {"b0": 7, "b1": 9, "other": 3}) == {"b0": 0, "b1": 9}


@quick
@given(data=st.data(), n=st.integers(2, 4))
def test_forced_weights_hold_after_every_decision(data, n):
    """Whatever the policy computes, the data path ends up with exactly the forced weights."""
    names = NAMES[:n]
    s = service([(name, data.draw(st.integers(1, 300))) for name in names], W)
    trackers = {name: steady(W, data.draw(st.floats(0.0005, 0.2))) for name in names}
    force = data.draw(st.dictionaries(st.sampled_from(names), st.integers(0, 65535), max_size=n))
    pushed = data.draw(st.none() | st.fixed_dictionaries({name: st.integers(0, 65535) for name in names}))
    now = pushed_now = after(pushed, decide(s, trackers, pushed, T0 + 10**9, forced=force))
    assert {name: now[name] for name in force} == force
    # the next decision, with nothing new, pushes nothing
    again = decide(s, trackers, pushed_now, T0 + 10**9, forced=force)
    assert not again.push and again.weights == pushed_now


@quick
@given(data=st.data(), n=st.integers(2, 4))
def test_forcing_one_backend_does_not_make_small_changes_of_the_others_a_push(data, n):
    """Hysteresis is judged on the backends the policy owns: with b0 forced and already
    pushed, a decision pushes only when the same decision without b0's force would."""
    names = NAMES[:n]
    s = service([(name, 100) for name in names], W)
    trackers = {name: steady(W, data.draw(st.floats(0.001, 0.1))) for name in names}
    policy = decide(s, trackers, None, T0 + 10**9).computed
    # what was pushed: the policy's weights give or take a little, b0 at its forced weight
    jitter = {name: max(1, round(w * data.draw(st.floats(0.9, 1.1)))) if w else 0 for name, w in policy.items()}
    force = {"b0": data.draw(st.integers(0, 65535))}
    pushed = {**jitter, **force}
    d = decide(s, trackers, pushed, T0 + 10**9, forced=force)
    without = decide(s, trackers, {**jitter, "b0": policy["b0"]}, T0 + 10**9)
    assert d.push == without.push
    assert d.weights["b0"] == force["b0"]


def test_a_new_override_is_a_push_even_within_the_hysteresis():
    s = service([("b0", 100), ("b1", 100)], W)
    trackers = {"b0": steady(W, 0.010), "b1": steady(W, 0.010)}
    pushed = decide(s, trackers, None, T0 + 10**9).weights
    d = decide(s, trackers, pushed, T0 + 10**9, forced={"b1": pushed["b1"] + 1})
    assert d.push and d.weights == {"b0": pushed["b0"], "b1": pushed["b1"] + 1}
    assert d.computed == pushed  # what the policy wants, for status


def test_a_drain_takes_the_backend_to_0_and_keeps_the_others_as_pushed():
    s = service([("b0", 100), ("b1", 100), ("b2", 100)], W)
    trackers = {name: steady(W, 0.010) for name in ("b0", "b1", "b2")}
    pushed = decide(s, trackers, None, T0 + 10**9).weights
    d = decide(s, trackers, pushed, T0 + 10**9, forced=forced(s, ["b1"], {}))
    assert d.push and d.weights == {**pushed, "b1": 0}
    assert d.states["b1"] == "up"  # the policy's view; edged shows the drain on top


def test_forced_names_outside_the_service_are_ignored():
    s = service([("b0", 100), ("b1", 100)], W)
    trackers = {"b0": steady(W, 0.010), "b1": steady(W, 0.010)}
    pushed = decide(s, trackers, None, T0 + 10**9).weights
    d = decide(s, trackers, pushed, T0 + 10**9, forced={"gone": 0})
    assert not d.push and d.weights == pushed
