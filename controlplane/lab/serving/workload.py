"""The benchmark's fleet, its capacity from the simulator's parameters, and the workload: open-loop
Poisson arrivals with a burst phase, long-tailed prompt and output lengths, and the fault plan
(a thermal throttle, an engine hang). Pure and seeded: the same load level gives every peer the
same requests at the same times.

Lengths. Prompt and output token counts are lognormal with sigma 1.0 (a long right tail: the mean
is 1.65x the median) around the means the vLLM paper (Kwon et al., SOSP 2023, Fig. 11) reports for
ShareGPT: 161 prompt and 338 output tokens. Like vLLM's ShareGPT benchmark, a request over 1,024
prompt or 2,048 total tokens is clipped. Then both are scaled by LENGTH_SCALE (1/10) so that a
small machine can stream them in Python; the shape, not the size, is what the balancers see.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field, replace

SHAREGPT_PROMPT_MEAN = 161.0
SHAREGPT_OUTPUT_MEAN = 338.0
SIGMA = 1.0
PROMPT_CLIP, TOTAL_CLIP = 1024, 2048
LENGTH_SCALE = 0.1


@dataclass(frozen=True)
class ServerClass:
    name: str
    ttft_ms: float
    tpot_ms: float
    max_running: int


FAST = ServerClass("fast", ttft_ms=50.0, tpot_ms=25.0, max_running=4)
SLOW = ServerClass("slow", ttft_ms=100.0, tpot_ms=50.0, max_running=2)  # an older GPU: 2x tpot, half the slots
NOMINAL_FLEET = (FAST,) * 6 + (SLOW,) * 2  # b0..b5 fast, b6 and b7 slow
FLEET = NOMINAL_FLEET  # as run: set_clock() slows it


def set_clock(k: float) -> tuple[ServerClass, ...]:
    """Slow the simulated fleet's clock by k: every ttft and tpot x k, so capacity_rps() (and with
    it every schedule()'s arrival rate) / k. Queues in requests, and the balancers' choices, are
    those of the nominal fleet; the simulators stream k times fewer tokens a second, so their own
    CPU and the host's jitter weigh k times less against a token's time. Returns the new FLEET."""
    global FLEET
    if not k > 0:
        raise ValueError(f"clock: {k} is not > 0")
    FLEET = tuple(replace(c, ttft_ms=c.ttft_ms * k, tpot_ms=c.tpot_ms * k) for c in NOMINAL_FLEET)
    return FLEET


def _mu(mean: float) -> float:
    """The lognormal's mu for this mean at SIGMA."""
    return math.log(mean) - SIGMA**2 / 2


def _length(u: float, mean: float, clip: int) -> int:
    """The length at quantile u (0 < u < 1), clipped and scaled; at least 1 token."""
    raw = math.exp(_mu(mean) + SIGMA * statistics.NormalDist().inv_cdf(u))
    return max(1, round(min(raw, clip) * LENGTH_SCALE))


def draw_lengths(rng: random.Random) -> tuple[int, int]:
    """(prompt tokens, output tokens) of one request."""
    prompt = _length(rng.random() or 0.5, SHAREGPT_PROMPT_MEAN, PROMPT_CLIP)
    out_clip = TOTAL_CLIP - min(PROMPT_CLIP, round(prompt / LENGTH_SCALE))
    return prompt, _length(rng.random() or 0.5, SHAREGPT_OUTPUT_MEAN, out_clip)


def mean_output_tokens(points: int = 20000) -> float:
    """E[output tokens] of draw_lengths, by the quantiles (the prompt clip ignored: it bites
    only above 1,024 prompt tokens, under 0.1 % of requests)."""
    return sum(_length((k + 0.5) / points, SHAREGPT_OUTPUT_MEAN, TOTAL_CLIP) for k in range(points)) / points


def service_s(c: ServerClass, out_tokens: float) -> float:
    """Time one request holds a slot: ttft, then one token per tpot after the first."""
    return (c.ttft_ms + max(out_tokens - 1, 0) * c.tpot_ms) / 1000


def capacity_rps(fleet: tuple[ServerClass, ...] | None = None, out_tokens: float | None = None) -> float:
    """Requests per second the fleet (default FLEET, as set_clock() left it) completes when every
    slot is always busy: sum over servers of max_running / service time of the mean request."""
    out = mean_output_tokens() if out_tokens is None else out_tokens
    return sum(c.max_running / service_s(c, out) for c in (FLEET if fleet is None else fleet))


@dataclass(frozen=True)
class Phase:
    """Arrivals at rate x factor in [start_s, end_s)."""

    start_s: float
    end_s: float
    factor: float


@dataclass(frozen=True)
class Fault:
    """A knob set on one server at at_s and reset at at_s + for_s (POST /sim/degrade)."""

    server: int
    at_s: float
    for_s: float
    knobs: dict = field(hash=False)
    reset: dict = field(hash=False)


@dataclass(frozen=True)
class Plan:
    """One run's timeline: duration, the burst, the faults."""

    duration_s: float
    burst: Phase
    faults: tuple[Fault, ...]


def plan(short: bool = False) -> Plan:
    """The run's timeline. Full: 32 s; b1 throttled (tpot x3) 6..26 s, b2 hung 10..20 s, a burst
    at twice the rate 27..30 s. Short: 6 s with the same events, compressed."""
    if short:
        return Plan(
            6.0,
            Phase(4.5, 5.5, 2.0),
            (
                Fault(1, 1.0, 3.0, {"tpot_factor": 3.0}, {"tpot_factor": 1.0}),
                Fault(2, 2.0, 1.5, {"hang": True}, {"hang": False}),
            ),
        )
    return Plan(
        32.0,
        Phase(27.0, 30.0, 2.0),
        (
            Fault(1, 6.0, 20.0, {"tpot_factor": 3.0}, {"tpot_factor": 1.0}),
            Fault(2, 10.0, 10.0, {"hang": True}, {"hang": False}),
        ),
    )


@dataclass(frozen=True)
class Req:
    i: int
    t_s: float  # offset from the run's start
    prompt_tokens: int
    max_tokens: int


def arrivals(rate: float, p: Plan, rng: random.Random) -> list[float]:
    """Open-loop Poisson arrival times over p.duration_s at rate, p.burst.factor x rate in the
    burst (a piecewise-constant rate: each gap is drawn at the rate of the time it starts from,
    and a gap that crosses a phase boundary is redrawn from the boundary, which memorylessness allows)."""
    if rate <= 0:
        raise ValueError(f"rate: {rate} is not > 0")
    out, t = [], 0.0
    edges = sorted({p.burst.start_s, p.burst.end_s, p.duration_s})
    while t < p.duration_s:
        r = rate * (p.burst.factor if p.burst.start_s <= t < p.burst.end_s else 1.0)
        nxt = t + rng.expovariate(r)
        edge = next((e for e in edges if e > t), p.duration_s)
        if nxt >= edge:
            t = edge
            continue
        out.append(nxt)
        t = nxt
    return out


def schedule(load: float, p: Plan, seed: int = 1, capacity: float | None = None) -> list[Req]:
    """The requests of one load level (a fraction of capacity_rps()), seeded by seed and load."""
    cap = capacity_rps() if capacity is None else capacity
    rng = random.Random(f"{seed}:{load}")
    times = arrivals(load * cap, p, rng)
    return [Req(i, t, *draw_lengths(rng)) for i, t in enumerate(times)]
