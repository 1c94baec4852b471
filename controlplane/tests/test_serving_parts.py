"""tools/bench-serving's pure parts (controlplane/lab/serving): arrivals, lengths, capacity,
accounting and the join-the-shortest-queue bound. No root, no network."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from controlplane.lab.serving import accounting as acc, jsq, policymodel, workload as wl


def test_arrivals_are_poisson_at_the_rate_and_the_burst_doubles_it():
    p = wl.Plan(200.0, wl.Phase(100.0, 150.0, 2.0), ())
    times = wl.arrivals(20.0, p, random.Random(3))
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 200.0
    base = [t for t in times if not 100 <= t < 150]
    burst = [t for t in times if 100 <= t < 150]
    assert len(base) / 150 == pytest.approx(20, rel=0.05)
    assert len(burst) / 50 == pytest.approx(40, rel=0.07)
    gaps = [b - a for a, b in zip(base[:1000], base[1:1001])]
    assert statistics.pstdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.1)  # exponential: sd = mean
    with pytest.raises(ValueError, match="rate"):
        wl.arrivals(0, p, random.Random(1))


def test_lengths_are_long_tailed_with_sharegpt_means_scaled():
    rng = random.Random(5)
    draws = [wl.draw_lengths(rng) for _ in range(20000)]
    prompts, outs = [d[0] for d in draws], [d[1] for d in draws]
    assert min(prompts) >= 1 and min(outs) >= 1
    assert statistics.mean(outs) == pytest.approx(wl.mean_output_tokens(), rel=0.03)
    assert statistics.mean(outs) == pytest.approx(wl.SHAREGPT_OUTPUT_MEAN * wl.LENGTH_SCALE, rel=0.15)
    assert statistics.mean(outs) > 1.4 * statistics.median(outs)  # the long right tail
    assert max(outs) <= round(wl.TOTAL_CLIP * wl.LENGTH_SCALE)
    assert max(prompts) <= round(wl.PROMPT_CLIP * wl.LENGTH_SCALE)


def test_capacity_is_slots_over_service_time_summed_over_the_fleet():
    fast, slow = wl.ServerClass("f", 100, 10, 4), wl.ServerClass("s", 100, 20, 2)
    # service of a 11-token request: ttft + 10 tpot = 0.2 s (fast), 0.3 s (slow)
    assert wl.capacity_rps((fast, slow), out_tokens=11) == pytest.approx(4 / 0.2 + 2 / 0.3)
    assert wl.capacity_rps() == pytest.approx(
        sum(c.max_running / wl.service_s(c, wl.mean_output_tokens()) for c in wl.FLEET)
    )


def test_a_slowed_clock_stretches_service_times_and_spreads_the_same_requests_over_k_times_the_gaps():
    p = wl.plan()
    nominal = wl.schedule(0.8, p, seed=1)
    try:
        fleet = wl.set_clock(2.0)
        assert [c.tpot_ms for c in fleet] == [2 * c.tpot_ms for c in wl.NOMINAL_FLEET]
        assert wl.capacity_rps() == pytest.approx(wl.capacity_rps(wl.NOMINAL_FLEET) / 2)
        slowed = wl.schedule(0.8, p, seed=1)
        assert 0.4 < len(slowed) / len(nominal) < 0.6  # half the rate over the same run
    finally:
        wl.set_clock(1.0)
    assert wl.FLEET == wl.NOMINAL_FLEET and wl.schedule(0.8, p, seed=1) == nominal


def test_the_schedule_is_the_same_for_the_same_seed_and_load():
    p = wl.plan(short=True)
    assert wl.schedule(0.5, p, seed=2) == wl.schedule(0.5, p, seed=2)
    assert wl.schedule(0.5, p, seed=2) != wl.schedule(0.8, p, seed=2)


def test_percentile_is_nearest_rank_and_failed_requests_count_as_infinitely_late():
    assert acc.percentile(range(1, 101), 99) == 99
    assert acc.percentile(range(1, 101), 50) == 50
    assert math.isnan(acc.percentile([], 50))
    outcomes = [acc.Outcome(i, 0.1, 1.0, 11, "b0") for i in range(98)]
    outcomes += [acc.Outcome(98, None, None, 0, None, "refused"), acc.Outcome(99, 0.2, None, 3, "b0", "reset")]
    r = acc.row("p", 0.8, "new", outcomes, {"b0": 0.09}, None)
    assert r.failed == 2 and r.ttft_p50 == 0.1 and math.isinf(r.ttft_p99) and math.isinf(r.e2e_p99)
    assert r.goodput == pytest.approx(0.98)


def test_goodput_needs_ttft_within_the_slo_and_tpot_within_1_5x_the_servers_nominal():
    nominal = {"fast": 0.025, "slow": 0.050}
    assert acc.good(acc.Outcome(0, 0.5, 0.5 + 10 * 0.0375, 11, "fast"), nominal)
    assert not acc.good(acc.Outcome(0, 0.51, 0.6, 11, "fast"), nominal)
    assert not acc.good(acc.Outcome(0, 0.1, 0.1 + 10 * 0.038, 11, "fast"), nominal)
    assert acc.good(acc.Outcome(0, 0.1, 0.1 + 10 * 0.070, 11, "slow"), nominal)  # slow is judged by its own
    assert acc.good(acc.Outcome(0, 0.1, 0.1, 1, "fast"), nominal)  # one token: no tpot
    assert not acc.good(acc.Outcome(0, 0.1, 0.5, 11, "unknown"), nominal)


def test_goals_compare_default_steering_with_static_and_leastconn_at_80_percent():
    def r(peer, p99, goodput):
        return acc.Row(peer, 0.8, "new", 100, 0.1, p99, p99, 1, 2, goodput, 0, None)

    rows = [r("edge-default", 0.4, 0.90), r("edge-static", 1.0, 0.5), r("haproxy-leastconn", 0.38, 0.94)]
    met = {g: ok for g, ok, _ in acc.goals(rows)}
    assert met == {
        "TTFT p99 <= 0.5x static's": True,
        "TTFT p99 <= 1.1x leastconn's": True,
        "goodput within 5 % of leastconn's": True,
    }
    rows[2] = r("haproxy-leastconn", 0.3, 0.99)
    assert [ok for _, ok, _ in acc.goals(rows)] == [True, False, False]
    assert [ok for _, ok, _ in acc.goals(rows[:1])] == [None, None, None]
    assert len(acc.table(rows)) == 4


ONE = wl.ServerClass("one", ttft_ms=100, tpot_ms=10, max_running=1)


def test_jsq_on_one_slot_is_fifo_with_ttft_then_tokens():
    reqs = [wl.Req(0, 0.0, 5, 11), wl.Req(1, 0.05, 5, 11)]
    a, b = jsq.simulate(reqs, (ONE,))
    assert (a.ttft_s, a.e2e_s) == pytest.approx((0.1, 0.2))
    assert (b.ttft_s, b.e2e_s) == pytest.approx((0.25, 0.35))  # waits for a's slot: starts at 0.2


def test_jsq_sends_each_request_to_the_least_loaded_server_and_avoids_a_hung_one():
    reqs = [wl.Req(i, 0.0, 5, 11) for i in range(4)]
    outs = jsq.simulate(reqs, (ONE, ONE))
    assert sorted(o.backend for o in outs) == ["b0", "b0", "b1", "b1"]
    hang = wl.Fault(0, 0.0, 1.0, {"hang": True}, {"hang": False})
    outs = jsq.simulate([wl.Req(0, 0.5, 5, 11)], (ONE, ONE), (hang,))
    assert outs[0].backend == "b1" and outs[0].ttft_s == pytest.approx(0.1)


def test_jsq_models_a_hang_and_a_throttle_as_the_simulator_does():
    hang = wl.Fault(0, 0.15, 1.0, {"hang": True}, {"hang": False})  # hangs mid-generation
    (o,) = jsq.simulate([wl.Req(0, 0.0, 5, 11)], (ONE,), (hang,))
    assert (o.ttft_s, o.e2e_s) == pytest.approx((0.1, 1.2))
    slow = wl.Fault(0, 0.0, 10.0, {"tpot_factor": 3.0}, {"tpot_factor": 1.0})
    (o,) = jsq.simulate([wl.Req(0, 0.0, 5, 11)], (ONE,), (slow,))
    assert (o.ttft_s, o.mean_tpot_s()) == pytest.approx((0.1, 0.03))  # ttft untouched, tokens 3x


def test_jsq_keeps_a_fleet_at_half_load_within_the_slo_through_the_faults():
    p = wl.plan()
    outs = jsq.simulate(wl.schedule(0.5, p, seed=1), wl.FLEET, p.faults)
    nominal = {f"b{i}": c.tpot_ms / 1000 for i, c in enumerate(wl.FLEET)}
    r = acc.row("jsq", 0.5, "new", outs, nominal, None)
    assert r.failed == 0 and r.ttft_p50 < 2 * wl.FAST.ttft_ms / 1000
    assert r.goodput > 0.85  # the throttled and the hung server's requests miss, as they should


def test_the_models_leastconn_counts_requests_blind_to_a_hang_and_weighted_splits_by_capacity():
    hang = wl.Fault(0, 0.0, 10.0, {"hang": True}, {"hang": False})
    reqs = [wl.Req(i, 0.01 * i, 5, 11) for i in range(4)]
    outs = jsq.simulate(reqs, (ONE, ONE), (hang,), choice="leastconn")
    assert sorted(o.backend for o in outs) == ["b0", "b0", "b1", "b1"]  # two wait on the hung b0
    outs = jsq.simulate(reqs, (ONE, ONE), (hang,), choice="weighted")
    assert {o.backend for o in outs} == {"b1"}  # a hung server has no capacity
    fast, slow = wl.ServerClass("f", 10, 10, 4), wl.ServerClass("s", 20, 20, 2)  # slow: a quarter of fast's
    many = [wl.Req(i, 0.001 * i, 5, 2) for i in range(2000)]
    got = [o.backend for o in jsq.simulate(many, (fast, slow), choice="weighted", seed=3)]
    assert 0.15 < got.count("b1") / len(got) < 0.25


def test_capacity_weights_in_the_model_send_a_slow_server_its_share_where_queue_weights_overload_it():
    p = wl.plan()
    reqs = wl.schedule(0.8, p, seed=1)
    share = {}
    for model in policymodel.MODELS:
        outs = jsq.simulate(reqs, wl.FLEET, p.faults, policymodel.chooser(model), seed=1)
        share[model] = sum(o.backend in ("b6", "b7") for o in outs) / len(outs)
    capacity = sum(c.max_running / wl.service_s(c, 30) for c in wl.FLEET[6:]) / wl.capacity_rps(out_tokens=30)
    assert share["capacity"] < share["queue"]
    assert share["capacity"] < 1.5 * capacity, (share, capacity)


def test_least_loaded_per_slot_weighs_open_requests_by_slots_and_a_tie_keeps_the_maglev_pick():
    """policymodel.least_loaded, as select.h's open_cost chooses: open / slot share, not open alone."""
    fleet = (wl.FAST, wl.SLOW)  # 4 slots, 2 slots
    srv = jsq.servers(fleet, ())
    srv[0].running, srv[1].running = 3, 2  # 3 of 4 against 2 of 2
    blind, per_slot = policymodel.least_loaded("none"), policymodel.least_loaded("slots")
    assert blind(srv, 0.0, random.Random(1)) == 1  # fewer open: the full 2-slot server
    assert per_slot(srv, 0.0, random.Random(1)) == 0  # 3/1 against 2/0.5: the 4-slot one has a slot free
    srv[0].running = 4  # 4/1 against 4: a tie keeps the Maglev pick, whichever it was
    picks = {policymodel.least_loaded("slots")(srv, 0.0, random.Random(k)) for k in range(40)}
    assert picks == {0, 1}
    with pytest.raises(ValueError, match="share"):
        policymodel.least_loaded("speed")


def test_least_loaded_per_slot_gets_more_of_the_requests_within_the_slo_than_blind_leastconn_in_the_model():
    """The model behind new_flows least_loaded by slots (docs/design-decisions.md): on the bench's
    fleet, faults and requests at 80 %, over four seeds together, per-slot least_loaded has more
    requests within the SLO than blind least-connections, and blind least_loaded is no better."""
    p = wl.plan()
    good = {"leastconn": 0, "none": 0, "slots": 0}
    nominal = {f"b{i}": c.tpot_ms / 1000 for i, c in enumerate(wl.FLEET)}
    for seed in range(1, 5):
        reqs = wl.schedule(0.8, p, seed=seed)
        for kind in good:
            choice = "leastconn" if kind == "leastconn" else policymodel.least_loaded(kind)
            outs = jsq.simulate(reqs, wl.FLEET, p.faults, choice, seed)
            good[kind] += sum(acc.good(o, nominal) for o in outs)
    assert good["slots"] > good["leastconn"] >= good["none"] * 0.98, good
