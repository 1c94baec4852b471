"""What `edgectl status` prints: a router's snapshot (from edged or read from
the pinned maps) rendered as the node's header lines and a table per service,
with the operator's notes under it. Pure: dicts in, text out."""

from __future__ import annotations

import time

from controlplane import statuspage


def _fmt_count(n: int) -> str:
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def same_shape(snap: dict) -> dict:
    """snap with every key `status --json` can have, None where its source has nothing: what
    only edged knows (edged, each backend's edged view, discovery), with node.fleet or node.bgp
    only (fleet, bgp), edged's prober only (probe_budget), after a cut conntrack count only (conntrack_partial). So a script sees
    one shape with or without edged. Units are in the names: *_us, *_ns and *_permille in the
    data path's records (probe), seconds and ratios everywhere else."""
    for key in ("edged", "fleet", "bgp", "conntrack_partial", "probe_budget"):
        snap.setdefault(key, None)
    snap.setdefault("stopped_early", [])
    snap.setdefault("summarized", False)
    for s in snap["services"]:
        s.setdefault("discovery", None)
        s.setdefault("summary", None)
        s.setdefault("backends_total", len(s["backends"]))
        s.setdefault("backends_offset", 0)
        for b in s["backends"]:
            b.setdefault("edged", None)
    return snap


def print_status(snap: dict) -> None:
    xdp = snap["xdp"]
    attached = f"XDP {xdp['mode']}, prog {xdp['prog_id']}" if xdp["attached"] else "XDP NOT ATTACHED"
    edged = f"; edged {snap['edged']['version']}, pid {snap['edged']['pid']}" if snap.get("edged") else ""
    print(f"{snap['iface']}  ({attached}; instance {snap['instance']}{edged})")
    if (snap.get("edged") or {}).get("not_serving"):
        print(f"  NOT SERVING: {snap['edged']['not_serving']}")
    if snap.get("node_drained"):
        since = snap.get("node_drained_t")
        when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}" if since else ""
        print(f"  node drained{when}: every VIP withdrawn from BGP (edgectl undrain-node to end it)")
    bgp = snap.get("bgp")
    if bgp and (bgp["announced"] or bgp["withdrawn"]):
        print(
            "  bgp: "
            + "; ".join(
                [f"announced {', '.join(bgp['announced'])}"] * bool(bgp["announced"])
                + [f"withdrawn {vip} ({why})" for vip, why in sorted(bgp["withdrawn"].items())]
            )
        )
    if snap.get("fleet"):
        print("  " + fmt_fleet(snap["fleet"]))
    if snap.get("probe_budget"):
        print("  " + fmt_probe_budget(snap["probe_budget"]))
    print(f"  return path: {', '.join(snap['return_ifaces']) or '-'}{statuspage.fmt_conntrack(snap)}")
    print("  verdicts: " + "  ".join(f"{k} {_fmt_count(v)}" for k, v in snap["verdicts"].items()))
    print("  drops:    " + "  ".join(f"{k} {_fmt_count(v)}" for k, v in snap["drops"].items()))
    print("  drops before a service was known: " + fmt_drops((snap.get("no_service") or {}).get("drops", {})))
    for line in snap.get("stopped_early") or ():
        print(f"  stopped early: {line}")
    if snap.get("summarized"):
        print(
            f"  summaries only ({sum(s['backends_total'] for s in snap['services'])} backends): "
            "--service S, --offset N, --limit N or --full list them"
        )
    for s in snap["services"]:
        print(
            f"\n  service {s['name']}  {s['vip']}:{s['port']}/{s['protocol']}  "
            f"packets {_fmt_count(s['packets'])}  bytes {_fmt_count(s['bytes'])}  "
            f"new flows {_fmt_count(s['new_flows'])}  returned {_fmt_count(s['return_packets'])}"
        )
        print("    drops: " + fmt_drops(s.get("drops", {})))
        if s.get("discovery"):
            print("    " + _fmt_discovery(s["discovery"]))
        if s.get("summary"):
            print("    " + statuspage.fmt_summary(s))
        if snap.get("summarized"):
            continue
        page = statuspage.fmt_page(s) if s.get("backends_total") is not None else None
        if page:
            print(f"    {page}")
        _print_backends(s, bool(snap.get("fleet")))


def _print_backends(s: dict, fleet: bool) -> None:
    """A service's backends as a table, the operator's notes under it."""
    total = sum(b["slots"] for b in s["backends"]) or 1
    rows = [
        (
            "backend",
            "address",
            "weight",
            "share",
            "state",
            "heartbeat",
            "rtt p50/p99",
            "load",
            "probe",
            "probe every",
            "wire hs/fb p50",
            "active",
            "packets",
            "new flows",
            "failovers",
            "returned",
        )
    ]
    notes = []
    for b in s["backends"]:
        h, p = b["health"], b["probe"]
        age = h["heartbeat_age_s"]
        beat = "-" if not h["heartbeat"] else ("never" if age is None else f"{age * 1000:.0f}ms ago")
        rows.append(
            (
                b["name"] + (" (standby)" if b["standby"] else ""),
                f"{b['address']}:{b['port']}",
                str(b["weight"]),
                f"{100 * b['slots'] / total:.1f}%",
                b["state"],
                beat,
                _fmt_rtt(p),
                _fmt_load(p),
                p["state"] or "-",
                fmt_probe_every(b),
                *_fmt_wire(b),
                _fmt_count(b["packets"]),
                _fmt_count(b["new_flows"]),
                _fmt_count(b["failovers"]),
                _fmt_count(b["return_packets"]),
            )
        )
        if p["reason"]:
            notes.append(f"{b['name']}: {p['reason']}")
        notes.extend(f"{b['name']}: {note}" for note in _operator_notes(b, fleet))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for note in notes:
        print(f"    {note}")


