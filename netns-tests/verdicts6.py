"""IPv6 rows of test_verdicts.py's table (ingress6.h, return6.h): frames built here with scapy, the
expected rewrites computed by scapy's own checksums, and the set-ups they need. The world
(verdicts.py) deploys the IPv6 service "web6" (VIP6:80 -> e0) next to the IPv4 ones, and every row
starts with edge_ct6 empty and e0's next hop cached, so no row asks the FIB. ROWS6 holds plain
tuples in row()'s argument order; test_verdicts.py turns them into its rows."""

from __future__ import annotations

import functools
import operator
import struct
from ipaddress import IPv6Address
from typing import Callable

from scapy.layers.inet import TCP, UDP
from scapy.layers.inet6 import ICMPv6ND_NS, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from verdicts import (
    CLIENT_IF,
    CLIENT_MAC,
    CLIENT_PORT,
    HOP_DMAC,
    HOP_EXPIRES,
    HOP_SMAC,
    MTU,
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

from controlplane import abi
from controlplane.maps.records import be16, hash_mix, put_addr

ING, RET, REP = abi.PROG_INGRESS, abi.PROG_RETURN, abi.PROG_REPLY
CLIENT6, ROUTER6 = IPv6Address("2001:2::2"), IPv6Address("2001:2::1")
VIP6 = IPv6Address("2001:2:0:ff::1")
E0, E1 = (IPv6Address("2001:2:0:1::2"), 8000), (IPv6Address("2001:2:0:1::3"), 8000)
SAME = "unchanged"


def frame6(src, dst, l4, *, ext=None, hlim=64) -> bytes:
    l3 = IPv6(src=str(src), dst=str(dst), hlim=hlim)
    if ext is not None:
        l3 = l3 / ext
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / l3 / l4)


def tcp6(src=CLIENT6, dst=VIP6, flags="S", *, sport=CLIENT_PORT, dport=80, ext=None, hlim=64, payload=b"") -> bytes:
    seg = TCP(sport=sport, dport=dport, flags=flags, seq=1000, ack=1 if "A" in flags else 0)
    return frame6(src, dst, seg / Raw(payload) if payload else seg, ext=ext, hlim=hlim)


def reply6(src=E0, flags="SA", hlim=64) -> bytes:
    """The backend's answer to the client's connection to VIP6:80 (acking its SYN, seq 1000)."""
    seg = TCP(sport=src[1], dport=CLIENT_PORT, flags=flags, seq=5000, ack=1001)
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(src[0]), dst=str(CLIENT6), hlim=hlim) / seg)


def dnat6(to) -> Callable[[bytes], bytes]:
    """Expected: destination (address, port) to, hop limit - 1, the cached hop's MACs."""

    def expect(f: bytes) -> bytes:
        p = Ether(f)
        p.dst, p.src = HOP_DMAC.hex(":"), HOP_SMAC.hex(":")
        p[IPv6].dst, p[IPv6].hlim = str(to[0]), p[IPv6].hlim - 1
        p[TCP].dport = to[1]
        del p[TCP].chksum
        return bytes(p)

    return expect


def snat6(f: bytes) -> bytes:
    """Expected: the reply's source is VIP6:80 again (handed to the stack: MACs, hop limit kept)."""
    p = Ether(f)
    p[IPv6].src = str(VIP6)
    p[TCP].sport = 80
    del p[TCP].chksum
    return bytes(p)


def connected6(
    backend: str, flags: int = 0, syn_seq: int = 0, vip: IPv6Address = VIP6, service: str = "web6"
) -> Callable[[World], None]:
    """edge_ct6 pins the client's connection to vip:80 (service's) to backend."""

    def setup(w: World) -> None:
        t = w.t[abi.MAP_CT6]
        k = t.Key()
        put_addr(k, "src", CLIENT6)
        put_addr(k, "dst", vip)
        k.sport, k.dport, k.proto = be16(CLIENT_PORT), be16(80), 6
        v = t.Leaf()
        v.backend_id, v.vip_id, v.flags = w.bid(backend), w.vid(service), flags
        v.syn_seq = syn_seq
        t[k] = v

    return setup


