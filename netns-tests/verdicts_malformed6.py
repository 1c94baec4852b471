"""The IPv6 malformed (non-ICMP) corpus of test_verdicts.py's table (ingress6.h, parse6): headers cut
short or lying about their length, extension header chains past the parser's bound
(EDGE_V6_EXT_MAX) or its reach (EDGE_V6_L4_MAX), fragments, next headers it does not take, broken
TCP and UDP headers, and neighbour discovery and MLD that must pass untouched. verdicts6.py has the
first rows of each kind (a first fragment, GRE, a neighbour solicitation, a destination options
header); these do not repeat them. A packet the ingress cannot take is dropped with its reason when
it is for a VIP address and left to the stack otherwise (unusual6); the drops count under no
service (""). A UDP datagram with checksum 0 (invalid in IPv6, RFC 8200 8.1) of a VIP flow, either
way, is dropped as malformed under its service (udp6, verdicts_world6.py) rather than NATed into a
wrong checksum. Rows are plain tuples in row()'s argument order, as verdicts6.py's."""

from __future__ import annotations

import struct

from scapy.layers.inet import TCP, UDP
from scapy.layers.inet6 import (
    HBHOptUnknown,
    ICMPv6MLReport2,
    ICMPv6ND_NA,
    ICMPv6ND_NS,
    ICMPv6ND_RA,
    ICMPv6ND_Redirect,
    ICMPv6ND_RS,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
    Jumbo,
    PadN,
    RouterAlert,
)
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from verdicts import (
    CLIENT_MAC,
    CLIENT_PORT,
    HOP_DMAC,
    HOP_SMAC,
    REPLY_DMAC,
    REPLY_SMAC,
    ROUTER_MAC,
    TC_ACT_OK,
    TC_ACT_SHOT,
    XDP_DROP,
    XDP_PASS,
    XDP_REDIRECT,
    World,
)
from verdicts6 import CLIENT6, E0, REP, RET, ROUTER6, SAME, VIP6, W, connected6, dnat6, drop, frame6, hop6, tcp6
from verdicts_world6 import U0, UDP6_PORT, UDP6_VIP

from controlplane import abi
from controlplane.maps.records import be16, put_addr

ING = abi.PROG_INGRESS
EXT_MAX = 4  # abi.h's EDGE_V6_EXT_MAX: extension headers walked before the L4 header
IP6 = 14  # the IPv6 header's offset in an untagged frame
MALFORMED = drop("malformed")
PASS = {"pass": 1}


def with_plen(f: bytes, plen: int) -> bytes:
    """f with its IPv6 payload length set to plen (the bytes stay)."""
    b = bytearray(f)
    b[IP6 + 4 : IP6 + 6] = struct.pack("!H", plen)
    return bytes(b)


def cut_frame(f: bytes, n: int) -> bytes:
    """f's first n bytes after the Ethernet header, the payload length left as it was."""
    return f[: IP6 + n]


def cut6(f: bytes, n: int) -> bytes:
    """f's IPv6 packet cut to n bytes of payload, payload length to match."""
    return with_plen(f[: IP6 + 40 + n], n)


def tagged(f: bytes) -> bytes:
    """f with an 802.1Q tag (VLAN 7) after its MACs."""
    return f[:12] + b"\x81\x00\x00\x07" + f[12:]


def proto6(nh: int, payload: bytes = b"\0" * 16, dst=VIP6) -> bytes:
    """An IPv6 packet with next header nh to dst."""
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(CLIENT6), dst=str(dst), nh=nh) / Raw(payload))


def tcp_doff(doff: int) -> bytes:
    """A SYN to the VIP whose TCP data offset is doff words (the frame holds 20 header bytes)."""
    f = bytearray(tcp6())
    f[IP6 + 40 + 12] = (doff << 4) | (f[IP6 + 40 + 12] & 0x0F)
    return bytes(f)


