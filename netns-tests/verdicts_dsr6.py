"""DSR rows of an IPv6 service for test_verdicts.py's table (encap6.h): the service "dsr6" of
verdicts.py's world (VIP6 2001:2:0:ff::3 port 80, one backend f0, forwarding: dsr). Each row
caches f0's way out (edge_hop6: BACKEND_IF, the hop's MACs, the router's address ROUTER6_B on
that link, MTU 1500), so no row asks the FIB. The expected frames are built with scapy: the
client's packet, hop limit - 1, behind an outer IPv6 header (next header 41) from ROUTER6_B to
f0. rows(row) builds them with verdicts_v4.py's row(). ICMPv6 errors about a dsr6 flow go to f0 in
the same tunnel, untranslated: f0 holds the VIP, so the error must quote the packet its socket sent."""

from __future__ import annotations

from ipaddress import IPv6Address
from typing import Callable

from scapy.layers.inet import TCP
from scapy.layers.inet6 import ICMPv6DestUnreach, ICMPv6TimeExceeded, IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw
from verdicts import (
    BACKEND_IF,
    CLIENT_MAC,
    CLIENT_PORT,
    DSR6_VIP,
    F0,
    HOP_DMAC,
    HOP_EXPIRES,
    HOP_SMAC,
    MTU,
    ROUTER_MAC,
    XDP_DROP,
    XDP_REDIRECT,
    World,
)
from verdicts6 import CLIENT6, connected6
from verdicts_icmp6 import error6, from_vip6

from controlplane import abi
from controlplane.maps.records import put_addr

ING = abi.PROG_INGRESS
DSR6 = abi.PROG_INGRESS6_DSR
ROUTER6_B = IPv6Address("2001:2:0:1::1")  # the router's address towards the backends: the outer source


def syn6(*, payload: bytes = b"", vlan: bool = False, fl: int = 0x12345, tc: int = 0x28) -> bytes:
    """A client's TCP segment to the dsr6 VIP (SYN, or with payload an ACK carrying it)."""
    seg = TCP(sport=CLIENT_PORT, dport=80, flags="A" if payload else "S", seq=1000, ack=1 if payload else 0)
    l3 = IPv6(src=str(CLIENT6), dst=str(DSR6_VIP), hlim=64, fl=fl, tc=tc) / seg / Raw(payload)
    eth = Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
    return bytes(eth / Dot1Q(vlan=7) / l3 if vlan else eth / l3)


def encap6(f: bytes) -> bytes:
    """Expected: the inner IPv6 packet (hop limit - 1) behind an outer IPv6 header from ROUTER6_B to
    f0 with its traffic class and flow label, hop limit 64, next header 41; the hop's MACs; no tag."""
    inner = Ether(f)[IPv6]
    inner.hlim -= 1
    raw = bytes(inner)
    outer = IPv6(src=str(ROUTER6_B), dst=str(F0[0]), nh=41, hlim=64, tc=inner.tc, fl=inner.fl, plen=len(raw))
    return bytes(Ether(dst=HOP_DMAC.hex(":"), src=HOP_SMAC.hex(":"), type=0x86DD) / outer / Raw(raw))


def hop6_cached(w: World) -> None:
    """f0's way out in edge_hop6, on every CPU."""
    t = w.t[abi.MAP_HOP6]
    v = t.Leaf()
    for cpu in range(len(v)):
        v[cpu].expires, v[cpu].ifindex, v[cpu].mtu = HOP_EXPIRES, BACKEND_IF, MTU
        for i in range(6):
            v[cpu].smac[i], v[cpu].dmac[i] = HOP_SMAC[i], HOP_DMAC[i]
        put_addr(v[cpu], "src", ROUTER6_B)
    t[t.Key(w.bid("f0"))] = v


# edge_ct6 pins the client's connection to the dsr6 VIP to f0 (select.h writes it for DSR too)
dsr6_connected = connected6("f0", vip=DSR6_VIP, service="dsr6")


def dsr6_error(**kw) -> bytes:
    """An ICMPv6 error (default: packet too big, MTU 1400) from a hop to the dsr6 VIP quoting the
    VIP's segment to the client."""
    return error6(from_vip6(src=DSR6_VIP), dst=DSR6_VIP, **kw)


def tagged(f: bytes) -> bytes:
    """f with an 802.1Q tag (VLAN 7) after its MACs."""
    return f[:12] + b"\x81\x00\x00\x07" + f[12:]


def hand_over(length: int, backend: str = "f0") -> Callable[[World], None]:
    """A hand-over from edge_ingress6 to the DSR program left on every CPU (maps.h, dsr6_hand):
    backend chosen, for a frame of length bytes."""

    def put(w: World) -> None:
        t = w.loaded.table("edge_dsr6_hand")
        v = t.Leaf()
        for cpu in range(len(v)):
            v[cpu].len, v[cpu].bid, v[cpu].vip_id = length, w.bid(backend), w.ids["dsr6"][0]
            v[cpu].l3_off, v[cpu].l3_len = 14, length - 14
        t[t.Key(0)] = v

    return put


