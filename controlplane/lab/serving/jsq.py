"""The bound of tools/bench-serving: the same requests and faults on a model of the same fleet,
dispatched by an ideal join-the-shortest-queue that sees every server's state exactly and at once.
Pure discrete-event simulation of the simulator's engine (controlplane/lab/inference/engine.py):
max_running slots, a FIFO queue, ttft then one token per tpot; a throttled server's tokens come
tpot_factor times slower; a hung server produces nothing and admits nothing until it resumes.
No network, no HTTP: what is left of the peers' latency above this is the cost of their choices.
"""

from __future__ import annotations

import collections
import heapq
import random
from dataclasses import dataclass, field
from typing import Callable

from controlplane.lab.serving.accounting import Outcome
from controlplane.lab.serving.workload import Fault, Req, ServerClass


@dataclass
class _Server:
    name: str
    c: ServerClass
    hangs: list[tuple[float, float]] = field(default_factory=list)  # [start, end) of each hang
    slows: list[tuple[float, float, float]] = field(default_factory=list)  # [start, end), tpot factor
    running: int = 0
    queue: collections.deque = field(default_factory=collections.deque)

    def hung_until(self, t: float) -> float:
        """The end of the hang t falls in, or t."""
        return next((end for start, end in self.hangs if start <= t < end), t)

    def _rate(self, t: float, tokens: bool) -> tuple[float, float]:
        """(progress per second at t, when that rate next changes)."""
        edges = [x for a, b in self.hangs for x in (a, b) if x > t]
        edges += [x for a, b, _ in self.slows for x in (a, b) if x > t] if tokens else []
        nxt = min(edges, default=float("inf"))
        if any(a <= t < b for a, b in self.hangs):
            return 0.0, nxt
        if tokens:
            factor = next((f for a, b, f in self.slows if a <= t < b), 1.0)
            return 1.0 / factor, nxt
        return 1.0, nxt

    def advance(self, t: float, work_s: float, tokens: bool) -> float:
        """When work_s of nominal time started at t is done, through hangs (and throttles, for tokens)."""
        while work_s > 1e-12:
            rate, nxt = self._rate(t, tokens)
            if rate > 0 and t + work_s / rate <= nxt:
                return t + work_s / rate
            work_s -= rate * (nxt - t)
            t = nxt
        return t

    def load(self, t: float) -> float:
        """Outstanding work per slot; a hung server is infinitely loaded (the oracle knows)."""
        if self.hung_until(t) > t:
            return float("inf")
        return (self.running + len(self.queue) + 1) / self.c.max_running


def servers(fleet: tuple[ServerClass, ...], faults: tuple[Fault, ...], t0: float = 0.0) -> list[_Server]:
    out = [_Server(f"b{i}", c) for i, c in enumerate(fleet)]
    for f in faults:
        span = (t0 + f.at_s, t0 + f.at_s + f.for_s)
        if f.knobs.get("hang"):
            out[f.server].hangs.append(span)
        if "tpot_factor" in f.knobs:
            out[f.server].slows.append((*span, float(f.knobs["tpot_factor"])))
    return out


def _speed(s: _Server, t: float) -> float:
    """Requests a second s completes with every slot busy at t, as an oracle knows it: 0 while hung."""
    if s.hung_until(t) > t:
        return 0.0
    factor = next((f for a, b, f in s.slows if a <= t < b), 1.0)
    return s.c.max_running / (s.c.ttft_ms + s.c.tpot_ms * factor)


def simulate(
    reqs: list[Req],
    fleet: tuple[ServerClass, ...],
    faults: tuple[Fault, ...] = (),
    choice: str | Callable[[list[_Server], float, random.Random], int] = "jsq",
    seed: int = 1,
) -> list[Outcome]:
    """Every request's outcome under a dispatcher that sees the fleet exactly and at once:
    jsq     ideal join-the-shortest-queue by outstanding work per slot, a hung server never
            (ties: the server with the smaller tpot, then the lower index): the bound;
    leastconn   the fewest outstanding requests, blind to slots, speed and hangs (HAProxy's view);
    weighted    a random server with probability in proportion to its capacity now (slots over
            its current tpot; 0 while hung): the best a weighted split without queue feedback does;
    or a callable (servers, t, rng) -> index (policymodel.py: weights as edged computes them)."""
    if not callable(choice) and choice not in ("jsq", "leastconn", "weighted"):
        raise ValueError(f"choice: {choice!r} is not jsq, leastconn or weighted")
    rng = random.Random(seed)
    srv = servers(fleet, faults)
    events: list[tuple[float, int, int, object]] = []  # (time, order, server, request or None: a resume)
    seq = 0
    for k, s in enumerate(srv):
        for _, end in s.hangs:
            events.append((end, seq, k, None))
            seq += 1
    heapq.heapify(events)
    out: dict[int, Outcome] = {}

    def start(k: int, r: Req, t: float) -> None:
        nonlocal seq
        s = srv[k]
        s.running += 1
        first = s.advance(t, s.c.ttft_ms / 1000, tokens=False)
        end = s.advance(first, (r.max_tokens - 1) * s.c.tpot_ms / 1000, tokens=True)
        out[r.i] = Outcome(r.i, first - r.t_s, end - r.t_s, r.max_tokens, s.name)
        heapq.heappush(events, (end, seq, k, r))
        seq += 1

    def admit(k: int, t: float) -> None:
        s = srv[k]
        while s.queue and s.running < s.c.max_running and s.hung_until(t) <= t:
            start(k, s.queue.popleft(), t)

    pending = collections.deque(sorted(reqs, key=lambda r: r.t_s))
    while pending or events:
        if pending and (not events or pending[0].t_s < events[0][0]):
            r = pending.popleft()
            k = choice(srv, r.t_s, rng) if callable(choice) else _choose(srv, r.t_s, choice, rng)
            srv[k].queue.append(r)
            admit(k, r.t_s)
            continue
        t, _, k, r = heapq.heappop(events)
        if r is not None:
            srv[k].running -= 1
        admit(k, t)
    return [out[r.i] for r in reqs]


def _choose(srv: list[_Server], t: float, choice: str, rng: random.Random) -> int:
    if choice == "leastconn":
        return min(range(len(srv)), key=lambda j: (srv[j].running + len(srv[j].queue), j))
    if choice == "weighted":
        speeds = [_speed(s, t) for s in srv]
        return rng.choices(range(len(srv)), weights=speeds)[0]
    return min(range(len(srv)), key=lambda j: (srv[j].load(t), srv[j].c.tpot_ms, j))
