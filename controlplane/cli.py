"""edgectl: the operator's CLI. One small function per subcommand; errors are
one line on stderr (`edgectl: <what>`) with a non-zero exit, and a traceback
only with --debug. Commands that act on a running edged (drain, undrain,
drain-node, undrain-node, weight, reload, events, and status when edged answers) go through
controlplane.api.client. Run `edgectl --help` or `edgectl COMMAND --help`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from controlplane import __version__, limits, statusview
from controlplane.errors import EdgeError, NotRunning, say

PROG = "edgectl"


def _progress(args) -> callable:
    def say(line: str) -> None:
        if not args.quiet:
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    return say


def cmd_validate(args) -> int:
    from controlplane.config import load_config
    from controlplane.loader import mem_available
    from controlplane.maps import sizing

    cfg = load_config(args.config)
    if misfit := sizing.misfit(cfg.node, mem_available()):
        raise EdgeError(misfit)
    backends = sum(len(s.backends) for s in cfg.services)
    print(f"{args.config}: ok ({len(cfg.services)} services, {backends} backends; "
          f"the maps pin {sizing.describe(sizing.node_bytes(cfg.node))})")
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


def _status_from_edged(args) -> list[dict] | None:
    """edged's snapshot when an edged answers (and runs the --iface asked for), else None."""
    if not args.api and not os.path.exists(args.socket):
        return None
    try:
        with _client(args) as edged:
            snap = edged.status(count_conntrack=args.conntrack)
    except NotRunning:
        if args.api:
            raise
        return None
    if args.iface and snap["iface"] != args.iface:
        return None
    return [snap]


def cmd_status(args) -> int:
    snaps = None if args.maps else _status_from_edged(args)
    if snaps is None:
        from controlplane import deploy

        snaps = deploy.status(args.pin_dir, args.iface, count_conntrack=args.conntrack)
    if args.json:
        json.dump(snaps, sys.stdout, indent=2)
        print()
        return 0
    if not snaps:
        print("nothing deployed in this network namespace")
        from controlplane import abi, loader

        for path in loader.other_abi_here(args.pin_dir):
            print(f"  (pins of ABI {path.parent.name} at {path}: this edgectl uses v{abi.ABI_VERSION}; "
                  f"migrate with 'edgectl undeploy --iface {path.name.rsplit('-', 1)[0]}' and deploy again)")
        return 0
    for i, snap in enumerate(snaps):
        if i:
            print()
        statusview.print_status(snap)
    return 0


# ---------------------------------------------------------------- commands served by edged


def _client(args):
    """A client of the edged that --socket or --api (with --cert, --key, --ca) names."""
    from controlplane.api.client import Client, Tls

    if args.api:
        missing = [f"--{name}" for name in ("cert", "key", "ca") if not getattr(args, name)]
        if missing:
            raise EdgeError(f"--api needs {', '.join(missing)} (edged serves TCP with mutual TLS only)")
        return Client(api=args.api, tls=Tls(args.cert, args.key, args.ca), timeout_s=args.timeout)
    if args.cert or args.key or args.ca:
        raise EdgeError("--cert, --key and --ca go with --api (the unix socket needs no TLS)")
    return Client(args.socket, timeout_s=args.timeout)


def _scope(scope: str, local: bool) -> str:
    """How far an operator action reached, as edged answered: the fleet, or this node."""
    fleet = " on every node of the fleet (the leader's next snapshot applies it)"
    return fleet if scope == "fleet" else (" on this node only" if local else "")


def cmd_drain(args) -> int:
    with _client(args) as edged:
        scope = edged.drain(args.service, args.backend, local=args.local)
    print(f"drained {args.service}/{args.backend}{_scope(scope, args.local)}: no new flows; established flows stay")
    return 0


def cmd_undrain(args) -> int:
    with _client(args) as edged:
        scope = edged.undrain(args.service, args.backend, local=args.local)
    print(f"undrained {args.service}/{args.backend}{_scope(scope, args.local)}")
    return 0


