"""What deploy, undeploy and status do to a node: the all-or-nothing sequence
that wires config, loader and maps together. Each step that changes the node
pushes its undo together with the change (a Ctrl-C waits for the pair:
interrupts.uninterrupted), so a failed or interrupted deploy leaves the node as it
was. Undeploy finds the pins wherever a deploy put them. Holds no packet logic
and no map layouts (maps.py), imports no bcc (loader.py; the compile runs in a child,
compilechild.py, so bcc never lives in this process), and no locks or marks (nodelock.py).
edgectl and edged call the same functions."""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from controlplane import abi, compilechild, loader
from controlplane.config import Config
from controlplane.errors import ConfigError, EdgeError, LoaderError, MapError, NotDeployed
from controlplane.interrupts import uninterrupted
from controlplane.maps import Maps, sizing
from controlplane.nodelock import (  # noqa: F401  (re-exported: edged and tests use them as deploy.*)
    LOCK_DIR_ENV,
    WRITE_WAIT_S,
    NodeLock,
    holder,
    node_drain,
    owned,
    remove_locks,
    set_node_drain,
    set_undeployed,
    undeployed_at,
)
from controlplane.pinsearch import pin_dirs_holding
from controlplane.returnpath import apply_on_new_links, attach_replies, detach_reply  # noqa: F401  (re-exported)

# `edgectl status` without edged walks the maps within this, as `edgectl conntrack` (a 16M
# conntrack counts in about 30 s); edged's walks have edged/status.py's WALK_DEADLINE_S
STATUS_WALK_S = 10.0

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class DeployResult:
    iface: str
    instance: str
    pin_path: Path
    mode: str
    updated: bool  # True when it replaced a deployment already there
    return_ifaces: tuple[str, ...]
    report: object
    held: loader.Pinned | None = None  # with hold=True: the open data path; the caller closes it
    maps: Maps | None = None
    reply_ifindex: tuple[int, ...] = ()  # return interfaces running the XDP fast path of replies


def adopted(maps: Maps, cfg: Config) -> Config:
    """cfg with the weights the deployed tables were built with, for services and
    backends already there whose weights are computed (policy other than static).
    A restarted edged programs this instead of cfg, so no weight jumps back to
    the configured one. A configured weight 0 (drain) still wins."""
    deployed = {}
    for s in cfg.services:
        if s.weights.policy == "static":
            continue
        try:
            deployed[s.name] = maps.weights(s.name)
        except MapError:
            continue  # a new service: configured weights
    if not deployed:
        return cfg
    services = []
    for s in cfg.services:
        now = deployed.get(s.name, {})
        backends = tuple(replace(b, weight=now[b.name]) if b.name in now and b.weight != 0 else b for b in s.backends)
        services.append(replace(s, backends=backends))
    return replace(cfg, services=tuple(services))


def params_of(cfg: Config) -> loader.Params:
    return loader.Params.of(cfg.node)


def open_maps(loaded: loader.Pinned | loader.Loaded) -> Maps:
    """Maps over a compiled instance, sized by its node record when it has one."""
    return Maps.sized_by_node(
        loaded.tables(), loaded.map_fd(abi.MAP_MAGLEV), loaded.params.maglev_m, loaded.params.max_services
    )


def backend_routes(cfg: Config) -> dict:
    """Egress ifindex towards every backend address; ConfigError naming one
    without a route."""
    found = loader.route_oifs(str(b.address) for s in cfg.services for b in s.backends)
    oifs = {}
    for i, s in enumerate(cfg.services):
        for j, b in enumerate(s.backends):
            if b.address in oifs:
                continue
            oif = found[str(b.address)]
            if oif is None:
                raise ConfigError(
                    f"services[{i}].backends[{j}].address: no route to {b.address} ({s.name}/{b.name}) from this node"
                )
            oifs[b.address] = oif
    return oifs


def _check_sizes(maps: Maps, cfg: Config) -> None:
    node = maps.node()
    if not node["maglev_m"]:
        return
    for key in ("maglev_m", "max_services", "max_backends", "ct_size"):
        want, have = getattr(cfg.node, key), node[key]
        if want != have:
            raise ConfigError(f"node.{key}: {want} differs from the deployed {have}; undeploy first to resize the maps")


