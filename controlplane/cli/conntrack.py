"""`edgectl conntrack`: the connections the data path tracks (edge_ct, then edge_ct6), read from the pinned
maps, at most --limit of them and filtered by service and backend, like `ipvsadm -Lnc`."""

from __future__ import annotations

import time

from controlplane.cli import nodeconf
from controlplane.cli.exits import UsageError
from controlplane.cli.output import emit
from controlplane.errors import EdgeError

WALK_S = 10.0  # a walk of a full table stops here, saying so


def _names(maps) -> tuple[dict[int, str], dict[int, str]]:
    """(VIP id -> service, backend id -> backend) of what is deployed."""
    services, backends = {}, {}
    for name in maps._services_in_maps():
        vid, bids = maps.ids(name)
        services[vid] = name
        backends.update({bid: b for b, bid in bids.items()})
    return services, backends


def _filters(maps, args) -> tuple[int | None, int | None]:
    if not args.service:
        if args.backend:
            raise UsageError("--backend goes with --service (backend names are per service)")
        return None, None
    vid, bids = maps.ids(args.service)
    if args.backend and args.backend not in bids:
        raise EdgeError(
            f"--backend: no backend {args.backend!r} in service {args.service} (have: {', '.join(sorted(bids))})"
        )
    return vid, bids.get(args.backend) if args.backend else None


def entries(maps, args, limit: int, deadline_ns: int) -> tuple[list[dict], bool]:
    vid, bid = _filters(maps, args)
    found, complete = maps.conntrack(limit, vid, bid, deadline_ns)
    services, backends = _names(maps)
    for e in found:
        e["service"] = services.get(e["vip_id"], "?")
        e["backend"] = backends.get(e["backend_id"], "?")
    return found, complete


def _table(rows: list[dict], complete: bool, limit: int) -> str:
    head = ("pro", "client", "vip", "service", "backend", "flags")
    lines = [head] + [
        (r["protocol"].upper(), r["client"], r["vip"], r["service"], r["backend"], ",".join(r["flags"]) or "-")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    more = "" if complete else f" (stopped at --limit {limit} or after {WALK_S:g} s: there are more)"
    return "\n".join(text + [f"{len(rows)} entries{more}"])


def cmd_conntrack(args) -> int:
    from controlplane import deploy, loader

    if args.limit < 1:
        raise UsageError(f"--limit: {args.limit} is not a positive number")
    pin_dir = nodeconf.pin_dir(args)
    loader.check_bpffs(pin_dir)
    names = [loader.instance_name(args.iface)] if args.iface else loader.instances_here(pin_dir)
    rows, complete = [], True
    deadline_ns = time.monotonic_ns() + int(WALK_S * 1e9)
    for name in names:
        loaded = loader.open_pinned(loader.instance_dir(pin_dir, name))
        try:
            maps = deploy.open_maps(loaded)
            try:
                got, done = entries(maps, args, args.limit - len(rows), deadline_ns)
            finally:
                maps.close()
        finally:
            loaded.close()
        rows += got
        complete = complete and done
    if not names:
        return emit(
            args, {"entries": [], "complete": True, "limit": args.limit}, "nothing deployed in this network namespace"
        )
    return emit(args, {"entries": rows, "complete": complete, "limit": args.limit}, _table(rows, complete, args.limit))
