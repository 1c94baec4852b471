"""When a probe result wakes a steering step (weights.sample_moves, edged's _on_sample), and the
wire's RTT reaching trackers that a reload made. Unprivileged: edged runs over FakeMaps
(test_edged_loop.py) and is handed its samples."""

from __future__ import annotations

from controlplane import weights
from controlplane.samples import Load, Sample
from controlplane.tests.edgedstage import MS, PROBED, config, daemon, handshakes, on_loop

OK = Sample(t_ns=0, ok=True, rtt_s=0.001)
FAILED = Sample(t_ns=0, ok=False, error="timeout")


def cfg(policy="latency_inverse", kind="tcp", **extra):
    probe = {**PROBED["health"]["probe"], "kind": kind}
    if kind == "http":
        probe["path"] = "/health"
    return config(("b0", "b1"), policy, health={"probe": probe, **extra})


def test_a_passing_probe_moves_nothing_while_the_wire_alone_gives_the_rtt():
    s = cfg().services[0]
    w, probe = s.weights, s.health.probe
    fresh = weights.Tracker(wire_rtt_s=0.0002)
    assert not weights.sample_moves(fresh, OK, False, w, "tcp")
    assert not weights.sample_moves(fresh, OK, False, w, None)
    # the probe's RTT counts: no fresh wire signal, or an http/grpc probe (the larger of the two)
    assert weights.sample_moves(weights.Tracker(), OK, False, w, "tcp")
    assert weights.sample_moves(fresh, OK, False, w, "http")
    # health counts always: a failure, and anything while down or coming up
    assert weights.sample_moves(fresh, FAILED, False, w, "tcp")
    assert weights.sample_moves(fresh, OK, True, w, "tcp")
    weights.observe_sample(down := weights.Tracker(wire_rtt_s=0.0002, down=True), OK, w, probe)  # rise 1: up
    assert not down.down and weights.sample_moves(down, OK, True, w, "tcp")


def test_under_the_static_policy_no_probe_result_moves_a_weight():
    w = cfg("static").services[0].weights
    assert not weights.sample_moves(weights.Tracker(), FAILED, False, w, "tcp")
    assert not weights.sample_moves(weights.Tracker(down=True), OK, True, w, "tcp")


def woken(d, backend: str, sample: Sample) -> bool:
    st = d.state.services["web"]
    st.wake.clear()
    d.steering.on_sample(("web", backend), sample)
    return st.wake.is_set()


def test_edged_steps_at_once_only_for_results_that_can_move_a_weight():
    def test():
        t = 10**12
        d = daemon(cfg())
        st = d.state.services["web"]
        assert woken(d, "b0", Sample(t_ns=t, ok=True, rtt_s=0.001))  # no wire signal: the probe's RTT
        d.steering.step(st, t)
        handshakes(d, "b0", 10, 6)
        d.steering.step(st, t + 300 * MS)  # the next read: b0's window holds 10 handshakes
        assert st.trackers["b0"].wire_rtt_s is not None and st.trackers["b1"].wire_rtt_s is None
        assert not woken(d, "b0", Sample(t_ns=t + 400 * MS, ok=True, rtt_s=0.001))
        assert woken(d, "b1", Sample(t_ns=t + 400 * MS, ok=True, rtt_s=0.001))
        assert woken(d, "b0", Sample(t_ns=t + 500 * MS, ok=False, error="timeout"))
        # counted all the same: status and metrics see every result
        assert d.state.observer.probes("web", "b0") == (2, 1)
        static = daemon(cfg("static"))
        assert not woken(static, "b0", Sample(t_ns=t, ok=False, error="refused"))
        passive = daemon(cfg("static", passive={"syn_timeout_ms": 200, "consecutive": 3, "ejection_ms": 1000}))
        assert woken(passive, "b0", Sample(t_ns=t, ok=True, rtt_s=0.001))  # evidence for readmission

    on_loop(test)


def test_a_backend_a_reload_adds_gets_the_wire_rtt_at_the_next_step_without_a_read():
    def test():
        t = 10**12
        d = daemon(cfg())
        st = d.state.services["web"]
        d.steering.step(st, t)
        handshakes(d, "b0", 10, 6)
        d.steering.step(st, t + 300 * MS)
        read_at = st.wire_read_ns
        st.trackers["b0"] = weights.Tracker()  # as a reload that made its tracker anew
        d.steering.set_services(d.state.cfg)
        d.steering.step(st, t + 301 * MS)  # before wire.interval_ms: no read
        assert st.wire_read_ns == read_at and st.trackers["b0"].wire_rtt_s is not None
        assert d.state.wire_fresh == {("web", "b0")}

    on_loop(test)


def test_steps_come_as_without_probes_while_every_backend_is_relaxed():
    """The periodic step follows the probe interval; once real traffic has relaxed every
    backend's probes it runs at the wire's interval instead (a failed probe still wakes it)."""
    from controlplane.edged.steer import interval_s

    s = cfg(kind="tcp").services[0]
    probe, wire = s.health.probe, s.weights.wire
    assert interval_s(s) == min(probe.interval_ms, wire.interval_ms) / 1000
    assert interval_s(s, relaxed=True) == min(probe.relaxed_ms, wire.interval_ms) / 1000
    assert interval_s(s, relaxed=True) > interval_s(s)


def test_under_the_static_policy_steps_come_as_without_probes_or_scrapes():
    """No probe or scrape result changes a configured weight, so the periodic step does not
    follow their pace (a backend without fresh wire signals keeps its probes at the full rate
    and used to make its whole service step every probe interval)."""
    from controlplane.edged.steer import interval_s

    metrics = {"metrics": {"interval_ms": 200}}
    for s in (cfg("static").services[0], cfg("static", kind="http").services[0], cfg("static", **metrics).services[0]):
        assert interval_s(s) == interval_s(s, relaxed=True) == 1.0
    computed = cfg(**metrics).services[0]
    assert interval_s(computed) == computed.health.probe.interval_ms / 1000


def test_a_scrape_wakes_the_step_only_where_it_can_move_a_weight():
    def test():
        metrics = {"metrics": {"interval_ms": 200}}
        for policy, wakes in (("static", False), ("latency_inverse", True)):
            d = daemon(cfg(policy, **metrics))
            st = d.state.services["web"]
            st.wake.clear()
            d.steering.on_load(("web", "b0"), Load(t_ns=10**12, ok=True, waiting=3.0, running=1.0))
            assert st.wake.is_set() is wakes, policy
            assert st.trackers["b0"].load is not None  # counted all the same

    on_loop(test)