def udp6(*, length: int | None = None, dst=VIP6) -> bytes:
    """A UDP datagram to the VIP (port 80), its length field length when given."""
    u = UDP(sport=CLIENT_PORT, dport=80) / Raw(b"q" * 8)
    if length is not None:
        u.len = length
    return frame6(CLIENT6, dst, u)


U = "udp6"  # verdicts_world6.py: UDP6_VIP:53/udp -> u0


def dgram6(*, zero: bool = False, reply: bool = False, dst=UDP6_VIP, hlim: int = 64) -> bytes:
    """A client's datagram to dst:53 (or, reply, u0's answer to it), its UDP checksum 0 if zero."""
    u = UDP(sport=CLIENT_PORT, dport=UDP6_PORT) / Raw(b"query 12")
    src = CLIENT6
    if reply:
        src, dst, u = U0[0], CLIENT6, UDP(sport=U0[1], dport=CLIENT_PORT) / Raw(b"answer 1")
    f = bytearray(frame6(src, dst, u, hlim=hlim))
    if zero:
        f[IP6 + 46 : IP6 + 48] = b"\0\0"
    return bytes(f)


def pinned_udp6(w: World) -> None:
    """edge_ct6 pins the client's flow to UDP6_VIP:53 to u0."""
    t = w.t[abi.MAP_CT6]
    k = t.Key()
    put_addr(k, "src", CLIENT6)
    put_addr(k, "dst", UDP6_VIP)
    k.sport, k.dport, k.proto = be16(CLIENT_PORT), be16(UDP6_PORT), 17
    v = t.Leaf()
    v.backend_id, v.vip_id = w.bid("u0"), w.vid(U)
    t[k] = v


def dnat_udp6(f: bytes) -> bytes:
    """Expected: to u0, hop limit - 1, the cached hop's MACs, the UDP checksum recomputed."""
    p = Ether(f)
    p.dst, p.src = HOP_DMAC.hex(":"), HOP_SMAC.hex(":")
    p[IPv6].dst, p[IPv6].hlim = str(U0[0]), p[IPv6].hlim - 1
    p[UDP].dport = U0[1]
    del p[UDP].chksum
    return bytes(p)


def snat_udp6(f: bytes, *, xdp: bool = False) -> bytes:
    """Expected of a reply: source UDP6_VIP:53 again (and with xdp, hop limit - 1, the reply hop's MACs)."""
    p = Ether(f)
    p[IPv6].src = str(UDP6_VIP)
    p[UDP].sport = UDP6_PORT
    del p[UDP].chksum
    if xdp:
        p.dst, p.src = REPLY_DMAC.hex(":"), REPLY_SMAC.hex(":")
        p[IPv6].hlim -= 1
    return bytes(p)


def ext_chain(n: int):
    """n destination options headers, chained."""
    chain = IPv6ExtHdrDestOpt()
    for _ in range(n - 1):
        chain = chain / IPv6ExtHdrDestOpt()
    return chain


def ext_cut_short() -> bytes:
    """To the VIP: next header destination options, and a single byte of it (payload length 1)."""
    return proto6(60, b"\x06")


def ext_past_payload() -> bytes:
    """A destination options header claiming 88 bytes (hdrlen 10) before a 20-byte TCP header."""
    f = bytearray(tcp6(ext=IPv6ExtHdrDestOpt()))
    f[IP6 + 40 + 1] = 10
    return bytes(f)


def padded(f: bytes, n: int = 12) -> bytes:
    """f with n bytes after its IPv6 packet (Ethernet padding: the payload length excludes them)."""
    return f + b"\0" * n


def dnat6_padded(n: int = 12):
    """Expected: the pinned flow's NAT of the packet, its padding kept as it was."""
    nat = dnat6(E0)
    return lambda f: nat(f[:-n]) + f[-n:]


