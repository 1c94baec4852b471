"""Weighted splits in the model of tools/bench-serving's fleet (jsq.py): what a Maglev split can
reach with weights computed as edged computes them (weights.load_factor's queue factor, and under
load_model capacity the capacity share, loadweights.py) from the servers' exact state, refreshed
every refresh_s (edged scrapes every 100 ms) and held in between, max_ratio's bound applied. No
network, no host noise, no lag beyond the refresh: what each weight model can do under Maglev at
best, to hold against jsq.py's leastconn and JSQ on the same requests. Pure."""

from __future__ import annotations

import random
from typing import Callable

from controlplane import weights
from controlplane.lab.serving import jsq

MAX_RATIO = 20  # weights.max_ratio's default
MODELS = ("queue", "capacity")


def weigh(model: str, srv: list[jsq._Server], t: float, power: float = weights.QUEUE_POWER) -> list[float]:
    """Each server's weight under model (queue or capacity), bounded by MAX_RATIO; a hung server
    gets the floor (edged's hung state, which the oracle knows at once)."""
    if model not in MODELS:
        raise ValueError(f"model: {model!r} is not one of {MODELS}")
    caps = [jsq._speed(s, t) for s in srv]
    top = max(caps) or 1.0
    raw, hung = [], []
    for s, cap in zip(srv, caps):
        q = 1.0 / (1.0 + (s.running + len(s.queue)) / s.c.max_running) ** power
        raw.append(q * (cap / top if model == "capacity" else 1.0))
        hung.append(s.hung_until(t) > t)
    lo = max(raw) / MAX_RATIO
    return [lo if h else max(lo, r) for r, h in zip(raw, hung)]


def chooser(model: str, refresh_s: float = 0.1, power: float = weights.QUEUE_POWER) -> Callable:
    """A jsq.simulate choice: a random server by model's weights, recomputed once refresh_s has
    passed since they were last computed (held between, as a pushed Maglev table is)."""
    held: dict = {"t": -1e9, "w": None}

    def pick(srv: list[jsq._Server], t: float, rng: random.Random) -> int:
        if held["w"] is None or t - held["t"] >= refresh_s:
            held["t"], held["w"] = t, weigh(model, srv, t, power)
        return rng.choices(range(len(srv)), weights=held["w"])[0]

    return pick