def make_pin_path(pin_path: Path, undo: loader.Undo) -> None:
    """pin_path and its missing parents. Another instance of this host may deploy at the same
    time and make a shared parent (the ABI's directory) first: that is no error. undo removes
    what this call made: the instance's directory with its pins, a parent only while empty."""
    for d in reversed([pin_path, *pin_path.parents]):
        if d.exists():
            continue
        try:
            d.mkdir()
        except FileExistsError:
            continue  # made just now by the other instance
        if d == pin_path:
            undo.push(f"remove {d}", lambda d=d: loader.remove_pins(d))
        else:
            undo.push(f"remove {d}", lambda d=d: _rmdir_if_empty(d))


def _rmdir_if_empty(d: Path) -> None:
    try:
        d.rmdir()
    except OSError as e:
        if e.errno != errno.ENOTEMPTY:
            raise


@dataclass
class _Target:
    """Where a deploy goes and what is there already (checked before anything changes)."""

    iface: str
    ingress: int
    instance: str
    pin_path: Path
    updating: bool  # our ingress program runs there: update in place
    routes: dict
    return_oifs: list[int]


@dataclass
class _Loaded:
    """A compiled data path with its maps and programs, not attached yet."""

    loaded: loader.Pinned
    maps: Maps
    xdp: object
    tc: object
    reply: object | None


def deploy(
    cfg: Config,
    iface: str,
    progress: Progress = quiet,
    adopt_weights: bool = False,
    hold: bool = False,
    amend: Callable[[Maps, Config], Config] | None = None,
    lock: NodeLock | None = None,
    cancel: compilechild.Cancel | None = None,
) -> DeployResult:
    """Loads, attaches and programs the data path on iface, or changes nothing. Refused
    while edged (or another deploy) owns the router; lock: the caller's own owner NodeLock,
    held together with the write lock (edged), else both are taken here.
    adopt_weights: keep the computed weights already in the tables (see adopted()).
    hold: return the open data path and maps in the result instead of closing them.
    amend: when a deployment is there already, amend(maps, cfg) gives what to program
    instead of cfg (edged keeps backends that are still draining out).
    cancel: ends the compile from another thread (errors.Cancelled, all undone)."""
    if lock is not None:
        return _deploy(cfg, iface, progress, adopt_weights, hold, amend, cancel)
    instance = loader.instance_name(iface)
    owner, write = NodeLock(instance, iface), NodeLock(instance, iface, "write", WRITE_WAIT_S)
    with owner, write:
        try:
            return _deploy(cfg, iface, progress, adopt_weights, hold, amend, cancel)
        except BaseException:
            if not loader.instance_dir(cfg.node.pin_dir, instance).exists():  # nothing is deployed
                write.release(remove=True)
                owner.release(remove=True)
            raise


def _deploy(
    cfg: Config,
    iface: str,
    progress: Progress,
    adopt_weights: bool,
    hold: bool,
    amend: Callable[[Maps, Config], Config] | None,
    cancel: compilechild.Cancel | None = None,
) -> DeployResult:
    t = _target(cfg, iface)
    undo = loader.Undo()
    got = None
    try:
        got = _load(cfg, t, undo, progress, cancel)
        old_node = got.maps.node() if t.updating else None
        applied = _amended(cfg, t, got.maps, amend)
        progress(f"programming {len(cfg.services)} services")
        report = got.maps.apply(adopted(got.maps, applied) if t.updating and adopt_weights else applied, t.routes)
        result = _attach(cfg, t, got, old_node, undo, progress, report)
        if not hold:
            got.maps.close()
    except BaseException as e:
        with uninterrupted():
            failed = undo.rollback()
            if got is not None:
                got.loaded.close()
        if failed and isinstance(e, EdgeError):
            raise type(e)(f"{e} (and undo failed: {failed[0]})") from e
        raise
    if not hold:
        got.loaded.close()
    undo.forget()
    set_undeployed(t.instance, False)  # deployed again: a running edged's watch repairs again
    if hold:
        return replace(result, held=got.loaded, maps=got.maps)
    return result


