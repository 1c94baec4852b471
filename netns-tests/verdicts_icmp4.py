"""The ICMP frames of the IPv4 rows (verdicts_v4.py; icmp.h in the data path): errors a hop sends
to a VIP about one of its flows (and the segment they quote), errors a backend sends to a client,
echo requests to a VIP address, and the frames each must leave as: the backend's error with the
VIP put back (to the client), a hop's error translated to the backend, the echo's reply. Builds
frames only; the rows that use them and what they count are verdicts_v4.py's.
"""

from __future__ import annotations

from typing import Callable

from scapy.layers.inet import ICMP, IP, TCP
from scapy.layers.l2 import Ether
from verdicts import (
    B0,
    CLIENT,
    CLIENT_MAC,
    CLIENT_PORT,
    ROUTER,
    ROUTER_MAC,
    TO_BACKEND,
    TO_CLIENT,
    VIP,
)


def icmp_error(quote, *, dst=VIP, src=ROUTER, type=3, code=4) -> bytes:
    """An ICMP error (default: fragmentation needed, next-hop MTU 1400) from a hop to dst quoting
    the packet quote."""
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(src), dst=str(dst), ttl=64)
        / ICMP(type=type, code=code, nexthopmtu=1400 if (type, code) == (3, 4) else 0)
        / quote
    )


def from_vip(dport: int = CLIENT_PORT, sport: int = 80, vip=VIP) -> IP:
    """A segment vip sent to the client, as an ICMP error quotes it."""
    return IP(src=str(vip), dst=str(CLIENT), ttl=60) / TCP(sport=sport, dport=dport, flags="A", seq=1, ack=1)


def backend_error(quote, *, src=B0[0], ttl=64) -> bytes:
    """An ICMP error (port unreachable) a backend sends to the client about the client's packet."""
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(src), dst=str(CLIENT), ttl=ttl)
        / ICMP(type=3, code=3)
        / quote
    )


def icmp_back(backend: tuple, vip=VIP, port: int = 80) -> Callable[[bytes], bytes]:
    """Expected: a backend's ICMP error with the VIP back as outer source and quoted destination
    address and port (outer IP, quoted IP and ICMP checksums), TTL - 1, sent to the reply hop."""

    def out(f: bytes) -> bytes:
        p = Ether(f)
        p.dst, p.src = TO_CLIENT[0].hex(":"), TO_CLIENT[1].hex(":")
        p[IP].src, p[IP].ttl = str(vip), p[IP].ttl - 1
        quote = p[ICMP].payload
        quote.dst = str(vip)
        quote.payload.dport = port
        del p[IP].chksum, p[ICMP].chksum, quote.chksum
        return bytes(p)

    return out


def echo(dst=VIP, *, src=CLIENT, type=8, code=0) -> bytes:
    """An ICMP echo request (ping) from src to dst."""
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(src), dst=str(dst), ttl=61)
        / ICMP(type=type, code=code, id=0x1234, seq=7)
        / (b"p" * 56)
    )


def echo_reply(f: bytes) -> bytes:
    """Expected: f answered from where it went: MACs and addresses swapped, TTL 64, echo reply."""
    p = Ether(f)
    p.src, p.dst = p.dst, p.src
    p[IP].src, p[IP].dst, p[IP].ttl = p[IP].dst, p[IP].src, 64
    p[ICMP].type = 0
    del p[IP].chksum, p[ICMP].chksum
    return bytes(p)


def icmp_to(to: tuple) -> Callable[[bytes], bytes]:
    """Expected: an ICMP error about a VIP flow translated to backend to (outer destination, quoted
    source address and port; outer IP, quoted IP and ICMP checksums; the quoted L4 checksum left),
    TTL - 1, redirected to the next hop."""

    def out(f: bytes) -> bytes:
        p = Ether(f)
        p.dst, p.src = TO_BACKEND[0].hex(":"), TO_BACKEND[1].hex(":")
        p[IP].dst, p[IP].ttl = str(to[0]), p[IP].ttl - 1
        quote = p[ICMP].payload
        quote.src = str(to[0])
        quote.payload.sport = to[1]
        del p[IP].chksum, p[ICMP].chksum, quote.chksum
        return bytes(p)

    return out
