"""Heartbeats for the namespace tests: real UDP datagrams from a backend's namespace to the router.

start_heartbeats() runs the project's agent (edge-heartbeat, through controlplane.lab.heartbeats)
with its health check off, so heartbeats go on whether or not the server answers.
hb_socket() and send() are for tests that send heartbeats one at a time, or forge them;
b0_beside_agents() gives such a socket on b0 while b1 and b2 run agents.
Every sender is bounded in count and time.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from ipaddress import IPv4Address
from typing import Iterator

from controlplane import abi
from controlplane.agent.wire import clock_ns
from controlplane.lab.heartbeats import start_heartbeats as agent
from controlplane.lab.topo import Net, Ns

HB_PORT = 7946
SERVICE_PORT = 8000


def hb_socket(ns: Ns, source: IPv4Address, *, forge: bool = False) -> socket.socket:
    """A UDP socket in ns bound to source; forge: source need not be an address of ns
    (IP_TRANSPARENT), for spoofing another host's heartbeats."""
    with ns.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if forge:
            sock.setsockopt(socket.SOL_IP, socket.IP_TRANSPARENT, 1)
        sock.bind((str(source), 0))
    except BaseException:
        sock.close()
        raise
    return sock


def now_epoch() -> int:
    """This second of the clock heartbeats are stamped with (CLOCK_TAI)."""
    return clock_ns() // 1_000_000_000


def send(
    sock: socket.socket,
    dst: IPv4Address,
    seq: int,
    token: int,
    *,
    hb_port: int = HB_PORT,
    service_port: int = SERVICE_PORT,
    epoch: int | None = None,
) -> None:
    """One heartbeat (abi.heartbeat) from sock to dst:hb_port; epoch: by default this second of
    the clock heartbeats are stamped with (the router takes a newer epoch, or a higher seq in the
    same one, within abi.HB_WINDOW_S of its clock)."""
    epoch = now_epoch() if epoch is None else epoch
    sock.sendto(abi.heartbeat(service_port, seq, token, epoch), (str(dst), hb_port))


def start_heartbeats(
    net: Net, i: int, *, token: int, hb_port: int = HB_PORT, interval_ms: float = 1, service_port: int = SERVICE_PORT
):
    """Backend i's heartbeats to the router's address on its link, every interval_ms,
    sent whether or not its server answers."""
    return agent(net, i, token=token, hb_port=hb_port, interval_ms=interval_ms, check="none", service_port=service_port)


@contextmanager
def b0_beside_agents(net: Net, tokens: dict[int, int]) -> Iterator[socket.socket]:
    """b1 and b2 run agents with their tokens, b0 none; yields a heartbeat socket on b0's address.
    Both are closed and stopped when the block ends."""
    agents = [start_heartbeats(net, i, token=tokens[i]) for i in (1, 2)]
    try:
        sock = hb_socket(net.backends[0], net.backend_addr(0))
        try:
            yield sock
        finally:
            sock.close()
    finally:
        for agent in agents:
            agent.stop()