def _runs_return_path(index: int) -> bool:
    """Whether interface index runs a router's return path (edge_return on clsact ingress)."""
    return loader.has_clsact(index) and (loader.return_filter(index) or "").startswith(abi.PROG_RETURN)


def _target(cfg: Config, iface: str) -> _Target:
    """What deploying cfg on iface means here; raises (changing nothing) when it cannot be done."""
    pin_dir = cfg.node.pin_dir
    loader.check_bpffs(pin_dir)
    ingress = loader.ifindex(iface)
    routes = backend_routes(cfg)
    v6 = [i for i, s in enumerate(cfg.services) if s.vip.version == 6]
    if v6 and not loader.ipv6_forwarding():  # bpf_fib_lookup of IPv6 answers "forwarding disabled"
        raise ConfigError(
            f"services[{v6[0]}].vip: an IPv6 VIP needs net.ipv6.conf.all.forwarding=1 (the data path's "
            "FIB lookups); set it and deploy again"
        )
    return_oifs = list(dict.fromkeys(routes.values()))
    if len(return_oifs) > abi.MAX_RETURN_IFACES:
        raise ConfigError(
            f"services: backends sit behind {len(return_oifs)} interfaces; at most {abi.MAX_RETURN_IFACES}"
        )
    current = loader.xdp_state(ingress)
    # a router's backend-facing interface runs its return path on tc, and with node.reply_xdp
    # (not off) its reply path on XDP: taking it over would break the router it serves
    reply = current.name == abi.PROG_REPLY if current else _runs_return_path(ingress)
    if reply:
        runs = f"reply path, {abi.PROG_REPLY}" if current else f"return path, {abi.PROG_RETURN}, on tc ingress"
        raise LoaderError(
            f"{iface} is a backend-facing interface of the router deployed here (it runs its "
            f"{runs}); deploy on the client-facing interface ('edgectl status' names it), and leave {iface} as it is"
        )
    if current and current.name != abi.PROG_INGRESS:
        raise LoaderError(
            f"{iface} already runs XDP program '{current.name}' (id {current.prog_id}), "
            f"which is not the router's; remove it first ('ip link set dev {iface} xdp off')"
        )
    instance = loader.instance_name(iface)
    pin_path = loader.instance_dir(pin_dir, instance)
    other = loader.other_abi_pins(pin_dir, instance)
    if other and not pin_path.exists():
        # Reading maps of another layout would misread every entry: refuse, say how to move on.
        raise LoaderError(
            f"{iface}: the data path pinned at {other[0]} has ABI {other[0].parent.name}, this build uses "
            f"v{abi.ABI_VERSION}; migrate with 'edgectl undeploy --iface {iface}' (removes the old version; "
            f"its connections reset) and deploy again"
        )
    loader.check_pin_dir(pin_dir, pin_path)
    if not pin_path.exists() and (misfit := sizing.misfit(cfg.node, loader.mem_available())):
        raise ConfigError(misfit)  # an update's maps are in memory already
    if current is not None and not pin_path.exists():
        raise LoaderError(
            f"{iface} runs {abi.PROG_INGRESS} but {pin_path} has no pins; run 'edgectl undeploy --iface {iface}' first"
        )
    return _Target(iface, ingress, instance, pin_path, current is not None, routes, return_oifs)


def has_ipv6(cfg: Config) -> bool:
    """Whether any service of cfg has an IPv6 VIP (the data path then loads its IPv6 programs)."""
    return any(s.vip.version == 6 for s in cfg.services)


def ipv6_loaded(pinned) -> bool:
    """Whether the deployed data path has its IPv6 ingress in edge_tails."""
    try:
        pinned.table(abi.MAP_TAILS)[abi.TAIL_V6]
    except KeyError:
        return False
    return True


