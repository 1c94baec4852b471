"""The probe budget (pure): how many probes a second the prober may start, and how far every
schedule's interval stretches when the targets ask for more. Every check is stretched by the
same factor, so every target is still probed, each at its interval times the stretch, and the
probes of all targets together start at about the budget. The engine (probe.engine) applies the
stretch; edged reports it (status, the edge_probe_* metrics, the probe-budget event). The budget is
node.probe_budget, lowered while the prober takes more than half of edged's loop (adapt) and
raised again when it takes less. No I/O.

    b = plan(demand([100_000_000] * 10_000), budget_per_s=5000)   # 10,000 targets every 100 ms
    b.stretch == 20.0, b.shortfall == 0.95, b.interval_ms(100) == 2000.0
    budget = adapt(budget, 10_000, b.run_per_s, share)   # once a second: share of the loop the prober took
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# node.probe_budget by default: about what one core does when nothing else wants it
# (tools/bench-probe --scale: 1,000 backends at 10 Hz took 46 % of a core under today's main,
# about 50 us a tcp probe with its steering), so the default 1,000 backends every 100 ms are
# probed at their rate on a quiet core. 0 in the config: no budget and no adaptation.
DEFAULT_BUDGET_PER_S = 10_000
# Below node.probe_budget the budget follows the loop (adapt): the prober may take about
# SHARE_TARGET of the wall time of its loop (its timer and epoll callbacks, the steering
# they call included; in edged the prober's own loop in its child process, with the results' handling
# on edged's loop counted in: probe.child), so the API, status
# and the steering steps find the interpreter free half the time whatever a probe costs here: a
# slower or busier core (other processes preempt the callbacks too) lowers the budget, a quiet
# one raises it back to the key. Once a
# second, by at most DOWN or UP; never below FLOOR_PER_S (health probing goes on, stretched).
# The loop's lateness alone would not do: on a busy machine the timers fire late however few
# probes run (measured: 20-30 ms at load 10 on 2 cores with the loop mostly idle).
SHARE_TARGET = 0.5
DOWN = 0.7
UP = 1.15
FLOOR_PER_S = 200.0
# A shortfall is reported from the first probe the budget holds back, and reported over once
# the demand falls below this share of the budget: a demand that hovers at the budget (targets
# relaxed and hurried as traffic comes and goes) does not start and stop the report each second.
CLEAR_BELOW = 0.9


@dataclass(frozen=True)
class Budget:
    """The prober's budget and what it does: budget_per_s 0 is no budget (stretch 1)."""

    budget_per_s: float  # the budget now: node.probe_budget, or less while the loop has no room (adapt)
    demand_per_s: float  # the probes a second the targets' intervals ask for (relaxed ones at theirs)
    stretch: float  # every interval is multiplied by this; >= 1
    cap_per_s: float = 0.0  # node.probe_budget

    @property
    def limited_by_loop(self) -> bool:
        """The budget is below node.probe_budget: the loop had no room for more (adapt)."""
        return 0 < self.budget_per_s < self.cap_per_s

    @property
    def shortfall(self) -> float:
        """The share of the asked-for probes that are not run: 0 when the budget suffices."""
        return 1.0 - 1.0 / self.stretch

    @property
    def short(self) -> bool:
        return self.stretch > 1.0

    @property
    def run_per_s(self) -> float:
        """The probes a second started under the budget (about; the wheel rounds times up)."""
        return self.demand_per_s / self.stretch

    def interval_ms(self, configured_ms: float) -> float:
        """A configured interval as it is run under the budget."""
        return configured_ms * self.stretch


NO_BUDGET = Budget(0.0, 0.0, 1.0, 0.0)


def demand(intervals_ns: Iterable[int]) -> float:
    """Probes a second that schedules of these intervals (ns) ask for together."""
    return sum(1e9 / i for i in intervals_ns if i > 0)


def plan(demand_per_s: float, budget_per_s: float, cap_per_s: float | None = None) -> Budget:
    """The stretch that brings demand_per_s down to budget_per_s (never below 1: a budget never
    probes faster than configured); budget_per_s <= 0 is no budget."""
    if demand_per_s < 0:
        raise ValueError(f"demand {demand_per_s} probes/s")
    cap = float(budget_per_s if cap_per_s is None else cap_per_s)
    if budget_per_s <= 0:
        return Budget(0.0, demand_per_s, 1.0, cap)
    return Budget(float(budget_per_s), demand_per_s, max(1.0, demand_per_s / budget_per_s), cap)


def adapt(budget_per_s: float, cap_per_s: float, run_per_s: float, share: float) -> float:
    """The next budget from this one, the configured cap (node.probe_budget; 0: none, no
    adaptation), the probes a second run over the last period and the share of that period's
    wall time the prober's callbacks took: the rate that would take SHARE_TARGET, moved to by at
    most DOWN or UP of the rate run now."""
    if cap_per_s <= 0:
        return 0.0
    base = min(budget_per_s, run_per_s) if run_per_s > 0 else budget_per_s
    want = base * SHARE_TARGET / share if share > 0 else float(cap_per_s)
    new = min(max(want, base * DOWN), max(base, budget_per_s) * UP)
    return min(float(cap_per_s), max(min(float(cap_per_s), FLOOR_PER_S), new))


def still_short(was_short: bool, b: Budget) -> bool:
    """Whether the shortfall is to be reported now: from the first probe held back (b.short)
    until the demand is below CLEAR_BELOW of the budget."""
    if b.short:
        return True
    return was_short and b.budget_per_s > 0 and b.demand_per_s >= CLEAR_BELOW * b.budget_per_s
