"""edgectl's command line, as argparse definitions: every command, its flags and help. The
global flags (-q, --debug, --json) work before or after the command. complete.py generates
the bash and zsh completion from what is defined here."""

from __future__ import annotations

import argparse

from controlplane import __version__, limits
from controlplane.cli import conntrack, exits, extra, local, served
from controlplane.cli.nodeconf import DEFAULT_CONFIG, ENV_API_SOCKET, ENV_CONFIG, ENV_PIN_DIR
from controlplane.cli.output import PROG


def _globals(json: bool = True, suppress: bool = True) -> argparse.ArgumentParser:
    """-q, --debug (and --json): on the top parser with their defaults, and on every command
    with none (SUPPRESS), so a flag after the command sets the same value as one before it."""
    g = argparse.ArgumentParser(add_help=False)
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    g.add_argument("-q", "--quiet", action="store_true", default=default(False), help="no progress lines on stderr")
    g.add_argument(
        "--debug", action="store_true", default=default(False), help="show tracebacks and compiler output on errors"
    )
    if json:
        g.add_argument(
            "--json",
            action="store_true",
            default=default(False),
            help="print one JSON document on stdout (every command)",
        )
    return g


def _node_config(p, what: str = "the node's config, for node.pin_dir and node.api_socket") -> None:
    p.add_argument(
        "--config", metavar="FILE", help=f"{what} (default ${ENV_CONFIG}, else {DEFAULT_CONFIG} when it exists)"
    )


def _pin_dir(p) -> None:
    p.add_argument(
        "--pin-dir",
        help=f"bpffs directory of the pins (default ${ENV_PIN_DIR}, else node.pin_dir "
        f"of the node's config, else /sys/fs/bpf/edge)",
    )


def _api_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reaching edged")
    g.add_argument(
        "--socket",
        metavar="PATH",
        help=f"edged's API socket (default ${ENV_API_SOCKET}, else node.api_socket of the node's "
        f"config, else /run/edge/edged.sock)",
    )
    g.add_argument(
        "--api", metavar="HOST:PORT", help="reach edged over TCP instead; needs --cert, --key and --ca (mutual TLS)"
    )
    g.add_argument("--cert", metavar="FILE", help="client certificate (PEM) for --api")
    g.add_argument("--key", metavar="FILE", help="private key (PEM) of the client certificate")
    g.add_argument("--ca", metavar="FILE", help="CA certificate (PEM) that signed edged's certificate")
    g.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="give up on an answer after S seconds (default %(default)s)",
    )


def _served(sub, name: str, func, help: str, description: str, backend: bool = True, local_flag: bool = True):
    s = sub.add_parser(name, help=help, description=description, parents=[_globals()])
    if backend:
        s.add_argument("service", metavar="SERVICE", help="service name, as in the config")
        s.add_argument("backend", metavar="BACKEND", help="backend name within that service")
    if local_flag:
        s.add_argument(
            "--local",
            action="store_true",
            help="in a fleet: this node only (its table then differs from the other nodes')",
        )
    _node_config(s)
    _api_args(s)
    s.set_defaults(func=func)
    return s


