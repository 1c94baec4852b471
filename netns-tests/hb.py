"""Heartbeats for the namespace tests: real UDP datagrams from a backend's namespace to the router.

start_heartbeats() runs the testbed's agent (controlplane.testbed.heartbeats) when it exists,
and otherwise a sender thread in this process with the same interface (.stop(), .kill(), .pid).
hb_socket() and send() are for tests that send heartbeats one at a time, or forge them.
Every sender is bounded in count and time.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from ipaddress import IPv4Address

from controlplane import abi
from controlplane.testbed.topo import Net, Ns

HB_PORT = 7946
SERVICE_PORT = 8000
MAX_S = 120.0  # no sender outlives this, whatever the test forgot
HAVE_AGENT = importlib.util.find_spec("controlplane.testbed.heartbeats") is not None


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


def send(sock: socket.socket, dst: IPv4Address, seq: int, token: int, *,
         hb_port: int = HB_PORT, service_port: int = SERVICE_PORT) -> None:
    """One heartbeat (abi.heartbeat) from sock to dst:hb_port."""
    sock.sendto(abi.heartbeat(service_port, seq, token), (str(dst), hb_port))


class Sender:
    """A thread sending backend i's heartbeats every interval_s until stop() or max_s."""

    def __init__(self, net: Net, i: int, *, token: int, hb_port: int, interval_s: float,
                 service_port: int, max_s: float = MAX_S):
        self.pid = os.getpid()
        self.sent = 0
        self._sock = hb_socket(net.backends[i], net.backend_addr(i))
        self._dst = net.topo.router_backend_addr(i).ip
        self._args = dict(token=token, hb_port=hb_port, service_port=service_port)
        self._interval_s, self._max_s = interval_s, max_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hb-b{i}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self._max_s
        try:
            for seq in range(int(self._max_s / self._interval_s) + 1):
                if time.monotonic() > deadline:
                    break
                try:
                    send(self._sock, self._dst, seq, **self._args)
                    self.sent += 1
                except OSError:
                    pass  # link down or no route: a real agent keeps trying too
                if self._stop.wait(self._interval_s):  # pacing, not waiting for a condition
                    break
        finally:
            self._sock.close()

    def stop(self) -> None:
        """No heartbeat leaves after this returns."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():
            raise RuntimeError(f"{self._thread.name}: still sending 5 s after stop()")

    kill = stop


def start_heartbeats(net: Net, i: int, *, token: int, hb_port: int = HB_PORT, interval_ms: float = 1,
                     service_port: int = SERVICE_PORT):
    """Backend i's heartbeats to the router's address on its link, every interval_ms,
    sent whether or not its server answers."""
    if HAVE_AGENT:
        from controlplane.testbed.heartbeats import start_heartbeats as agent

        return agent(net, i, token=token, hb_port=hb_port, interval_ms=interval_ms, check="none",
                     service_port=service_port)
    return Sender(net, i, token=token, hb_port=hb_port, interval_s=interval_ms / 1000,
                  service_port=service_port)
