"""Crafted frames at the router: each gets its verdict (and drop reason), and nothing corrupted is forwarded.

        client ──veth── router ──veth── b0
      crafted frames   rt-c (XDP)  ├──veth── b1     each backend's interface is captured
      from 198.18.0.77             └──veth── b2     (incoming IPv4) while a case runs

Katran-style table: Case(description, frame builder, expected outcome). Each case sends its frame
5 times from the client namespace out of the client's veth (AF_PACKET; built with scapy; the
destination MAC is the router's client-facing interface), waits until the router has handled
them, then sends one good HTTP request through the VIP, which must still be answered. Outcomes:

  a drop reason   the reason's counter and the drop verdict rise by exactly 5, the other reasons
                  not at all, and no crafted frame (source 198.18.0.77) reaches any backend;
  "pass"          left to the router's kernel untouched: no drop, nothing NATed; `reaches` says
                  where the kernel delivers it (b0 for the same oddity sent to b0's own address,
                  which is no VIP; nowhere for what the kernel discards);
  "nat"           a well-formed edge case for the VIP: all 5 arrive at one backend, rewritten to
                  it, TTL one less, with valid IPv4 and TCP/UDP checksums (a UDP checksum of 0,
                  "none", stays 0).

An Ethernet frame shorter than 14 bytes is not among the cases: the kernel refuses to send one
(AF_PACKET on a veth returns EINVAL), and BPF_PROG_TEST_RUN refuses one too, so the XDP program
cannot meet it here. An 802.1Q tag cut off after the Ethernet header takes the same branch
(parse_eth finds the header cut off).

All cases share one deployment (module-scoped fixtures). They read the counters straight from
the pinned maps (Router.counters, bpftool: milliseconds) because `edgectl status` compiles the
data path on every run (seconds); the last test checks that `status --json` reports the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Callable

import pytest
from crafted import COPIES, deltas, settle
from packets import send_frames
from scapy.layers.inet import IP, TCP, UDP, IPOption_RR
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import checksum

from controlplane.lab.router import Router, link_mac
from controlplane.lab.traffic import wait_until

PORT = 8000  # conftest.BACKEND_PORT; the VIP serves web (tcp) and dns (udp) on it
CRAFTED_SRC = IPv4Address("198.18.0.77")  # in the client's subnet, used by no socket
MARKER = b"edge-malformed-test-marker"
ETH_P_IP, ETH_P_8021Q = 0x0800, 0x8100
ETH_MIN_FRAME = 60  # without the FCS; what a NIC pads short frames to
DROP_REASONS = ("malformed", "ip_options", "fragment", "bad_checksum")


@dataclass(frozen=True)
class Wire:
    """What a frame builder needs: the link's MACs and the addresses."""

    router_mac: str
    client_mac: str
    vip: str
    backend: str  # b0's own address: not a VIP

    def eth(self, type: int = ETH_P_IP) -> Ether:
        return Ether(dst=self.router_mac, src=self.client_mac, type=type)

    def ip(self, dst: str | None = None, **fields) -> IP:
        fields.setdefault("ttl", 64)
        return IP(src=str(CRAFTED_SRC), dst=dst or self.vip, **fields)


@dataclass(frozen=True)
class Case:
    description: str
    build: Callable[[Wire], bytes] = field(repr=False)
    expect: str  # one of DROP_REASONS, "pass" or "nat" (see the module docstring)
    reaches: str = "nothing"  # for "pass": "b0" or "nothing"


def syn(sport: int = 40000, **fields) -> TCP:
    return TCP(sport=sport, dport=PORT, flags="S", **fields)


def bad_ip_checksum(frame: bytes) -> bytes:
    """frame with its IPv4 header checksum made wrong (one byte flipped)."""
    out = bytearray(frame)
    out[14 + 10] ^= 0xFF
    return bytes(out)


def padded(frame: bytes) -> bytes:
    return frame + bytes(max(0, ETH_MIN_FRAME - len(frame)))