def _local_commands(sub) -> None:
    s = sub.add_parser(
        "deploy",
        parents=[_globals()],
        help="load and attach the data path and program services",
        description="Compile and attach the XDP router on IFACE, attach the return path on the "
        "interfaces that route to the backends, and program the services of FILE. "
        "Run again with a changed FILE to update in place; connections are kept. "
        "On any error nothing is left behind.",
    )
    s.add_argument("--iface", help="client-facing interface that receives VIP traffic (default node.iface)")
    _node_config(s, "YAML config to deploy (see edge/edge.yaml)")
    s.add_argument("--dry-run", action="store_true", help="change nothing: print what would change (edgectl diff)")
    _pin_dir(s)
    _api_args(s)
    s.set_defaults(func=local.cmd_deploy, maps=False, conntrack=False)

    s = sub.add_parser(
        "diff",
        parents=[_globals()],
        help="what deploying or reloading FILE would change",
        description="Compare FILE with what runs here (edged's view, else the pinned maps): "
        "services, VIPs, backends and configured weights added, removed or changed. "
        "Changes nothing.",
    )
    s.add_argument("--iface", help="only the router deployed on this interface")
    _node_config(s, "YAML config to compare")
    _pin_dir(s)
    s.add_argument("--maps", action="store_true", help="compare with the pinned maps even when edged answers")
    _api_args(s)
    s.set_defaults(func=local.cmd_diff, conntrack=False, dry_run=True)

    s = sub.add_parser(
        "undeploy",
        parents=[_globals()],
        help="detach the data path and remove its pins",
        description="Detach XDP from IFACE and the return path from the backend-facing "
        "interfaces, and unpin the maps. The pins are looked for in the pin dir "
        "(--pin-dir, else the node's config) and, when not there, on every bpffs "
        "(a config may set its own node.pin_dir). Fails naming what it could not "
        "remove. Says so and exits 0 if nothing is deployed.",
    )
    s.add_argument("--iface", help="interface given to deploy (default node.iface)")
    _node_config(s)
    _pin_dir(s)
    s.set_defaults(func=local.cmd_undeploy)

    s = sub.add_parser(
        "status",
        parents=[_globals()],
        help="show services, backends, weights and counters",
        description="Show what is deployed in this network namespace: edged's view when an "
        "edged answers on its API socket (with its live RTT window, load and "
        "operator overrides), else what the pinned maps hold.",
    )
    s.add_argument("--iface", help="only the router deployed on this interface")
    s.add_argument(
        "--conntrack", action="store_true", help="also count conntrack entries (walks the table: slow when it is full)"
    )
    _node_config(s)
    _pin_dir(s)
    s.add_argument("--maps", action="store_true", help="read the pinned maps even when edged answers")
    s.add_argument(
        "--summary",
        action="store_true",
        default=None,
        help="per service only counts: backends up, down, draining, weights sum, failovers "
        "(the default above 256 backends)",
    )
    s.add_argument("--full", action="store_true", help="list every backend, whatever the size")
    s.add_argument("--service", default="", help="only this service")
    s.add_argument("--offset", type=int, default=0, help="list each service's backends from this one on (from 0)")
    s.add_argument("--limit", type=int, default=None, help="list at most this many backends per service")
    _api_args(s)
    s.set_defaults(func=local.cmd_status)

    s = sub.add_parser(
        "validate",
        parents=[_globals()],
        help="check a config file without touching the kernel",
        description="Parse and validate FILE and report every error, one line each, naming "
        "the field, e.g. services[1].backends[0].port.",
    )
    _node_config(s, "YAML config to check")
    s.set_defaults(func=local.cmd_validate)

    s = sub.add_parser(
        "conntrack",
        parents=[_globals()],
        help="list connections the data path tracks",
        description="List conntrack entries (client, VIP, backend, flags) from the pinned maps, "
        "at most --limit of them, like ipvsadm -Lnc.",
    )
    s.add_argument("--iface", help="only the router deployed on this interface")
    s.add_argument("--service", metavar="NAME", help="only connections of this service")
    s.add_argument("--backend", metavar="NAME", help="only connections to this backend")
    s.add_argument("--limit", type=int, default=1000, metavar="N", help="list at most N (default %(default)s)")
    _node_config(s)
    _pin_dir(s)
    s.set_defaults(func=conntrack.cmd_conntrack)


