"""Connection-state rows of IPv6 for test_verdicts.py's table (bpf/include/state6.h): half-open
entries (a SYN waits in edge_half_open6 until the client's ACK acknowledges the backend's SYN-ACK,
so a SYN flood cannot evict edge_ct6's connections), the stateless path over the budget in both
directions (a flow with no entry goes to its first Maglev pick; a reply with no entry is reverse-
NATed when that pick is the sender), and direct connections to a backend's own IPv6 address
(edge_direct6), which the return path leaves alone. The world (verdicts.py) has "web6" (VIP6:80 ->
e0, e1); frames come from verdicts6.py's builders and are checked with scapy's checksums.
rows(row) builds them with verdicts_v4.py's row()."""

from __future__ import annotations

import struct
from ipaddress import IPv6Address
from typing import Callable

from scapy.layers.inet import TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from verdicts import (
    CLIENT_MAC,
    CLIENT_PORT,
    LO,
    ROUTER_MAC,
    TC_ACT_OK,
    TC_ACT_SHOT,
    TC_ACT_UNSPEC,
    XDP_DROP,
    XDP_PASS,
    XDP_REDIRECT,
    World,
    _xdp_md,
)
from verdicts6 import CLIENT6, E0, E1, VIP6, dnat6, drop, reply6, snat6
from verdicts_dsr6 import encap6, hop6_cached, syn6
from verdicts_icmp6 import port_picking6

from controlplane import abi, loader
from controlplane.maps.records import be16, hash_mix, put_addr

ING, RET = abi.PROG_INGRESS, abi.PROG_RETURN
W = "web6"
UP = abi.BE_F_VALID | abi.BE_F_UP
FLOOD = 2048  # spoofed SYNs: twice edge_ct6's and edge_half_open6's 1024 entries (verdicts.PARAMS)


def _key(t, sport: int = CLIENT_PORT, client: IPv6Address = CLIENT6):
    k = t.Key()
    put_addr(k, "src", client)
    put_addr(k, "dst", VIP6)
    k.sport, k.dport, k.proto = be16(sport), be16(80), 6
    return k


def _get(w: World, name: str, sport: int):
    t = w.t[name]
    try:
        return t[_key(t, sport)]
    except KeyError:
        return None


def half_open6(backend: str, *, answered_seq: int | None = None, sport: int = CLIENT_PORT):
    """edge_half_open6 holds the client's connection to VIP6:80, its SYN (seq 1000) to backend;
    answered_seq: the backend's SYN-ACK with that sequence number was seen."""

    def setup(w: World) -> None:
        t = w.t[abi.MAP_HALF_OPEN6]
        v = t.Leaf()
        v.ct.backend_id, v.ct.vip_id, v.ct.flags = w.bid(backend), w.vid(W), abi.CT_F_SYN
        v.ct.syn_seq = int.from_bytes((1000).to_bytes(4, "big"), "little")
        if answered_seq is not None:
            v.ack_seq = int.from_bytes((answered_seq + 1).to_bytes(4, "big"), "little")
            v.flags = abi.HO_F_ANSWERED
        t[_key(t, sport)] = v

    return setup


def connected6_port(backend: str, sport: int = CLIENT_PORT) -> Callable[[World], None]:
    def setup(w: World) -> None:
        t = w.t[abi.MAP_CT6]
        v = t.Leaf()
        v.backend_id, v.vip_id = w.bid(backend), w.vid(W)
        t[_key(t, sport)] = v

    return setup


def in_ct6(backend: str | None) -> tuple[str, Callable[[World], bool]]:
    want = "no edge_ct6 entry" if backend is None else f"edge_ct6 pins it to {backend}"
    return (
        want,
        lambda w: (
            (lambda v: None if v is None else v.backend_id)(_get(w, abi.MAP_CT6, CLIENT_PORT))
            == (None if backend is None else w.bid(backend))
        ),
    )


