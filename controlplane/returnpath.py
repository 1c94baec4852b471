"""The data path on backend-facing interfaces: the XDP fast path of replies (edge_reply) put
on or taken off, and a new backend-facing interface taken into service from the programs a
process holds (no compile), with the apply that needs it, all or nothing. Decides nothing
about traffic, holds no map layout (maps/) and imports no bcc (loader.py); deploy.py and
edged's watch and reload call it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from controlplane import abi, loader
from controlplane.config import Config
from controlplane.errors import ConfigError, LoaderError
from controlplane.interrupts import uninterrupted

if TYPE_CHECKING:
    from controlplane.maps import Maps

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def attach_replies(
    return_oifs: list[int], ingress: int, fn, xdp_mode: str, want: str, undo: loader.Undo, progress: Progress
) -> tuple[int, ...]:
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
                raise LoaderError(
                    f"node.reply_xdp: on, but {name} runs XDP program {holder}; "
                    f"set node.reply_xdp: auto to leave its replies to tc"
                )
            progress(f"replies on {name} stay with tc: XDP program {holder} holds its hook")
            continue
        try:
            with uninterrupted():  # the program and its undo, or neither
                flags = loader.attach_xdp(name, fn, xdp_mode, replace=current is not None)
                if current is None:
                    undo.push(f"detach XDP from {name}", lambda name=name, flags=flags: loader.detach_xdp(name, flags))
        except LoaderError as e:
            if want == "on":
                raise
            progress(f"replies on {name} stay with tc: {e}")
            continue
        done.append(idx)
    if done:
        progress(f"XDP fast path of replies on {', '.join(loader.ifname(i) for i in done)}")
    return tuple(done)


def apply_on_new_links(
    held: loader.Pinned, maps: "Maps", cfg: Config, routes: dict, replies: tuple[int, ...], progress: Progress = quiet
) -> tuple[object, tuple[int, ...]]:
    """Programs cfg into the maps when its backends sit behind interfaces the node record lacks,
    without a compile: the return path (tc) and the replies' fast path (XDP, node.reply_xdp) of
    the programs held go on those interfaces, the record lists them, then the apply. All or
    nothing: when a step fails, what was attached comes off and the record is as it was.
    cfg: what to program (deploy.adopted's). Returns (the apply's report, where the replies'
    fast path runs now)."""
    node = maps.node()
    new = [oif for oif in dict.fromkeys(routes.values()) if oif not in node["return_ifindex"]]
    if len(node["return_ifindex"]) + len(new) > abi.MAX_RETURN_IFACES:
        raise ConfigError(
            f"services: backends sit behind {len(node['return_ifindex']) + len(new)} interfaces; "
            f"at most {abi.MAX_RETURN_IFACES}"
        )
    undo = loader.Undo()
    try:
        tc = held.load(abi.PROG_RETURN, "tc")
        added = []
        for idx in new:
            with uninterrupted():
                added.append(loader.attach_tc(idx, tc, undo))
        reply = held.load(abi.PROG_REPLY, "xdp") if cfg.node.reply_xdp != "off" else None
        got = attach_replies(new, node["ingress_ifindex"], reply, cfg.node.xdp_mode, cfg.node.reply_xdp, undo, progress)
        with uninterrupted():
            maps.write_node(
                **{
                    **node,
                    "return_ifindex": node["return_ifindex"] + new,
                    "return_clsact_added": node["return_clsact_added"] + added,
                }
            )
            undo.push(f"{abi.MAP_NODE}: restore", lambda: maps.write_node(**node))
        progress(f"return path on {', '.join(loader.ifname(i) for i in new)} (no compile)")
        report = maps.apply(cfg, routes)
    except BaseException:
        with uninterrupted():
            undo.rollback()
        raise
    return report, tuple(replies) + got


def detach_reply(idx: int) -> bool:
    """Removes our reply fast path from interface idx if it runs there."""
    current = loader.xdp_state(idx)
    if current is None or current.name != abi.PROG_REPLY:
        return False
    loader.detach_xdp(loader.ifname(idx), loader.XDP_MODES.get(current.mode, 0))
    return True
