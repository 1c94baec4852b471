"""Whether the data path a running edged deployed is still whole, and putting it back
when it can. Three faults of the node: the client-facing interface deleted (and made
again: a new ifindex with no XDP), a backend-facing one deleted and made again (no tc
return path, no XDP fast path of replies), and the bpffs holding the pins unmounted (the
kernel keeps what is attached, but a restarted edged or edgectl would find nothing).
edged holds the compiled programs and the maps' fds, so it can attach XDP and tc again
and pin the maps again without a compile; a repair holds the router's write lock, as
every other change of the data path does. Decides nothing about traffic; holds no map
layout (maps.py) and imports no bcc (loader.py). Runs off edged's loop (netlink).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncContextManager, Awaitable, Callable

from controlplane import abi, deploy, loader
from controlplane.errors import LoaderError
from controlplane.maps import Maps
from controlplane.netlink import NetlinkError
from controlplane.undo import Undo


def _ifindex(iface: str) -> int | None:
    try:
        return loader.ifindex(iface)
    except LoaderError:
        return None


def check(
    maps: Maps,
    iface: str,
    pin_dir: str,
    pin_path: Path,
    replies: tuple[int, ...] = (),
    backends: tuple[str, ...] = (),
    reply_xdp: str = "auto",
) -> str:
    """'' when the data path is whole; else one line saying what is missing. replies: the return
    interfaces deploy put the XDP fast path of replies on (with reply_xdp "on": every one);
    backends: every backend address (the interface routing to one needs the return path)."""
    try:
        return _check(maps, iface, pin_dir, pin_path, replies, backends, reply_xdp)
    except NetlinkError as e:  # an interface went away between two questions
        return f"netlink: {os.strerror(e.code)} while checking the data path"


def undeployed(pin_path: Path) -> str:
    """The problem to report when `edgectl undeploy` took the data path from under edged ('' when
    it did not): nothing is put back then."""
    t = deploy.undeployed_at(pin_path.name)  # the instance's pins live in a directory of its name
    if t is None:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "an unknown time"
    return f"undeployed by 'edgectl undeploy' at {when}; edged puts nothing back until it is restarted"


def _check(
    maps: Maps,
    iface: str,
    pin_dir: str,
    pin_path: Path,
    replies: tuple[int, ...],
    backends: tuple[str, ...] = (),
    reply_xdp: str = "auto",
) -> str:
    stopped = undeployed(pin_path)
    if stopped:
        return stopped
    try:
        loader.check_bpffs(pin_dir)
    except LoaderError:
        return f"pins: {pin_dir} is no longer on a bpffs (unmounted?); a restarted edged would find nothing"
    missing = [name for name in abi.MAP_NAMES if not (pin_path / name).exists()]
    if missing:
        return f"pins: {pin_path} lost {', '.join(missing)}"
    node = maps.node()
    index = _ifindex(iface)
    if index is None:
        return f"{iface}: the client-facing interface is gone; XDP is attached nowhere"
    xdp = loader.xdp_state(index)
    if xdp is None or xdp.name != abi.PROG_INGRESS or index != node["ingress_ifindex"]:
        return f"{iface}: XDP is not attached (the interface was made again?)"
    for idx in node["return_ifindex"]:
        if _ifname(idx) is not None and loader.return_filter(idx) is None:  # a gone one routes nothing
            return f"{loader.ifname(idx)}: the return path is not attached"
    for idx in _new_return_ifaces(node, backends):
        return f"{loader.ifname(idx)}: the return path is not attached (the interface was made again?)"
    for idx in node["return_ifindex"] if reply_xdp == "on" else replies:
        if _ifname(idx) is None:  # gone: the new interface in its place is the one above
            continue
        xdp = loader.xdp_state(idx)
        if xdp is None or xdp.name != abi.PROG_REPLY:
            return f"{loader.ifname(idx)}: the XDP fast path of replies is not attached (tc carries them)"
    return ""


@dataclass(frozen=True)
class Repaired:
    did: str  # what it put back, '' for nothing
    reply_ifindex: tuple[int, ...]  # where the XDP fast path of replies runs now
    return_ifindex: tuple[int, ...] = ()  # backend-facing interfaces it attached the return path to


def repair(
    held: loader.Pinned,
    maps: Maps,
    iface: str,
    xdp_mode: str,
    pin_dir: str,
    pin_path: Path,
    replies: tuple[int, ...] = (),
    backends: tuple[str, ...] = (),
    reply_xdp: str = "auto",
) -> Repaired:
    """Puts back what it can and says what it did. Raises LoaderError."""
    try:
        return _repair(held, maps, iface, xdp_mode, pin_dir, pin_path, replies, backends, reply_xdp)
    except NetlinkError as e:
        raise LoaderError(f"netlink: {os.strerror(e.code)} while putting the data path back") from e


def _repair(
    held: loader.Pinned,
    maps: Maps,
    iface: str,
    xdp_mode: str,
    pin_dir: str,
    pin_path: Path,
    replies: tuple[int, ...],
    backends: tuple[str, ...],
    reply_xdp: str,
) -> Repaired:
    if undeployed(pin_path):  # read under the write lock, which undeploy held while it wrote the mark
        return Repaired("", replies)
    done = []
    try:
        loader.check_bpffs(pin_dir)
        mounted = True
    except LoaderError:
        mounted = False
    if mounted and any(not (pin_path / name).exists() for name in abi.MAP_NAMES):
        loader.check_pin_dir(pin_dir, pin_path)
        loader.pin_maps(held, pin_path)
        done.append(f"pinned the maps again at {pin_path}")
    index = _ifindex(iface)
    if index is not None:
        xdp = loader.xdp_state(index)
        if xdp is None:
            fn = held.load(abi.PROG_INGRESS, "xdp")
            flags = loader.attach_xdp(iface, fn, xdp_mode, replace=False)
            node = maps.node()
            if node["ingress_ifindex"] != index or node["xdp_flags"] != flags:
                maps.write_node(**{**node, "ingress_ifindex": index, "xdp_flags": flags})
            done.append(f"attached XDP on {iface} again (ifindex {index})")
    fresh = _reattach_return(held, maps, backends, done)
    replies = tuple(idx for idx in replies if _ifname(idx) is not None)
    # The replies' fast path only on top of a whole data path (tc behind it): not, say, after an
    # undeploy under edged. It redirects to the node record's ingress_ifindex: nothing to rewrite.
    whole = bool(replies or fresh or reply_xdp == "on") and not _check(maps, iface, pin_dir, pin_path, (), backends)
    for idx in replies if whole else ():
        if loader.xdp_state(idx) is None:
            loader.attach_xdp(loader.ifname(idx), held.load(abi.PROG_REPLY, "xdp"), xdp_mode, replace=False)
            done.append(f"attached the reply fast path on {loader.ifname(idx)} again")
    # deploy's rules: auto leaves a refused interface to tc, on fails (another program's hook, the
    # driver), and every return interface of "on" must have it
    lacking = [
        idx
        for idx in (maps.node()["return_ifindex"] if reply_xdp == "on" else fresh)
        if idx not in replies and _ifname(idx) is not None
    ]
    if whole and lacking and reply_xdp != "off":
        said: list[str] = []
        got = deploy.attach_replies(
            lacking,
            maps.node()["ingress_ifindex"],
            held.load(abi.PROG_REPLY, "xdp"),
            xdp_mode,
            reply_xdp,
            Undo(),
            said.append,
        )
        done += [line for line in said if "stay with tc" in line]
        if got:
            done.append(f"attached the reply fast path on {', '.join(map(loader.ifname, got))} again")
        replies += tuple(idx for idx in got if idx not in replies)
    return Repaired("; ".join(done), replies, tuple(fresh))


def _new_return_ifaces(node: dict, backends: tuple[str, ...]) -> list[int]:
    """Interfaces a backend is routed through that the node record does not know: made again
    (a new ifindex) since deploy attached the return path. Asked of the routes only while an
    interface of the record is gone (a route lookup per backend every second would cost a
    node with 1,000 backends a third of a core)."""
    if all(_ifname(idx) is not None for idx in node["return_ifindex"]):
        return []
    oifs = dict.fromkeys(oif for oif in loader.route_oifs(backends).values() if oif is not None)
    return [oif for oif in oifs if oif not in node["return_ifindex"]]


def _reattach_return(held: loader.Pinned, maps: Maps, backends: tuple[str, ...], done: list[str]) -> list[int]:
    """The return path (tc) on every interface a backend is routed through that the node record does
    not know; the record then lists those instead of the interfaces that are gone. Returns them."""
    node = maps.node()
    fresh = _new_return_ifaces(node, backends)
    if not fresh:
        return []
    kept = [
        (idx, added)
        for idx, added in zip(node["return_ifindex"], node["return_clsact_added"])
        if _ifname(idx) is not None
    ]
    if len(kept) + len(fresh) > abi.MAX_RETURN_IFACES:
        raise LoaderError(f"backends sit behind {len(kept) + len(fresh)} interfaces; at most {abi.MAX_RETURN_IFACES}")
    undo = Undo()
    try:
        fn = held.load(abi.PROG_RETURN, "tc")
        added = [loader.attach_tc(idx, fn, undo) for idx in fresh]
        maps.write_node(
            **{
                **node,
                "return_ifindex": [i for i, _ in kept] + fresh,
                "return_clsact_added": [a for _, a in kept] + added,
            }
        )
    except BaseException:
        undo.rollback()
        raise
    undo.forget()
    done.append(f"attached the return path on {', '.join(loader.ifname(i) for i in fresh)} again")
    return fresh


def _ifname(index: int) -> str | None:
    name = loader.ifname(index)
    return None if name.startswith("ifindex ") else name


@dataclass(frozen=True)
class Watched:
    """What a running edged holds of its data path."""

    held: loader.Pinned
    maps: Maps
    iface: str
    xdp_mode: str
    pin_dir: str
    pin_path: Path
    reply_ifindex: tuple[int, ...] = ()
    backends: tuple[str, ...] = ()  # every backend address the data path forwards to
    reply_xdp: str = "auto"  # node.reply_xdp


async def run(
    watched: Callable[[], Watched | None],
    report: Callable[[str, str], None],
    executor: Executor,
    every_s: float,
    locked: Callable[[], AsyncContextManager] = contextlib.nullcontext,
    repaired: Callable[[Repaired], Awaitable[None]] | None = None,
) -> None:
    """Every every_s: check the data path, repair what can be repaired, and call
    report(problem, did) (problem '' when whole). Netlink runs on executor, off the loop.
    A repair runs inside locked() (edged: its write lock), and repaired(result) is awaited
    there too when it put something back (edged remembers the reply interfaces and writes the
    maps' interface indexes again)."""
    loop = asyncio.get_running_loop()
    problem = ""
    while True:
        await asyncio.sleep(every_s)
        w = watched()
        if w is None:
            continue
        did = ""
        try:
            problem = await loop.run_in_executor(
                executor, check, w.maps, w.iface, w.pin_dir, w.pin_path, w.reply_ifindex, w.backends, w.reply_xdp
            )
            if problem:
                report(problem, "")
                async with locked():
                    w = watched()  # what edged holds may have changed while the lock was waited for
                    if w is None:
                        continue
                    got = await loop.run_in_executor(
                        executor,
                        repair,
                        w.held,
                        w.maps,
                        w.iface,
                        w.xdp_mode,
                        w.pin_dir,
                        w.pin_path,
                        w.reply_ifindex,
                        w.backends,
                        w.reply_xdp,
                    )
                    did = got.did
                    if did and repaired is not None:
                        await repaired(got)
                if did:
                    problem = await loop.run_in_executor(
                        executor,
                        check,
                        w.maps,
                        w.iface,
                        w.pin_dir,
                        w.pin_path,
                        got.reply_ifindex,
                        w.backends,
                        w.reply_xdp,
                    )
        except LoaderError as e:  # a repair that failed: still not serving, tried again next time
            report(f"{problem} (putting it back failed: {e})" if problem else f"data path: {e}", "")
            continue
        report(problem, did)