def cmd_drain_node(args) -> int:
    with _client(args) as edged:
        got = edged.drain_node(args.drain_node)
    for vip, why in sorted(got["withdrawn"].items()):
        print(f"{vip}: withdrawn ({why})")
    for vip in got["announced"]:
        print(f"{vip}: announced")
    return 0


def cmd_weight(args) -> int:
    if (args.weight is None) == (not args.clear):
        raise EdgeError(f"weight: give either N ({limits.WEIGHTS}) or --clear")
    if args.weight is not None and not limits.is_weight(args.weight):
        raise EdgeError(f"weight: {args.weight} is out of range {limits.WEIGHTS}")
    with _client(args) as edged:
        scope = _scope(edged.set_weight(args.service, args.backend, args.weight, local=args.local), args.local)
    if args.clear:
        print(f"{args.service}/{args.backend}: weight override cleared{scope}")
    else:
        print(f"{args.service}/{args.backend}: weight pinned at {args.weight}{scope}")
    return 0


RELOAD_CHANGES = (("added_services", "services added"), ("removed_services", "services removed"),
                  ("updated_services", "services updated"), ("added_backends", "backends added"),
                  ("removed_backends", "backends removed"), ("draining_backends", "backends draining"))


def cmd_reload(args) -> int:
    from controlplane.config import read_config_text

    # edged reads no file a client names: the text goes in the request
    text = read_config_text(args.config) if args.config else None
    with _client(args) as edged:
        summary = edged.reload(text)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
        return 0
    changes = [f"{label}: {', '.join(summary[key])}" for key, label in RELOAD_CHANGES if summary.get(key)]
    print("reloaded: " + ("; ".join(changes) if changes else "no changes"))
    return 0


def _fmt_event(event: dict) -> str:
    t = event.get("t") or 0.0
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
    return f"{stamp}  {event.get('kind', '?'):<9} {event.get('text', '')}"


def cmd_events(args) -> int:
    if args.count is not None and args.count < 1:
        raise EdgeError(f"--count: {args.count} is not a positive number")
    with _client(args) as edged:
        stream = edged.events(tuple(args.kind or ()), args.recent)
        interrupted = []

        def on_ctrl_c(signum, frame):
            # Ctrl-C is how a watch ends: cancel the call and let the loop end by itself.
            # A KeyboardInterrupt raised anywhere inside grpc's iterator could leave it
            # holding a lock, and closing the channel would then wait for ever.
            interrupted.append(signum)
            signal.signal(signal.SIGINT, previous)  # a second Ctrl-C interrupts as usual
            stream.cancel()

        previous = signal.signal(signal.SIGINT, on_ctrl_c)
        seen = 0
        try:
            for event in stream:
                print(json.dumps(event, sort_keys=True) if args.json else _fmt_event(event), flush=True)
                seen += 1
                if args.count and seen >= args.count:
                    return 0
        except KeyboardInterrupt:  # a second Ctrl-C
            return 0
        except BrokenPipeError:  # `edgectl events | head`: the reader is gone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        finally:
            if signal.getsignal(signal.SIGINT) is on_ctrl_c:
                signal.signal(signal.SIGINT, previous)
            stream.close()
        if interrupted:
            return 0
    raise EdgeError("edged ended the event stream (it is stopping)")