def in_half_open6(backend: str | None) -> tuple[str, Callable[[World], bool]]:
    want = "no edge_half_open6 entry" if backend is None else f"edge_half_open6 holds it for {backend}"
    return (
        want,
        lambda w: (
            (lambda v: None if v is None else v.ct.backend_id)(_get(w, abi.MAP_HALF_OPEN6, CLIENT_PORT))
            == (None if backend is None else w.bid(backend))
        ),
    )


def answered6(seq: int) -> tuple[str, Callable[[World], bool]]:
    def holds(w: World) -> bool:
        v = _get(w, abi.MAP_HALF_OPEN6, CLIENT_PORT)
        return (
            v is not None
            and bool(v.flags & abi.HO_F_ANSWERED)
            and v.ack_seq == int.from_bytes(seq.to_bytes(4, "big"), "little")
        )

    return (f"the SYN-ACK's sequence + 1 ({seq}) noted", holds)


def pinned_half_open(backend: str) -> tuple[str, Callable[[World], bool]]:
    """The half-open entry of the port picking e0 names backend, its SYN's sequence number noted."""

    def holds(w: World) -> bool:
        v = _get(w, abi.MAP_HALF_OPEN6, port_picking6("e0")(w))
        seq = int.from_bytes((1000).to_bytes(4, "big"), "little")
        return v is not None and v.ct.backend_id == w.bid(backend) and v.ct.syn_seq == seq

    return (f"edge_half_open6 holds it for {backend}", holds)


def _direct_key(w: World, backend: tuple[IPv6Address, int], sport: int):
    t = w.t[abi.MAP_DIRECT6]
    k = t.Key()
    put_addr(k, "backend", backend[0])
    put_addr(k, "client", CLIENT6)
    k.backend_port, k.client_port = be16(backend[1]), be16(sport)
    return t, k


def direct6(backend: tuple[IPv6Address, int], sport: int = CLIENT_PORT) -> Callable[[World], None]:
    """The client's connection from sport to backend's own address is a direct one (edge_direct6)."""

    def setup(w: World) -> None:
        t, k = _direct_key(w, backend, sport)
        t[k] = t.Leaf(1)

    return setup


def known_direct6(backend: tuple[IPv6Address, int]) -> tuple[str, Callable[[World], bool]]:
    def holds(w: World) -> bool:
        t, k = _direct_key(w, backend, CLIENT_PORT)
        try:
            t[k]
        except KeyError:
            return False
        return True

    return (f"the client's connection to {backend[0]} is known direct", holds)


def seg6(flags: str, *, sport: int = CLIENT_PORT, ack: int = 0, src=CLIENT6, dst=VIP6, dport: int = 80) -> bytes:
    """A client's TCP segment (seq 1000 for a SYN, 1001 after it)."""
    seq = 1000 if flags == "S" else 1001
    l3 = IPv6(src=str(src), dst=str(dst), hlim=64) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack)
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / l3)


def picking(backend: str, flags: str = "A", **kw) -> Callable[[World], bytes]:
    """A client segment from a port whose flow's first Maglev pick is backend."""
    return lambda w: seg6(flags, sport=port_picking6(backend)(w), **kw)


def reply_picking(backend: tuple[IPv6Address, int], name: str, flags: str = "A") -> Callable[[World], bytes]:
    """backend's reply to the client's port whose flow's first Maglev pick is name."""

    def frame(w: World) -> bytes:
        seg = TCP(sport=backend[1], dport=port_picking6(name)(w), flags=flags, seq=5000, ack=1001)
        l3 = IPv6(src=str(backend[0]), dst=str(CLIENT6), hlim=1)  # hop limit 1: tc's TC_ACT_OK, no FIB
        return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / l3 / seg)

    return frame