def hop6(ifindex: int = CLIENT_IF, vip: IPv6Address = VIP6) -> Callable[[World], None]:
    """edge_reply_hop6 holds the hop of replies from vip (VIP6 unless given) to CLIENT6 (hop6.h, reply_hop6_at: its
    slot, tagged with both addresses) on every CPU: out of ifindex, the REPLY_* MACs."""

    def setup(w: World) -> None:
        words = struct.unpack("=4I", CLIENT6.packed) + struct.unpack("=4I", vip.packed)
        slot = hash_mix(functools.reduce(operator.xor, words)) & (abi.REPLY_HOP_SLOTS - 1)
        t = w.t[abi.MAP_REPLY_HOP6]
        v = t.Leaf()
        for cpu in range(len(v)):
            e = v[cpu]
            e.expires, e.ifindex, e.mtu = HOP_EXPIRES, ifindex, MTU
            put_addr(e, "client", CLIENT6)
            put_addr(e, "vip", vip)
            for field, mac in (("smac", REPLY_SMAC), ("dmac", REPLY_DMAC)):
                for i, b in enumerate(mac):
                    getattr(e, field)[i] = b
        t[t.Key(slot)] = v
        w.hop6_slot = slot  # reset() empties it for the next row

    return setup


def rnat6_changed(to_backend: str) -> Callable[[World], None]:
    """edge_reply copies e0's edge_rnat6 entry (one reply through it: reply6.h, rnat6_cached), then the
    entry names to_backend under a new node_info.rnat_gen, as the maps writer changes it (reset() puts
    it back): the copy must not be used."""

    def setup(w: World) -> None:
        verdict, *_ = w.run(REP, reply6(flags="A"))
        assert verdict == XDP_REDIRECT  # the copy is made, under the current generation
        t = w.t[abi.MAP_RNAT6]
        k = t.Key()
        put_addr(k, "addr", E0[0])
        k.port, k.proto = be16(E0[1]), 6
        old = t[k]
        w.rnat6_saved = [(type(k).from_buffer_copy(k), type(old).from_buffer_copy(old))]
        v = type(old).from_buffer_copy(old)
        v.backend_id = w.bid(to_backend)
        t[k] = v
        w.maps.rnat_changed()

    return setup


def snat6_xdp(f: bytes) -> bytes:
    """Expected of edge_reply: source VIP6:80 again, hop limit - 1, the cached reply hop's MACs."""
    p = Ether(snat6(f))
    p.dst, p.src = REPLY_DMAC.hex(":"), REPLY_SMAC.hex(":")
    p[IPv6].hlim -= 1
    return bytes(p)


def drop(reason: str) -> dict[str, int]:
    return {"drop": 1, f"drop:{reason}": 1}


DSTOPT = IPv6ExtHdrDestOpt()
FRAG = IPv6ExtHdrFragment(offset=0, m=1, id=7)
NS = bytes(
    Ether(dst="33:33:ff:00:00:01", src=CLIENT_MAC)
    / IPv6(src=str(CLIENT6), dst="ff02::1:ff00:1", hlim=255)
    / ICMPv6ND_NS(tgt=str(ROUTER6))
)

GRE6 = bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(CLIENT6), dst=str(VIP6), nh=47) / Raw(b"\0" * 8))


def broken_syn() -> bytes:
    """A SYN to the VIP whose TCP checksum is one off."""
    f = bytearray(tcp6())
    f[14 + 40 + 17] ^= 1  # the checksum's low byte
    return bytes(f)


W = "web6"  # the service rows after the VIP lookup count under

