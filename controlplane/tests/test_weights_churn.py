"""controlplane.weights: identical backends whose probe RTTs are noisy get no weight pushes in
steady state, while a real 2x RTT difference still moves the weights within 2 probe intervals
(issue 20's weight churn). Pure: explicit times, seeded noise, no clock."""

from __future__ import annotations

import random
from ipaddress import IPv4Address

import pytest

from controlplane.config import Backend, Health, Probe, Service, Weights
from controlplane.samples import Sample
from controlplane.weights import Tracker, decide, observe_sample

MS = 1_000_000
T0 = 10**12
PROBE = Probe(interval_ms=100, timeout_ms=50, fall=3, rise=2)
DEFAULTS = Weights(policy="latency_inverse")  # the shipped defaults: hysteresis, offset, smoothing


def service(n: int, w: Weights = DEFAULTS) -> Service:
    bs = tuple(Backend(name=f"b{i}", address=IPv4Address(f"198.18.{i + 1}.2"), port=8000, weight=1) for i in range(n))
    return Service(
        name="chat", vip=IPv4Address("198.18.255.1"), port=8000, health=Health(probe=PROBE), weights=w, backends=bs
    )


def noisy(rng: random.Random, base_s: float) -> float:
    """A probe RTT on a busy host: +-20 % jitter, and one sample in 50 a spike of 2..6x."""
    x = base_s * rng.uniform(0.8, 1.2)
    return x * rng.uniform(2, 6) if rng.random() < 0.02 else x


def run(
    svc: Service,
    base: dict[str, float],
    seconds: float,
    rng: random.Random,
    trackers=None,
    pushed=None,
    t_ns: int = T0,
    until=None,
):
    """Probe every backend each 100 ms (phases staggered), deciding after each sample as edged
    does; returns (pushes, trackers, pushed, t_ns, the time until(decision) first held or None)."""
    trackers = trackers if trackers is not None else {n: Tracker() for n in base}
    pushes, hit = 0, None
    start = t_ns
    for k in range(int(seconds * 10)):
        for j, name in enumerate(base):
            t = start + k * 100 * MS + j * 33 * MS
            observe_sample(trackers[name], Sample(t_ns=t, ok=True, rtt_s=noisy(rng, base[name])), svc.weights, PROBE)
            d = decide(svc, trackers, pushed, t)
            if d.push:
                pushes += 1
                pushed = d.weights
            if until is not None and hit is None and until(d):
                hit = t - start
    return pushes, trackers, pushed, start + int(seconds * 10) * 100 * MS, hit


WITHDRAWN = pytest.mark.xfail(
    strict=True,
    reason=(
        "issue 20's churn target is not met: the noise band that met it in this model snapped an RTT "
        "near its edge to the fastest, a jump of the weight that test_weights_policy's "
        "noise-within-a-quarter-of-the-hysteresis property found (about 1 run in 8); withdrawn until "
        "the band is continuous"
    ),
)


@WITHDRAWN
def test_identical_noisy_backends_push_at_most_once_a_minute_after_the_first():
    svc = service(3)
    base = {"b0": 0.001, "b1": 0.001, "b2": 0.001}
    pushes = []
    for seed in range(3):
        _, trackers, pushed, t, _ = run(svc, base, 5, random.Random(seed))  # warm up: the first pushes
        pushes.append(run(svc, base, 60, random.Random(seed + 100), trackers, pushed, t)[0])
    assert sum(pushes) <= 3, pushes  # three minutes of steady state


@WITHDRAWN
def test_a_real_2x_rtt_difference_moves_weights_within_two_probe_intervals():
    svc = service(3)
    base = {"b0": 0.005, "b1": 0.005, "b2": 0.005}
    for seed in range(3):
        rng = random.Random(seed)
        _, trackers, pushed, t, _ = run(svc, base, 10, rng)
        before = pushed["b0"]
        slower = {**base, "b0": 0.010}
        _, trackers, pushed, t, hit = run(
            svc,
            slower,
            2,
            rng,
            trackers,
            pushed,
            t,
            until=lambda d, before=before: d.push and d.weights["b0"] < 0.85 * before,
        )
        assert hit is not None and hit <= 200 * MS, (seed, hit)
        _, _, _, _, hit = run(
            svc,
            base,
            2,
            rng,
            trackers,
            pushed,
            t,
            until=lambda d, before=before: d.push and d.weights["b0"] > 0.95 * before,
        )
        assert hit is not None, seed