def flood_keeps(backend: str) -> tuple[str, Callable[[World], bool]]:
    """FLOOD valid SYNs from distinct spoofed sources in 2001:2:0:77::/64 through the ingress; then
    the established connection's edge_ct6 entry is still there."""

    def holds(w: World) -> bool:
        fd = w.fds[ING]
        for n in range(FLOOD):
            f = seg6("S", src=IPv6Address(f"2001:2:0:77::{n + 1:x}"), sport=1024 + n)
            loader.prog_test_run(fd, f, ctx=_xdp_md(len(f), LO))
        v = _get(w, abi.MAP_CT6, CLIENT_PORT)
        return v is not None and v.backend_id == w.bid(backend)

    return (f"after {FLOOD} spoofed SYNs edge_ct6 still pins the connection to {backend}", holds)


def syn_seq6(backend: str, syn_seq: int = 1000) -> Callable[[World], None]:
    """edge_ct6 pins the client's connection to backend, whose SYN (seq syn_seq) went through the VIP."""

    def setup(w: World) -> None:
        t = w.t[abi.MAP_CT6]
        v = t.Leaf()
        v.backend_id, v.vip_id, v.flags = w.bid(backend), w.vid(W), abi.CT_F_SYN
        v.syn_seq = int.from_bytes(syn_seq.to_bytes(4, "big"), "little")
        t[_key(t, CLIENT_PORT)] = v

    return setup


def syn_ack6(src: tuple[IPv6Address, int], ack: int) -> bytes:
    """src's SYN-ACK to the client's port acknowledging ack - 1."""
    seg = TCP(sport=src[1], dport=CLIENT_PORT, flags="SA", seq=5000, ack=ack)
    return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(src[0]), dst=str(CLIENT6), hlim=1) / seg)


TWO_CHOICES_SEED = 0x5BD1E995  # select.h, EDGE_TWO_CHOICES_SEED: the second candidate's hash


def _fold(addr: IPv6Address) -> int:
    a, b, c, d = struct.unpack("<4I", addr.packed)
    return a ^ b ^ c ^ d


def port_two(first: str, second: str) -> Callable[[World], int]:
    """A client port whose flow to VIP6:80 has first as its Maglev pick and second as two_choices'
    second candidate (select.h: the service's backend list at hash_mix(hash ^ seed) % n)."""

    def pick(w: World) -> int:
        t = w.t[abi.MAP_VIPS6]
        k = t.Key()
        put_addr(k, "addr", VIP6)
        k.port, k.proto = be16(80), 6
        table = w.maps.read_table(w.vid(W), t[k].table)
        cfg = w.t[abi.MAP_SVC_CFG][w.t[abi.MAP_SVC_CFG].Key(w.vid(W))]
        for p in range(CLIENT_PORT, CLIENT_PORT + 2000):
            h = 0x9E3779B9
            for v in (_fold(CLIENT6), _fold(VIP6), (be16(p) << 16) | be16(80), 6):
                h = hash_mix(h ^ v)
            two = cfg.backends[(hash_mix(h ^ TWO_CHOICES_SEED) % cfg.n_backends) & 1023]
            if table[h % w.maps.m] == w.bid(first) and two == w.bid(second):
                return p
        raise AssertionError(f"no port picks {first} then {second}")

    return pick


def svc_flags6(flags: int, service: str = W) -> Callable[[World], None]:
    """The service's edge_svc_cfg flags also hold flags (World.reset restores them)."""

    def setup(w: World) -> None:
        t = w.t[abi.MAP_SVC_CFG]
        v = t[t.Key(w.vid(service))]
        v.flags |= flags
        t[t.Key(w.vid(service))] = v

    return setup


def open_conns(**counts: int) -> Callable[[World], None]:
    """edge_inflight: backend name -> its open connections (World.reset zeroes them)."""

    def setup(w: World) -> None:
        t = w.t[abi.MAP_INFLIGHT]
        for name, n in counts.items():
            t[t.Key(w.bid(name))] = t.Leaf(n)

    return setup


