"""The probe budget: the pure plan (probe.budget) and the prober under it (probe.engine on
loopback): every target still probed, all at the same stretched interval, the shortfall
reported once when it starts and once when it ends."""

from __future__ import annotations

import asyncio
import time

import pytest

from controlplane.config import MetricsScrape, Probe
from controlplane.probe import Prober, Target, budget as budgets
from controlplane.tests.proberstage import LOOPBACK, Recorder, closing, run, started, wait_for

# ------------------------------------------------------------ the plan (pure)


def test_within_the_budget_nothing_stretches():
    b = budgets.plan(budgets.demand([100_000_000] * 400), 5000)  # 4,000 probes/s
    assert (b.demand_per_s, b.stretch, b.shortfall, b.short) == (4000.0, 1.0, 0.0, False)
    assert b.run_per_s == 4000.0 and b.interval_ms(100) == 100.0


def test_over_the_budget_every_interval_stretches_by_one_factor():
    # 10,000 targets every 100 ms against 5,000 probes/s: each is probed every 200 ms, none skipped
    b = budgets.plan(budgets.demand([100_000_000] * 10_000), 5000)
    assert b.stretch == pytest.approx(20.0)
    assert b.shortfall == pytest.approx(0.95) and b.short
    assert b.run_per_s == pytest.approx(5000.0)
    assert b.interval_ms(100) == pytest.approx(2000.0)


def test_mixed_intervals_keep_their_ratios_and_the_sum_meets_the_budget():
    intervals_ms = [50] * 100 + [100] * 300 + [1000] * 600  # 2,000 + 3,000 + 600 probes/s
    b = budgets.plan(budgets.demand(ms * 1_000_000 for ms in intervals_ms), 2800)
    assert b.demand_per_s == pytest.approx(5600.0) and b.stretch == pytest.approx(2.0)
    stretched = [b.interval_ms(ms) for ms in intervals_ms]
    assert sum(1000 / ms for ms in stretched) == pytest.approx(2800.0)
    # even: every target keeps the same share of its configured rate
    assert {round(ms / s, 9) for ms, s in zip(intervals_ms, stretched)} == {0.5}


def test_no_budget_never_stretches_and_a_budget_never_speeds_up():
    assert budgets.plan(1e6, 0).stretch == 1.0
    assert budgets.plan(1e6, 0).short is False
    assert budgets.plan(10.0, 1e6).stretch == 1.0  # a budget above the demand probes as configured
    assert budgets.plan(0.0, 100).stretch == 1.0  # nothing to probe
    with pytest.raises(ValueError):
        budgets.plan(-1.0, 100)


def test_the_budget_follows_the_share_of_the_loop_the_prober_takes():
    cap = 10_000
    # the prober took 90 % of the loop running 10,000/s: down, by at most DOWN a second
    assert budgets.adapt(10_000, cap, 10_000, 0.9) == pytest.approx(7000)
    # 60 % at 7,000/s: to the rate that takes half, 7,000 * 0.5 / 0.6
    assert budgets.adapt(7000, cap, 7000, 0.6) == pytest.approx(7000 * 0.5 / 0.6)
    # 25 % at 4,000/s: up, by at most UP a second, and never past the cap
    assert budgets.adapt(4000, cap, 4000, 0.25) == pytest.approx(4600)
    assert budgets.adapt(9500, cap, 9500, 0.1) == cap
    # a settled loop: the budget that takes half stays
    assert budgets.adapt(5000, cap, 5000, 0.5) == pytest.approx(5000)
    # the probes ask for less than the budget: a busy loop lowers it from what runs, not from above
    assert budgets.adapt(10_000, cap, 2000, 1.0) == pytest.approx(1400)
    # health probing never stops; a cap below the floor holds; no budget: no adaptation
    assert budgets.adapt(250.0, cap, 250, 1.0) == budgets.FLOOR_PER_S
    assert budgets.adapt(150.0, 150, 150, 1.0) == 150
    assert budgets.adapt(5000.0, 0, 5000, 1.0) == 0
    # converges: a probe costing 100 us of loop time settles at half the loop, 5,000/s
    b = float(cap)
    for _ in range(30):
        b = budgets.adapt(b, cap, b, b * 100e-6)
    assert b == pytest.approx(5000, rel=0.01)
    limited = budgets.plan(20_000, 3430, cap_per_s=10_000)
    assert limited.limited_by_loop and limited.cap_per_s == 10_000
    assert not budgets.plan(20_000, 10_000).limited_by_loop


def test_the_report_starts_at_the_first_held_back_probe_and_ends_below_the_clear_mark():
    at = [budgets.plan(d, 1000) for d in (900, 1001, 990, 950, 899, 1000, 1000.5)]
    was, seen = False, []
    for b in at:
        was = budgets.still_short(was, b)
        seen.append(was)
    # 1001 starts it; 990 and 950 (>= 900) hold it; 899 ends it; 1000 exactly is no shortfall; 1000.5 is one
    assert seen == [False, True, True, True, False, False, True]


# ------------------------------------------------------------ the prober under a budget (loopback)


def rate_per_target(rec: Recorder, keys, since_ns: int, until_ns: int) -> list[float]:
    return [sum(since_ns <= s.t_ns < until_ns for s in rec.of(k)) / ((until_ns - since_ns) / 1e9) for k in keys]


