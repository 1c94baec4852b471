"""Whether the data path a running edged deployed is still whole, and putting it back
when it can. Two faults of the node: the client-facing interface deleted (and made
again: a new ifindex with no XDP), and the bpffs holding the pins unmounted (the
kernel keeps what is attached, but a restarted edged or edgectl would find nothing).
edged holds the compiled programs and the maps' fds, so it can attach XDP again and
pin the maps again without a compile. Decides nothing about traffic; holds no map
layout (maps.py) and imports no bcc (loader.py). Runs off edged's loop (netlink).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pyroute2.netlink.exceptions import NetlinkError

from controlplane import abi, loader
from controlplane.errors import LoaderError
from controlplane.maps import Maps


def _ifindex(iface: str) -> int | None:
    try:
        return loader.ifindex(iface)
    except LoaderError:
        return None


def check(maps: Maps, iface: str, pin_dir: str, pin_path: Path, replies: tuple[int, ...] = ()) -> str:
    """'' when the data path is whole; else one line saying what is missing. replies: the return
    interfaces deploy put the XDP fast path of replies on."""
    try:
        return _check(maps, iface, pin_dir, pin_path, replies)
    except NetlinkError as e:  # an interface went away between two questions
        return f"netlink: {os.strerror(e.code)} while checking the data path"


def _check(maps: Maps, iface: str, pin_dir: str, pin_path: Path, replies: tuple[int, ...]) -> str:
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
        if loader.return_filter(idx) is None:
            return f"{loader.ifname(idx)}: the return path is not attached"
    for idx in replies:
        xdp = loader.xdp_state(idx)
        if xdp is None or xdp.name != abi.PROG_REPLY:
            return f"{loader.ifname(idx)}: the XDP fast path of replies is not attached (tc carries them)"
    return ""


def repair(held: loader.Loaded, maps: Maps, iface: str, xdp_mode: str, pin_dir: str, pin_path: Path,
           replies: tuple[int, ...] = ()) -> str:
    """Puts back what it can; says what it did ('' for nothing). Raises LoaderError."""
    try:
        return _repair(held, maps, iface, xdp_mode, pin_dir, pin_path, replies)
    except NetlinkError as e:
        raise LoaderError(f"netlink: {os.strerror(e.code)} while putting the data path back") from e


def _repair(held: loader.Loaded, maps: Maps, iface: str, xdp_mode: str, pin_dir: str, pin_path: Path,
            replies: tuple[int, ...]) -> str:
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
    # The replies' fast path only on top of a whole data path (tc behind it): not, say, after an
    # undeploy under edged. It redirects to the node record's ingress_ifindex: nothing to rewrite.
    whole = not _check(maps, iface, pin_dir, pin_path, ()) if replies else False
    for idx in replies if whole else ():
        if loader.xdp_state(idx) is None and _ifname(idx) is not None:
            loader.attach_xdp(loader.ifname(idx), held.load(abi.PROG_REPLY, "xdp"), xdp_mode, replace=False)
            done.append(f"attached the reply fast path on {loader.ifname(idx)} again")
    return "; ".join(done)


def _ifname(index: int) -> str | None:
    name = loader.ifname(index)
    return None if name.startswith("ifindex ") else name


@dataclass(frozen=True)
class Watched:
    """What a running edged holds of its data path."""

    held: loader.Loaded
    maps: Maps
    iface: str
    xdp_mode: str
    pin_dir: str
    pin_path: Path
    reply_ifindex: tuple[int, ...] = ()


async def run(watched: Callable[[], Watched | None], report: Callable[[str, str], None],
              executor: Executor, every_s: float) -> None:
    """Every every_s: check the data path, repair what can be repaired, and call
    report(problem, did) (problem '' when whole). Netlink runs on executor, off the loop."""
    loop = asyncio.get_running_loop()
    problem = ""
    while True:
        await asyncio.sleep(every_s)
        w = watched()
        if w is None:
            continue
        did = ""
        try:
            problem = await loop.run_in_executor(executor, check, w.maps, w.iface, w.pin_dir, w.pin_path,
                                                 w.reply_ifindex)
            if problem:
                report(problem, "")
                did = await loop.run_in_executor(executor, repair, w.held, w.maps, w.iface, w.xdp_mode,
                                                 w.pin_dir, w.pin_path, w.reply_ifindex)
                if did:
                    problem = await loop.run_in_executor(executor, check, w.maps, w.iface, w.pin_dir,
                                                         w.pin_path, w.reply_ifindex)
        except LoaderError as e:  # a repair that failed: still not serving, tried again next time
            report(problem or f"data path: {e}", "")
            continue
        report(problem, did)
