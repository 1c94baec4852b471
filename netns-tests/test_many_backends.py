"""A thousand backends behind one VIP (EDGE_MAX_PER_SERVICE, 1,024): new flows spread over all of
them, and a backend whose heartbeats stop loses its new flows to live backends, in the kernel
(no edged runs: edgectl deploy programs the maps and exits).

        client ──veth── router (XDP + tc) ──veth── b0: 1,024 addresses 198.19.x.y/32,
                                                      one server on 0.0.0.0:8000 answering with
                                                      the address a connection reached

One sender in b0 heartbeats for every backend (IP_PKTINFO picks each datagram's source
address), a round every HB_ROUND_S, bounded in rounds; a backend left out of the rounds is
down one timeout later. The two tests share one deployment (it compiles the data path once).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Iterator

import hb
import pytest

from controlplane import abi
from controlplane.lab.procs import read_line, terminate
from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Topo
from controlplane.lab.traffic import backends_seen, wait_until

N = abi.MAX_PER_SERVICE  # 1,024
PORT = 8000
BLOCK = IPv4Network("198.19.0.0/16")  # backend addresses; clear of the lab's 198.18.x link nets
PER_BLOCK = 250
TIMEOUT_MS = 3000
HB_ROUND_S = 0.3
HB_MAX_ROUNDS = 2000  # 10 minutes of heartbeats at most
TOKEN_BASE = 0x5EED0000
FLOWS = 4 * N
FIRST_PORT = (
    20000  # below the ephemeral ports; the failover test's client ports: FIRST_PORT .. FIRST_PORT + PINNED_FLOWS - 1
)
PINNED_FLOWS = 1024
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # linux/in.h; Python 3.11 lacks the name


def backend_address(i: int) -> IPv4Address:
    return BLOCK.network_address + 256 * (i // PER_BLOCK) + i % PER_BLOCK + 1


class Heartbeats:
    """Heartbeats for every backend in `alive`, from b0 to the router's address on its link."""

    def __init__(self, net: Net):
        self.net = net
        self.alive = set(range(N))
        self.rounds = 0
        self._stop = threading.Event()
        with net.backends[0].enter():
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.dst = (str(net.topo.router_backend_addr(0).ip), hb.HB_PORT)
        self.epoch = int(time.time())
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _round(self) -> None:
        self.rounds += 1
        for i in sorted(self.alive):
            src = backend_address(i).packed
            pktinfo = struct.pack("=I4s4s", 0, src, bytes(4))  # struct in_pktinfo: ipi_spec_dst is the source
            payload = abi.heartbeat(PORT, self.rounds, TOKEN_BASE + i, self.epoch)
            self.sock.sendmsg([payload], [(socket.IPPROTO_IP, IP_PKTINFO, pktinfo)], 0, self.dst)

    def _run(self) -> None:
        while self.rounds < HB_MAX_ROUNDS and not self._stop.is_set():
            self._round()
            self._stop.wait(HB_ROUND_S)

    def __enter__(self) -> "Heartbeats":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close()


def service(net: Net) -> dict:
    health = {
        "heartbeat": {"port": hb.HB_PORT, "interval_ms": int(HB_ROUND_S * 1000), "timeout_ms": TIMEOUT_MS, "rise": 1}
    }
    backends = [
        {"name": f"b{i}", "address": str(backend_address(i)), "port": PORT, "token": hex(TOKEN_BASE + i)}
        for i in range(N)
    ]
    return {"name": "big", "vip": str(net.vip), "port": PORT, "protocol": "tcp", "health": health, "backends": backends}


def add_backends(net: Net) -> None:
    """N /32 addresses on b0's veth; the router routes their block via b0."""
    with net.backends[0].iproute() as ipr:
        index = ipr.link_lookup(ifname=net.backend_peer_iface(0))[0]
        for i in range(N):
            ipr.addr("add", index=index, address=str(backend_address(i)), prefixlen=32)
    with net.router.iproute() as ipr:
        ipr.route("add", dst=str(BLOCK), gateway=str(net.backend_addr(0)))


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[Net, Heartbeats]]:
    with Net(Topo(backends=1)) as net:
        net.build()
        add_backends(net)
        server = net.backends[0].popen(
            [sys.executable, "-m", "controlplane.lab.backend", "--name", "@local", "--listen", f"0.0.0.0:{PORT}"],
            stdout=subprocess.PIPE,
            env=_env(),
        )
        try:
            assert read_line(server, 10.0).startswith("listening @local ")
            router = Router(net)
            with Heartbeats(net) as beats:
                router.deploy([service(net)], node={"max_backends": 2 * N})
                try:
                    yield net, beats
                finally:
                    router.undeploy(check=False)
        finally:
            terminate(server)