def test_over_the_budget_every_target_is_probed_at_the_same_stretched_interval():
    async def main() -> None:
        server = await started()
        rec, reports = Recorder(), []
        # 60 targets every 20 ms ask for 3,000 probes/s; a budget of 300 stretches every interval 10x (200 ms)
        p = Prober(on_sample=rec.sample, budget_per_s=300, on_budget=reports.append)
        probe = Probe(kind="tcp", interval_ms=20, timeout_ms=20)
        keys = list(range(60))
        p.set_targets([Target(k, LOOPBACK, server.port, probe) for k in keys])
        assert p.stretch == pytest.approx(10.0) and p.short
        t0 = time.monotonic_ns()
        await asyncio.sleep(1.5)
        t1 = time.monotonic_ns()
        budget = p.budget
        await closing(p, server)

        assert [r.short for r in reports] == [True]
        assert budget.demand_per_s == pytest.approx(3000.0) and budget.shortfall == pytest.approx(0.9)
        rates = rate_per_target(rec, keys, t0, t1)
        # every target probed, each about every 200 ms (7-8 in 1.5 s): not some at 50 Hz and others never
        assert min(rates) > 0, rates
        assert max(rates) <= 6.0, rates  # 5 Hz stretched; at the configured interval it would be 50 Hz
        assert sum(rates) <= 300 * 1.2, sum(rates)

    run(main())


def test_a_budget_raised_above_the_demand_restores_the_configured_rate_and_ends_the_report():
    async def main() -> None:
        server = await started()
        rec, reports = Recorder(), []
        p = Prober(on_sample=rec.sample, budget_per_s=50, on_budget=reports.append)
        probe = Probe(kind="tcp", interval_ms=50, timeout_ms=50)
        keys = list(range(10))  # 200 probes/s asked for
        p.set_targets([Target(k, LOOPBACK, server.port, probe) for k in keys])
        assert p.stretch == pytest.approx(4.0)
        p.set_budget(1000)
        assert p.stretch == 1.0 and not p.short
        await asyncio.sleep(0.5)  # probes scheduled at the stretched interval (200 ms) come due
        t0 = time.monotonic_ns()
        await asyncio.sleep(1.0)
        t1 = time.monotonic_ns()
        await closing(p, server)

        assert [r.short for r in reports] == [True, False]
        rates = rate_per_target(rec, keys, t0, t1)
        assert min(rates) >= 12, rates  # back at about 20 Hz, the configured rate

    run(main())


def test_scrapes_count_against_the_budget_and_stretch_too():
    p = Prober(budget_per_s=100)
    probe = Probe(kind="tcp", interval_ms=100, timeout_ms=50)
    scrape = MetricsScrape(interval_ms=100, stale_ms=2000)

    async def main() -> None:
        # 20 targets: 10 probes/s and 10 scrapes/s each
        p.set_targets([Target(k, LOOPBACK, 9, probe, scrape) for k in range(20)])
        assert p.budget.demand_per_s == pytest.approx(400.0) and p.stretch == pytest.approx(4.0)
        await p.close()

    run(main())


def test_the_demand_follows_relaxed_targets():
    async def main() -> None:
        server = await started()
        p = Prober(budget_per_s=1000)
        probe = Probe(kind="tcp", interval_ms=20, timeout_ms=20, relaxed_interval_ms=200, rise=1)
        keys = list(range(10))
        p.set_targets([Target(k, LOOPBACK, server.port, probe) for k in keys])
        assert p.budget.demand_per_s == pytest.approx(500.0)
        p.relax(keys, time.monotonic_ns() + 10**10)
        await wait_for(lambda: all(p.relaxed(k) for k in keys), 3, "every target relaxed")
        p._rebudget()  # the periodic sum, now rather than within REBUDGET_S
        demand = p.budget.demand_per_s
        await closing(p, server)
        assert demand == pytest.approx(50.0)

    run(main())


def test_steps_stretch_with_the_probes_they_follow():
    """Under the budget a service's periodic step follows its stretched probes: steps at the
    configured pace would decide on results that have not come (and at thousands of backends the
    steps themselves held edged's loop); the wire's interval and the static policy's 1 s stay."""
    from controlplane.config import parse_config
    from controlplane.edged.steer import interval_s

    def service(policy: str, wire: bool) -> object:
        doc = {
            "version": 1,
            "services": [
                {
                    "name": "web",
                    "vip": "198.18.255.1",
                    "port": 80,
                    "health": {"probe": {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50}},
                    "weights": {"policy": policy, "wire": {"enabled": wire}},
                    "backends": [{"name": "b0", "address": "198.19.0.1", "port": 80}],
                }
            ],
        }
        return parse_config(doc).services[0]

    assert interval_s(service("latency_inverse", False), stretch=10.0) == pytest.approx(1.0)
    assert interval_s(service("latency_inverse", False)) == pytest.approx(0.1)
    wired = service("latency_inverse", True)
    assert interval_s(wired, stretch=10.0) == pytest.approx(wired.weights.wire.interval_ms / 1000)
    assert interval_s(service("static", False), stretch=10.0) == 1.0
