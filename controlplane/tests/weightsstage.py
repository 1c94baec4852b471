"""The weight policy tests' stage (test_weights_*.py): a service of given backends (service),
probe samples fed into a Tracker (probes, steady), the times and configs they share, and
hypothesis' setting for them (quick).
"""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Optional

from hypothesis import settings

from controlplane.config import Backend, Health, MetricsScrape, Probe, Service, Weights
from controlplane.samples import Sample
from controlplane.weights import Tracker, observe_sample

MS = 1_000_000  # ns
T0 = 10**12  # an arbitrary monotonic start, far from 0
PROBE = Probe(interval_ms=100, timeout_ms=50, fall=3, rise=2)
METRICS = MetricsScrape(interval_ms=100, stale_ms=2000)

quick = settings(max_examples=60, deadline=None)


def service(
    backends,
    weights: Optional[Weights] = None,
    probe: Optional[Probe] = PROBE,
    metrics: Optional[MetricsScrape] = None,
) -> Service:
    """backends: (name, weight) or (name, weight, standby) tuples."""
    bs = tuple(
        Backend(
            name=b[0],
            address=IPv4Address(f"198.18.{i + 1}.2"),
            port=8000,
            weight=b[1],
            standby=b[2] if len(b) > 2 else False,
        )
        for i, b in enumerate(backends)
    )
    return Service(
        name="chat",
        vip=IPv4Address("198.18.255.1"),
        port=8000,
        health=Health(probe=probe, metrics=metrics),
        weights=weights or Weights(policy="latency_inverse", rtt_offset_ms=0),
        backends=bs,
    )


def probes(tr: Tracker, w: Weights, rtts, start_ns: int, probe: Probe = PROBE, step_ns: int = 100 * MS) -> int:
    """Feed one sample per entry (None = a failed probe), step_ns apart; returns the next time."""
    t = start_ns
    for rtt in rtts:
        s = Sample(t_ns=t, ok=False, error="timeout after 0.05s") if rtt is None else Sample(t_ns=t, ok=True, rtt_s=rtt)
        observe_sample(tr, s, w, probe)
        t += step_ns
    return t


def steady(w: Weights, rtt: float, n: int = 5, start_ns: int = T0) -> Tracker:
    tr = Tracker()
    probes(tr, w, [rtt] * n, start_ns)
    return tr