# (name, prog, frame, verdict, out, counters, the service they grow under ("": none known), *setup)
# fmt: off
ROWS6 = [
    ("IPv6 SYN to the VIP: NAT to its Maglev pick, redirected", ING, tcp6(), XDP_REDIRECT, None, {"redirect": 1}, W),
    ("IPv6 SYN of a pinned flow: NAT to its backend", ING, tcp6(), XDP_REDIRECT, dnat6(E0), {"redirect": 1}, W,
     connected6("e0")),
    ("IPv6 SYN behind a destination options header: NAT", ING, tcp6(ext=DSTOPT), XDP_REDIRECT, None,
     {"redirect": 1}, W),
    ("IPv6 ACK of a pinned flow: NAT", ING, tcp6(flags="A"), XDP_REDIRECT, dnat6(E0), {"redirect": 1}, W,
     connected6("e0")),
    ("IPv6 UDP to the VIP's TCP port passes", ING, frame6(CLIENT6, VIP6, UDP(sport=CLIENT_PORT, dport=80) / Raw(b"q")),
     XDP_PASS, SAME, {"pass": 1}, ""),
    ("IPv6 to another address passes", ING, tcp6(dst=ROUTER6, dport=22), XDP_PASS, SAME, {"pass": 1}, ""),
    ("IPv6 neighbour solicitation passes untouched", ING, NS, XDP_PASS, SAME, {"pass": 1}, ""),
    ("IPv6 hop limit 1: to the stack (time exceeded)", ING, tcp6(hlim=1), XDP_PASS, SAME, {"pass": 1}, W),
    ("IPv6 fragment to the VIP: dropped", ING, tcp6(ext=FRAG), XDP_DROP, SAME, drop("v6_fragment"), ""),
    ("IPv6 fragment to another address passes", ING, tcp6(dst=ROUTER6, ext=FRAG), XDP_PASS, SAME, {"pass": 1}, ""),
    ("IPv6 GRE (an unknown next header) to the VIP: dropped", ING, GRE6, XDP_DROP, SAME, drop("v6_ext_header"), ""),
    ("IPv6 SYN with a wrong checksum: dropped", ING, broken_syn(), XDP_DROP, SAME, drop("bad_checksum"), W),
    ("IPv6 SYN-ACK from the pinned backend: source back to the VIP", RET, reply6(hlim=1), TC_ACT_OK, snat6,
     {"return_nat": 1}, W, connected6("e0", abi.CT_F_SYN, 1000)),
    ("IPv6 reply of a flow pinned to another backend: dropped", RET, reply6(src=E1), TC_ACT_SHOT, SAME,
     drop("other_backend"), W, connected6("e0")),
    ("IPv6 reply without a connection: untouched", RET, reply6(), 0xFFFFFFFF, SAME, {}, ""),
    ("IPv6 SYN-ACK: to tc (passive detection)", REP, reply6(), XDP_PASS, SAME, {}, "", connected6("e0")),
    ("IPv6 reply without a connection: to tc", REP, reply6(flags="A"), XDP_PASS, SAME, {}, ""),
    ("IPv6 reply, hop limit 1: to tc", REP, reply6(flags="A", hlim=1), XDP_PASS, SAME, {}, "", connected6("e0")),
    # the reply hop cache (hop6.h): a hit needs no FIB; a hop out of another interface is tc's
    ("IPv6 reply, its hop cached: reverse NAT, redirected (XDP)", REP, reply6(flags="A"), XDP_REDIRECT, snat6_xdp,
     {"return_xdp": 1}, W, connected6("e0"), hop6()),
    ("IPv6 reply, its cached hop out of another interface: to tc", REP, reply6(flags="A"), XDP_PASS, SAME, {}, "",
     connected6("e0"), hop6(99)),
    # edge_reply's per-CPU copies of edge_rnat6 entries (reply6.h): used only under the generation they were made in
    ("IPv6 reply after its edge_rnat6 entry changed: the entry decides, not the copy (to tc)", REP, reply6(flags="A"),
     XDP_PASS, SAME, {}, "", connected6("e0"), hop6(), rnat6_changed("e1")),
]
# fmt: on