def _load(
    cfg: Config, t: _Target, undo: loader.Undo, progress: Progress, cancel: compilechild.Cancel | None = None
) -> _Loaded:
    """Compiles the data path (pinning its maps at t.pin_path) and loads its programs."""
    with uninterrupted():
        make_pin_path(t.pin_path, undo)
    progress(
        f"compiling the data path (M={cfg.node.maglev_m}, {cfg.node.max_services} services, "
        f"{cfg.node.max_backends} backends)"
    )
    progs = [(abi.PROG_INGRESS, "xdp"), (abi.PROG_RETURN, "tc")]
    if cfg.node.reply_xdp != "off":
        progs.append((abi.PROG_REPLY, "xdp"))
    # bcc and LLVM live in a child; the IPv6 programs are verified only for a config that has IPv6
    loaded = compilechild.build(t.pin_path, params_of(cfg), progs, ipv6=has_ipv6(cfg), cancel=cancel)
    try:
        maps = open_maps(loaded)
        _check_sizes(maps, cfg)
        reply = loaded.load(abi.PROG_REPLY, "xdp") if cfg.node.reply_xdp != "off" else None
        return _Loaded(loaded, maps, loaded.load(abi.PROG_INGRESS, "xdp"), loaded.load(abi.PROG_RETURN, "tc"), reply)
    except BaseException:
        loaded.close()
        raise


def _amended(cfg: Config, t: _Target, maps: Maps, amend) -> Config:
    """What to program: cfg, or amend(maps, cfg) over a deployment already there (which may
    move the return path: t's routes follow)."""
    if not (t.updating and amend is not None):
        return cfg
    applied = amend(maps, cfg)
    if applied is not cfg:
        t.routes = backend_routes(applied)
        t.return_oifs = list(dict.fromkeys(t.routes.values()))
    return applied


def _attach(
    cfg: Config, t: _Target, got: _Loaded, old_node: dict | None, undo: loader.Undo, progress: Progress, report
) -> DeployResult:
    """Forwarding, the return path, the replies' fast path and the ingress program, then the
    node record saying what was made (for undeploy)."""
    forward_was = _forwarding(old_node, undo, progress)
    added = _return_path(t, got.tc, old_node, undo)
    names = tuple(loader.ifname(i) for i in t.return_oifs)
    progress(f"return path on {', '.join(names)}")
    replies = attach_replies(t.return_oifs, t.ingress, got.reply, cfg.node.xdp_mode, cfg.node.reply_xdp, undo, progress)
    mode = cfg.node.xdp_mode
    with uninterrupted():
        flags = loader.attach_xdp(t.iface, got.xdp, mode, replace=t.updating)
        if not t.updating:
            undo.push(f"detach XDP from {t.iface}", lambda: loader.detach_xdp(t.iface, flags))
    got.maps.write_node(
        maglev_m=cfg.node.maglev_m,
        max_services=cfg.node.max_services,
        max_backends=cfg.node.max_backends,
        ct_size=cfg.node.ct_size,
        ingress_ifindex=t.ingress,
        xdp_flags=flags,
        ip_forward_was=forward_was,
        return_ifindex=list(added),
        return_clsact_added=list(added.values()),
        answer_ping=cfg.node.answer_ping,
    )
    return DeployResult(t.iface, t.instance, t.pin_path, mode, t.updating, names, report, reply_ifindex=replies)


def _forwarding(old_node: dict | None, undo: loader.Undo, progress: Progress) -> int:
    """Turns net.ipv4.ip_forward on (the return path needs it); returns what it was before the
    first deploy, which undeploy restores."""
    if old_node and old_node["ip_forward_was"] is not None:
        forward_was = old_node["ip_forward_was"]
    else:
        forward_was = loader.ip_forward()
    if loader.ip_forward() == 0:
        with uninterrupted():
            loader.set_ip_forward(1)
            undo.push("restore net.ipv4.ip_forward", lambda: loader.set_ip_forward(0))
        progress("enabled net.ipv4.ip_forward (the return path is forwarded by the kernel)")
    return forward_was


def _return_path(t: _Target, tc_fn, old_node: dict | None, undo: loader.Undo) -> dict[int, bool]:
    """The return-path program on every backend-facing interface; ifindex -> whether deploy
    added its clsact qdisc (kept from the first deploy). Where no longer needed, removed."""
    added = {}
    for idx in t.return_oifs:
        with uninterrupted():
            added[idx] = loader.attach_tc(idx, tc_fn, undo)
    if old_node:
        for idx, was_added in zip(old_node["return_ifindex"], old_node["return_clsact_added"]):
            if idx in added:
                added[idx] = added[idx] or was_added
            else:
                loader.detach_tc(idx, remove_clsact=was_added)
                detach_reply(idx)
    return added


