"""The drill's report: the dict a run returns (build_report: the analysis of what was captured,
the router's counters, notes on what limits the figures), and its forms: a short table, the JSON
file and a timeline plot. The plot needs matplotlib, the project's optional `plot` extra.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane.config import Service
from controlplane.drill.analysis import Flow, HealthSeen, analyse, ns_to_ms
from controlplane.drill.capture import Captured
from controlplane.drill.plan import FIRST_SPORT, DrillError, Plan

if TYPE_CHECKING:
    from controlplane.drill.run import Silencer
    from controlplane.lab.topo import Net

T0_LABELS = {"heartbeat": "last heartbeat", "link": "link down", "kill": "first refusal"}


def build_report(
    svc: Service,
    plan: Plan,
    net: "Net",
    dead: int,
    start_ns: int,
    sent: list[int],
    captured: Captured,
    silencer: "Silencer",
    snap: dict,
) -> dict:
    """The drill's report: t0 by mode (analysis.analyse says what each finding means), the traffic
    as sent, the router's view after the run (snap: `edgectl status --json`) and notes."""
    names = [b.name for b in svc.backends]
    hb = svc.health.heartbeat if svc.health else None
    seen = captured.backends
    where: dict[int, tuple[int, int]] = {}
    for i, b in enumerate(seen):
        for sport, t in b.first.items():
            if sport not in where or t < where[sport][1]:
                where[sport] = (i, t)
    flows = []
    for k, t in enumerate(sent):
        sport = FIRST_SPORT + k
        i, arrived = where.get(sport, (None, None))
        flows.append(Flow(sport, t, i, arrived, i is not None and sport in seen[i].refused))

    dead_beats = [t for t in seen[dead].heartbeats if t <= silencer.done_ns]
    last_hb = max(dead_beats) if dead_beats else None
    after_hb = sum(1 for t in seen[dead].heartbeats if t > silencer.done_ns)
    first_refusal = min((t for t in seen[dead].refused.values() if t >= silencer.started_ns), default=None)
    if plan.mode == "heartbeat":
        t0 = last_hb if last_hb is not None else silencer.started_ns
    elif plan.mode == "link":
        # Setting a veth down takes milliseconds (the kernel waits for RCU and for its queues), and
        # the link carries frames until it is down: the last one it carried is the best estimate.
        carried = [t for t in [*seen[dead].heartbeats, *seen[dead].first.values()] if t <= silencer.done_ns]
        t0 = max([silencer.started_ns, *carried])
    else:
        t0 = first_refusal if first_refusal is not None else silencer.done_ns
    passive = svc.health.passive if svc.health and svc.protocol == "tcp" else None
    health = HealthSeen(
        timeout_ms=hb.timeout_ms if hb else None,
        rise=hb.rise if hb else 1,
        ejection_ms=passive.ejection_ms if passive else None,
        beats=tuple(tuple(b.heartbeats) for b in seen) if hb else (),
        takes_new=tuple(b.weight > 0 for b in svc.backends),
    )
    findings = analyse(flows, names, dead, plan.mode, t0, t0 if plan.mode == "kill" else last_hb, health)

    period_ns = 1e9 / plan.rate
    lateness = sorted(t - (start_ns + k * period_ns) for k, t in enumerate(sent))
    span_s = (sent[-1] - sent[0]) / 1e9 if len(sent) > 1 else 0.0
    rsvc = next(s for s in snap["services"] if s["name"] == svc.name)
    router = {
        "backends": {
            b["name"]: {"state": b["state"], "new_flows": b["new_flows"], "failovers": b["failovers"]}
            for b in rsvc["backends"]
        },
        "failovers": sum(b["failovers"] for b in rsvc["backends"]),
        "drops": {k: v for k, v in snap["drops"].items() if v},
    }
    notes = []
    if not findings["detected"]:
        notes.append(
            f"{plan.backend} still got flows at the end of the run: not detected"
            + (" (kill needs health.passive on a tcp service: heartbeats go on)" if plan.mode == "kill" else "")
        )
    if any(b.dropped for b in seen):
        notes.append(f"the capture lost frames {[b.dropped for b in seen]}: 'lost' counts are upper bounds")
    if plan.mode == "kill" and first_refusal is None:
        notes.append(f"{plan.backend} refused no flow after the kill; t0 is when its process was reaped")
    if plan.mode == "heartbeat" and last_hb is None:
        notes.append("no heartbeat of the silenced backend was captured; t0 is when its agent was stopped")
    if after_hb and plan.mode != "kill":
        notes.append(f"{after_hb} heartbeats of {plan.backend} left after it was silenced")
    spurious = {n: g["over_timeout"] for n, g in findings["heartbeat_gaps"].items() if g["over_timeout"]}
    if spurious:
        notes.append(
            f"heartbeat gaps longer than the timeout (the backend was briefly down, its flows went "
            f"elsewhere): {spurious}"
        )
    if findings["lost_unexplained"]:
        notes.append(
            f"{findings['lost_unexplained']} flows were lost outside the dead run and outside "
            f"heartbeat gaps (router drops: {router['drops'] or 'none'})"
        )
    rel = lambda t: None if t is None else round((t - t0) / 1e6, 3)  # noqa: E731
    return {
        "drill": "failover",
        "mode": plan.mode,
        "service": svc.name,
        "protocol": svc.protocol,
        "backend": plan.backend,
        "backends": names,
        "testbed": {
            "prefix": net.prefix,
            "vip": str(net.vip),
            "port": svc.port,
            "addresses": {n: str(net.backend_addr(i)) for i, n in enumerate(names)},
        },
        "heartbeat": None
        if hb is None
        else {"interval_ms": hb.interval_ms, "timeout_ms": hb.timeout_ms, "rise": hb.rise},
        "passive": None if not (svc.health and svc.health.passive) else asdict(svc.health.passive),
        "traffic": {
            "flows": len(sent),
            "rate": plan.rate,
            "duration_s": plan.duration_s,
            "achieved_rate": round((len(sent) - 1) / span_s, 1) if span_s else None,
            "max_send_lag_ms": ns_to_ms(lateness[-1]),
            "p99_send_lag_ms": ns_to_ms(lateness[int(0.99 * (len(lateness) - 1))]),
        },
        "times_ms": {
            "t0": 0.0,
            "first_flow": rel(sent[0]),
            "last_flow": rel(sent[-1]),
            "silence_started": rel(silencer.started_ns),
            "silence_done": rel(silencer.done_ns),
            "last_heartbeat": rel(last_hb),
            "first_refusal": rel(first_refusal),
        },
        **findings,
        "router": router,
        "capture": {
            "frames": sum(b.frames for b in seen),
            "dropped": [b.dropped for b in seen],
            "clock_error_us": round(captured.clock_error_ns / 1e3, 1),
        },
        "notes": notes,
        "flows": [
            {
                "sport": f.sport,
                "sent_ms": rel(f.sent_ns),
                "backend": None if f.backend is None else names[f.backend],
                "arrived_ms": rel(f.arrived_ns),
                "refused": f.refused,
            }
            for f in flows
        ],
    }


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}{unit}"
    return f"{v}{unit}"


