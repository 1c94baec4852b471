"""tools/_vs_haproxy.py, the pure part of `tools/bench-failover --vs-haproxy`: the two configs
say the same detection, and a run's analysis counts failures by their start relative to the
kill. No root."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import _vs_haproxy as vs  # noqa: E402
from controlplane.config import parse_config  # noqa: E402

MS = 1_000_000
KILL = 10**12


def test_the_routers_config_is_valid_and_has_passive_detection_plus_probes():
    cfg = parse_config({"version": 1, "services": [vs.edge_service("198.18.255.1", ["198.18.1.2", "198.18.2.2"])]})
    (s,) = cfg.services
    assert s.weights.policy == "static" and [b.name for b in s.backends] == ["b0", "b1"]
    assert (s.health.passive.consecutive, s.health.passive.ejection_ms) == (1, 1000)
    assert (s.health.probe.interval_ms, s.health.probe.fall, s.health.probe.rise) == (100, 2, 2)


def test_haproxy_checks_as_often_and_marks_down_on_the_first_failed_connection():
    text = vs.haproxy_config("198.18.255.1", ["198.18.1.2", "198.18.2.2"])
    assert "bind 198.18.255.1:8000" in text and "mode tcp" in text
    assert "check inter 100 fall 2 rise 2 observe layer4 error-limit 1 on-error mark-down" in text
    assert "server b0 198.18.1.2:8000" in text and "server b1 198.18.2.2:8000" in text
    assert "redispatch" not in text  # a client whose connection found the dead server sees it fail


def test_a_run_counts_failures_by_their_start_after_the_kill():
    conns = [
        vs.Conn(KILL - 5 * MS, KILL, "error:timeout"),  # before the kill: counted apart
        vs.Conn(KILL - 1 * MS, KILL + 2 * MS, "b0"),
        vs.Conn(KILL + 1 * MS, KILL + 2 * MS, "error:refused"),
        vs.Conn(KILL + 4 * MS, KILL + 5 * MS, "b1"),
        vs.Conn(KILL + 9 * MS, KILL + 9 * MS, "error:refused"),
        vs.Conn(KILL + 1015 * MS, KILL + 1016 * MS, "error:refused"),  # the trial flow of the issue
        vs.Conn(KILL + 1020 * MS, KILL + 1021 * MS, "b2"),
    ]
    r = vs.analyse(conns, KILL)
    assert (r["flows"], r["failed"], r["failed_before_kill"], r["failed_after_kill"]) == (7, 4, 1, 3)
    assert (r["first_failure_ms"], r["last_failure_ms"]) == (1.0, 1015.0)
    assert (r["late"], r["late_ms"], r["goal_met"]) == (1, [1015.0], False)
    assert r["errors"] == {"error:timeout": 1, "error:refused": 3}
    assert r["exit_ms"] is None and r["late_after_exit"] == 1  # without an exit time: the kill's
    exited = vs.analyse(conns, KILL, exit_ns=KILL + 1010 * MS)  # the server took 1,010 ms to die
    assert (exited["exit_ms"], exited["late"], exited["late_after_exit"]) == (1010.0, 1, 0)
    on_time = vs.analyse(conns[:5], KILL)
    assert on_time["goal_met"] and on_time["late"] == 0 and on_time["last_failure_ms"] == 9.0


def test_the_table_says_per_system_how_many_runs_met_the_goal():
    ok = vs.analyse([vs.Conn(KILL + MS, KILL + MS, "error:refused")], KILL)
    late = vs.analyse([vs.Conn(KILL + 20 * MS, KILL + 20 * MS, "error:refused")], KILL)
    text = vs.table({"edge (static)": [ok, late], "haproxy": [ok, {"error": "haproxy exited 1"}]})
    assert "edge (static): no failed new connection later than 10 ms after the kill in 1 of 2 runs" in text
    assert "haproxy: no failed new connection later than 10 ms after the kill in 1 of 2 runs" in text
    assert "MISSED" in text and "ERROR: haproxy exited 1" in text