CASES = [
    Case("802.1Q tag cut off after the Ethernet header", lambda w: bytes(w.eth(ETH_P_8021Q)), "malformed"),
    Case("IPv4 header cut off after 10 bytes", lambda w: bytes(w.eth()) + bytes(w.ip() / syn())[:10], "malformed"),
    Case(
        "IHL 4, shorter than the IPv4 header", lambda w: bytes(w.eth() / w.ip(ihl=4) / syn() / Raw(MARKER)), "malformed"
    ),
    Case(
        "IPv4 total length shorter than its header",
        lambda w: bytes(w.eth() / w.ip(len=16) / syn() / Raw(MARKER)),
        "malformed",
    ),
    Case(
        "IPv4 total length larger than the frame",
        lambda w: bytes(w.eth() / w.ip(len=200) / syn() / Raw(MARKER)),
        "malformed",
    ),
    Case(
        "IPv4 options to the VIP",
        lambda w: bytes(w.eth() / w.ip(options=[IPOption_RR()]) / syn() / Raw(MARKER)),
        "ip_options",
    ),
    Case(
        "first fragment (MF) to the VIP",
        lambda w: bytes(w.eth() / w.ip(flags="MF", id=0xED01) / syn() / Raw(MARKER * 4)),
        "fragment",
    ),
    Case(
        "non-first fragment to the VIP",
        lambda w: bytes(w.eth() / w.ip(frag=8, id=0xED02, proto=6) / Raw(MARKER)),
        "fragment",
    ),
    Case(
        "TCP header cut off to the VIP", lambda w: bytes(w.eth() / w.ip(proto=6) / Raw(bytes(syn())[:12])), "malformed"
    ),
    Case("TCP data offset 4 to the VIP", lambda w: bytes(w.eth() / w.ip() / syn(dataofs=4) / Raw(MARKER)), "malformed"),
    Case(
        "TCP data offset past the IPv4 payload to the VIP",
        lambda w: bytes(w.eth() / w.ip() / syn(dataofs=15) / Raw(MARKER)),
        "malformed",
    ),
    Case(
        "UDP length 0 to a UDP VIP",
        lambda w: bytes(w.eth() / w.ip() / UDP(sport=40000, dport=PORT, len=0) / Raw(MARKER)),
        "malformed",
    ),
    Case(
        "UDP length larger than the payload to a UDP VIP",
        lambda w: bytes(w.eth() / w.ip() / UDP(sport=40000, dport=PORT, len=200) / Raw(MARKER)),
        "malformed",
    ),
    Case(
        "IPv4 header checksum wrong to the VIP",
        lambda w: bad_ip_checksum(bytes(w.eth() / w.ip() / syn(40005) / Raw(MARKER))),
        "bad_checksum",
    ),
    Case(
        "IPv4 header checksum wrong to a UDP VIP",
        lambda w: bad_ip_checksum(bytes(w.eth() / w.ip() / UDP(sport=40006, dport=PORT) / Raw(MARKER))),
        "bad_checksum",
    ),
    Case(
        "TCP SYN with a wrong TCP checksum to the VIP",
        lambda w: bytes(w.eth() / w.ip() / syn(40007, chksum=0xBAD)),
        "bad_checksum",
    ),
    Case(
        "IPv4 header checksum wrong to a backend address (no VIP; the kernel discards it)",
        lambda w: bad_ip_checksum(bytes(w.eth() / w.ip(w.backend) / UDP(sport=40000, dport=9) / Raw(MARKER))),
        "pass",
    ),
    Case(
        "IPv4 options to a backend address (no VIP)",
        lambda w: bytes(w.eth() / w.ip(w.backend, options=[IPOption_RR()]) / UDP(sport=40000, dport=9) / Raw(MARKER)),
        "pass",
        reaches="b0",
    ),
    Case(
        "first fragment (MF) to a backend address (no VIP)",
        lambda w: bytes(w.eth() / w.ip(w.backend, flags="MF", id=0xED03) / UDP(sport=40000, dport=9) / Raw(MARKER * 4)),
        "pass",
        reaches="b0",
    ),
    Case(
        "TTL 1 to the VIP (left to the kernel)",
        lambda w: bytes(w.eth() / w.ip(ttl=1) / syn(40001) / Raw(MARKER)),
        "pass",
    ),
    Case(
        "TCP SYN to the VIP padded to the Ethernet minimum",
        lambda w: padded(bytes(w.eth() / w.ip() / syn(40002))),
        "nat",
    ),
    Case(
        "UDP to a UDP VIP with checksum 0 (none)",
        lambda w: bytes(w.eth() / w.ip() / UDP(sport=40003, dport=PORT, chksum=0) / Raw(MARKER)),
        "nat",
    ),
    Case(
        "UDP to a UDP VIP with a checksum",
        lambda w: bytes(w.eth() / w.ip() / UDP(sport=40004, dport=PORT) / Raw(MARKER)),
        "nat",
    ),
]


@dataclass(frozen=True)
class Deployed:
    router: Router
    wire: Wire
    backends: frozenset[str]  # the backends' addresses


@pytest.fixture(scope="module")
def deployed(shared_net, shared_router) -> Deployed:
    """web (tcp) and dns (udp) on VIP:8000 over the three backends, deployed once for all cases."""
    net, router = shared_net, shared_router
    router.deploy([router.service("web"), router.service("dns", protocol="udp")])
    wire = Wire(router.mac(), link_mac(net.client, net.client_iface), str(net.vip), str(net.backend_addr(0)))
    return Deployed(router, wire, frozenset(str(net.backend_addr(i)) for i in range(3)))


