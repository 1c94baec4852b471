"""What deploy, undeploy and status do to a node: the all-or-nothing sequence
that wires config, loader and maps together. Each step that changes the node
pushes its undo, so a failed deploy leaves the interface as it was. Holds no
packet logic and no map layouts (maps.py), and imports no bcc (loader.py).
edgectl and edged call the same functions."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from controlplane import abi, loader
from controlplane.config import Config
from controlplane.errors import ConfigError, EdgeError, LoaderError, MapError, NotDeployed
from controlplane.maps import Maps, sizing

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
    held: loader.Loaded | None = None  # with hold=True: the open data path; the caller closes it
    maps: Maps | None = None
    reply_ifindex: tuple[int, ...] = ()  # return interfaces running the XDP fast path of replies


LOCK_DIR_ENV = "EDGE_LOCK_DIR"  # where the writer locks live; the unit's /run/edge by default


WRITE_WAIT_S = 10.0  # how long a write waits for another router writer to finish


class NodeLock:
    """Who may change a router, as flocks on files in the run dir (a holder that dies
    releases them). "owner" (<instance>.lock): edged holds it for its life, edgectl deploy
    for its run; a second one is refused in one line naming the holder. "write"
    (<instance>.write): every change of the maps takes it, edged's reloads and drain
    expiry, deploy and undeploy, waiting up to wait_s for the one before to finish;
    so undeploy, the stop button, still works under edged, but never midway through
    one of its writes."""

    def __init__(self, instance: str, iface: str, kind: str = "owner", wait_s: float = 0.0):
        suffix = {"owner": "lock", "write": "write"}[kind]
        self.path = Path(os.environ.get(LOCK_DIR_ENV, "/run/edge")) / f"{instance}.{suffix}"
        self.iface, self.kind, self.wait_s = iface, kind, wait_s
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self.wait_s
        for _ in range(int(self.wait_s / 0.02) + 1):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise LoaderError(f"{self.path}: cannot lock: {e.strerror}") from e
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        who = holder(self.path)
        os.close(fd)
        if self.kind == "owner":
            raise LoaderError(f"{self.iface}: another writer holds this router ({who}); "
                              f"while edged runs, change it with 'edgectl reload'")
        raise LoaderError(f"{self.iface}: another writer is changing this router ({who}) "
                          f"and did not finish within {self.wait_s:g} s")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "NodeLock":
        self.acquire()
        return self

    def __exit__(self, *_) -> None:
        self.release()


def _run_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV, "/run/edge"))


def _mark_time(instance: str, suffix: str, key: str) -> float | None:
    """The time (UNIX, under key) a mark file beside the router's locks (<instance>.<suffix>)
    holds; None when there is none, 0.0 when it cannot be read (the mark counts all the same)."""
    try:
        return float(json.loads((_run_dir() / f"{instance}.{suffix}").read_text())[key])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _set_mark(instance: str, suffix: str, key: str, on: bool, what: str) -> None:
    """Writes (atomically, with the time and this pid) or removes a mark file; LoaderError naming
    the file if it cannot."""
    path = _run_dir() / f"{instance}.{suffix}"
    try:
        if not on:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{suffix}.tmp")
        tmp.write_text(json.dumps({key: time.time(), "pid": os.getpid()}) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise LoaderError(f"{path}: cannot {'write' if on else 'remove'} the {what}: {e.strerror}") from e


def node_drain(instance: str) -> float | None:
    """When `edgectl drain-node` drained this router (UNIX time), None when it is not drained
    (0.0 when the mark is unreadable: drained rather than announced by mistake; undrain-node
    rewrites it). The mark is a small file beside the router's locks (<instance>.drained): it
    outlives edged, as the pinned data path does, and goes with undeploy (and a reboot, as the
    pins do)."""
    return _mark_time(instance, "drained", "since_t")


def set_node_drain(instance: str, drained: bool) -> None:
    _set_mark(instance, "drained", "since_t", drained, "drain-node mark")


def undeployed_at(instance: str) -> float | None:
    """When `edgectl undeploy` took the data path from under a running edged (UNIX time); None
    when it did not. The mark (<instance>.undeployed, beside the locks) tells that edged's watch
    to put nothing back: undeploy is the stop button, not a fault to repair. The next deploy
    (edged's own at its start, or edgectl deploy) removes it, and so does edged when it stops."""
    return _mark_time(instance, "undeployed", "t")


def set_undeployed(instance: str, undeployed: bool) -> None:
    _set_mark(instance, "undeployed", "t", undeployed, "undeploy mark")


def _owned(instance: str, iface: str) -> bool:
    """Whether a running edged (or a deploy) holds the router's owner lock."""
    try:
        with NodeLock(instance, iface):
            return False
    except LoaderError:
        return True


def holder(path: Path) -> str:
    """'pid N: command line' of the process holding a flock on path, from /proc/locks."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if "FLOCK" in fields and len(fields) > 5 and fields[5] == inode:
            pid = fields[4]
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = "?"
            return f"pid {pid}: {cmd.strip()[:200]}"
    return "a process this one cannot see"


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
        backends = tuple(
            replace(b, weight=now[b.name]) if b.name in now and b.weight != 0 else b for b in s.backends
        )
        services.append(replace(s, backends=backends))
    return replace(cfg, services=tuple(services))


_HELD = NodeLock("", "")  # stands for "the caller holds the lock already"


def params_of(cfg: Config) -> loader.Params:
    return loader.Params.of(cfg.node)


def open_maps(loaded: loader.Loaded) -> Maps:
    """Maps over a compiled instance, sized by its node record when it has one."""
    return Maps.sized_by_node(loaded.tables(), loaded.map_fd(abi.MAP_MAGLEV), loaded.params.maglev_m,
                              loaded.params.max_services)


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
            raise ConfigError(
                f"node.{key}: {want} differs from the deployed {have}; undeploy first to resize the maps"
            )


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


def deploy(cfg: Config, iface: str, progress: Progress = quiet, adopt_weights: bool = False,
           hold: bool = False, amend: Callable[[Maps, Config], Config] | None = None,
           lock: NodeLock | None = None) -> DeployResult:
    """Loads, attaches and programs the data path on iface, or changes nothing. Refused
    while edged (or another deploy) owns the router; lock: the caller's own NodeLock,
    already held with the write lock (edged).
    adopt_weights: keep the computed weights already in the tables (see adopted()).
    hold: return the open data path and maps in the result instead of closing them.
    amend: when a deployment is there already, amend(maps, cfg) gives what to program
    instead of cfg (edged keeps backends that are still draining out)."""
    if lock is None:  # edged passes its own, holding both
        instance = loader.instance_name(iface)
        with NodeLock(instance, iface), NodeLock(instance, iface, "write", WRITE_WAIT_S):
            return deploy(cfg, iface, progress, adopt_weights, hold, amend, lock=_HELD)
    pin_dir = cfg.node.pin_dir
    loader.check_bpffs(pin_dir)
    ingress = loader.ifindex(iface)
    routes = backend_routes(cfg)
    return_oifs = list(dict.fromkeys(routes.values()))
    if len(return_oifs) > abi.MAX_RETURN_IFACES:
        raise ConfigError(f"services: backends sit behind {len(return_oifs)} interfaces; at most {abi.MAX_RETURN_IFACES}")

    current = loader.xdp_state(ingress)
    if current and current.name != abi.PROG_INGRESS:
        raise LoaderError(f"{iface} already runs XDP program '{current.name}' (id {current.prog_id}); remove it first")
    updating = current is not None
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
    if updating and not pin_path.exists():
        raise LoaderError(f"{iface} runs {abi.PROG_INGRESS} but {pin_path} has no pins; run 'edgectl undeploy --iface {iface}' first")

    undo = loader.Undo()
    loaded = None
    try:
        make_pin_path(pin_path, undo)
        progress(f"compiling the data path (M={cfg.node.maglev_m}, {cfg.node.max_services} services, "
                 f"{cfg.node.max_backends} backends)")
        loaded = loader.compile_datapath(pin_path, params_of(cfg))
        maps = open_maps(loaded)
        _check_sizes(maps, cfg)
        old_node = maps.node() if updating else None
        xdp_fn = loaded.load(abi.PROG_INGRESS, "xdp")
        tc_fn = loaded.load(abi.PROG_RETURN, "tc")
        reply_fn = loaded.load(abi.PROG_REPLY, "xdp") if cfg.node.reply_xdp != "off" else None

        applied = cfg
        if updating and amend is not None:
            applied = amend(maps, cfg)
            if applied is not cfg:
                routes = backend_routes(applied)
                return_oifs = list(dict.fromkeys(routes.values()))
        progress(f"programming {len(cfg.services)} services")
        report = maps.apply(adopted(maps, applied) if updating and adopt_weights else applied, routes)

        if old_node and old_node["ip_forward_was"] is not None:
            forward_was = old_node["ip_forward_was"]
        else:
            forward_was = loader.ip_forward()
        if loader.ip_forward() == 0:
            loader.set_ip_forward(1)
            undo.push("restore net.ipv4.ip_forward", lambda: loader.set_ip_forward(0))
            progress("enabled net.ipv4.ip_forward (the return path is forwarded by the kernel)")

        added = {}
        for idx in return_oifs:
            added[idx] = loader.attach_tc(idx, tc_fn, undo)
        if old_node:  # keep what the first deploy created; detach where no longer needed
            for idx, was_added in zip(old_node["return_ifindex"], old_node["return_clsact_added"]):
                if idx in added:
                    added[idx] = added[idx] or was_added
                else:
                    loader.detach_tc(idx, remove_clsact=was_added)
                    detach_reply(idx)
        names = tuple(loader.ifname(i) for i in return_oifs)
        progress(f"return path on {', '.join(names)}")
        replies = attach_replies(return_oifs, ingress, reply_fn, cfg.node.xdp_mode, cfg.node.reply_xdp,
                                 undo, progress)

        mode = cfg.node.xdp_mode
        flags = loader.attach_xdp(iface, xdp_fn, mode, replace=updating)
        if not updating:
            undo.push(f"detach XDP from {iface}", lambda: loader.detach_xdp(iface, flags))

        maps.write_node(
            maglev_m=cfg.node.maglev_m, max_services=cfg.node.max_services,
            max_backends=cfg.node.max_backends, ct_size=cfg.node.ct_size,
            ingress_ifindex=ingress, xdp_flags=flags, ip_forward_was=forward_was,
            return_ifindex=list(added), return_clsact_added=list(added.values()),
        )
        if not hold:
            maps.close()
    except BaseException as e:
        failed = undo.rollback()
        if loaded is not None:
            loaded.close()
        if failed and isinstance(e, EdgeError):
            raise type(e)(f"{e} (and undo failed: {failed[0]})") from e
        raise
    if not hold:
        loaded.close()
    undo.forget()
    set_undeployed(instance, False)  # deployed again: a running edged's watch repairs again
    if hold:
        return DeployResult(iface, instance, pin_path, mode, updating, names, report, loaded, maps, replies)
    return DeployResult(iface, instance, pin_path, mode, updating, names, report, reply_ifindex=replies)


def attach_replies(return_oifs: list[int], ingress: int, fn, xdp_mode: str, want: str,
                   undo: loader.Undo, progress: Progress) -> tuple[int, ...]:
    """Puts the XDP fast path of replies (edge_reply) on every return interface, or replaces
    ours there; returns where it runs. want "off" (fn None) removes ours; "auto" leaves an
    interface to tc alone when its driver refuses (one progress line), "on" fails the deploy.
    Not where the ingress program holds the XDP hook (backends behind the client-facing
    interface) nor where another program does."""
    done = []
    for idx in return_oifs:
        name = loader.ifname(idx)
        current = loader.xdp_state(idx)
        if fn is None:
            detach_reply(idx)
            continue
        if idx == ingress or (current is not None and current.name != abi.PROG_REPLY):
            holder = abi.PROG_INGRESS if idx == ingress else f"'{current.name}'"
            if want == "on":
                raise LoaderError(f"node.reply_xdp: on, but {name} runs XDP program {holder}; "
                                  f"set node.reply_xdp: auto to leave its replies to tc")
            progress(f"replies on {name} stay with tc: XDP program {holder} holds its hook")
            continue
        try:
            flags = loader.attach_xdp(name, fn, xdp_mode, replace=current is not None)
        except LoaderError as e:
            if want == "on":
                raise
            progress(f"replies on {name} stay with tc: {e}")
            continue
        if current is None:
            undo.push(f"detach XDP from {name}", lambda name=name, flags=flags: loader.detach_xdp(name, flags))
        done.append(idx)
    if done:
        progress(f"XDP fast path of replies on {', '.join(loader.ifname(i) for i in done)}")
    return tuple(done)


def detach_reply(idx: int) -> bool:
    """Removes our reply fast path from interface idx if it runs there."""
    current = loader.xdp_state(idx)
    if current is None or current.name != abi.PROG_REPLY:
        return False
    loader.detach_xdp(loader.ifname(idx), loader.XDP_MODES.get(current.mode, 0))
    return True


def undeploy(iface: str, pin_dir: str, progress: Progress = quiet) -> bool:
    """Removes what deploy put on iface; False when nothing was there. Also under a
    running edged (which then reports the data path gone), but never midway through
    one of its writes."""
    loader.check_bpffs(pin_dir)
    instance = loader.instance_name(iface)
    with NodeLock(instance, iface, "write", WRITE_WAIT_S):
        done = _undeploy(iface, pin_dir, progress)
        if done and _owned(instance, iface):  # before the lock goes: the watch's repair waits for it
            set_undeployed(instance, True)
            progress("the running edged leaves the data path off until it is restarted")
    if node_drain(instance) is not None:  # the drain-node mark goes with the data path
        set_node_drain(instance, False)
        progress("removed the drain-node mark")
    return done


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

    node = None
    if pin_path.exists():
        loaded = loader.open_pinned(pin_path)
        try:
            maps = open_maps(loaded)
            node = maps.node()
            maps.close()
        finally:
            loaded.close()
    if ours:
        flags = node["xdp_flags"] if node and node["xdp_flags"] else loader.XDP_MODES.get(current.mode, 0)
        loader.detach_xdp(iface, flags)
        progress(f"detached XDP from {iface}")
    if node:
        for idx, added in zip(node["return_ifindex"], node["return_clsact_added"]):
            if detach_reply(idx):
                progress(f"detached the reply fast path from {loader.ifname(idx)}")
            loader.detach_tc(idx, remove_clsact=added)
        others = [i for i in loader.instances_here(pin_dir) if loader.instance_dir(pin_dir, i) != pin_path]
        if node["ip_forward_was"] == 0 and not others:
            loader.set_ip_forward(0)
            progress("restored net.ipv4.ip_forward = 0")
    _remove_instance(pin_path, progress)
    return True


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
        if loader.has_clsact(index) and (loader.return_filter(index) or "").startswith(abi.PROG_RETURN):
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


def status(pin_dir: str, iface: str | None = None, count_conntrack: bool = False) -> list[dict]:
    """Snapshots of the instances deployed in this network namespace."""
    loader.check_bpffs(pin_dir)
    names = [loader.instance_name(iface)] if iface else loader.instances_here(pin_dir)
    out = []
    for name in names:
        pin_path = loader.instance_dir(pin_dir, name)
        loaded = loader.open_pinned(pin_path)
        try:
            maps = open_maps(loaded)
            out.append(describe(maps, name, pin_path, count_conntrack))
            maps.close()
        finally:
            loaded.close()
    if iface and not out:
        raise NotDeployed(f"nothing deployed on {iface}")
    return out


def describe(maps: Maps, instance: str, pin_path: Path, count_conntrack: bool = False,
             deadline_ns: int | None = None) -> dict:
    """One instance as `edgectl status --json` shows it: the maps' snapshot plus
    what is attached where. deadline_ns: see Maps.snapshot."""
    snap = maps.snapshot(count_conntrack, deadline_ns)
    node = snap["node"]
    snap["instance"] = instance
    snap["pin_path"] = str(pin_path)
    snap["iface"] = loader.ifname(node["ingress_ifindex"]) if node["ingress_ifindex"] else None
    xdp = loader.xdp_state(node["ingress_ifindex"]) if node["ingress_ifindex"] else None
    snap["xdp"] = {"attached": bool(xdp and xdp.name == abi.PROG_INGRESS),
                   "mode": xdp.mode if xdp else None, "prog_id": xdp.prog_id if xdp else None}
    snap["return_ifaces"] = [loader.ifname(i) for i in node["return_ifindex"]]
    snap["reply_xdp_ifaces"] = [loader.ifname(i) for i in node["return_ifindex"]
                                if (x := loader.xdp_state(i)) is not None and x.name == abi.PROG_REPLY]
    since = node_drain(instance)
    snap["node_drained"], snap["node_drained_t"] = since is not None, since
    return snap

