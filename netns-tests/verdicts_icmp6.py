"""ICMPv6 rows of test_verdicts.py's table (bpf/include/icmp6.h): errors about IPv6 VIP flows sent
to their backend, a backend's errors sent back as the VIP's, and the malformed corpus (cut short,
nested, naming no flow, quoting extension headers, not quoting the VIP). Frames are built with
scapy; the expected rewrites recompute every checksum from scratch (scapy's, or icmp6_sum here for
quotes too short to hold their TCP checksum), independently of the data path's incremental updates.
World (verdicts.py) has "web6" (VIP6:80 -> e0, e1); rows are plain tuples in row()'s argument order,
as verdicts6.py's."""

from __future__ import annotations

import struct
from typing import Callable

from scapy.layers.inet import TCP, TCPerror
from scapy.layers.inet6 import (
    ICMPv6DestUnreach,
    ICMPv6EchoReply,
    ICMPv6EchoRequest,
    ICMPv6PacketTooBig,
    ICMPv6TimeExceeded,
    IPv6,
    IPv6ExtHdrDestOpt,
    in6_chksum,
)
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from verdicts import (
    CLIENT_MAC,
    HOP_DMAC,
    HOP_SMAC,
    ROUTER_MAC,
    TC_ACT_OK,
    TC_ACT_UNSPEC,
    XDP_DROP,
    XDP_PASS,
    XDP_REDIRECT,
    World,
)
from verdicts6 import CLIENT6, E0, E1, ROUTER6, SAME, VIP6, W, connected6, drop, frame6

from controlplane import abi
from controlplane.maps.records import hash_mix, put_addr

ING, RET, REP = abi.PROG_INGRESS, abi.PROG_RETURN, abi.PROG_REPLY
CPORT = 40000  # verdicts.CLIENT_PORT: connected6's client port
HOP6 = "2001:2:0:fe::1"  # a router between the VIP and the client


def from_vip6(*, dport: int = CPORT, sport: int = 80, src=VIP6, ext=None):
    """A segment VIP6:80 sent to the client, as an ICMPv6 error quotes it (whole: 20-byte TCP header)."""
    l3 = IPv6(src=str(src), dst=str(CLIENT6), hlim=60)
    return (l3 / ext if ext is not None else l3) / TCP(sport=sport, dport=dport, flags="A", seq=1, ack=1)


def error6(quote, *, kind=ICMPv6PacketTooBig, dst=VIP6, src=HOP6, ext=None, hlim=64, **kw) -> bytes:
    """An ICMPv6 error (default: packet too big, MTU 1400) from a hop to dst quoting quote."""
    if kind is ICMPv6PacketTooBig:
        kw.setdefault("mtu", 1400)
    l3 = IPv6(src=src, dst=str(dst), hlim=hlim)
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / (l3 / ext if ext else l3) / kind(**kw) / quote)


def icmp6_sum(frame: bytes, icmp_off: int) -> bytes:
    """frame with its ICMPv6 checksum computed from scratch (over the outer IPv6 pseudo-header)."""
    f = bytearray(frame)
    f[icmp_off + 2 : icmp_off + 4] = b"\0\0"
    ip = IPv6(bytes(f[14:]))
    s = in6_chksum(58, ip, bytes(f[icmp_off:]))
    f[icmp_off + 2 : icmp_off + 4] = struct.pack("!H", s)
    return bytes(f)


def icmp6_to(to, *, whole: bool = True, ext_len: int = 0) -> Callable[[bytes], bytes]:
    """Expected: an ICMPv6 error translated to backend to (outer destination, quoted source address
    and port, the quoted TCP checksum when whole, the ICMPv6 checksum), hop limit - 1, the cached
    hop's MACs; ext_len bytes of extension headers before the ICMPv6 header."""

    def out(f: bytes) -> bytes:
        b = bytearray(f)
        b[0:6], b[6:12] = HOP_DMAC, HOP_SMAC
        b[14 + 7] -= 1
        b[14 + 24 : 14 + 40] = to[0].packed
        icmp = 14 + 40 + ext_len
        b[icmp + 8 + 8 : icmp + 8 + 24] = to[0].packed  # the quote's source
        b[icmp + 48 : icmp + 50] = struct.pack("!H", to[1])
        if whole:
            p = Ether(bytes(b))
            del p[TCPerror].chksum
            b = bytearray(bytes(p))
        return icmp6_sum(bytes(b), icmp)

    return out


def icmp6_back(vip=VIP6, port: int = 80) -> Callable[[bytes], bytes]:
    """Expected: a backend's ICMPv6 error with VIP6 back as outer source and quoted destination
    address and port, the quoted TCP and the ICMPv6 checksums recomputed (handed to the stack:
    MACs and hop limit kept)."""

    def out(f: bytes) -> bytes:
        b = bytearray(f)
        b[14 + 8 : 14 + 24] = vip.packed
        icmp = 14 + 40
        b[icmp + 8 + 24 : icmp + 8 + 40] = vip.packed  # the quote's destination
        b[icmp + 50 : icmp + 52] = struct.pack("!H", port)
        p = Ether(bytes(b))
        del p[TCPerror].chksum
        return icmp6_sum(bytes(p), icmp)

    return out


