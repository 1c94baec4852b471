"""Crafted ICMP errors at the router (bpf/include/icmp.h): each gets its verdict and drop reason,
and what is forwarded to a backend is translated with every checksum right.

        client ──veth── router ──veth── b0, b1, b2   (each backend's interface captured)
      crafted ICMP
      from 198.18.0.77 (a "hop")

As in test_malformed.py: each case sends its frame 5 times out of the client's veth, waits until
the router has handled them, then one HTTP request through the VIP must still be answered.
Outcomes: a drop reason (its counter and the drop verdict rise by exactly 5, no crafted frame
reaches a backend); "pass" (left to the kernel: no drop, nothing translated; `reaches` b0 for an
error to b0's own address, which is no VIP); "to_backend" (all 5 arrive at one backend: outer
destination, quoted source address and port rewritten to it, TTL one less, the outer IPv4, ICMP
and quoted IPv4 checksums valid, everything else as sent). The quoted flows have no conntrack
entry: the VIP's Maglev table names their backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Callable

import pytest
from crafted import COPIES, settle
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_RR
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import checksum

from controlplane.lab.router import link_mac

PORT = 8000  # conftest.BACKEND_PORT; the VIP serves web (tcp) and dns (udp) on it
HOP = IPv4Address("198.18.0.77")  # the crafted errors' source, used by no socket
CLIENT = "198.18.0.99"  # the client the quoted packets went to
ETH_P_IP = 0x0800
ICMP_DROPS = ("icmp_malformed", "icmp_nested", "icmp_no_flow")


@dataclass(frozen=True)
class Wire:
    router_mac: str
    client_mac: str
    vip: str
    backend: str  # b0's own address: not a VIP

    def frame(self, icmp: bytes, dst: str | None = None) -> bytes:
        outer = Ether(dst=self.router_mac, src=self.client_mac, type=ETH_P_IP)
        return bytes(outer / IP(src=str(HOP), dst=dst or self.vip, ttl=64, proto=1) / Raw(icmp))

    def quoted(self, l4=None, src: str | None = None, **fields) -> IP:
        """The packet an error quotes: one the VIP sent to CLIENT."""
        fields.setdefault("ttl", 60)
        return IP(src=src or self.vip, dst=CLIENT, **fields) / (l4 if l4 is not None else TCP(sport=PORT, dport=40100))


def frag_needed(quote) -> bytes:
    return bytes(ICMP(type=3, code=4, nexthopmtu=1400) / quote)


@dataclass(frozen=True)
class Case:
    description: str
    build: Callable[[Wire], bytes] = field(repr=False)
    expect: str  # a drop reason, "pass" or "to_backend"
    reaches: str = "nothing"


CASES = [
    Case("ICMP header cut off", lambda w: w.frame(bytes(ICMP(type=3, code=4))[:6]), "icmp_malformed"),
    Case(
        "frag needed quoting no header",
        lambda w: w.frame(bytes(ICMP(type=3, code=4, nexthopmtu=1400))),
        "icmp_malformed",
    ),
    Case(
        "frag needed quoting 20 bytes of IPv4, no ports",
        lambda w: w.frame(frag_needed(Raw(bytes(w.quoted())[:20]))),
        "icmp_malformed",
    ),
    Case(
        "frag needed quoting a packet with IPv4 options",
        lambda w: w.frame(frag_needed(w.quoted(options=[IPOption_RR()]))),
        "icmp_malformed",
    ),
    Case(
        "frag needed quoting a later fragment",
        lambda w: w.frame(frag_needed(w.quoted(frag=8, proto=6, l4=Raw(b"12345678")))),
        "icmp_malformed",
    ),
    Case(
        "frag needed quoting a packet not from this VIP",
        lambda w: w.frame(frag_needed(w.quoted(src=w.backend))),
        "icmp_malformed",
    ),
    Case(
        "frag needed quoting ICMP (nested)",
        lambda w: w.frame(frag_needed(w.quoted(l4=ICMP(type=8) / Raw(b"ping")))),
        "icmp_nested",
    ),
    Case(
        "frag needed quoting ICMP quoting TCP (nested)",
        lambda w: w.frame(frag_needed(w.quoted(l4=ICMP(type=3, code=4) / w.quoted()))),
        "icmp_nested",
    ),
    Case(
        "frag needed quoting a VIP port no service has",
        lambda w: w.frame(frag_needed(w.quoted(l4=TCP(sport=9999, dport=40100)))),
        "icmp_no_flow",
    ),
    # an echo request is answered by the router (test_icmp_echo.py); other queries go to the kernel
    Case(
        "timestamp request to the VIP (left to the kernel)",
        lambda w: w.frame(bytes(ICMP(type=13) / Raw(b"ping"))),
        "pass",
    ),
    Case(
        "frag needed to a backend address (no VIP)",
        lambda w: w.frame(frag_needed(w.quoted(src=w.backend)), dst=w.backend),
        "pass",
        reaches="b0",
    ),
    Case("frag needed about a TCP flow of the VIP", lambda w: w.frame(frag_needed(w.quoted())), "to_backend"),
    Case(
        "time exceeded about a UDP flow of the VIP",
        lambda w: w.frame(bytes(ICMP(type=11, code=0) / w.quoted(l4=UDP(sport=PORT, dport=40200) / Raw(b"q")))),
        "to_backend",
    ),
    Case(
        "port unreachable about a TCP flow, the whole segment quoted",
        lambda w: w.frame(bytes(ICMP(type=3, code=3) / w.quoted() / Raw(b"x" * 501))),
        "to_backend",
    ),
]


@pytest.fixture(scope="module")
def deployed(shared_net, shared_router):
    net, router = shared_net, shared_router
    router.deploy([router.service("web"), router.service("dns", protocol="udp")])
    wire = Wire(router.mac(), link_mac(net.client, net.client_iface), str(net.vip), str(net.backend_addr(0)))
    return router, wire, frozenset(str(net.backend_addr(i)) for i in range(3))


def crafted(frames: list[bytes]) -> list[bytes]:
    return [f for f in frames if f[26:30] == HOP.packed]


def translation_problems(sent: bytes, got: bytes, backends: frozenset[str]) -> list[str]:
    """What is wrong with `got` (at a backend) as the translation of the ICMP error `sent`."""
    ip, orig = got[14:], sent[14:]
    tot_len = int.from_bytes(ip[2:4], "big")
    icmp, orig_icmp = ip[20:tot_len], orig[20:]
    backend = ip[16:20]
    problems = []
    if str(IPv4Address(backend)) not in backends:
        problems.append(f"destination {IPv4Address(backend)} is no backend")
    if ip[8] != orig[8] - 1 or checksum(ip[:20]) != 0:
        problems.append("outer TTL or IPv4 checksum")
    if checksum(icmp) != 0:
        problems.append("ICMP checksum")
    inner = icmp[8:]
    if (inner[12:16], inner[20:22]) != (backend, PORT.to_bytes(2, "big")):
        problems.append("quoted source address or port not the backend's")
    if checksum(inner[:20]) != 0:
        problems.append("quoted IPv4 checksum")
    same = (icmp[:2], icmp[4:18], icmp[20:20], inner[16:20], inner[22:])
    want = (orig_icmp[:2], orig_icmp[4:18], b"", orig_icmp[8 + 16 : 8 + 20], orig_icmp[8 + 22 :])
    if same != want or len(icmp) != len(orig_icmp):
        problems.append("fields other than the quoted source and checksums changed")
    return problems


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.description)
def test_crafted_icmp_error_gets_its_verdict_and_nothing_corrupted_is_forwarded(shared_net, deployed, case):
    net, (router, wire, backends) = shared_net, deployed
    frame = case.build(wire)
    dropped = case.expect in ICMP_DROPS
    outcome = "drop" if dropped else "forward" if case.expect == "to_backend" else "pass"
    before = router.counters()
    run = settle(net, router, frame, crafted=crafted, outcome=outcome, to_b0=case.reaches == "b0", port=PORT)
    got, b0 = run.got, run.ends[0]

    no_drops = {reason: 0 for reason in before["drops"]}
    counts = run.counts()
    if dropped:
        assert (got["drops"], got["drop"], got["nat"], got["icmp"]) == ({**no_drops, case.expect: COPIES}, COPIES, 0, 0)
        assert counts == {ifname: 0 for ifname in run.ends}
    elif case.expect == "pass":
        assert (got["drops"], got["drop"], got["nat"], got["icmp"]) == (no_drops, 0, 0, 0)
        assert counts == {ifname: COPIES if ifname == b0 and case.reaches == "b0" else 0 for ifname in run.ends}
        assert all(f[34:] == frame[34:] for f in run.arrived[b0]), "ICMP message changed"
    else:
        assert (got["drops"], got["drop"], got["nat"], got["icmp"]) == (no_drops, 0, COPIES, COPIES)
        assert sorted(counts.values()) == [0, 0, COPIES]  # one flow: one backend
        problems = [translation_problems(frame, f, backends) for fs in run.arrived.values() for f in fs]
        assert problems == [[]] * COPIES
    assert (run.reply.status, run.reply.server_addr) == (200, f"{net.vip}:{PORT}")