def fmt_drops(drops: dict[str, int]) -> str:
    """The drop reasons that counted any packet, most first: 'no_backend 12, untracked 3', or 'none'."""
    seen = sorted(((n, reason) for reason, n in drops.items() if n), key=lambda x: (-x[0], x[1]))
    return ", ".join(f"{reason} {_fmt_count(n)}" for n, reason in seen) or "none"


def fmt_probe_budget(b: dict) -> str:
    """One line: the probes run against node.probe_budget, and the shortfall when there is one."""
    budget = f"budget {b['budget_per_s']:.0f}/s" if b["budget_per_s"] else "no budget"
    if 0 < b["budget_per_s"] < b.get("configured_per_s", 0):
        budget += (
            f" (node.probe_budget {b['configured_per_s']:.0f}/s, lowered: the probes took over half of edged's loop)"
        )
    line = f"probes: {b['run_per_s']:.0f}/s of {b['demand_per_s']:.0f}/s asked for, {budget}"
    if b["stretch"] > 1:
        line += (
            f"; SHORT by {b['shortfall_ratio']:.0%}: every interval {b['stretch']:.2f}x as configured"
            " (raise node.probe_budget or the intervals)"
        )
    return line


def fmt_fleet(f: dict) -> str:
    role = "leader" if f["is_leader"] else f"leader {f['leader'] or '(none)'}"
    applied = (
        f"snapshot v{f['version']} applied {f['applied_age_s']:.1f}s ago"
        if f["version"]
        else "no snapshot yet (local weights)"
    )
    etcd = "" if f["connected"] else f"; etcd LOST ({f['problem']}): keeping the snapshot, forwarding"
    return f"fleet: {f['name']}, {role}, {applied}{etcd}"


def _fmt_discovery(d: dict) -> str:
    """One line: source, state, how old the data is, failures and the last error."""
    age = "no data yet" if d.get("age_s") is None else f"data {d['age_s']:.1f}s old"
    line = (
        f"discovery: {d['source']} {d['state']}, {d.get('backends', 0)} backends, {age}, "
        f"{d.get('failures', 0)} failures, {d.get('changes', 0)} changes"
    )
    return line + (f"; last error: {d['error']}" if d.get("error") else "")


def _operator_notes(b: dict, fleet: bool = False) -> list[str]:
    """Drain and weight override set with edgectl, from edged's view or what it wrote to the maps;
    in a fleet, the fleet-wide ones (from the applied snapshot) and the node's own (--local)."""
    from controlplane import abi

    e, p = b.get("edged") or {}, b["probe"]
    if e.get("drained") is not None:
        drained, override = e["drained"], e.get("override")
    else:
        drained = bool(p["flags"] & abi.PROBE_F_DRAINED)
        override = p["override_weight"] if p["flags"] & abi.PROBE_F_OVERRIDE else None
    notes = []
    if e.get("fleet_drained"):
        notes.append("drained fleet-wide by an operator (edgectl undrain to end it)")
    if e.get("fleet_override") is not None:
        notes.append(
            f"weight pinned at {e['fleet_override']} fleet-wide by an operator (edgectl weight --clear to end it)"
        )
    local = " on this node only, so its table differs from the fleet's" if fleet else ""
    flag = " --local" if fleet else ""
    if drained:
        notes.append(f"drained by an operator{local} (edgectl undrain{flag} to end it)")
    if override is not None:
        notes.append(f"weight pinned at {override} by an operator{local} (edgectl weight --clear{flag} to end it)")
    return notes


def _fmt_rtt(p: dict) -> str:
    """The probe window's p50/p99 RTT, in ms."""
    if not p["rtt_p50_us"]:
        return "-"
    return f"{p['rtt_p50_us'] / 1000:.1f}/{p['rtt_p99_us'] / 1000:.1f}ms"


def fmt_probe_every(b: dict) -> str:
    """The interval of the backend's health probes now, edged's view: 'relaxed' while real traffic
    measures the backend (adaptive probing); '-' without edged or without health.probe."""
    e = b.get("edged") or {}
    interval = e.get("probe_interval_s")
    if interval is None:
        return "-"
    text = f"{interval * 1000:.0f}ms" if interval < 1 else f"{interval:g}s"
    return text + (" relaxed" if e.get("probe_relaxed") else "")


def _fmt_wire(b: dict) -> tuple[str, str]:
    """(handshake p50 / first-byte p50, active flows) of real traffic: edged's window when it has
    one (a '*' marks a signal fresh enough to weigh), else since the data path was deployed."""
    w, live = b.get("wire") or {}, (b.get("edged") or {}).get("wire") or {}
    src = live if live.get("window_s") is not None else w

    def ms(x):
        return "-" if x is None else f"{x * 1000:.2f}" if x < 0.01 else f"{x * 1000:.0f}"

    hs, fb = src.get("handshake_p50_s"), src.get("first_byte_p50_s")
    text = "-" if hs is None and fb is None else f"{ms(hs)}/{ms(fb)}ms" + ("*" if src.get("fresh") else "")
    active = w.get("active") if w.get("active") is not None else src.get("active")
    return text, "-" if active is None else str(active)


def _fmt_load(p: dict) -> str:
    """Queue (waiting+running) and KV-cache use as the backend last reported them."""
    parts = []
    if p["waiting"] is not None or p["running"] is not None:
        parts.append(
            f"q {p['waiting'] if p['waiting'] is not None else '?'}+{p['running'] if p['running'] is not None else '?'}"
        )
    if p["kv_permille"] is not None:
        parts.append(f"kv {p['kv_permille'] / 10:.0f}%")
    return " ".join(parts) or "-"