def undeploy(iface: str, pin_dir: str, progress: Progress = quiet) -> bool:
    """Removes what deploy put on iface; False when nothing was there. The pins are looked for
    in pin_dir and, when not there, on every bpffs (a config may set its own node.pin_dir).
    Raises LoaderError naming what is left when something could not be removed. Also under a
    running edged (which then reports the data path gone), but never midway through one of
    its writes."""
    instance = loader.instance_name(iface)
    pin_dir = where_pinned(pin_dir, instance, progress)
    loader.check_bpffs(pin_dir)
    with uninterrupted(), NodeLock(instance, iface, "write", WRITE_WAIT_S):
        done = _undeploy(iface, pin_dir, progress)
        running = owned(instance, iface)
        if done and running:  # before the lock goes: the watch's repair waits for it
            set_undeployed(instance, True)
            progress("the running edged leaves the data path off until it is restarted")
        left = leftovers(iface, loader.instance_dir(pin_dir, instance))
    if left:
        raise LoaderError(f"{iface}: undeploy left {'; '.join(left)}")
    if node_drain(instance) is not None:  # the drain-node mark goes with the data path
        set_node_drain(instance, False)
        progress("removed the drain-node mark")
    if not running:
        remove_locks(instance, iface)
    return done


def where_pinned(pin_dir: str, instance: str, progress: Progress = quiet) -> str:
    """pin_dir when it holds the instance's pins (of any ABI), else the one bpffs directory
    that does; pin_dir when none does. LoaderError when several do (say which to take)."""
    if loader.instance_dir(pin_dir, instance).exists() or loader.other_abi_pins(pin_dir, instance):
        return pin_dir
    found = [d for d in pin_dirs_holding(instance) if Path(d) != Path(pin_dir)]
    if len(found) > 1:
        raise LoaderError(f"--pin-dir: {instance} is pinned under {', '.join(found)}; name one with --pin-dir")
    if found:
        progress(f"the pins are under {found[0]} (the config's node.pin_dir), not {pin_dir}")
        return found[0]
    return pin_dir


def leftovers(iface: str, pin_path: Path) -> list[str]:
    """What of a deployment is still on the node after undeploy: our ingress program on
    iface, the instance's pins."""
    left = []
    try:
        current = loader.xdp_state(loader.ifindex(iface))
    except LoaderError:  # the interface is gone
        current = None
    if current is not None and current.name == abi.PROG_INGRESS:
        left.append(f"XDP program {abi.PROG_INGRESS} (id {current.prog_id}) on {iface}")
    if pin_path.exists():
        left.append(f"pins under {pin_path}")
    return left


def _undeploy(iface: str, pin_dir: str, progress: Progress) -> bool:
    instance = loader.instance_name(iface)
    pin_path = loader.instance_dir(pin_dir, instance)
    try:
        ingress = loader.ifindex(iface)
        current = loader.xdp_state(ingress)
    except LoaderError:  # the interface is gone; its pins may not be
        ingress, current = None, None
    ours = current is not None and current.name == abi.PROG_INGRESS
    other = loader.other_abi_pins(pin_dir, instance)
    if other and not pin_path.exists():
        return _undeploy_other_abi(iface, current if ours else None, other, progress)
    if not pin_path.exists() and not ours:
        return False

    node = _node_record(pin_path)
    if ours:
        flags = node["xdp_flags"] if node and node["xdp_flags"] else loader.XDP_MODES.get(current.mode, 0)
        loader.detach_xdp(iface, flags)
        progress(f"detached XDP from {iface}")
    if node:
        _undo_return_path(node, pin_dir, pin_path, progress)
    _remove_instance(pin_path, progress)
    return True


def _node_record(pin_path: Path) -> dict | None:
    """The node record of the instance pinned at pin_path (what its deploys made); None without pins."""
    if not pin_path.exists():
        return None
    loaded = loader.open_pinned(pin_path)
    try:
        maps = open_maps(loaded)
        node = maps.node()
        maps.close()
        return node
    finally:
        loaded.close()