def crafted(frames: list[bytes]) -> list[bytes]:
    """Frames whose IPv4 source is CRAFTED_SRC or which carry the marker (Ethernet header included)."""
    return [f for f in frames if f[26:30] == CRAFTED_SRC.packed or MARKER in f]


def nat_problems(sent: bytes, got: bytes, backends: frozenset[str]) -> list[str]:
    """What is wrong with `got` (a frame at a backend) as the NATed form of `sent` (as crafted)."""
    ip, orig = got[14:], sent[14:]
    ihl, tot_len, proto = (ip[0] & 0x0F) * 4, int.from_bytes(ip[2:4], "big"), ip[9]
    l4 = ip[ihl:tot_len]
    problems = []
    if str(IPv4Address(ip[16:20])) not in backends:
        problems.append(f"destination {IPv4Address(ip[16:20])} is no backend")
    if (ip[12:16], l4[:2], int.from_bytes(l4[2:4], "big")) != (orig[12:16], orig[20:22], PORT):
        problems.append("source or ports rewritten wrongly")
    if ip[8] != orig[8] - 1:
        problems.append(f"TTL {ip[8]}, sent {orig[8]}")
    if checksum(ip[:ihl]) != 0:
        problems.append("IPv4 header checksum")
    unchanged = (slice(4, 16), slice(18, None)) if proto == 6 else (slice(4, 6), slice(8, None))
    if [l4[s] for s in unchanged] != [orig[20 : 20 + len(l4)][s] for s in unchanged]:
        problems.append("TCP/UDP fields other than the destination port and checksum changed")
    if proto == 17 and orig[26:28] == b"\0\0":
        if l4[6:8] != b"\0\0":
            problems.append("UDP checksum 0 (none) became a checksum")
    elif checksum(ip[12:20] + bytes([0, proto]) + len(l4).to_bytes(2, "big") + l4) != 0:
        problems.append(f"{'UDP' if proto == 17 else 'TCP'} checksum")
    return problems


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.description)
def test_crafted_frame_gets_its_verdict_and_nothing_corrupted_is_forwarded(shared_net, deployed, case):
    net, router = shared_net, deployed.router
    frame = case.build(deployed.wire)
    dropped = case.expect in DROP_REASONS
    outcome = "drop" if dropped else "forward" if case.expect == "nat" else "pass"
    before = router.counters()
    run = settle(net, router, frame, crafted=crafted, outcome=outcome, to_b0=case.reaches == "b0", port=PORT)
    got, b0 = run.got, run.ends[0]

    no_drops = {reason: 0 for reason in before["drops"]}
    counts = run.counts()
    if dropped:
        assert (got["drops"], got["drop"], got["nat"]) == ({**no_drops, case.expect: COPIES}, COPIES, 0)
        assert counts == {ifname: 0 for ifname in run.ends}
    elif case.expect == "pass":
        assert (got["drops"], got["drop"], got["nat"]) == (no_drops, 0, 0)
        assert got["pass"] >= COPIES
        assert counts == {ifname: COPIES if ifname == b0 and case.reaches == "b0" else 0 for ifname in run.ends}
        ihl = (frame[14] & 0x0F) * 4
        # Forwarded by the kernel: TTL (and the record-route option) updated, the rest as sent.
        assert all(f[14 + ihl :] == frame[14 + ihl :] for f in run.arrived[b0]), "L4 header or payload changed"
    else:
        assert (got["drops"], got["drop"], got["nat"]) == (no_drops, 0, COPIES)
        assert sorted(counts.values()) == [0, 0, COPIES]  # one flow: one backend
        problems = [nat_problems(frame, f, deployed.backends) for fs in run.arrived.values() for f in fs]
        assert problems == [[]] * COPIES
    assert (run.reply.status, run.reply.server_addr) == (200, f"{net.vip}:{PORT}")
    assert run.reply.backend in {"b0", "b1", "b2"}


def test_status_reports_the_drop_counters_of_the_pinned_maps(shared_net, deployed):
    """One frame per drop reason, then `edgectl status --json` and the pinned maps agree exactly
    (only crafted frames are ever dropped here, so nothing moves between the two readings)."""
    by_reason = {}
    for case in CASES:
        if case.expect in DROP_REASONS:
            by_reason.setdefault(case.expect, case)
    router = deployed.router
    before = router.counters()
    send_frames(shared_net.client, shared_net.client_iface, [c.build(deployed.wire) for c in by_reason.values()])
    wait_until(
        lambda: deltas(before, router.counters())["drop"] >= len(by_reason),
        2.0,
        "drops counted",
        observe=lambda: deltas(before, router.counters()),
    )

    maps = router.counters()
    snap = router.status()

    assert {k: v for k, v in deltas(before, maps)["drops"].items() if v} == {r: 1 for r in DROP_REASONS}
    assert snap["drops"] == maps["drops"]
    assert snap["verdicts"]["drop"] == maps["verdicts"]["drop"] == sum(maps["drops"].values())
