"""edgectl: the operator's CLI. One small function per subcommand; errors are
one line on stderr (`edgectl: <what>`) with a non-zero exit, and a traceback
only with --debug. Run `edgectl --help` or `edgectl COMMAND --help`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from controlplane import __version__
from controlplane.errors import EdgeError

PROG = "edgectl"


def _progress(args) -> callable:
    def say(line: str) -> None:
        if not args.quiet:
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    return say


def cmd_validate(args) -> int:
    from controlplane.config import load_config

    cfg = load_config(args.config)
    backends = sum(len(s.backends) for s in cfg.services)
    print(f"{args.config}: ok ({len(cfg.services)} services, {backends} backends)")
    return 0


def cmd_deploy(args) -> int:
    from controlplane import deploy
    from controlplane.config import load_config

    cfg = load_config(args.config)
    res = deploy.deploy(cfg, args.iface, progress=_progress(args))
    r = res.report
    verb = "updated" if res.updated else "deployed"
    changes = []
    for label, items in (("added", r.added_services), ("removed", r.removed_services),
                         ("backends added", r.added_backends), ("backends removed", r.removed_backends)):
        if items:
            changes.append(f"{label}: {', '.join(items)}")
    print(f"{verb} on {res.iface} (XDP {res.mode}, return path on {', '.join(res.return_ifaces)}): "
          f"{len(cfg.services)} services" + (f"; {'; '.join(changes)}" if changes and res.updated else ""))
    return 0


def cmd_undeploy(args) -> int:
    from controlplane import deploy

    if deploy.undeploy(args.iface, args.pin_dir, progress=_progress(args)):
        print(f"undeployed from {args.iface}")
    else:
        print(f"nothing deployed on {args.iface}")
    return 0


def _fmt_count(n: int) -> str:
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _print_status(snap: dict) -> None:
    xdp = snap["xdp"]
    attached = f"XDP {xdp['mode']}, prog {xdp['prog_id']}" if xdp["attached"] else "XDP NOT ATTACHED"
    print(f"{snap['iface']}  ({attached}; instance {snap['instance']})")
    ct_entries = "" if snap["conntrack_entries"] is None else f"   conntrack entries: {snap['conntrack_entries']}"
    print(f"  return path: {', '.join(snap['return_ifaces']) or '-'}{ct_entries}")
    print("  verdicts: " + "  ".join(f"{k} {_fmt_count(v)}" for k, v in snap["verdicts"].items()))
    print("  drops:    " + "  ".join(f"{k} {_fmt_count(v)}" for k, v in snap["drops"].items()))
    for s in snap["services"]:
        print(f"\n  service {s['name']}  {s['vip']}:{s['port']}/{s['protocol']}  "
              f"packets {_fmt_count(s['packets'])}  bytes {_fmt_count(s['bytes'])}  "
              f"new flows {_fmt_count(s['new_flows'])}  returned {_fmt_count(s['return_packets'])}")
        total = sum(b["slots"] for b in s["backends"]) or 1
        rows = [("backend", "address", "weight", "share", "state", "heartbeat", "rtt p50/p99", "load",
                 "probe", "packets", "new flows", "failovers", "returned")]
        notes = []
        for b in s["backends"]:
            h, p = b["health"], b["probe"]
            age = h["heartbeat_age_s"]
            beat = "-" if not h["heartbeat"] else ("never" if age is None else f"{age * 1000:.0f}ms ago")
            rows.append((
                b["name"] + (" (standby)" if b["standby"] else ""), f"{b['address']}:{b['port']}",
                str(b["weight"]), f"{100 * b['slots'] / total:.1f}%", b["state"], beat,
                _fmt_rtt(p), _fmt_load(p), p["state"] or "-",
                _fmt_count(b["packets"]), _fmt_count(b["new_flows"]), _fmt_count(b["failovers"]),
                _fmt_count(b["return_packets"]),
            ))
            if p["reason"]:
                notes.append(f"{b['name']}: {p['reason']}")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        for note in notes:
            print(f"    {note}")


def _fmt_rtt(p: dict) -> str:
    """The probe window's p50/p99 RTT, in ms."""
    if not p["rtt_p50_us"]:
        return "-"
    return f"{p['rtt_p50_us'] / 1000:.1f}/{p['rtt_p99_us'] / 1000:.1f}ms"


def _fmt_load(p: dict) -> str:
    """Queue (waiting+running) and KV-cache use as the backend last reported them."""
    parts = []
    if p["waiting"] is not None or p["running"] is not None:
        parts.append(f"q {p['waiting'] if p['waiting'] is not None else '?'}+{p['running'] if p['running'] is not None else '?'}")
    if p["kv_permille"] is not None:
        parts.append(f"kv {p['kv_permille'] / 10:.0f}%")
    return " ".join(parts) or "-"


