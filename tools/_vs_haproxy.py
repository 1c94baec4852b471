"""The pure part of `tools/bench-failover --vs-haproxy`: failover with real TCP connections, this
router (passive detection plus probes, under edged) against HAProxy (health checks plus
`observe layer4`), same generator, same kill. Owns the two configs, the record of one connection,
the analysis of a run and the side-by-side table. No I/O, no root (controlplane/tests/
test_bench_vs_haproxy.py); the runner is tools/_vs_haproxy_run.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

GOAL_MS = 10.0  # no failed new connection started later than this after the kill
PORT = 8000
# The setting (issue 23): one refused SYN ejects for 1 s; tcp probes every 100 ms, 2 to fall.
PASSIVE = {"syn_timeout_ms": 50, "consecutive": 1, "ejection_ms": 1000, "max_ejected_percent": 50}
PROBE = {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50, "fall": 2, "rise": 2}


@dataclass(frozen=True)
class Conn:
    """One new connection of the generator: when it was started (connect(), CLOCK_MONOTONIC ns),
    when it ended, and how: a backend's name, or "error:<why>"."""

    start_ns: int
    end_ns: int
    outcome: str

    @property
    def failed(self) -> bool:
        return self.outcome.startswith("error:")


def edge_service(vip: str, backends: Sequence[str], policy: str = "static") -> dict:
    """The router's service: passive detection plus tcp probes (edged), the given weight policy."""
    return {
        "name": "web",
        "vip": vip,
        "port": PORT,
        "protocol": "tcp",
        "health": {"passive": dict(PASSIVE), "probe": dict(PROBE)},
        "weights": {"policy": policy},
        "backends": [{"name": f"b{i}", "address": a, "port": PORT} for i, a in enumerate(backends)],
    }


def haproxy_config(vip: str, backends: Sequence[str]) -> str:
    """HAProxy in TCP mode with the same detection: checks every 100 ms (fall 2, rise 2) and
    `observe layer4` with error-limit 1 marking a server down on its first failed connection,
    as one refused SYN ejects in the router. Retries left at HAProxy's default (3, same server,
    no redispatch): a client whose connection found a dead server sees it fail, as with the router."""
    servers = "\n".join(f"    server b{i} {a}:{PORT}" for i, a in enumerate(backends))
    return f"""global
    maxconn 8000
    nbthread 1

defaults
    mode tcp
    timeout connect 1s
    timeout client 5s
    timeout server 5s

frontend vip
    bind {vip}:{PORT}
    default_backend web

backend web
    balance roundrobin
    default-server check inter {PROBE["interval_ms"]} fall {PROBE["fall"]} rise {PROBE["rise"]} observe layer4 error-limit {PASSIVE["consecutive"]} on-error mark-down
{servers}
"""


def analyse(conns: Sequence[Conn], kill_ns: int, exit_ns: int | None = None, dead: str = "b0") -> dict:
    """One run: how many connections, how many failed, and when the failures started relative to
    the kill (ms, by their start); late = failures started more than GOAL_MS after the kill.
    exit_ns: when the killed server was seen gone (reaped); until then its host still completes
    handshakes into its listen queue, which its exit resets (on a loaded host that takes ms);
    late_after_exit counts the failures started more than GOAL_MS after that."""
    failed = sorted((c for c in conns if c.failed), key=lambda c: c.start_ns)
    after = [c for c in failed if c.start_ns >= kill_ns]
    late = [c for c in after if c.start_ns > kill_ns + GOAL_MS * 1e6]
    gone = exit_ns if exit_ns is not None else kill_ns
    ms = [(c.start_ns - kill_ns) / 1e6 for c in after]
    return {
        "exit_ms": None if exit_ns is None else (exit_ns - kill_ns) / 1e6,
        "late_after_exit": sum(1 for c in after if c.start_ns > gone + GOAL_MS * 1e6),
        "flows": len(conns),
        "failed": len(failed),
        "failed_before_kill": len(failed) - len(after),
        "failed_after_kill": len(after),
        "first_failure_ms": ms[0] if ms else None,
        "last_failure_ms": ms[-1] if ms else None,
        "late": len(late),
        "late_ms": [round(x, 1) for x in ms if x > GOAL_MS][:10],
        "to_dead_after_kill": sum(1 for c in conns if c.outcome == dead and c.start_ns >= kill_ns),
        "errors": dict(Counter(c.outcome for c in failed)),  # every failure, before the kill too, by kind
        "goal_met": not late,
    }


def _ms(x) -> str:
    return "-" if x is None else f"{x:,.1f}"


def table(results: dict[str, list[dict]]) -> str:
    """The side-by-side table: one row per run of each system, then how many runs met the goal."""
    head = (
        "system",
        "run",
        "flows",
        "failed",
        "after kill",
        "first ms",
        "last ms",
        f"> {GOAL_MS:g} ms",
        "goal",
        "exit ms",
        f"> exit+{GOAL_MS:g}",
    )
    rows = [head]
    for system, runs in results.items():
        for i, r in enumerate(runs, 1):
            if "error" in r:
                rows.append((system, str(i), "-", "-", "-", "-", "-", "-", f"ERROR: {r['error']}", "-", "-"))
                continue
            rows.append(
                (
                    system,
                    str(i),
                    str(r["flows"]),
                    str(r["failed"]),
                    str(r["failed_after_kill"]),
                    _ms(r["first_failure_ms"]),
                    _ms(r["last_failure_ms"]),
                    str(r["late"]),
                    "met" if r["goal_met"] else "MISSED",
                    _ms(r.get("exit_ms")),
                    str(r.get("late_after_exit", "-")),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if k == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    for system, runs in results.items():
        met = sum(1 for r in runs if r.get("goal_met"))
        lines.append(
            f"  {system}: no failed new connection later than {GOAL_MS:g} ms after the kill in "
            f"{met} of {len(runs)} runs"
        )
    return "\n".join(lines)