def _served_commands(sub) -> None:
    _served(
        sub,
        "drain",
        served.cmd_drain,
        "stop new flows to a backend (edged); established flows stay",
        "Ask edged to give BACKEND weight 0 until undrained: it gets no new flows, and its established "
        "flows stay where they are, until `edgectl undrain`. In a fleet (node.fleet) every node does so, "
        "unless --local.",
    )
    _served(
        sub,
        "undrain",
        served.cmd_undrain,
        "end an operator drain (edged)",
        "Ask edged to give BACKEND new flows again, with the weight its policy computes (or the pinned one, "
        "see `edgectl weight`). In a fleet this ends the fleet-wide drain; --local ends a drain made with "
        "--local.",
    )
    s = _served(
        sub,
        "drain-node",
        served.cmd_drain_node,
        "withdraw every VIP of this node from BGP (edged)",
        "Ask edged to withdraw every VIP from BGP: the upstream sends new flows to the other nodes; what "
        "still arrives here is forwarded. Ends with `edgectl undrain-node`; kept across edged restarts "
        "(undeploy ends it).",
        backend=False,
        local_flag=False,
    )
    s.set_defaults(drain_node=True)
    s = _served(
        sub,
        "undrain-node",
        served.cmd_drain_node,
        "announce this node's VIPs over BGP again (edged)",
        "End a node drain: every VIP with a usable backend is announced again.",
        backend=False,
        local_flag=False,
    )
    s.set_defaults(drain_node=False)
    s = _served(
        sub,
        "weight",
        served.cmd_weight,
        "pin a backend's weight, or clear the pin (edged)",
        "Ask edged to use a fixed weight for BACKEND instead of the one its policy computes, or with "
        "--clear to compute it again. The scale is the service's: under latency_inverse the best "
        "backend gets 10000, so a pin of 4 is in effect a drain. P% pins P percent of the largest "
        "weight among the service's backends now (50% = half the best's share of new flows); N pins "
        "N on that scale (0 stops new flows). The answer shows the pin as a share of the scale. In a "
        "fleet (node.fleet) every node does so, unless --local.",
    )
    s.add_argument(
        "weight", metavar="N|P%", nargs="?", help=f"the weight, {limits.WEIGHTS}, or P%% of the best backend's"
    )
    s.add_argument("--clear", action="store_true", help="remove the pinned weight")
    s = _served(
        sub,
        "reload",
        served.cmd_reload,
        "make edged read its config again, or apply FILE",
        "Ask edged to read its config file again (or to apply FILE, which edgectl checks, reads and "
        "sends) and apply the difference; established flows are kept. It prints what changed. An "
        "invalid config is refused with the reason (exit 1), and the running one stays. A config sent "
        "with --config is not written to edged's file: a restart of edged reads that file again.",
        backend=False,
        local_flag=False,
    )
    s = _served(
        sub,
        "events",
        served.cmd_events,
        "stream edged's events (state changes, weights, errors)",
        "Print edged's events as they happen, until Ctrl-C or --count events.",
        backend=False,
        local_flag=False,
    )
    s.add_argument(
        "--kind",
        action="append",
        metavar="K",
        help="only events of kind K (state, weights, error, deployed, ...); may be repeated",
    )
    s.add_argument("--count", type=int, metavar="N", help="stop after N events")
    s.add_argument(
        "--recent",
        type=int,
        default=0,
        metavar="N",
        help="first show up to N events from before the call (default %(default)s)",
    )


