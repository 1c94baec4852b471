"""edgectl's commands that work on this host whether edged runs or not: validate, diff
(and deploy --dry-run), deploy, undeploy, status. Each reads the node's config for pin_dir
and api_socket (nodeconf); status prefers edged's view when an edged answers."""

from __future__ import annotations

from controlplane import configdiff, statuspage, statusview
from controlplane.cli import nodeconf
from controlplane.cli.exits import REFUSED, UsageError
from controlplane.cli.output import PROG, emit, progress
from controlplane.errors import ConfigError, EdgeError, NotRunning


def _config_file(args) -> str:
    return nodeconf.config_path(args.config, required=True)


def _iface(args) -> str:
    """--iface, else node.iface of the node's config."""
    if args.iface:
        return args.iface
    iface = nodeconf._node(args).iface
    if not iface:
        raise ConfigError("--iface: not given, and the node's config sets no node.iface")
    return iface


def cmd_validate(args) -> int:
    import sys

    from controlplane.config import parse_config
    from controlplane.configkit import _load_yaml, collect_errors, read_config_text
    from controlplane.loader import mem_available
    from controlplane.maps import sizing

    path = _config_file(args)
    doc = _load_yaml(read_config_text(path), path)
    errors = collect_errors(lambda: parse_config(doc, path))
    if not errors:
        misfit = sizing.misfit(parse_config(doc, path).node, mem_available())  # the maps must fit the host
        errors = [misfit] if misfit else []
    if errors:
        if args.json:
            emit(args, {"config": path, "ok": False, "errors": errors}, "")
        else:
            for line in errors:
                print(f"{PROG}: {line}", file=sys.stderr)
            if len(errors) > 1:
                print(f"{PROG}: {path}: {len(errors)} errors", file=sys.stderr)
        return REFUSED
    cfg = parse_config(doc, path)
    backends = sum(len(s.backends) for s in cfg.services)
    pinned = sizing.node_bytes(cfg.node)
    return emit(
        args,
        {"config": path, "ok": True, "services": len(cfg.services), "backends": backends, "pinned_bytes": pinned},
        f"{path}: ok ({len(cfg.services)} services, {backends} backends; the maps pin {sizing.describe(pinned)})",
    )


def running(args, iface: str | None = None, view: statuspage.View | None = None) -> list[dict]:
    """Snapshots of what runs here: edged's view when one answers (and runs iface), else the
    pinned maps' (their walks within deploy.STATUS_WALK_S); view: the summaries or a page of
    backends (statuspage), as edged applies it or here to the maps'."""
    snaps = None if getattr(args, "maps", False) else _status_from_edged(args, iface, view)
    if snaps is None:
        from controlplane import deploy

        snaps = deploy.status(nodeconf.pin_dir(args), iface, count_conntrack=getattr(args, "conntrack", False))
        try:
            snaps = [statuspage.apply(snap, view) for snap in snaps] if view is not None else snaps
        except LookupError as e:
            raise EdgeError(str(e).strip("'\"")) from None
    return snaps


def _status_from_edged(args, iface: str | None, view: statuspage.View | None = None) -> list[dict] | None:
    import os

    from controlplane.cli.served import client

    if not args.api and not os.path.exists(nodeconf.api_socket(args)):
        return None
    try:
        with client(args) as edged:
            snap = edged.status(count_conntrack=getattr(args, "conntrack", False), view=view)
    except NotRunning:
        if args.api:
            raise
        return None
    if iface and snap["iface"] != iface:
        return None
    return [snap]


def cmd_diff(args) -> int:
    from controlplane.config import load_config

    path = _config_file(args)
    cfg = load_config(path)
    snaps = running(args, args.iface)
    d = configdiff.diff(configdiff.shape_of_status(snaps), configdiff.shape_of_config(cfg))
    where = ", ".join(s["iface"] or "?" for s in snaps) or "nothing deployed here"
    lines = configdiff.describe(d)
    text = "\n".join([f"{path} against what runs ({where}):"] + [f"  {line}" for line in lines or ["no changes"]])
    return emit(args, {"config": path, "running": [s["iface"] for s in snaps], "changed": bool(lines), **d}, text)


def cmd_deploy(args) -> int:
    if args.dry_run:
        return cmd_diff(args)
    from controlplane import deploy
    from controlplane.config import load_config

    path = _config_file(args)
    cfg = load_config(path)
    res = deploy.deploy(cfg, _iface(args), progress=progress(args))
    r = res.report
    verb = "updated" if res.updated else "deployed"
    changes = {
        "added_services": r.added_services,
        "removed_services": r.removed_services,
        "added_backends": r.added_backends,
        "removed_backends": r.removed_backends,
    }
    said = [f"{k.replace('_', ' ')}: {', '.join(v)}" for k, v in changes.items() if v and res.updated]
    text = (
        f"{verb} on {res.iface} (XDP {res.mode}, return path on {', '.join(res.return_ifaces)}): "
        f"{len(cfg.services)} services" + (f"; {'; '.join(said)}" if said else "")
    )
    return emit(
        args,
        {
            "result": verb,
            "iface": res.iface,
            "xdp_mode": res.mode,
            "return_ifaces": list(res.return_ifaces),
            "services": len(cfg.services),
            **changes,
        },
        text,
    )


def cmd_undeploy(args) -> int:
    from controlplane import deploy

    iface = _iface(args)
    done = deploy.undeploy(iface, nodeconf.pin_dir(args), progress=progress(args))
    return emit(
        args,
        {"iface": iface, "undeployed": done},
        f"undeployed from {iface}" if done else f"nothing deployed on {iface}",
    )


def cmd_status(args) -> int:
    view = statuspage.View(args.summary, args.full, args.service, args.offset, args.limit)
    try:
        view.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    snaps = [statusview.same_shape(snap) for snap in running(args, args.iface, view)]
    if args.json:
        return emit(args, snaps, "")
    if not snaps:
        print("nothing deployed in this network namespace")
        from controlplane import abi, loader

        for path in loader.other_abi_here(nodeconf.pin_dir(args)):
            print(
                f"  (pins of ABI {path.parent.name} at {path}: this edgectl uses v{abi.ABI_VERSION}; "
                f"migrate with 'edgectl undeploy --iface {path.name.rsplit('-', 1)[0]}' and deploy again)"
            )
        return 0
    for i, snap in enumerate(snaps):
        if i:
            print()
        statusview.print_status(snap)
    return 0