def _env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def get_from(net: Net, sport: int, timeout_s: float = 2.0) -> str:
    """The backend (its address) that answers a new connection from the client's port sport;
    closed with an RST, so the tuple can be used again at once. 'error:...' on failure."""
    with net.client.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.settimeout(timeout_s)
        sock.bind((str(net.topo.client_addr.ip), sport))
        sock.connect((str(net.vip), PORT))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return json.loads(data.split(b"\r\n\r\n", 1)[1])["backend"]
    except (OSError, ValueError, IndexError, KeyError) as e:
        return f"error:{e}"
    finally:
        sock.close()


def test_new_flows_spread_over_a_thousand_backends(lab) -> None:
    net, _ = lab
    wait_until(lambda: get_from(net, FIRST_PORT - 1).startswith("198.19."), 30, "the VIP answers")
    seen = backends_seen(net.client, net.vip, PORT, FLOWS, deadline_s=120)
    errors = {k: v for k, v in seen.items() if k.startswith("error:")}
    assert errors == {}
    assert set(seen) <= {str(backend_address(i)) for i in range(N)}
    # 4 flows a backend on average: about 1,024 * e^-4 = 19 get none; more than 20 is ~1e-7 each
    assert len(seen) >= N - 60, f"{len(seen)} of {N} backends got flows"
    assert max(seen.values()) <= 20, seen.most_common(3)


def test_one_dead_of_a_thousand_loses_its_flows_to_live_backends(lab) -> None:
    net, beats = lab
    before = {sport: get_from(net, sport) for sport in range(FIRST_PORT, FIRST_PORT + PINNED_FLOWS)}
    assert not [b for b in before.values() if b.startswith("error:")]
    counts = Counter(before.values())
    dead, n_dead = counts.most_common(1)[0]
    assert n_dead >= 2
    dead_ports = [p for p, b in before.items() if b == dead]
    third, fourth = IPv4Address(dead).packed[2:]
    beats.alive.discard(third * PER_BLOCK + fourth - 1)
    try:
        wait_until(lambda: get_from(net, dead_ports[0]) != dead, TIMEOUT_MS / 1000 * 5, f"{dead}'s flows move")
        after = {p: get_from(net, p) for p in dead_ports}
        assert all(b.startswith("198.19.") and b != dead for b in after.values()), after
        # a flow that did not go to the dead backend stays where it was
        others = [p for p, b in before.items() if b != dead][:64]
        assert {p: get_from(net, p) for p in others} == {p: before[p] for p in others}
    finally:
        beats.alive = set(range(N))


@pytest.mark.parametrize("last", [N - 1, 0], ids=["in-the-last-chunk", "in-the-first-chunk"])
def test_the_one_live_backend_of_a_thousand_is_found_by_the_scan(lab, last) -> None:
    """Every Maglev pick and rehash is dead, so the fallback scan decides: its runs (one tail
    call per 64 backends, select.h) reach the live one wherever it is in the list."""
    net, beats = lab
    live = str(backend_address(last))
    beats.alive = {last}
    try:
        wait_until(lambda: get_from(net, FIRST_PORT - 2) == live, TIMEOUT_MS / 1000 * 5, f"only {live} answers")
        seen = Counter(get_from(net, p) for p in range(FIRST_PORT, FIRST_PORT + 64))
        assert seen == {live: 64}
    finally:
        beats.alive = set(range(N))
        # new tuples (conntrack keeps the old ones on the backend that took them)
        wait_until(
            lambda: len(backends_seen(net.client, net.vip, PORT, 32)) > 16, TIMEOUT_MS / 1000 * 5, "the others are back"
        )
