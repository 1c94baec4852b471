"""Helpers of the abuse tests (test_health_abuse.py, test_state_abuse.py, test_heartbeat_trust.py):
crafted frames from CRAFTED_SRC, an address in the client's subnet that no socket uses, the
router's neighbour entry that lets answers to it reach the client's link (whose kernel drops
them), the heartbeat service those tests deploy, waiting until the router has judged frames,
and the SYN-ACKs answering a crafted SYN.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from ipaddress import IPv4Address
from typing import Callable, Iterator

import hb
from packets import Capture
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from controlplane.lab.router import Router, link_mac
from controlplane.lab.topo import Net
from controlplane.lab.traffic import backends_seen, wait_until

PORT = 8000  # conftest.BACKEND_PORT
CRAFTED_SRC = IPv4Address("198.18.0.77")  # in the client's subnet, used by no socket
ALL = {"b0", "b1", "b2"}
TOKENS = {i: 0x5EED0100 + i for i in range(3)}
HEARTBEAT = {"port": hb.HB_PORT, "interval_ms": 1, "timeout_ms": 250, "rise": 3}


def web(router: Router, health: dict, **extra) -> dict:
    svc = router.service("web", health=health, **extra)
    if "heartbeat" in health:
        for entry in svc["backends"]:
            entry["token"] = hex(TOKENS[int(entry["name"][1:])])
    return svc


def crafter(net: Net, router: Router) -> Callable[[TCP], bytes]:
    """frame(tcp): one frame from CRAFTED_SRC to the VIP, out of the client's veth to the router."""
    eth = Ether(dst=router.mac(), src=link_mac(net.client, net.client_iface))
    return lambda tcp: bytes(eth / IP(src=str(CRAFTED_SRC), dst=str(net.vip), ttl=64) / tcp)


def flows(net: Net, n: int) -> Counter:
    return backends_seen(net.client, net.vip, PORT, n, flow_timeout_s=1.0)


def answer(conn) -> str:
    """The backend answering one more request on conn, or "error:<exception>"."""
    try:
        return conn.request().backend
    except OSError as e:
        return f"error:{type(e).__name__}"


def handled(router: Router, before: dict, n: int) -> None:
    """Wait until the router has forwarded or dropped n more VIP packets than in before."""

    def count(c: dict) -> int:
        v = c["verdicts"]
        return v["redirect"] + v["nat_pass"] + v["drop"]

    wait_until(
        lambda: count(router.counters()) - count(before) >= n,
        5.0,
        f"{n} frames handled",
        observe=lambda: count(router.counters()) - count(before),
    )


@contextmanager
def crafted_neighbour(net: Net) -> Iterator[None]:
    """The router resolves CRAFTED_SRC to the client's MAC inside the block."""
    mac = link_mac(net.client, net.client_iface)
    with net.router.iproute() as ipr:
        index = ipr.link_lookup(ifname=net.router_client_iface)[0]
        ipr.neigh("add", dst=str(CRAFTED_SRC), lladdr=mac, ifindex=index, state="permanent")
    try:
        yield
    finally:
        with net.router.iproute() as ipr:
            ipr.neigh("del", dst=str(CRAFTED_SRC), lladdr=mac, ifindex=index)


def syn_acks(capture: Capture, iface: str, dport: int) -> list[tuple[str, int]]:
    """(source address, source port) of each SYN-ACK to CRAFTED_SRC:dport in capture.take() on iface."""
    out = []
    for frame in capture.take()[iface]:
        ip = IP(frame[14:])
        if ip.dst == str(CRAFTED_SRC) and TCP in ip and ip[TCP].dport == dport and ip[TCP].flags == "SA":
            out.append((ip.src, ip[TCP].sport))
    return out


def two_syn_acks(capture: Capture, iface: str, dport: int, what: str) -> list[tuple[str, int]]:
    """Wait until capture holds a SYN-ACK to CRAFTED_SRC:dport and a retransmission; return them.
    The backend retransmits 1, 3 and 7 s after its first SYN-ACK; the one at 1 s can come while a
    flood's thousands of SYN-ACKs overrun the capture, so the wait reaches past the one at 7 s."""

    def seen() -> list[tuple[str, int]]:
        return syn_acks(capture, iface, dport)

    return wait_until(lambda: (lambda s: s if len(s) >= 2 else None)(seen()), 12.0, what, observe=seen)