def _undo_return_path(node: dict, pin_dir: str, pin_path: Path, progress: Progress) -> None:
    """Removes the return path and the replies' fast path the node record names, and restores
    ip_forward when the deploy turned it on and no other instance here needs it."""
    for idx, added in zip(node["return_ifindex"], node["return_clsact_added"]):
        if detach_reply(idx):
            progress(f"detached the reply fast path from {loader.ifname(idx)}")
        loader.detach_tc(idx, remove_clsact=added)
    others = [i for i in loader.instances_here(pin_dir) if loader.instance_dir(pin_dir, i) != pin_path]
    if node["ip_forward_was"] == 0 and not others:
        loader.set_ip_forward(0)
        progress("restored net.ipv4.ip_forward = 0")


def _undeploy_other_abi(iface: str, current, pins: list[Path], progress: Progress) -> bool:
    """Removes a data path of another ABI version without reading its maps: its XDP
    program, our return-path filters (known by priority and name) on every interface
    of this namespace, and its pins. A clsact qdisc it added stays (harmless)."""
    if current is not None:
        loader.detach_xdp(iface, loader.XDP_MODES.get(current.mode, 0))
        progress(f"detached XDP ({pins[0].parent.name}) from {iface}")
    for index in loader.ifindexes():
        if detach_reply(index):
            progress(f"detached the reply fast path from {loader.ifname(index)}")
        if _runs_return_path(index):
            loader.detach_tc(index)
            progress(f"detached the return path from {loader.ifname(index)}")
    for path in pins:
        _remove_instance(path, progress)
    return True


def _remove_instance(pin_path: Path, progress: Progress) -> None:
    """Unpins an instance and removes its directory, and the version directory above when empty."""
    loader.remove_pins(pin_path)
    for parent in (pin_path.parent, pin_path.parent.parent):
        try:
            parent.rmdir()
        except OSError:
            break
    progress(f"removed pins under {pin_path}")


def status(
    pin_dir: str, iface: str | None = None, count_conntrack: bool = False, walk_s: float | None = None
) -> list[dict]:
    """Snapshots of the instances deployed in this network namespace, each walked within
    walk_s (default STATUS_WALK_S; what a walk cut short says so in stopped_early)."""
    loader.check_bpffs(pin_dir)
    walk_ns = int((STATUS_WALK_S if walk_s is None else walk_s) * 1e9)
    names = [loader.instance_name(iface)] if iface else loader.instances_here(pin_dir)
    out = []
    for name in names:
        pin_path = loader.instance_dir(pin_dir, name)
        loaded = loader.open_pinned(pin_path)
        try:
            maps = open_maps(loaded)
            out.append(describe(maps, name, pin_path, count_conntrack, time.monotonic_ns() + walk_ns))
            maps.close()
        finally:
            loaded.close()
    if iface and not out:
        raise NotDeployed(f"nothing deployed on {iface}")
    return out


def describe(
    maps: Maps, instance: str, pin_path: Path, count_conntrack: bool = False, deadline_ns: int | None = None
) -> dict:
    """One instance as `edgectl status --json` shows it: the maps' snapshot plus
    what is attached where. deadline_ns: see Maps.snapshot."""
    snap = maps.snapshot(count_conntrack, deadline_ns)
    node = snap["node"]
    snap["instance"] = instance
    snap["pin_path"] = str(pin_path)
    snap["iface"] = loader.ifname(node["ingress_ifindex"]) if node["ingress_ifindex"] else None
    xdp = loader.xdp_state(node["ingress_ifindex"]) if node["ingress_ifindex"] else None
    snap["xdp"] = {
        "attached": bool(xdp and xdp.name == abi.PROG_INGRESS),
        "mode": xdp.mode if xdp else None,
        "prog_id": xdp.prog_id if xdp else None,
    }
    snap["return_ifaces"] = [loader.ifname(i) for i in node["return_ifindex"]]
    snap["reply_xdp_ifaces"] = [
        loader.ifname(i)
        for i in node["return_ifindex"]
        if (x := loader.xdp_state(i)) is not None and x.name == abi.PROG_REPLY
    ]
    since = node_drain(instance)
    snap["node_drained"], snap["node_drained_t"] = since is not None, since
    return snap
