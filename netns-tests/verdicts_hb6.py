"""Heartbeat rows of IPv6 backends for test_verdicts.py's table (heartbeat6.h): the service "hb6"
of verdicts.py's world (two IPv6 backends g0, g1 judged by heartbeats, registered in edge_hb6 on
BACKEND_IF). Each row starts with both alive and risen; the frames are a backend's heartbeat
over IPv6 to the router, valid or not. rows(row) builds them with verdicts_v4.py's row()."""

from __future__ import annotations

import time
from typing import Callable

from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from verdicts import CLIENT_MAC, G0, HB_PORT, LO, ROUTER_MAC, TC_ACT_SHOT, TOKENS, XDP_DROP, XDP_PASS, World
from verdicts6 import CLIENT6, ROUTER6, SAME

from controlplane import abi

ING, RET, REP = abi.PROG_INGRESS, abi.PROG_RETURN, abi.PROG_REPLY


def hb6(*, seq=1, token=None, epoch=None, src=G0[0], ahead=0) -> Callable[[World], bytes]:
    """g0's heartbeat seq over IPv6 from src to the router's heartbeat port; epoch: the row's
    second (World.epoch) plus ahead, unless given."""

    def frame(w: World) -> bytes:
        payload = abi.heartbeat(
            G0[1], seq, TOKENS["g0"] if token is None else token, w.epoch + ahead if epoch is None else epoch
        )
        return bytes(
            Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
            / IPv6(src=str(src), dst=str(ROUTER6))
            / UDP(sport=40001, dport=HB_PORT)
            / Raw(payload)
        )

    return frame


def heard(seq: int) -> Callable[[World], None]:
    """g0's last heartbeat taken had seq in the row's epoch."""
    return lambda w: w.set_health("g0", last_seen_ns=time.monotonic_ns(), rise_count=100, hb_seq=seq, hb_epoch=w.epoch)


def stamped(seq: int) -> tuple[str, Callable[[World], bool]]:
    return (f"g0's health took heartbeat {seq}", lambda w: w.health("g0").hb_seq == seq)


def drop(reason: str) -> dict[str, int]:
    return {"drop": 1, f"drop:{reason}": 1}


def rows(row) -> list:
    """The rows, made by verdicts_v4.py's row()."""
    on_lo = lambda w: w.hb_interface("g0", LO)  # noqa: E731  (where the XDP test runs arrive)
    # fmt: off
    return [
        row("IPv6 heartbeat on the client side: dropped", ING, hb6(), XDP_DROP, None, drop("spoofed_heartbeat")),
        row("IPv6 heartbeat from an unregistered address: dropped", ING, hb6(src=CLIENT6), XDP_DROP, None,
            drop("spoofed_heartbeat")),
        row("IPv6 heartbeat where its backend is: to the stack (tc takes it)", ING, hb6(), XDP_PASS, SAME,
            {"pass": 1}, on_lo),
        row("IPv6 heartbeat consumed", RET, hb6(seq=7), TC_ACT_SHOT, None, {"heartbeat": 1}, after=[stamped(7)]),
        row("IPv6 heartbeat with a wrong token: forged", RET, hb6(token=0xBAD), TC_ACT_SHOT, None,
            drop("spoofed_heartbeat"), after=[stamped(0)]),
        row("IPv6 heartbeat from another address", RET, hb6(src=CLIENT6), TC_ACT_SHOT, None,
            drop("spoofed_heartbeat")),
        row("IPv6 heartbeat of epoch 0: stale", RET, hb6(seq=9, epoch=0), TC_ACT_SHOT, None,
            drop("stale_heartbeat"), after=[stamped(0)]),
        row("IPv6 heartbeat from beyond the window ahead: stale", RET, hb6(seq=9, ahead=10 * abi.HB_WINDOW_S),
            TC_ACT_SHOT, None, drop("stale_heartbeat")),
        row("IPv6 heartbeat replayed (same seq)", RET, hb6(seq=5), TC_ACT_SHOT, None, drop("replayed_heartbeat"),
            heard(5), after=[stamped(5)]),
        row("IPv6 heartbeat: to tc", REP, hb6(), XDP_PASS, SAME, {}),
    ]
    # fmt: on