def rows(row) -> list:
    # fmt: off
    return [
        # -- half-open (state6.h): a SYN waits outside edge_ct6 ------------------------------------
        row("IPv6 SYN to the VIP: edge_half_open6 holds it, edge_ct6 does not", ING, seg6("S"), XDP_REDIRECT, None,
            {"redirect": 1}, svc=W, after=[in_ct6(None), ("edge_half_open6 holds it", lambda w: _get(
                w, abi.MAP_HALF_OPEN6, CLIENT_PORT) is not None)]),
        row("IPv6 SYN flood: an established connection keeps its edge_ct6 entry", ING, seg6("S", sport=CLIENT_PORT + 1),
            XDP_REDIRECT, None, {"redirect": 1}, connected6_port("e0"), svc=W, after=[flood_keeps("e0")]),
        row("IPv6 ACK acknowledging the SYN-ACK: the half-open entry moves to edge_ct6", ING, seg6("A", ack=5001),
            XDP_REDIRECT, dnat6(E1), {"redirect": 1}, half_open6("e1", answered_seq=5000), svc=W,
            after=[in_ct6("e1"), in_half_open6(None)]),
        row("IPv6 ACK acknowledging the SYN-ACK, budget spent: moves all the same", ING, seg6("A", ack=5001),
            XDP_REDIRECT, dnat6(E1), {"redirect": 1}, half_open6("e1", answered_seq=5000), lambda w: w.spend_budget(),
            svc=W, after=[in_ct6("e1"), in_half_open6(None)]),
        row("IPv6 ACK acknowledging another sequence: the half-open entry stays", ING, seg6("A", ack=7777),
            XDP_REDIRECT, None, {"redirect": 1}, half_open6("e1", answered_seq=5000), svc=W,
            after=[in_half_open6("e1")]),
        row("IPv6 SYN sent again on a half-open flow: the entry's backend, as IPv4's", ING,
            picking("e0", "S"), XDP_REDIRECT, dnat6(E1), {"redirect": 1},
            lambda w: half_open6("e1", answered_seq=5000, sport=port_picking6("e0")(w))(w), svc=W,
            after=[pinned_half_open("e1")]),
        row("IPv6 SYN sent again on a half-open flow, its backend draining: a new pick, the entry rewritten", ING,
            picking("e0", "S"), XDP_REDIRECT, dnat6(E0), {"redirect": 1},
            lambda w: half_open6("e1", answered_seq=5000, sport=port_picking6("e0")(w))(w),
            lambda w: w.set_flags("e1", UP | abi.BE_F_DRAINING), svc=W, after=[pinned_half_open("e0")]),
        row("IPv6 SYN-ACK of a half-open flow: source back to the VIP, its sequence noted", RET, reply6(hlim=1),
            TC_ACT_OK, snat6, {"return_nat": 1}, half_open6("e0"), svc=W,
            after=[in_half_open6("e0"), answered6(5001)]),
        row("IPv6 SYN-ACK of a half-open flow of another backend: dropped", RET, reply6(src=E1, hlim=1),
            TC_ACT_SHOT, None, drop("other_backend"), half_open6("e0"), svc=W),
        # -- the stateless path over the budget ---------------------------------------------------
        row("IPv6 ACK, no entry, budget spent: to its Maglev pick, no entry", ING, picking("e1"), XDP_REDIRECT,
            dnat6(E1), {"redirect": 1, "stateless": 1}, lambda w: w.spend_budget(), svc=W, after=[in_ct6(None)]),
        row("IPv6 ACK, no entry, budget spent, its pick draining: dropped", ING, picking("e1"), XDP_DROP, None,
            drop("untracked"), lambda w: w.spend_budget(), lambda w: w.set_flags("e1", UP | abi.BE_F_DRAINING),
            svc=W),
        # as IPv4's fast path (select.h): two_choices takes the lesser loaded candidate, DSR encapsulates,
        # least_loaded (its loop is the slow path's) drops
        row("IPv6 ACK, no entry, budget spent, two_choices: the lesser loaded candidate, no entry", ING,
            lambda w: seg6("A", sport=port_two("e1", "e0")(w)), XDP_REDIRECT, dnat6(E0),
            {"redirect": 1, "stateless": 1}, lambda w: w.spend_budget(), svc_flags6(abi.SVC_F_TWO_CHOICES),
            open_conns(e1=5, e0=0), svc=W, after=[in_ct6(None)]),
        row("IPv6 ACK, no entry, budget spent, two_choices, its pick the lesser loaded: the pick", ING,
            lambda w: seg6("A", sport=port_two("e1", "e0")(w)), XDP_REDIRECT, dnat6(E1),
            {"redirect": 1, "stateless": 1}, lambda w: w.spend_budget(), svc_flags6(abi.SVC_F_TWO_CHOICES),
            open_conns(e1=0, e0=5), svc=W, after=[in_ct6(None)]),
        row("IPv6 ACK, no entry, budget spent, least_loaded: dropped, as IPv4's", ING, picking("e1"), XDP_DROP,
            None, drop("untracked"), lambda w: w.spend_budget(), svc_flags6(abi.SVC_F_LEAST_LOADED), svc=W),
        row("IPv6 DSR ACK, no entry, budget spent: its Maglev pick in IPv6-in-IPv6, no entry", ING,
            syn6(payload=b"data"), XDP_REDIRECT, encap6, {"dsr": 1, "stateless": 1}, hop6_cached,
            lambda w: w.spend_budget(), svc="dsr6"),
        row("IPv6 reply, no entry, the Maglev slot names the sender: source back to the VIP", RET,
            reply_picking(E1, "e1"), TC_ACT_OK, snat6, {"return_nat": 1, "return_stateless": 1}, svc=W,
            after=[("no edge_ct6 entry made", lambda w: len(list(w.t[abi.MAP_CT6].keys())) == 0)]),
        row("IPv6 SYN-ACK, no entry, the slot names the sender: never the backend's address", RET,
            reply_picking(E1, "e1", "SA"), TC_ACT_OK, snat6, {"return_nat": 1, "return_stateless": 1}, svc=W),
        row("IPv6 reply, no entry, the slot names another backend: untouched", RET, reply_picking(E0, "e1"),
            TC_ACT_UNSPEC, "unchanged", {}),
        # -- direct connections to a backend's own address (edge_direct6) -------------------------
        row("IPv6 SYN to a backend's own address: passes, known direct", ING, seg6("S", dst=E1[0], dport=E1[1]),
            XDP_PASS, "unchanged", {"pass": 1}, after=[known_direct6(E1)]),
        row("IPv6 SYN from a backend's side to a backend: untouched, known direct", RET,
            bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(CLIENT6), dst=str(E1[0]))
                  / TCP(sport=CLIENT_PORT, dport=E1[1], flags="S")), TC_ACT_UNSPEC, "unchanged", {},
            after=[known_direct6(E1)]),
        row("IPv6 reply of a direct connection, the slot naming the sender: untouched", RET,
            reply_picking(E1, "e1"), TC_ACT_UNSPEC, "unchanged", {},
            lambda w: direct6(E1, port_picking6("e1")(w))(w)),
        row("IPv6 SYN-ACK of a direct connection on a VIP flow's port: untouched, the entry goes", RET,
            syn_ack6(E0, 2_000_000), TC_ACT_UNSPEC, "unchanged", {}, syn_seq6("e0"), direct6(E0),
            after=[in_ct6(None)]),
        row("IPv6 SYN-ACK not answering the VIP's SYN, no direct connection: reverse NAT all the same", RET,
            syn_ack6(E0, 2_000_000), TC_ACT_OK, snat6, {"return_nat": 1}, syn_seq6("e0"), svc=W,
            after=[in_ct6("e0")]),
        row("IPv6 SYN-ACK answering the VIP's SYN, a direct connection known: reverse NAT", RET,
            syn_ack6(E0, 1001), TC_ACT_OK, snat6, {"return_nat": 1}, syn_seq6("e0"), direct6(E0), svc=W,
            after=[in_ct6("e0")]),
        row("IPv6 reply of a direct connection on a VIP flow of another backend: untouched", RET,
            reply6(src=E1, hlim=1), TC_ACT_UNSPEC, "unchanged", {}, half_open6("e0"), direct6(E1)),
    ]
    # fmt: on