def cmd_fleet_status(args) -> int:
    import asyncio
    from dataclasses import replace

    from controlplane.config import Fleet, load_config
    from controlplane.configkit import _etcd_prefix, _list_of, _server
    from controlplane.errors import ConfigError
    from controlplane.fleet import member, snapshot

    fleet = load_config(args.config).node.fleet if args.config else None
    if args.config and fleet is None:
        raise ConfigError(f"{args.config}: node.fleet: not set (this node is in no fleet)")
    if args.etcd:
        endpoints = _list_of(_server, empty=False)(args.etcd.split(","), "--etcd")
        fleet = replace(fleet, etcd=endpoints) if fleet else Fleet(etcd=endpoints, name="edgectl")
    if fleet is None:
        raise ConfigError("fleet status: give --config FILE (its node.fleet) or --etcd HOST:PORT")
    if args.prefix:
        fleet = replace(fleet, prefix=_etcd_prefix(args.prefix, "--prefix"))
    try:
        status = asyncio.run(member.read_status(fleet))
    except ConnectionError as e:
        raise EdgeError(str(e)) from None
    print(json.dumps(status, indent=1) if args.json else snapshot.format_status(status))
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


def default_api_socket() -> str:
    from controlplane.config import Node

    return os.environ.get("EDGE_API_SOCKET", Node().api_socket)


def _api_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reaching edged")
    g.add_argument("--socket", metavar="PATH", default=default_api_socket(),
                   help="edged's API socket (default %(default)s; env EDGE_API_SOCKET)")
    g.add_argument("--api", metavar="HOST:PORT",
                   help="reach edged over TCP instead; needs --cert, --key and --ca (mutual TLS)")
    g.add_argument("--cert", metavar="FILE", help="client certificate (PEM) for --api")
    g.add_argument("--key", metavar="FILE", help="private key (PEM) of the client certificate")
    g.add_argument("--ca", metavar="FILE", help="CA certificate (PEM) that signed edged's certificate")
    g.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="give up on an answer after S seconds (default %(default)s)")


def _local_arg(p) -> None:
    p.add_argument("--local", action="store_true",
                   help="in a fleet: this node only (its table then differs from the other nodes')")