def format_table(r: dict) -> str:
    """The report as a short human table (the JSON has everything)."""
    hb, t, times = r["heartbeat"], r["traffic"], r["times_ms"]
    t0 = {
        "heartbeat": "last heartbeat of the backend",
        "link": "its veth went down (last frame it carried)",
        "kill": "its killed server refused a flow first (heartbeats go on)",
    }[r["mode"]]
    if r["mode"] == "link" and times["last_heartbeat"] is not None:
        t0 += f"; last heartbeat at {times['last_heartbeat']:.2f} ms"
    rows = [
        (
            "traffic",
            f"{t['flows']} new flows at {t['rate']}/s (achieved {_fmt(t['achieved_rate'])}/s; "
            f"send lag p99 {_fmt(t['p99_send_lag_ms'], ' ms')}, max {_fmt(t['max_send_lag_ms'], ' ms')})",
        ),
        ("t0", t0),
        (
            "detection",
            f"{_fmt(r['detection_ms'], ' ms')}  (resolution ~{_fmt(r['resolution_ms'], ' ms')})"
            + ("" if r["detected"] else "  NOT DETECTED"),
        ),
        ("failover", f"{_fmt(r['failover_ms'], ' ms')}  (t0 -> first rerouted flow)"),
        ("last to dead", f"{_fmt(r['last_to_dead_ms'], ' ms')}  ({r['dead_run']} flows given to it after t0)"),
        (
            "lost",
            f"{r['lost']}  ({r['lost_dead_run']} in the dead run, {r['lost_heartbeat_gaps']} while every "
            f"other backend missed heartbeats, {r['lost_unexplained']} unexplained)",
        ),
        (
            "late",
            _fmt(r["late"])
            + (
                f"  (given to it after {'t0' if r['mode'] == 'kill' else 'last heartbeat'}"
                f" + timeout + 1 ms = {r['late_deadline_ms']:.2f} ms)"
                if r["late_deadline_ms"] is not None
                else ""
            ),
        ),
        (
            "after detection",
            str(r["after_detection"])
            + (f"  ({r['readmitted']} more once its ejection ran out)" if r["readmitted"] else ""),
        ),
    ]
    if r["refused"] is not None:
        rows.append(("refused", f"{r['refused']}  (reached the killed server's port)"))
    moved = ", ".join(f"{n} {b['failovers']}" for n, b in r["router"]["backends"].items() if b["failovers"])
    rows.append(
        (
            "router",
            f"failovers {r['router']['failovers']}"
            + (f" (to {moved})" if moved else "")
            + f"; {r['backend']} is {r['router']['backends'][r['backend']]['state']}; "
            f"drops {r['router']['drops'] or 'none'}",
        )
    )
    head = f"failover drill: {r['service']} ({r['protocol']}), {r['backend']} silenced by {r['mode']}" + (
        f"; heartbeat every {hb['interval_ms']} ms, timeout {hb['timeout_ms']} ms" if hb else "; no heartbeats"
    )
    lines = [head] + [f"  {k:<16} {v}" for k, v in rows]
    table = [("backend", "flows before t0", "after t0", "max heartbeat gap")]
    for name, c in r["per_backend"].items():
        gap = r["heartbeat_gaps"].get(name)
        table.append(
            (
                name + (" (silenced)" if name == r["backend"] else ""),
                str(c["before"]),
                str(c["after"]),
                "-"
                if gap is None
                else f"{gap['max_gap_ms']:.2f} ms"
                + (f" ({gap['over_timeout']} over timeout)" if gap["over_timeout"] else ""),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        lines.append("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines)


def write_json(r: dict, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(r, indent=1) + "\n")


def require_matplotlib() -> None:
    """DrillError (one line) when matplotlib is missing: check before a drill that is to be plotted."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise DrillError(
            f"--plot needs matplotlib, which is not installed ({e}); "
            f"install the project's plot extra (pip install 'edge-router[plot]')"
        ) from e


def write_plot(r: dict, path: str | os.PathLike) -> None:
    """Timeline: which backend got each flow, by send time, with silencing and detection marked."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(r["backends"]) + ["lost"]
    y = {name: i for i, name in enumerate(rows)}
    xs = [f["sent_ms"] for f in r["flows"]]
    ys = [y[f["backend"] if f["backend"] is not None else "lost"] for f in r["flows"]]
    colors = [
        "tab:red" if f["backend"] is None else "tab:orange" if f["backend"] == r["backend"] else "tab:blue"
        for f in r["flows"]
    ]
    det = r["detection_ms"]
    zoom_hi = max(30.0, (det or 0) + 25.0)
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1, 1.3]})
    for ax, lim, size in ((axes[0], None, 2), (axes[1], (-15.0, zoom_hi), 12)):
        ax.scatter(xs, ys, s=size, c=colors, marker="|" if lim is None else "o", linewidths=1)
        ax.axvline(0.0, color="black", linestyle="--", label=f"t0: {T0_LABELS[r['mode']]}")
        hb_line = r["times_ms"]["last_heartbeat"]
        if r["mode"] == "link" and hb_line is not None:
            ax.axvline(hb_line, color="grey", linestyle=":", label="last heartbeat")
        if r["late_deadline_ms"] is not None:
            ax.axvline(
                r["late_deadline_ms"],
                color="tab:purple",
                linestyle=":",
                label=("t0" if r["mode"] == "kill" else "last heartbeat") + " + timeout + 1 ms",
            )
        if det is not None:
            ax.axvline(det, color="tab:green", linestyle="-", label=f"detection ({det:.2f} ms)")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(rows)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        if lim is not None:
            ax.set_xlim(*lim)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_title(
        f"failover drill: {r['backend']} of {r['service']} silenced by {r['mode']} "
        f"({r['traffic']['flows']} flows at {r['traffic']['rate']}/s)"
    )
    axes[1].set_title("around the failover", fontsize=10)
    axes[1].set_xlabel("flow sent at (ms, relative to t0)")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
