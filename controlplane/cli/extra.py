"""edgectl's fleet status (read from etcd, so it works with edged down), the failover drill,
and the shell completion scripts (generated from the parser by complete.py)."""

from __future__ import annotations

from controlplane.cli import nodeconf
from controlplane.cli.output import emit, progress
from controlplane.errors import ConfigError, EdgeError


def _fleet_of(args):
    from dataclasses import replace

    from controlplane.config import Fleet, load_config
    from controlplane.configkit import _etcd_prefix, _list_of, _server

    path = args.config or (None if args.etcd else nodeconf.config_path(None))
    fleet = load_config(path).node.fleet if path else None
    if path and fleet is None and not args.etcd:
        raise ConfigError(f"{path}: node.fleet: not set (this node is in no fleet)")
    if args.etcd:
        endpoints = _list_of(_server, empty=False)(args.etcd.split(","), "--etcd")
        fleet = replace(fleet, etcd=endpoints) if fleet else Fleet(etcd=endpoints, name="edgectl")
    if fleet is None:
        raise ConfigError("fleet status: give --config FILE (its node.fleet) or --etcd HOST:PORT")
    if args.prefix:
        fleet = replace(fleet, prefix=_etcd_prefix(args.prefix, "--prefix"))
    return fleet


def cmd_fleet_status(args) -> int:
    import asyncio

    from controlplane.fleet import etcdio, snapshot

    fleet = _fleet_of(args)
    try:
        status = asyncio.run(etcdio.read_status(fleet))
    except ConnectionError as e:
        raise EdgeError(str(e)) from None
    return emit(args, status, snapshot.format_status(status))


def cmd_drill_failover(args) -> int:
    from controlplane import drill
    from controlplane.config import load_config

    cfg = load_config(nodeconf.config_path(args.config, required=True))
    if args.plot:
        drill.require_matplotlib()
    plan = drill.Plan(
        backend=args.backend, mode=args.mode, rate=args.rate, duration_s=args.duration, service=args.service
    )
    report = drill.failover(cfg, plan, progress=progress(args))
    if args.json_out:
        drill.write_json(report, args.json_out)
    if args.plot:
        drill.write_plot(report, args.plot)
    return emit(args, report, drill.format_table(report))


def cmd_heartbeat_key(args) -> int:
    from controlplane.config import load_config
    from controlplane.discovery.tokens import heartbeat_key

    key = f"{heartbeat_key(load_config(nodeconf.config_path(args.config, required=True)), args.service, args.backend):#034x}"
    return emit(args, {"service": args.service, "backend": args.backend, "key": key}, key)


def cmd_completion(args) -> int:
    from controlplane.cli import complete
    from controlplane.cli.parser import build_parser

    print(complete.script(build_parser(), args.shell), end="")
    return 0