def _backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("service", metavar="SERVICE", help="service name, as in the config")
    p.add_argument("backend", metavar="BACKEND", help="backend name within that service")


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
                                   "interfaces, and unpin the maps. The pins are looked for in --pin-dir and, "
                                   "when not there, on every bpffs (a config may set its own node.pin_dir). "
                                   "Fails naming what it could not remove. Says so and exits 0 if nothing "
                                   "is deployed.")
    s.add_argument("--iface", required=True, help="interface given to deploy")
    s.add_argument("--pin-dir", default=default_pin_dir(), help="bpffs directory of the pins (default %(default)s)")
    s.set_defaults(func=cmd_undeploy)

    s = sub.add_parser("status", help="show services, backends, weights and counters",
                       description="Show what is deployed in this network namespace: edged's view when an "
                                   "edged answers on its API socket (with its live RTT window, load and "
                                   "operator overrides), else what the pinned maps hold.")
    s.add_argument("--iface", help="only the router deployed on this interface")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--conntrack", action="store_true",
                   help="also count conntrack entries (walks the table: slow when it is full)")
    s.add_argument("--pin-dir", default=default_pin_dir(), help="bpffs directory of the pins (default %(default)s)")
    s.add_argument("--maps", action="store_true", help="read the pinned maps even when edged answers")
    _api_args(s)
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("drain", help="stop new flows to a backend (edged); established flows stay",
                       description="Ask edged to give BACKEND weight 0 until undrained: it gets no new flows, "
                                   "and its established flows stay where they are, until `edgectl undrain`. "
                                   "In a fleet (node.fleet) every node does so, unless --local.")
    _backend_args(s)
    _local_arg(s)
    _api_args(s)
    s.set_defaults(func=cmd_drain)

    s = sub.add_parser("undrain", help="end an operator drain (edged)",
                       description="Ask edged to give BACKEND new flows again, with the weight its policy "
                                   "computes (or the pinned one, see `edgectl weight`). In a fleet this ends "
                                   "the fleet-wide drain; --local ends a drain made with --local.")
    _backend_args(s)
    _local_arg(s)
    _api_args(s)
    s.set_defaults(func=cmd_undrain)

    s = sub.add_parser("drain-node", help="withdraw every VIP of this node from BGP (edged, node.bgp)",
                       description="Ask edged to withdraw every VIP from BGP: the upstream sends new flows to "
                                   "the other nodes; what still arrives here is forwarded. Ends with "
                                   "`edgectl undrain-node`; kept across edged restarts (undeploy ends it).")
    _api_args(s)
    s.set_defaults(func=cmd_drain_node, drain_node=True)

    s = sub.add_parser("undrain-node", help="announce this node's VIPs over BGP again (edged)",
                       description="End a node drain: every VIP with a usable backend is announced again.")
    _api_args(s)
    s.set_defaults(func=cmd_drain_node, drain_node=False)

    s = sub.add_parser("weight", help="pin a backend's weight, or clear the pin (edged)",
                       description="Ask edged to use weight N for BACKEND instead of the one its policy "
                                   "computes (0 stops new flows), or with --clear to compute it again. "
                                   "In a fleet (node.fleet) every node does so, unless --local.")
    _backend_args(s)
    _local_arg(s)
    s.add_argument("weight", metavar="N", type=int, nargs="?", help=f"the weight, {limits.WEIGHTS}")
    s.add_argument("--clear", action="store_true", help="remove the pinned weight")
    _api_args(s)
    s.set_defaults(func=cmd_weight)

    s = sub.add_parser("reload", help="make edged read its config again",
                       description="Ask edged to read its config file again (or to apply FILE, which "
                                   "edgectl reads and sends) and apply the difference; established flows "
                                   "are kept. An invalid config is refused with the reason, and the running "
                                   "one stays. A config sent with --config is not written to edged's file: "
                                   "a SIGHUP or a restart of edged reads that file again.")
    s.add_argument("--config", metavar="FILE",
                   help="a config file here, at most 1 MiB; its text is sent to edged")
    s.add_argument("--json", action="store_true", help="print what changed as JSON")
    _api_args(s)
    s.set_defaults(func=cmd_reload)

    s = sub.add_parser("events", help="stream edged's events (state changes, weights, errors)",
                       description="Print edged's events as they happen, until Ctrl-C or --count events.")
    s.add_argument("--kind", action="append", metavar="K",
                   help="only events of kind K (state, weights, error, deployed, ...); may be repeated")
    s.add_argument("--count", type=int, metavar="N", help="stop after N events")
    s.add_argument("--recent", type=int, default=0, metavar="N",
                   help="first show up to N events from before the call (default %(default)s)")
    s.add_argument("--json", action="store_true", help="one JSON object per line")
    _api_args(s)
    s.set_defaults(func=cmd_events)

    s = sub.add_parser("validate", help="check a config file without touching the kernel",
                       description="Parse and validate FILE; errors name the field, e.g. "
                                   "services[1].backends[0].port.")
    s.add_argument("--config", required=True, metavar="FILE", help="YAML config")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("fleet", help="the fleet this node is in (node.fleet), read from etcd",
                       description="Fleet commands; they read etcd directly, so they work with edged down.")
    fleet = s.add_subparsers(dest="fleet", metavar="COMMAND", required=True)
    d = fleet.add_parser("status", help="every node: snapshot version, serving, backends down, leader, report age",
                         description="The leader, the current snapshot version and one line per node that "
                                     "reports (a node whose lease ran out is gone from the list).")
    d.add_argument("--config", metavar="FILE", help="config whose node.fleet names etcd and the prefix")
    d.add_argument("--etcd", metavar="HOST:PORT[,...]", help="etcd endpoints (instead of, or over, the config's)")
    d.add_argument("--prefix", metavar="PREFIX", help="the fleet's key prefix (default the config's, or /edge/fleet/)")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_fleet_status)

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
        say(PROG, e, args.debug)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an unexpected failure is still reported as one line
        say(PROG, f"internal error: {type(e).__name__}: {e} (run with --debug for details)", args.debug)
        return 2


if __name__ == "__main__":
    sys.exit(main())