def _fleet_and_drill(sub) -> None:
    s = sub.add_parser(
        "fleet",
        help="the fleet this node is in (node.fleet), read from etcd",
        description="Fleet commands; they read etcd directly, so they work with edged down.",
    )
    fleet = s.add_subparsers(dest="fleet", metavar="COMMAND", required=True)
    d = fleet.add_parser(
        "status",
        parents=[_globals()],
        help="every node: snapshot version, serving, backends down, leader, report age",
        description="The leader, the current snapshot version and one line per node that "
        "reports (a node whose lease ran out is gone from the list).",
    )
    _node_config(d, "config whose node.fleet names etcd and the prefix")
    d.add_argument("--etcd", metavar="HOST:PORT[,...]", help="etcd endpoints (instead of, or over, the config's)")
    d.add_argument("--prefix", metavar="PREFIX", help="the fleet's key prefix (default the config's, or /edge/fleet/)")
    d.set_defaults(func=extra.cmd_fleet_status)

    s = sub.add_parser(
        "drill",
        help="experiments that check the router's behaviour in a namespace testbed",
        description="Self-contained experiments: each builds network namespaces of its own, "
        "deploys the router there, sends real traffic and removes everything again. "
        "Needs root; touches nothing outside the namespaces it makes.",
    )
    drills = s.add_subparsers(dest="drill", metavar="DRILL", required=True)
    d = drills.add_parser(
        "failover",
        parents=[_globals(json=False)],
        help="silence one backend under a stream of new flows; measure the failover",
        description="Build a testbed for one service of FILE (one namespace per backend; the "
        "config's addresses are replaced by the testbed's, names, weights, standby, "
        "tokens and health settings are kept), start backends and heartbeat agents, "
        "deploy the router, send new flows to the VIP at RATE, silence BACKEND a "
        "third into the run, and report detection and failover times, lost flows "
        "and flows that reached the dead backend late. `edgectl --json drill ...` "
        "prints the report as JSON.",
    )
    _node_config(d, "YAML config (see edge/edge.yaml)")
    d.add_argument("--backend", required=True, metavar="NAME", help="the backend to silence")
    d.add_argument(
        "--mode",
        required=True,
        choices=("heartbeat", "link", "kill"),
        help="heartbeat: stop its heartbeat agent; link: set its veth down; "
        "kill: kill its server while heartbeats go on",
    )
    d.add_argument("--service", metavar="NAME", help="the service to drill (default: the config's first)")
    d.add_argument(
        "--rate",
        type=int,
        default=2000,
        metavar="PPS",
        help="new flows per second, one packet each (default %(default)s)",
    )
    d.add_argument(
        "--duration",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds of traffic; the backend is silenced after a third (default %(default)s)",
    )
    d.add_argument(
        "--json", dest="json_out", metavar="OUT", help="write the full report, every flow included, as JSON to OUT"
    )
    d.add_argument(
        "--plot", metavar="OUT.png", help="draw the timeline (which backend got each flow) to OUT.png; needs matplotlib"
    )
    d.set_defaults(func=extra.cmd_drill_failover)

    s = sub.add_parser(
        "heartbeat-key",
        parents=[_globals()],
        help="print one backend's heartbeat key, for its agent's --token-file",
        description="Print the heartbeat key of one backend of a service: its token in the "
        "config, or for a discovered backend the key derived from the service's "
        "discovery.token_secret_file. Give each agent only its own key.",
    )
    _node_config(s, "the config naming the service")
    s.add_argument("--service", required=True, metavar="NAME")
    s.add_argument(
        "--backend",
        required=True,
        metavar="ADDR:PORT",
        help="the backend's address and service port (a discovered one need not be in the config)",
    )
    s.set_defaults(func=extra.cmd_heartbeat_key)

    s = sub.add_parser(
        "completion",
        parents=[_globals(json=False)],
        help="print a shell completion script",
        description="Print the completion script for SHELL, generated from edgectl's own "
        "definitions. bash: edgectl completion bash > /etc/bash_completion.d/edgectl; "
        'zsh: edgectl completion zsh > "${fpath[1]}/_edgectl".',
    )
    s.add_argument("shell", choices=("bash", "zsh"))
    s.set_defaults(func=extra.cmd_completion)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        parents=[_globals(suppress=False)],
        epilog=exits.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Operate the edge router: an XDP load balancer for GPU inference backends. Commands read "
        f"the node's config (--config, ${ENV_CONFIG}, else {DEFAULT_CONFIG}) for node.pin_dir and "
        "node.api_socket.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _local_commands(sub)
    _served_commands(sub)
    _fleet_and_drill(sub)
    return p
