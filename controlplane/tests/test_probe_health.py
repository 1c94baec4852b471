"""Probes decide health under every weight policy (static and latency_inverse): the pure parts.
weights.decide takes a backend its probes call down out of new flows and brings it back after
rise; a probe result that moves a backend in or out wakes the step; the status shows it as down;
and the data path's rule (bpf/include/health.h, compiled for this host as test_health_rule does)
spends no client flow as a trial on a backend of a probed service. Unprivileged.
"""

from __future__ import annotations

import pytest

from controlplane import abi, weights
from controlplane.config import Weights
from controlplane.samples import Sample
from controlplane.tests.test_health_rule import HARNESS, BackendHealth, BackendInfo, ServiceCfg, health_lib
from controlplane.tests.test_weights_policy import MS, PROBE, T0, probes, service, steady
from controlplane.weights import decide

POLICIES = {
    "static": Weights(policy="static"),
    "latency_inverse": Weights(policy="latency_inverse", rtt_offset_ms=0, slow_start_ms=1000),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_under_every_policy_fall_failed_probes_take_a_backend_out_of_new_flows(policy):
    w = POLICIES[policy]
    svc = service([("a", 3), ("b", 1), ("c", 1)], w)
    a, b, c = steady(w, 0.001), steady(w, 0.001), steady(w, 0.001)
    t = probes(a, w, [None] * (PROBE.fall - 1), T0 + 500 * MS)
    d = decide(svc, {"a": a, "b": b, "c": c}, None, t)
    assert d.weights["a"] > 0 and d.states["a"] != "down"  # fall - 1 failures: still in
    t = probes(a, w, [None], t)
    d2 = decide(svc, {"a": a, "b": b, "c": c}, d.weights, t)
    assert (d2.weights["a"], d2.states["a"], d2.push) == (0, "down", True)
    assert d2.reasons["a"] == f"{PROBE.fall} failed probes in a row: timeout after 0.05s"
    assert d2.weights["b"] > 0 and d2.weights["c"] > 0


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_under_every_policy_rise_good_probes_bring_it_back(policy):
    """static: its configured weight at once (static has no slow start); latency_inverse: from
    the floor, by slow start."""
    w = POLICIES[policy]
    svc = service([("a", 3), ("b", 1)], w)
    a, b = steady(w, 0.001), steady(w, 0.001)
    t = probes(a, w, [None] * PROBE.fall, T0 + 500 * MS)
    d = decide(svc, {"a": a, "b": b}, None, t)
    assert d.weights["a"] == 0
    t = probes(a, w, [0.001] * (PROBE.rise - 1), t)
    assert decide(svc, {"a": a, "b": b}, d.weights, t).weights["a"] == 0  # rise - 1: still out
    t = probes(a, w, [0.001], t) - 100 * MS  # at the time of the rise-th good probe
    back = decide(svc, {"a": a, "b": b}, d.weights, t)
    assert back.push and back.weights["a"] > 0
    if policy == "static":
        assert (back.weights["a"], back.states["a"]) == (3, "static")
    else:
        assert back.states["a"] == "slow-start" and back.weights["a"] == w.floor


def test_under_the_static_policy_every_backend_down_fails_open():
    """As under latency_inverse: when every backend fails its probes, the probes are taken to be
    wrong rather than the whole fleet, and the configured weights stay."""
    w = POLICIES["static"]
    svc = service([("a", 3), ("b", 1), ("off", 0)], w)
    a, b = steady(w, 0.001), steady(w, 0.001)
    probes(a, w, [None] * PROBE.fall, T0 + 500 * MS)
    probes(b, w, [None] * PROBE.fall, T0 + 500 * MS)
    d = decide(svc, {"a": a, "b": b}, None, T0 + 900 * MS)
    assert d.weights == {"a": 3, "b": 1, "off": 0}
    assert d.states == {"a": "fail-open", "b": "fail-open", "off": "draining"}
    assert "failing open" in d.reasons["a"]


def test_under_the_static_policy_a_result_that_moves_a_backend_in_or_out_wakes_the_step():
    w, kind = POLICIES["static"], "tcp"
    failed = Sample(t_ns=T0, ok=False, error="timeout")
    ok = Sample(t_ns=T0, ok=True, rtt_s=0.001)
    tr = steady(w, 0.001)
    for _ in range(PROBE.fall - 1):
        weights.observe_sample(tr, failed, w, PROBE)
        assert not weights.sample_moves(tr, failed, False, w, kind)  # not down yet: nothing moves
    weights.observe_sample(tr, failed, w, PROBE)
    assert tr.down and weights.sample_moves(tr, failed, False, w, kind)  # it goes out
    weights.observe_sample(tr, ok, w, PROBE)
    assert tr.down and not weights.sample_moves(tr, ok, True, w, kind)
    weights.observe_sample(tr, ok, w, PROBE)
    assert not tr.down and weights.sample_moves(tr, ok, True, w, kind)  # it comes back


def test_status_shows_a_backend_its_probes_took_out_as_down():
    from controlplane.maps.records import shown_state

    up = {"state": "up", "usable": True}
    probation = {"state": "probation", "usable": False}
    assert shown_state(abi.BE_F_VALID | abi.BE_F_UP | abi.BE_F_DRAINING, up, "down") == "down"
    assert shown_state(abi.BE_F_VALID | abi.BE_F_UP | abi.BE_F_DRAINING, probation, "down") == "down"
    assert shown_state(abi.BE_F_VALID | abi.BE_F_UP | abi.BE_F_DRAINING, up, "draining") == "draining"
    assert shown_state(abi.BE_F_VALID | abi.BE_F_UP | abi.BE_F_DRAINING, up, "") == "draining"
    assert shown_state(abi.BE_F_VALID | abi.BE_F_UP, probation, "static") == "probation"
    assert shown_state(abi.BE_F_VALID | abi.BE_F_UP, up, "static") == "up"


# ---- the data path's trial rule (health.h's passive_ok), compiled for this host ----

TRIAL = (
    HARNESS
    + r"""
int trial(const struct backend_info *be, const struct service_cfg *sc, struct backend_health *h, __u64 now)
{
	the_health = h;
	return passive_ok(be, sc, now);
}
"""
)


@pytest.fixture(scope="module")
def health_h(tmp_path_factory):
    return health_lib(tmp_path_factory, TRIAL, "trial")


def on_probation(now: int) -> BackendHealth:
    """A backend whose passive ejection just ended: on probation, no trial out yet."""
    return BackendHealth(ejected_until_ns=now - 1, probation=1, ejections=1)


def test_a_probed_service_spends_no_client_flow_as_a_trial(health_h):
    """With probes the readmission waits for a passing probe (edged ends the probation):
    passive detection lets no new flow through while the backend is on probation."""
    now = 10**12
    be = BackendInfo(flags=abi.BE_F_VALID | abi.BE_F_UP, health_id=0)
    sc = ServiceCfg(
        flags=abi.SVC_F_PASSIVE | abi.SVC_F_PROBED,
        syn_timeout_ns=50 * MS,
        consecutive=1,
        ejection_ns=1000 * MS,
        max_ejected_pct=50,
        n_backends=3,
    )
    h = on_probation(now)
    assert [health_h.trial(be, sc, h, now + i * MS) for i in range(5)] == [0] * 5
    assert h.trial_ns == 0 and h.probation == 1 and h.ejected_until_ns == now - 1  # nothing else moved
    h.probation = 0  # what maps.readmit does on a passing probe
    assert health_h.trial(be, sc, h, now + 10 * MS) == 1


def test_without_probes_one_trial_flow_at_a_time_is_still_let_through(health_h):
    now = 10**12
    be = BackendInfo(flags=abi.BE_F_VALID | abi.BE_F_UP, health_id=0)
    sc = ServiceCfg(
        flags=abi.SVC_F_PASSIVE,
        syn_timeout_ns=50 * MS,
        consecutive=1,
        ejection_ns=1000 * MS,
        max_ejected_pct=50,
        n_backends=3,
    )
    h = on_probation(now)
    assert [health_h.trial(be, sc, h, now + i * MS) for i in range(3)] == [1, 0, 0]
    assert h.trial_ns == now


def test_a_service_with_probes_tells_the_data_path_so():
    """edge_svc_cfg carries SVC_F_PROBED exactly for the services with a health.probe section."""
    from controlplane.tests.memtables import MemMaps
    from controlplane.tests.test_maps_apply import M, be, config, svc

    passive = {"syn_timeout_ms": 50, "consecutive": 1, "ejection_ms": 1000}
    cfg = config(
        svc("probed", 1, be("b0", 2), health={"passive": passive, "probe": {"kind": "tcp"}}),
        svc("passive", 2, be("b1", 3), health={"passive": passive}),
    )
    mem = MemMaps(M, cfg.node.max_services, cfg.node.max_backends)
    try:
        maps = mem.maps()
        maps.apply(cfg)
        t = maps.t[abi.MAP_SVC_CFG]
        flags = {name: t[t.Key(maps.ids(name)[0])].flags for name in ("probed", "passive")}
        assert flags == {"probed": abi.SVC_F_PASSIVE | abi.SVC_F_PROBED, "passive": abi.SVC_F_PASSIVE}
    finally:
        mem.close()


def test_the_metrics_show_a_backend_its_probes_took_out_as_down():
    """edge_backend_up 0 and edge_backend_probe_down 1 (the reason: its probes), though the
    data path's own health judgement of it is up (it only gets no new flows)."""
    from controlplane.tests.test_metrics import Source, be, endpoint, realistic_snapshot, scrape, value

    snap = realistic_snapshot()
    a = snap["services"][0]["backends"][0]
    assert a["name"] == "h100-a" and a["health"]["usable"]
    a["state"], a["probe"]["state"] = "down", "down"
    with endpoint(Source(snap)) as server:
        fams = scrape(server)
    assert value(fams, "edge_backend_up", **be("llama-70b", "h100-a")) == 0
    assert value(fams, "edge_backend_probe_down", **be("llama-70b", "h100-a")) == 1
    assert value(fams, "edge_backend_probe_down", **be("llama-70b", "h100-spare")) == 0