def hands_left(w: World) -> int:
    """On how many CPUs a hand-over waits (the DSR program clears the one it takes)."""
    t = w.loaded.table("edge_dsr6_hand")
    return sum(v.len != 0 for v in t[t.Key(0)])


def cpus(w: World) -> int:
    return len(w.loaded.table("edge_dsr6_hand").Leaf())


def hand_taken(w: World) -> bool:
    """No hand-over left on any CPU: the DSR program took the one edge_ingress6 gave it."""
    return hands_left(w) == 0


def drop(reason: str) -> dict[str, int]:
    return {"drop": 1, f"drop:{reason}": 1}


def rows(row) -> list:
    """The rows, made by verdicts_v4.py's row()."""
    too_big = syn6(payload=b"x" * 1440)  # 1500 bytes of IPv6 packet: 1540 with the outer header
    fits = syn6(payload=b"x" * 1400)  # 1460: 1500 with it
    out: Callable[[bytes], bytes] = encap6
    icmp = {"icmp_to_backend": 1, "dsr": 1}
    # fmt: off
    return [
        row("IPv6 DSR: a SYN goes to the backend in IPv6-in-IPv6", ING, syn6(), XDP_REDIRECT, out, {"dsr": 1},
            hop6_cached, after=[("the DSR program took edge_ingress6's hand-over", hand_taken)], svc="dsr6"),
        # the DSR program on its own (edge_ingress6 handed nothing over: a tail of another compile
        # during a deploy): it parses the packet again and sends it where edge_ct6 says
        row("IPv6 DSR program without a hand-over: parses again, to edge_ct6's backend", DSR6, syn6(payload=b"x"),
            XDP_REDIRECT, out, {"dsr": 1}, hop6_cached, dsr6_connected, svc="dsr6"),
        row("IPv6 DSR program with a hand-over for a frame of another length: parses again", DSR6,
            syn6(payload=b"x"), XDP_REDIRECT, out, {"dsr": 1}, hop6_cached, dsr6_connected, hand_over(99),
            after=[("the stale hand-over is left", lambda w: hands_left(w) == cpus(w))], svc="dsr6"),
        row("IPv6 DSR program with edge_ingress6's hand-over: sent to its backend, no second lookup (no entry)",
            DSR6, syn6(payload=b"x"), XDP_REDIRECT, out, {"dsr": 1}, hop6_cached,
            hand_over(len(syn6(payload=b"x"))), after=[("this CPU's hand-over is taken", lambda w: hands_left(w) == cpus(w) - 1)],
            svc="dsr6"),
        row("IPv6 DSR program without a hand-over or an entry: dropped", DSR6, syn6(payload=b"x"), XDP_DROP, None,
            drop("no_backend"), hop6_cached, svc=""),
        row("IPv6 DSR: a full-size segment that still fits the backend link", ING, fits, XDP_REDIRECT, out,
            {"dsr": 1}, hop6_cached, svc="dsr6"),
        row("IPv6 DSR: a packet the tunnel cannot carry is dropped", ING, too_big, XDP_DROP, None,
            drop("dsr_too_big"), hop6_cached, svc="dsr6"),
        row("IPv6 DSR, VLAN tagged: the tag goes", ING, syn6(vlan=True), XDP_REDIRECT, out, {"dsr": 1},
            hop6_cached, svc="dsr6"),
        # ICMPv6 errors about a DSR flow (icmp6.h): to the backend in the tunnel, the error unchanged
        row("ICMPv6 packet too big about a pinned IPv6 DSR flow: to f0 in IPv6-in-IPv6, untranslated", ING,
            dsr6_error(), XDP_REDIRECT, out, icmp, hop6_cached, dsr6_connected, svc="dsr6"),
        row("ICMPv6 destination unreachable about an IPv6 DSR flow edge_ct6 lacks: to the Maglev pick, "
            "untranslated", ING, dsr6_error(kind=ICMPv6DestUnreach, code=1), XDP_REDIRECT, out, icmp,
            hop6_cached, svc="dsr6"),
        row("ICMPv6 time exceeded about an IPv6 DSR flow: to f0, untranslated", ING,
            dsr6_error(kind=ICMPv6TimeExceeded), XDP_REDIRECT, out, icmp, hop6_cached, dsr6_connected,
            svc="dsr6"),
        row("ICMPv6 error about an IPv6 DSR flow, VLAN tagged: the tag goes", ING, tagged(dsr6_error()),
            XDP_REDIRECT, out, icmp, hop6_cached, dsr6_connected, svc="dsr6"),
    ]
    # fmt: on