def echo6_reply(f: bytes) -> bytes:
    """Expected: an echo request answered from where it went: MACs and addresses swapped, hop limit
    64, type echo reply, the ICMPv6 checksum recomputed."""
    b = bytearray(f)
    b[0:6], b[6:12] = f[6:12], f[0:6]
    b[14 + 8 : 14 + 24], b[14 + 24 : 14 + 40] = f[14 + 24 : 14 + 40], f[14 + 8 : 14 + 24]
    b[14 + 7] = 64
    b[14 + 40] = 129
    return icmp6_sum(bytes(b), 14 + 40)


def backend_error6(src=E0, *, quote_dst=None, kind=ICMPv6DestUnreach, **kw) -> bytes:
    """An ICMPv6 error (default: port unreachable) backend src sends the client about the client's
    segment to it (or to quote_dst)."""
    to = quote_dst or src
    quote = IPv6(src=str(CLIENT6), dst=str(to[0]), hlim=63) / TCP(sport=CPORT, dport=to[1], flags="A", seq=1, ack=1)
    if kind is ICMPv6DestUnreach:
        kw.setdefault("code", 4)
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(src[0]), dst=str(CLIENT6)) / kind(**kw) / quote)


def port_picking6(backend: str) -> Callable[[World], int]:
    """A client port whose flow to VIP6:80 has backend as its first Maglev pick (flow.h's hash over
    the folded addresses, ingress6.h's fold6)."""

    def fold(addr) -> int:
        a, b, c, d = struct.unpack("<4I", addr.packed)
        return a ^ b ^ c ^ d

    def pick(w: World) -> int:
        t = w.t[abi.MAP_VIPS6]
        k = t.Key()
        put_addr(k, "addr", VIP6)
        k.port, k.proto = int.from_bytes((80).to_bytes(2, "big"), "little"), 6
        table = w.maps.read_table(w.vid("web6"), t[k].table)
        want = w.bid(backend)
        swap = lambda p: int.from_bytes(p.to_bytes(2, "big"), "little")  # noqa: E731
        for p in range(CPORT, CPORT + 1000):
            h = 0x9E3779B9
            for v in (fold(CLIENT6), fold(VIP6), (swap(p) << 16) | swap(80), 6):
                h = hash_mix(h ^ v)
            if table[h % w.maps.m] == want:
                return p
        raise AssertionError(f"no port picks {backend}")

    return pick


def error_picking(backend: str, **kw) -> Callable[[World], bytes]:
    return lambda w: error6(from_vip6(dport=port_picking6(backend)(w)), **kw)


def cut(b: bytes, n: int) -> bytes:
    """b's IPv6 packet cut to its first n bytes of payload (payload length to match)."""
    f = bytearray(b[: 14 + 40 + n])
    f[14 + 4 : 14 + 6] = struct.pack("!H", n)
    return bytes(f)


ECHO6 = frame6(CLIENT6, VIP6, ICMPv6EchoRequest(id=0x1234, seq=7, data=b"p" * 56), hlim=61)
PTB = error6(from_vip6())
PTB_NESTED = error6(IPv6(src=str(VIP6), dst=str(CLIENT6)) / ICMPv6PacketTooBig(mtu=1400) / from_vip6())
PTB_SHORT_QUOTE = icmp6_sum(cut(PTB, 8 + 40 + 8), 14 + 40)  # the quote's first 8 TCP bytes only

