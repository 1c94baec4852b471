"""Weighted splits in the model of tools/bench-serving's fleet (jsq.py): what a Maglev split can
reach with weights computed as edged computes them (weights.load_factor's queue factor, and under
load_model capacity the capacity share, loadweights.py) from the servers' exact state, refreshed
every refresh_s (edged scrapes every 100 ms) and held in between, max_ratio's bound applied. No
network, no host noise, no lag beyond the refresh: what each weight model can do under Maglev at
best, to hold against jsq.py's leastconn and JSQ on the same requests; and new_flows least_loaded
(least_loaded): the fewest open requests, blind or per slot, as the data path chooses. Pure."""

from __future__ import annotations

import random
from typing import Callable

from controlplane import weights
from controlplane.lab.serving import jsq

MAX_RATIO = 20  # weights.max_ratio's default
MODELS = ("queue", "capacity")
SHARE_MIN = 0.05  # loadweights.SHARE_MIN


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


def capacity_shares(srv: list[jsq._Server], t: float) -> list[float]:
    """Each server's capacity share at t as an oracle knows it (the largest 1, at least
    SHARE_MIN: a hung server's 0 counts as that floor)."""
    caps = [jsq._speed(s, t) for s in srv]
    top = max(caps) or 1.0
    return [max(SHARE_MIN, c / top) for c in caps]


def slot_shares(srv: list[jsq._Server], t: float) -> list[float]:
    """Each server's slots over the largest (what edged learns: loadweights.open_extras), blind to
    speed and hangs."""
    top = max(s.c.max_running for s in srv)
    return [s.c.max_running / top for s in srv]


SHARES: dict[str, Callable[[list[jsq._Server], float], list[float]]] = {
    "none": lambda srv, t: [1.0] * len(srv),  # blind: the data path's least_loaded before slots
    "slots": slot_shares,  # what select.h's open_cost weighs by
    "capacity": capacity_shares,  # slots x speed: tried, scaled too far (loadweights.open_extras)
}


def least_loaded(
    share: str = "slots", model: str = "capacity", refresh_s: float = 0.1, lag_s: float = 0.0, plus_one: bool = False
) -> Callable:
    """The data path's new_flows least_loaded (select.h) in the model: the Maglev pick (a random
    server by model's weights, refreshed every refresh_s) against every other server; the fewest
    open requests (running + queued: what the connection counts see) divided by the server's
    share (SHARES: none, slots or capacity; (open + 1) / share with plus_one) takes the flow, a
    tie keeps the Maglev pick. The shares are those of lag_s ago, refreshed with the weights
    (edged learns capacity from its scrapes, smoothed over about a second)."""
    if share not in SHARES:
        raise ValueError(f"share: {share!r} is not one of {tuple(SHARES)}")
    held: dict = {"t": -1e9, "w": None, "s": None}

    def pick(srv: list[jsq._Server], t: float, rng: random.Random) -> int:
        if held["w"] is None or t - held["t"] >= refresh_s:
            held["t"], held["w"] = t, weigh(model, srv, t)
            held["s"] = SHARES[share](srv, max(0.0, t - lag_s))
        first = rng.choices(range(len(srv)), weights=held["w"])[0]

        def cost(j: int) -> float:
            return (srv[j].running + len(srv[j].queue) + (1 if plus_one else 0)) / held["s"][j]

        return min(range(len(srv)), key=lambda j: (cost(j), j != first))

    return pick