HBH = IPv6ExtHdrHopByHop(options=[RouterAlert(value=0), PadN(optdata=b"")])
FAR = IPv6ExtHdrDestOpt(options=[HBHOptUnknown(otype=0x1E, optdata=b"\0" * 250) for _ in range(2)])  # 512 bytes
JUMBO = bytes(
    Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
    / IPv6(src=str(CLIENT6), dst=str(VIP6), plen=0)
    / IPv6ExtHdrHopByHop(options=[Jumbo(jumboplen=70000)])
    / TCP(sport=CLIENT_PORT, dport=80, flags="S", seq=1000)
)
MLD = bytes(
    Ether(dst="33:33:00:00:00:16", src=CLIENT_MAC)
    / IPv6(src=str(CLIENT6), dst="ff02::16", hlim=1)
    / IPv6ExtHdrHopByHop(options=[RouterAlert(value=0), PadN(optdata=b"")])
    / ICMPv6MLReport2()
)


def nd(msg, dst, ether_dst: str = ROUTER_MAC) -> bytes:
    return bytes(Ether(dst=ether_dst, src=CLIENT_MAC) / IPv6(src=str(CLIENT6), dst=str(dst), hlim=255) / msg)


# fmt: off
ROWS_MALFORMED6 = [
    # -- the IPv6 header -------------------------------------------------------------------------------
    ("IPv6 header cut short (20 of its 40 bytes): dropped", ING, cut_frame(tcp6(), 20), XDP_DROP, SAME, MALFORMED,
     ""),
    ("IPv6 header cut short behind an 802.1Q tag: dropped", ING, tagged(tcp6())[: 18 + 20], XDP_DROP, SAME, MALFORMED,
     ""),
    ("IPv6 EtherType, version field 4, to the VIP: dropped", ING,
     bytes([*tcp6()[:IP6], 0x40 | (tcp6()[IP6] & 0x0F), *tcp6()[IP6 + 1 :]]), XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 payload length 8 bytes past the frame, to the VIP: dropped", ING, with_plen(tcp6(), 28), XDP_DROP, SAME,
     MALFORMED, ""),
    ("IPv6 payload length past the frame behind an 802.1Q tag, to the VIP: dropped", ING, tagged(tcp6())[:-4],
     XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 payload length past the frame, to another address: passes", ING,
     with_plen(tcp6(dst=ROUTER6, dport=22), 28), XDP_PASS, SAME, PASS, ""),
    ("IPv6 payload length shorter than the TCP header (10 of 20 bytes): dropped", ING, with_plen(tcp6(), 10),
     XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 payload length 0, next header TCP, to the VIP: dropped", ING, cut6(tcp6(), 0), XDP_DROP, SAME, MALFORMED,
     ""),
    ("IPv6 SYN with Ethernet padding after it (payload length shorter than the frame): NAT, padding kept", ING,
     padded(tcp6()), XDP_REDIRECT, dnat6_padded(), {"redirect": 1}, W, connected6("e0")),
    ("IPv6 jumbogram (payload length 0, hop-by-hop jumbo option) to the VIP: dropped", ING, JUMBO, XDP_DROP, SAME,
     MALFORMED, ""),
    # -- extension headers ---------------------------------------------------------------------------
    ("IPv6 SYN behind a hop-by-hop header (router alert): NAT", ING, tcp6(ext=HBH), XDP_REDIRECT, dnat6(E0),
     {"redirect": 1}, W, connected6("e0")),
    ("IPv6 SYN behind hop-by-hop, routing (segments left 0) and destination options: NAT", ING,
     tcp6(ext=HBH / IPv6ExtHdrRouting(segleft=0) / IPv6ExtHdrDestOpt()), XDP_REDIRECT, dnat6(E0), {"redirect": 1},
     W, connected6("e0")),
    (f"IPv6 SYN behind {EXT_MAX} extension headers (the parser's bound): NAT", ING, tcp6(ext=ext_chain(EXT_MAX)),
     XDP_REDIRECT, dnat6(E0), {"redirect": 1}, W, connected6("e0")),
    (f"IPv6 SYN behind {EXT_MAX + 1} extension headers (past the bound) to the VIP: v6_ext_header", ING,
     tcp6(ext=ext_chain(EXT_MAX + 1)), XDP_DROP, SAME, drop("v6_ext_header"), ""),
    (f"IPv6 behind {EXT_MAX + 1} extension headers to another address: passes", ING,
     tcp6(dst=ROUTER6, dport=22, ext=ext_chain(EXT_MAX + 1)), XDP_PASS, SAME, PASS, ""),
    ("IPv6 SYN behind 520 bytes of destination options (past the L4 offset the parser reaches): dropped", ING,
     tcp6(ext=FAR), XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 SYN with a routing header, segments left 1 (the VIP not its final destination): v6_ext_header", ING,
     tcp6(ext=IPv6ExtHdrRouting(segleft=1, addresses=[str(ROUTER6)])), XDP_DROP, SAME, drop("v6_ext_header"), "",
     connected6("e0")),
    ("IPv6 segment routing header, segments left 1, to the VIP: v6_ext_header", ING,
     tcp6(ext=IPv6ExtHdrRouting(type=4, segleft=1, addresses=[str(ROUTER6)])), XDP_DROP, SAME,
     drop("v6_ext_header"), ""),
    ("IPv6 routing header cut short (2 of its 8 bytes in the frame) to the VIP: dropped", ING,
     proto6(43, b"\x06\x00"), XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 routing header, segments left 1, to another address: passes", ING,
     tcp6(dst=ROUTER6, dport=22, ext=IPv6ExtHdrRouting(segleft=1, addresses=[str(VIP6)])), XDP_PASS, SAME, PASS,
     ""),
    ("IPv6 extension header cut short (1 byte of it in the frame) to the VIP: dropped", ING, ext_cut_short(),
     XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 extension header longer than the payload (88 bytes before 20) to the VIP: dropped", ING,
     ext_past_payload(), XDP_DROP, SAME, MALFORMED, ""),
    # -- fragments and next headers the ingress does not take ------------------------------------------
    ("IPv6 later fragment (offset 185, the last) to the VIP: v6_fragment", ING,
     frame6(CLIENT6, VIP6, Raw(b"x" * 24), ext=IPv6ExtHdrFragment(offset=185, m=0, id=7, nh=6)), XDP_DROP, SAME,
     drop("v6_fragment"), ""),
    ("IPv6 atomic fragment (offset 0, no more fragments) to the VIP: v6_fragment", ING,
     tcp6(ext=IPv6ExtHdrFragment(offset=0, m=0, id=8)), XDP_DROP, SAME, drop("v6_fragment"), ""),
    ("IPv6 first fragment behind a destination options header to the VIP: v6_fragment", ING,
     tcp6(ext=IPv6ExtHdrDestOpt() / IPv6ExtHdrFragment(offset=0, m=1, id=9)), XDP_DROP, SAME, drop("v6_fragment"),
     ""),
    ("IPv6 no next header (59) to the VIP: v6_ext_header", ING, proto6(59), XDP_DROP, SAME, drop("v6_ext_header"),
     ""),
    ("IPv6 ESP (50) to the VIP: v6_ext_header", ING, proto6(50), XDP_DROP, SAME, drop("v6_ext_header"), ""),
    ("IPv6 SCTP (132) behind a hop-by-hop header to the VIP: v6_ext_header", ING,
     frame6(CLIENT6, VIP6, Raw(b"\0" * 12), ext=IPv6ExtHdrHopByHop(nh=132, options=[RouterAlert(value=0), PadN()])),
     XDP_DROP, SAME, drop("v6_ext_header"), ""),
    ("IPv6 unknown next header (253) to another address: passes", ING, proto6(253, dst=ROUTER6), XDP_PASS, SAME,
     PASS, ""),
    # -- TCP and UDP headers -----------------------------------------------------------------------------
    ("IPv6 TCP header cut short (12 of 20 bytes) to the VIP: dropped", ING, cut6(tcp6(), 12), XDP_DROP, SAME,
     MALFORMED, ""),
    ("IPv6 TCP data offset 4 (below the header's 5 words) to the VIP: dropped", ING, tcp_doff(4), XDP_DROP, SAME,
     MALFORMED, ""),
    ("IPv6 TCP data offset 15 (60 bytes, 20 in the packet) to the VIP: dropped", ING, tcp_doff(15), XDP_DROP, SAME,
     MALFORMED, ""),
    ("IPv6 UDP header cut short (6 of 8 bytes) to the VIP: dropped", ING, cut6(udp6(), 6), XDP_DROP, SAME, MALFORMED,
     ""),
    ("IPv6 UDP length past the payload to the VIP: dropped", ING, udp6(length=40), XDP_DROP, SAME, MALFORMED, ""),
    ("IPv6 UDP length 4 (below its own header) to the VIP: dropped", ING, udp6(length=4), XDP_DROP, SAME, MALFORMED,
     ""),
    # -- UDP checksum 0: invalid in IPv6 (RFC 8200 8.1); NAT would turn it into a wrong one -----------
    ("IPv6 UDP to a UDP VIP: NAT to its backend, checksum recomputed", ING, dgram6(), XDP_REDIRECT, dnat_udp6,
     {"redirect": 1}, U),
    ("IPv6 UDP with checksum 0 to a UDP VIP: dropped", ING, dgram6(zero=True), XDP_DROP, SAME, MALFORMED, U),
    ("IPv6 UDP with checksum 0 of a pinned flow (the established path): dropped", ING, dgram6(zero=True), XDP_DROP,
     SAME, MALFORMED, U, pinned_udp6),
    ("IPv6 UDP with checksum 0 to another address: passes", ING, dgram6(zero=True, dst=ROUTER6), XDP_PASS, SAME,
     PASS, ""),
    ("IPv6 UDP reply of a pinned flow: source back to the VIP (tc)", RET, dgram6(reply=True, hlim=1), TC_ACT_OK,
     snat_udp6, {"return_nat": 1}, U, pinned_udp6),
    ("IPv6 UDP reply with checksum 0 of a pinned flow: dropped (tc)", RET, dgram6(zero=True, reply=True, hlim=1),
     TC_ACT_SHOT, SAME, MALFORMED, U, pinned_udp6),
    ("IPv6 UDP reply of a pinned flow, its hop cached: reverse NAT, redirected (XDP)", REP, dgram6(reply=True),
     XDP_REDIRECT, lambda f: snat_udp6(f, xdp=True), {"return_xdp": 1}, U, pinned_udp6, hop6(vip=UDP6_VIP)),
    ("IPv6 UDP reply with checksum 0 of a pinned flow, its hop cached: to tc", REP, dgram6(zero=True, reply=True),
     XDP_PASS, SAME, {}, "", pinned_udp6, hop6(vip=UDP6_VIP)),
    # -- neighbour discovery and MLD pass untouched ------------------------------------------------------
    ("IPv6 neighbour solicitation to the VIP itself (unicast, reachability): passes untouched", ING,
     nd(ICMPv6ND_NS(tgt=str(VIP6)), VIP6), XDP_PASS, SAME, PASS, ""),
    ("IPv6 neighbour advertisement to the router: passes untouched", ING,
     nd(ICMPv6ND_NA(tgt=str(CLIENT6), S=1), ROUTER6), XDP_PASS, SAME, PASS, ""),
    ("IPv6 router solicitation: passes untouched", ING, nd(ICMPv6ND_RS(), "ff02::2", "33:33:00:00:00:02"), XDP_PASS,
     SAME, PASS, ""),
    ("IPv6 router advertisement: passes untouched", ING, nd(ICMPv6ND_RA(), "ff02::1", "33:33:00:00:00:01"), XDP_PASS,
     SAME, PASS, ""),
    ("IPv6 redirect to the VIP address: passes untouched", ING, nd(ICMPv6ND_Redirect(tgt=str(ROUTER6),
     dst=str(CLIENT6)), VIP6), XDP_PASS, SAME, PASS, ""),
    ("IPv6 MLDv2 report behind a hop-by-hop header (router alert): passes untouched", ING, MLD, XDP_PASS, SAME, PASS,
     ""),
]
# fmt: on