# fmt: off
ROWS_ICMP6 = [
    # -- ingress: ICMPv6 errors about IPv6 VIP flows (icmp6.h) -------------------------------------
    ("ICMPv6 packet too big about a pinned IPv6 VIP flow: to its backend, translated", ING, PTB, XDP_REDIRECT,
     icmp6_to(E0), {"icmp_to_backend": 1, "redirect": 1}, W, connected6("e0")),
    ("ICMPv6 destination unreachable about a flow pinned to e1: to e1", ING,
     error6(from_vip6(), kind=ICMPv6DestUnreach, code=1), XDP_REDIRECT, icmp6_to(E1),
     {"icmp_to_backend": 1, "redirect": 1}, W, connected6("e1")),
    ("ICMPv6 time exceeded about a flow edge_ct6 does not hold: to its Maglev pick", ING,
     error_picking("e1", kind=ICMPv6TimeExceeded), XDP_REDIRECT, icmp6_to(E1),
     {"icmp_to_backend": 1, "redirect": 1}, W),
    ("ICMPv6 packet too big quoting 8 bytes of TCP: translated, no quoted checksum to fix", ING, PTB_SHORT_QUOTE,
     XDP_REDIRECT, icmp6_to(E0, whole=False), {"icmp_to_backend": 1, "redirect": 1}, W, connected6("e0")),
    ("ICMPv6 error to a VIP behind a destination options header: translated", ING,
     error6(from_vip6(), ext=IPv6ExtHdrDestOpt()), XDP_REDIRECT, icmp6_to(E0, ext_len=8),
     {"icmp_to_backend": 1, "redirect": 1}, W, connected6("e0")),
    ("ICMPv6 error to a VIP, hop limit 1: to the stack", ING, error6(from_vip6(), hlim=1), XDP_PASS,
     SAME, {"pass": 1}, "", connected6("e0")),
    ("ICMPv6 error to another address passes", ING, error6(from_vip6(), dst=ROUTER6), XDP_PASS, SAME,
     {"pass": 1}, ""),
    ("ICMPv6 echo reply to a VIP (no error) passes", ING, frame6(CLIENT6, VIP6, ICMPv6EchoReply()), XDP_PASS, SAME,
     {"pass": 1}, ""),
    # -- ingress: the malformed corpus ----------------------------------------------------------------
    ("ICMPv6 header cut short to a VIP: icmp_malformed", ING, cut(PTB, 2), XDP_DROP, SAME,
     drop("icmp_malformed"), ""),
    ("ICMPv6 error whose quote is cut short (half an IPv6 header): icmp_malformed", ING, cut(PTB, 8 + 20),
     XDP_DROP, SAME, drop("icmp_malformed"), "", connected6("e0")),
    ("ICMPv6 error quoting an ICMPv6 error: icmp_nested", ING, PTB_NESTED, XDP_DROP, SAME, drop("icmp_nested"), ""),
    ("ICMPv6 error about a VIP port no service has: icmp_no_flow", ING, error6(from_vip6(sport=81)),
     XDP_DROP, SAME, drop("icmp_no_flow"), ""),
    ("ICMPv6 error quoting a packet with an extension header: icmp_malformed", ING,
     error6(from_vip6(ext=IPv6ExtHdrDestOpt())), XDP_DROP, SAME, drop("icmp_malformed"), "",
     connected6("e0")),
    ("ICMPv6 error to a VIP quoting a packet from another address: icmp_malformed", ING,
     error6(from_vip6(src=ROUTER6)), XDP_DROP, SAME, drop("icmp_malformed"), ""),
    ("ICMPv6 error quoting a packet that is no IPv6: icmp_malformed", ING,
     error6(Raw(b"\x45" + b"\0" * 55)), XDP_DROP, SAME, drop("icmp_malformed"), ""),
    # -- ingress: echo requests to an IPv6 VIP address (icmp6.h, icmp6_echo) ------------------------
    ("ping to an IPv6 VIP address: answered from the VIP, back where it came from", ING, ECHO6, XDP_REDIRECT,
     echo6_reply, {"icmp_echo": 1}, ""),
    ("ping to an IPv6 VIP address, node.answer_ping off: to the stack", ING, ECHO6, XDP_PASS, SAME, {"pass": 1}, "",
     lambda w: w.node(answer_ping=False)),
    ("ping to an IPv6 VIP address from a multicast source: to the stack", ING,
     frame6("ff02::1", VIP6, ICMPv6EchoRequest()), XDP_PASS, SAME, {"pass": 1}, ""),
    ("ping to an IPv6 VIP address behind a destination options header: to the stack", ING,
     frame6(CLIENT6, VIP6, ICMPv6EchoRequest(), ext=IPv6ExtHdrDestOpt()), XDP_PASS, SAME, {"pass": 1}, ""),
    ("ping to the router's IPv6 address passes", ING, frame6(CLIENT6, ROUTER6, ICMPv6EchoRequest()), XDP_PASS, SAME,
     {"pass": 1}, ""),
    # -- return path (tc): a backend's ICMPv6 error about a client's packet --------------------------
    ("a backend's ICMPv6 port unreachable goes back as the VIP's", RET, backend_error6(), TC_ACT_OK,
     icmp6_back(), {"icmp_return": 1}, W, connected6("e0")),
    ("a backend's ICMPv6 error about a flow pinned to another backend: untouched", RET, backend_error6(E1),
     TC_ACT_UNSPEC, SAME, {}, "", connected6("e0")),
    ("a backend's ICMPv6 error quoting a packet to another address: untouched", RET,
     backend_error6(quote_dst=(ROUTER6, 8000)), TC_ACT_UNSPEC, SAME, {}, "", connected6("e0")),
    ("a backend's ICMPv6 error without a connection: untouched", RET, backend_error6(), TC_ACT_UNSPEC, SAME, {}, ""),
    ("a backend's ICMPv6 echo request: untouched", RET, frame6(E0[0], CLIENT6, ICMPv6EchoRequest()), TC_ACT_UNSPEC,
     SAME, {}, "", connected6("e0")),
    ("a backend's ICMPv6 error (XDP): to tc", REP, backend_error6(), XDP_PASS, SAME, {}, "", connected6("e0")),
]
# fmt: on