def cmd_status(args) -> int:
    from controlplane import deploy

    snaps = deploy.status(args.pin_dir, args.iface, count_conntrack=args.conntrack)
    if args.json:
        json.dump(snaps, sys.stdout, indent=2)
        print()
        return 0
    if not snaps:
        print("nothing deployed in this network namespace")
        return 0
    for i, snap in enumerate(snaps):
        if i:
            print()
        _print_status(snap)
    return 0


def cmd_drill_failover(args) -> int:
    from controlplane import drill
    from controlplane.config import load_config

    cfg = load_config(args.config)
    if args.plot:
        drill.require_matplotlib()
    plan = drill.Plan(backend=args.backend, mode=args.mode, rate=args.rate, duration_s=args.duration,
                      service=args.service)
    report = drill.failover(cfg, plan, progress=_progress(args))
    print(drill.format_table(report))
    if args.json:
        drill.write_json(report, args.json)
    if args.plot:
        drill.write_plot(report, args.plot)
    return 0


def default_pin_dir() -> str:
    from controlplane.config import Node

    return os.environ.get("EDGE_PIN_DIR", Node().pin_dir)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Operate the edge router: an XDP load balancer for GPU inference backends.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and compiler output on errors")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("deploy", help="load and attach the data path on an interface and program services",
                       description="Compile and attach the XDP router on IFACE, attach the return path on the "
                                   "interfaces that route to the backends, and program the services of FILE. "
                                   "Run again with a changed FILE to update in place; connections are kept. "
                                   "On any error nothing is left behind.")
    s.add_argument("--iface", required=True, help="client-facing interface that receives VIP traffic")
    s.add_argument("--config", required=True, metavar="FILE", help="YAML config (see edge/edge.yaml)")
    s.set_defaults(func=cmd_deploy)

    s = sub.add_parser("undeploy", help="detach the data path from an interface and remove its pins",
                       description="Detach XDP from IFACE and the return path from the backend-facing "
                                   "interfaces, and unpin the maps. Says so and exits 0 if nothing is deployed.")
    s.add_argument("--iface", required=True, help="interface given to deploy")
    s.add_argument("--pin-dir", default=default_pin_dir(), help="bpffs directory of the pins (default %(default)s)")
    s.set_defaults(func=cmd_undeploy)

    s = sub.add_parser("status", help="show services, backends, weights and counters",
                       description="Read the pinned maps and show what is deployed in this network namespace.")
    s.add_argument("--iface", help="only the router deployed on this interface")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--conntrack", action="store_true",
                   help="also count conntrack entries (walks the table: slow when it is full)")
    s.add_argument("--pin-dir", default=default_pin_dir(), help="bpffs directory of the pins (default %(default)s)")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("validate", help="check a config file without touching the kernel",
                       description="Parse and validate FILE; errors name the field, e.g. "
                                   "services[1].backends[0].port.")
    s.add_argument("--config", required=True, metavar="FILE", help="YAML config")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("drill", help="experiments that check the router's behaviour in a namespace testbed",
                       description="Self-contained experiments: each builds network namespaces of its own, "
                                   "deploys the router there, sends real traffic and removes everything again. "
                                   "Needs root; touches nothing outside the namespaces it makes.")
    drills = s.add_subparsers(dest="drill", metavar="DRILL", required=True)
    d = drills.add_parser("failover", help="silence one backend under a stream of new flows; measure the failover",
                          description="Build a testbed for one service of FILE (one namespace per backend; the "
                                      "config's addresses are replaced by the testbed's, names, weights, standby, "
                                      "tokens and health settings are kept), start backends and heartbeat agents, "
                                      "deploy the router, send new flows to the VIP at RATE, silence BACKEND a "
                                      "third into the run, and report detection and failover times, lost flows "
                                      "and flows that reached the dead backend late.")
    d.add_argument("--config", required=True, metavar="FILE", help="YAML config (see edge/edge.yaml)")
    d.add_argument("--backend", required=True, metavar="NAME", help="the backend to silence")
    d.add_argument("--mode", required=True, choices=("heartbeat", "link", "kill"),
                   help="heartbeat: stop its heartbeat agent; link: set its veth down; "
                        "kill: kill its server while heartbeats go on")
    d.add_argument("--service", metavar="NAME", help="the service to drill (default: the config's first)")
    d.add_argument("--rate", type=int, default=2000, metavar="PPS",
                   help="new flows per second, one packet each (default %(default)s)")
    d.add_argument("--duration", type=float, default=2.0, metavar="S",
                   help="seconds of traffic; the backend is silenced after a third (default %(default)s)")
    d.add_argument("--json", metavar="OUT", help="write the full report, every flow included, as JSON to OUT")
    d.add_argument("--plot", metavar="OUT.png",
                   help="draw the timeline (which backend got each flow) to OUT.png; needs matplotlib")
    d.set_defaults(func=cmd_drill_failover)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except EdgeError as e:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an unexpected failure is still reported as one line
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (run with --debug for details)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
