"""The IPv4 rows of the data path's verdict table (test_verdicts.py runs them with the IPv6 rows of
verdicts6.py, verdicts_icmp6.py, verdicts_hb6.py and verdicts_dsr6.py): the Row type, the frame builders,
set-ups and checks the rows use, and ROWS. The ICMP frames are verdicts_icmp4.py's, the harness and the
world verdicts.py's. What a row means is said in test_verdicts.py."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Callable

from scapy.layers.inet import ICMP, IP, TCP, IPOption_NOP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from verdicts import (  # netns-tests/verdicts.py: the harness
    B0,
    CLIENT,
    CLIENT_MAC,
    CLIENT_PORT,
    D0,
    DSR_VIP,
    H0,
    H1,
    HB_PORT,
    HB_VIP,
    LO,
    P0,
    P1,
    PAS_VIP,
    ROUTER,
    ROUTER_MAC,
    S0,
    S1,
    SBY_VIP,
    TC_ACT_OK,
    TC_ACT_REDIRECT,
    TC_ACT_SHOT,
    TC_ACT_UNSPEC,
    TO_BACKEND,
    TO_CLIENT,
    VIP,
    XDP_DROP,
    XDP_PASS,
    XDP_REDIRECT,
    World,
    broken_ip_csum,
    broken_tcp_csum,
    heartbeat,
    inet_sum,
    parsed,
    rewritten,
    set_bytes,
    tcp,
    udp,
)
from verdicts_icmp4 import backend_error, echo, echo_reply, from_vip, icmp_back, icmp_error, icmp_to

from controlplane import abi

ING, RET, REP = abi.PROG_INGRESS, abi.PROG_RETURN, abi.PROG_REPLY


def hb_at(backend: str, *, seq: int, ahead: int = 0) -> Callable[[World], bytes]:
    """backend's heartbeat seq, its epoch ahead seconds from the row's (World.epoch)."""
    return lambda w: heartbeat(backend, seq=seq, epoch=w.epoch + ahead)


SAME = "unchanged"  # the frame leaves as it came
ALIVE, SILENT = "alive", "silent"


def drop(reason: str) -> dict[str, int]:
    return {"drop": 1, f"drop:{reason}": 1}


def dnat(to: tuple, *, hop: bool = True) -> Callable[[bytes], bytes]:
    """Expected: destination rewritten to the backend to; redirected (hop) or handed to the stack."""
    return lambda f: rewritten(f, dst=(str(to[0]), to[1]), hop=TO_BACKEND if hop else None)


def snat(vip, port: int) -> Callable[[bytes], bytes]:
    """Expected: the reply's source is the VIP's again, redirected to the client."""
    return lambda f: rewritten(f, src=(str(vip), port), hop=TO_CLIENT)


def unhopped_snat(vip, port: int) -> Callable[[bytes], bytes]:
    """Expected: the reply's source is the VIP's again, handed to the stack (MACs and TTL as they were)."""
    return lambda f: rewritten(f, src=(str(vip), port))


# ---------------------------------------------------------------- set-ups


def silent(backend: str) -> Callable[[World], None]:
    """backend's last heartbeat is long gone."""
    return lambda w: w.set_health(backend, last_seen_ns=0, rise_count=100)


def connected(backend: str, **flow) -> Callable[[World], None]:
    return lambda w: w.connect(backend, **flow)


def flags(backend: str, value: int) -> Callable[[World], None]:
    return lambda w: w.set_flags(backend, value)


def spent(w: World) -> None:
    w.spend_budget()


def hb_on_lo(backend: str) -> Callable[[World], None]:
    """backend's heartbeats are registered on lo, where the XDP test runs arrive."""
    return lambda w: w.hb_interface(backend, LO)


def failing(backend: str, *, syns: int = 0, rsts: int = 0) -> Callable[[World], None]:
    """Passive detection holds syns SYNs to backend unanswered since long ago, and rsts RSTs."""
    return lambda w: w.set_health(backend, syn_outstanding=syns, first_syn_ns=1 if syns else 0, rst_count=rsts)


def heard(backend: str, *, seq: int) -> Callable[[World], None]:
    """backend's last heartbeat taken had seq in the row's epoch."""
    return lambda w: w.set_health(
        backend, last_seen_ns=time.monotonic_ns(), rise_count=100, hb_seq=seq, hb_epoch=w.epoch
    )


UP = abi.BE_F_VALID | abi.BE_F_UP


# ---------------------------------------------------------------- checks after the run


def pinned_to(backend: str | None, **flow) -> tuple[str, Callable[[World], bool]]:
    return (
        f"conntrack pins the flow to {backend}",
        lambda w: w.connection(**flow) == (None if backend is None else w.bid(backend)),
    )


def half_open_to(backend: str | None, **flow) -> tuple[str, Callable[[World], bool]]:
    return (
        f"the half-open table pins the flow to {backend}",
        lambda w: w.connection(half_open=True, **flow) == (None if backend is None else w.bid(backend)),
    )


def known_direct(backend: str) -> tuple[str, Callable[[World], bool]]:
    return (f"the client's connection to {backend} is known direct", lambda w: w.is_direct(backend))


def half_open(backend: str, **kw) -> Callable[[World], None]:
    return lambda w: w.half_open(backend, **kw)


def stamped(backend: str, seq: int) -> tuple[str, Callable[[World], bool]]:
    return (f"{backend}'s health took heartbeat {seq}", lambda w: w.health(backend).hb_seq == seq)


# ---------------------------------------------------------------- frames


def ip_options(dst, dport: int = 80) -> bytes:
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(CLIENT), dst=str(dst), options=[IPOption_NOP()] * 4)
        / TCP(sport=CLIENT_PORT, dport=dport, flags="S")
    )


def long_tcp_header(dst) -> bytes:
    """A TCP header whose data offset (60 bytes) runs past the IPv4 packet."""
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(CLIENT), dst=str(dst))
        / TCP(sport=CLIENT_PORT, dport=80, flags="S", dataofs=15)
    )


def arp() -> bytes:
    return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=CLIENT_MAC) / ARP(psrc=str(CLIENT), pdst=str(ROUTER)))


def syn_with_options(dst, **kw) -> bytes:
    """A SYN as stacks send it: MSS, SACK permitted, timestamps, window scale."""
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(CLIENT), dst=str(dst))
        / TCP(
            sport=CLIENT_PORT,
            dport=80,
            flags="S",
            seq=1000,
            options=[("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None), ("WScale", 7)],
        )
    )


def padded(frame: bytes, length: int = 60) -> bytes:
    """frame with Ethernet padding up to length bytes (the minimum frame, without FCS)."""
    return frame + b"\0" * (length - len(frame))


def partial_csum(frame: bytes) -> bytes:
    """A TCP frame whose checksum field holds the folded pseudo-header sum (CHECKSUM_PARTIAL)."""
    p = parsed(frame)
    ip, l4 = p.l3, p.l4(frame)
    seg_len = struct.unpack_from("!H", frame, ip + 2)[0] - (l4 - ip)
    words = struct.unpack("!4H", frame[ip + 12 : ip + 20]) + (6, seg_len)
    s = sum(words)
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return set_bytes(frame, l4 + 16, struct.pack("!H", s))


def with_ip_options(frame: bytes) -> bytes:
    """frame (untagged IPv4) with four NOP option bytes in its IPv4 header; checksums right."""
    pkt = Ether(frame)
    pkt[IP].options = [IPOption_NOP()] * 4
    del pkt[IP].ihl, pkt[IP].len, pkt[IP].chksum
    return bytes(pkt)


def udp_summing_to_zero(src, dst, *, sport: int, dport: int, nat_src=None, nat_dst=None) -> bytes:
    """A UDP frame whose checksum after the NAT to nat_src / nat_dst computes to 0, which UDP must
    send as 0xffff (0 is "no checksum"): its last two payload bytes are chosen for that."""

    def frame(x: int) -> bytes:
        return udp(src, dst, sport=sport, dport=dport, payload=b"zerosu" + struct.pack("!H", x))

    after = bytearray(rewritten(frame(0), src=nat_src, dst=nat_dst))
    after[40:42] = b"\0\0"  # the UDP checksum field: summed as 0
    seg = bytes(after[34:])
    total = 0xFFFF - inet_sum(after[26:34] + struct.pack("!BBH", 0, 17, len(seg)) + seg)  # the sum itself
    return frame(0xFFFF - total)


def reply(backend: tuple, flags: str = "A", **kw) -> bytes:
    """backend's TCP segment to the client's connection."""
    return tcp(backend[0], CLIENT, flags, sport=backend[1], dport=CLIENT_PORT, **kw)


def udp_reply(backend: tuple, **kw) -> bytes:
    return udp(backend[0], CLIENT, sport=backend[1], dport=CLIENT_PORT, **kw)


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    name: str
    prog: str  # ING (edge_ingress, client side), RET (edge_return, tc, backend side), REP (edge_reply)
    frame: Callable[[World], bytes] | bytes
    verdict: int
    out: object  # SAME, a function of the input frame giving the expected output, or None: not looked at
    counters: dict[str, int]
    setup: tuple[Callable[[World], None], ...] = ()
    after: tuple[tuple[str, Callable[[World], bool]], ...] = ()
    xfail: str | None = None
    svc: str = ""  # the service the counters grow under; "": none known (before the VIP lookup, heartbeats)


def row(name, prog, frame, verdict, out, counters, *setup, after=(), xfail=None, svc="") -> Row:
    return Row(name, prog, frame, verdict, out, counters, tuple(setup), tuple(after), xfail, svc)


HB_SYN = tcp(CLIENT, HB_VIP, "S")
HB_ACK = tcp(CLIENT, HB_VIP, "A")


def to_pick_of(backend: str, flags: str = "S", service: str = "hb", vip=HB_VIP) -> Callable[[World], bytes]:
    """A TCP segment to service's VIP whose first Maglev pick is backend."""
    return lambda w: tcp(CLIENT, vip, flags, sport=w.port_picking(service, backend, vip=vip))


def pas_flow(backend: str) -> Callable[[World], None]:
    """A connection to the pas VIP, pinned to backend, whose SYN (seq 1000) awaits its answer."""
    return lambda w: w.connect(backend, vip=PAS_VIP, flags=abi.CT_F_SYN | abi.CT_F_SYN_PENDING, syn_seq=1000)


def health_says(backend: str, what: str, test: Callable) -> tuple[str, Callable[[World], bool]]:
    return (f"{backend}'s health: {what}", lambda w: test(w.health(backend)))


# One row per case reads as a table: ruff format would spread each over lines.
# fmt: off
ROWS = [
    # -- ingress (XDP, client side): not for a VIP -----------------------------------------
    row("non-VIP TCP passes", ING, tcp(CLIENT, ROUTER, "S", dport=22), XDP_PASS, SAME, {"pass": 1}),
    row("non-IPv4 (ARP) passes", ING, arp(), XDP_PASS, SAME, {"pass": 1}),
    row("VIP address, other port passes", ING, tcp(CLIENT, VIP, "S", dport=443), XDP_PASS, SAME, {"pass": 1}),
    row("ICMP to the VIP other than echo or an error passes", ING, echo(type=13), XDP_PASS, SAME, {"pass": 1}),
    row("ping to a non-VIP address passes", ING, echo(ROUTER), XDP_PASS, SAME, {"pass": 1}),
    row("non-VIP IP options pass", ING, ip_options(ROUTER), XDP_PASS, SAME, {"pass": 1}),
    row("non-VIP fragment passes", ING, tcp(CLIENT, ROUTER, "A", dport=22, ip_flags="MF"), XDP_PASS, SAME,
        {"pass": 1}),
    row("non-VIP TCP header cut short passes", ING, long_tcp_header(ROUTER), XDP_PASS, SAME, {"pass": 1}),
    row("not a heartbeat, to the heartbeat port, passes", ING,
        udp(CLIENT, ROUTER, dport=HB_PORT, payload=b"hello, world, hello, world"), XDP_PASS, SAME, {"pass": 1}),
    # -- ingress: drop reasons --------------------------------------------------------------
    row("truncated IPv4 header: malformed", ING, tcp(CLIENT, VIP, "S")[:30], XDP_DROP, None, drop("malformed")),
    row("IPv4 total length past the frame: malformed", ING,
        set_bytes(tcp(CLIENT, VIP, "S"), 16, b"\x05\xdc"), XDP_DROP, None, drop("malformed")),
    row("VIP TCP header cut short: malformed", ING, long_tcp_header(VIP), XDP_DROP, None, drop("malformed")),
    row("VIP IP options", ING, ip_options(VIP), XDP_DROP, None, drop("ip_options")),
    row("VIP address, other port, IP options: dropped too (by address)", ING, ip_options(VIP, dport=22), XDP_DROP,
        None, drop("ip_options")),
    row("VIP fragment (more fragments)", ING, tcp(CLIENT, VIP, "A", ip_flags="MF"), XDP_DROP, None, drop("fragment")),
    row("VIP fragment (offset)", ING, tcp(CLIENT, VIP, "A", frag=10), XDP_DROP, None, drop("fragment")),
    row("VIP wrong IPv4 checksum", ING, broken_ip_csum(tcp(CLIENT, VIP, "S")), XDP_DROP, None,
        drop("bad_checksum"), svc="web"),
    row("VIP SYN wrong TCP checksum", ING, broken_tcp_csum(tcp(CLIENT, VIP, "S")), XDP_DROP, None,
        drop("bad_checksum"), svc="web"),
    row("no usable backend (all silent)", ING, HB_SYN, XDP_DROP, None, drop("no_backend"),
        silent("h0"), silent("h1"), after=[pinned_to(None, vip=HB_VIP)], svc="hb"),
    row("no usable backend (admin down)", ING, tcp(CLIENT, VIP, "S"), XDP_DROP, None, drop("no_backend"),
        flags("b0", abi.BE_F_VALID), svc="web"),
    row("no usable backend of the UDP service on the same address: counted as its, not web's", ING,
        udp(CLIENT, VIP), XDP_DROP, None, drop("no_backend"), flags("d0", abi.BE_F_VALID), svc="dns"),
    row("no usable backend (the only one drains)", ING, tcp(CLIENT, VIP, "S"), XDP_DROP, None,
        drop("no_backend"), flags("b0", UP | abi.BE_F_DRAINING), svc="web"),
    row("untracked: no SYN, no entry, budget spent, pick dead", ING, HB_ACK, XDP_DROP, None, drop("untracked"),
        spent, silent("h0"), silent("h1"), svc="hb"),
    row("heartbeat on the client side", ING, heartbeat("h0"), XDP_DROP, None, drop("spoofed_heartbeat")),
    row("heartbeat from an unregistered address", ING, heartbeat("h0", src=CLIENT), XDP_DROP, None,
        drop("spoofed_heartbeat")),
    # -- ingress: forward NAT -----------------------------------------------------------------
    row("new TCP flow: DNAT, redirect, half-open", ING, tcp(CLIENT, VIP, "S"), XDP_REDIRECT, dnat(B0),
        {"redirect": 1}, after=[half_open_to("b0"), pinned_to(None)], svc="web"),
    row("ACK of the backend's SYN-ACK: the half-open flow moves into conntrack", ING,
        tcp(CLIENT, VIP, "A", seq=1001, ack=5001), XDP_REDIRECT, dnat(B0), {"redirect": 1},
        half_open("b0", answered_seq=5000), after=[pinned_to("b0"), half_open_to(None)], svc="web"),
    row("budget spent: the ACK of the SYN-ACK still moves the flow into conntrack", ING,
        tcp(CLIENT, VIP, "A", seq=1001, ack=5001), XDP_REDIRECT, dnat(B0), {"redirect": 1},
        half_open("b0", answered_seq=5000), spent, after=[pinned_to("b0"), half_open_to(None)], svc="web"),
    row("ACK not acknowledging the SYN-ACK: the half-open flow stays half-open", ING,
        tcp(CLIENT, VIP, "A", seq=1001, ack=7777), XDP_REDIRECT, dnat(B0), {"redirect": 1},
        half_open("b0", answered_seq=5000), after=[half_open_to("b0")], svc="web"),
    row("SYN to a backend's own address: passes, known direct", ING, tcp(CLIENT, B0[0], "S", dport=B0[1]),
        XDP_PASS, SAME, {"pass": 1}, after=[known_direct("b0")]),
    row("established TCP flow: DNAT, redirect", ING, tcp(CLIENT, VIP, "A", payload=b"GET /"), XDP_REDIRECT,
        dnat(B0), {"redirect": 1}, connected("b0"), svc="web"),
    row("established flow, backend draining: kept", ING, tcp(CLIENT, VIP, "A"), XDP_REDIRECT, dnat(B0),
        {"redirect": 1}, connected("b0"), flags("b0", UP | abi.BE_F_DRAINING), svc="web"),
    row("no SYN, no entry, within budget: entry made", ING, tcp(CLIENT, VIP, "A"), XDP_REDIRECT, dnat(B0),
        {"redirect": 1}, after=[pinned_to("b0")], svc="web"),
    row("no SYN, no entry, budget spent: stateless", ING, tcp(CLIENT, VIP, "A"), XDP_REDIRECT, dnat(B0),
        {"redirect": 1, "stateless": 1}, spent, after=[pinned_to(None)], svc="web"),
    row("new UDP flow: DNAT, redirect", ING, udp(CLIENT, VIP), XDP_REDIRECT, dnat(D0), {"redirect": 1},
        after=[pinned_to("d0", dport=53, proto=17)], svc="dns"),
    row("UDP without checksum: stays without", ING, udp(CLIENT, VIP, zero_csum=True), XDP_REDIRECT, dnat(D0),
        {"redirect": 1}, svc="dns"),
    row("VLAN tagged: DNAT, to the stack", ING, tcp(CLIENT, VIP, "S", vlan=True), XDP_PASS, dnat(B0, hop=False),
        {"nat_pass": 1}, svc="web"),
    row("TTL 1: to the stack (ICMP time exceeded)", ING, tcp(CLIENT, VIP, "S", ttl=1), XDP_PASS, SAME,
        {"pass": 1}, svc="web"),
    row("first pick alive: new flow goes there", ING, to_pick_of("h0"), XDP_REDIRECT, dnat(H0), {"redirect": 1},
        svc="hb"),
    row("first pick dead: new flow fails over", ING, to_pick_of("h0"), XDP_REDIRECT, dnat(H1), {"redirect": 1},
        silent("h0"), svc="hb"),
    row("a SYN as stacks send it (TCP options): DNAT, redirect", ING, syn_with_options(VIP), XDP_REDIRECT,
        dnat(B0), {"redirect": 1}, svc="web"),
    row("padded to 60 bytes: DNAT, padding kept", ING, padded(tcp(CLIENT, VIP, "S")), XDP_REDIRECT, dnat(B0),
        {"redirect": 1}, svc="web"),
    row("UDP checksum computing to 0: sent as 0xffff", ING,
        udp_summing_to_zero(CLIENT, VIP, sport=CLIENT_PORT, dport=53, nat_dst=(str(D0[0]), D0[1])), XDP_REDIRECT,
        dnat(D0), {"redirect": 1}, svc="dns"),
    row("UDP of odd length: DNAT, redirect", ING, udp(CLIENT, VIP, payload=b"odd"), XDP_REDIRECT, dnat(D0),
        {"redirect": 1}, svc="dns"),
    row("established, wrong IPv4 checksum", ING, broken_ip_csum(tcp(CLIENT, VIP, "A")), XDP_DROP, None,
        drop("bad_checksum"), connected("b0"), svc="web"),
    row("established, TTL 1: to the stack", ING, tcp(CLIENT, VIP, "A", ttl=1), XDP_PASS, SAME, {"pass": 1},
        connected("b0"), svc="web"),
    row("established, VLAN tagged: DNAT, to the stack", ING, tcp(CLIENT, VIP, "A", vlan=True), XDP_PASS,
        dnat(B0, hop=False), {"nat_pass": 1}, connected("b0"), svc="web"),
    row("heartbeat where its backend is: to the stack (tc takes it)", ING, heartbeat("h0"), XDP_PASS, SAME,
        {"pass": 1}, hb_on_lo("h0")),
    row("passive: a SYN to the pick is counted", ING, to_pick_of("p0", service="pas", vip=PAS_VIP),
        XDP_REDIRECT, dnat(P0), {"redirect": 1},
        after=[health_says("p0", "one SYN outstanding", lambda h: h.syn_outstanding == 1)], svc="pas"),
    row("passive: unanswered SYNs eject the pick, the flow fails over", ING,
        to_pick_of("p0", service="pas", vip=PAS_VIP), XDP_REDIRECT, dnat(P1), {"redirect": 1, "ejection": 1},
        failing("p0", syns=3), after=[health_says("p0", "ejected", lambda h: h.ejected_until_ns > 0)], svc="pas"),
    row("primary down: the standby takes the new flow", ING, tcp(CLIENT, SBY_VIP, "S"), XDP_REDIRECT, dnat(S1),
        {"redirect": 1}, flags("s0", abi.BE_F_VALID), after=[half_open_to("s1", vip=SBY_VIP)], svc="sby"),
    row("primary up: the standby takes nothing", ING, tcp(CLIENT, SBY_VIP, "S"), XDP_REDIRECT, dnat(S0),
        {"redirect": 1}, svc="sby"),
    row("existing_flows keep: an established flow stays on its down backend", ING, tcp(CLIENT, SBY_VIP, "A"),
        XDP_REDIRECT, dnat(S0), {"redirect": 1}, connected("s0", vip=SBY_VIP), flags("s0", abi.BE_F_VALID), svc="sby"),
    row("existing_flows keep: a SYN reusing the tuple is a new flow", ING, tcp(CLIENT, SBY_VIP, "S"),
        XDP_REDIRECT, dnat(S1), {"redirect": 1}, connected("s0", vip=SBY_VIP), flags("s0", abi.BE_F_VALID),
        after=[pinned_to("s1", vip=SBY_VIP)], svc="sby"),
    row("established flow on a dead backend moves", ING, HB_ACK, XDP_REDIRECT, dnat(H1), {"redirect": 1},
        connected("h0", vip=HB_VIP), silent("h0"), after=[pinned_to("h1", vip=HB_VIP)], svc="hb"),
    # -- ingress: ICMP errors about VIP flows (icmp.h) --------------------------------------------
    row("ICMP frag-needed about a VIP flow goes to its backend", ING, icmp_error(from_vip()), XDP_REDIRECT,
        None, {"icmp_to_backend": 1, "redirect": 1}, connected("b0"), svc="web"),
    row("ICMP error whose quote is cut short: malformed", ING, icmp_error(Raw(bytes(from_vip())[:12])),
        XDP_DROP, None, drop("icmp_malformed")),
    row("ICMP error quoting an ICMP error: nested", ING,
        icmp_error(IP(src=str(VIP), dst=str(CLIENT)) / ICMP(type=3, code=4) / from_vip()), XDP_DROP, None,
        drop("icmp_nested")),
    row("ICMP error about a VIP port no service has: no flow", ING, icmp_error(from_vip(sport=81)), XDP_DROP,
        None, drop("icmp_no_flow")),
    row("ICMP error about a VIP flow conntrack does not hold goes to its Maglev pick", ING,
        lambda w: icmp_error(from_vip(dport=w.port_picking("hb", "h1", vip=HB_VIP), vip=HB_VIP), dst=HB_VIP),
        XDP_REDIRECT, icmp_to(H1), {"icmp_to_backend": 1, "redirect": 1}, svc="hb"),
    # -- ingress: echo requests to a VIP address (icmp.h, icmp_echo) --------------------------
    row("ping to a VIP address: answered from the VIP, back where it came from", ING, echo(), XDP_REDIRECT,
        echo_reply, {"icmp_echo": 1}),
    row("ping to a VIP address, node.answer_ping off: to the stack", ING, echo(), XDP_PASS, SAME, {"pass": 1},
        lambda w: w.node(answer_ping=False)),
    row("ping from a broadcast source: to the stack", ING, echo(src="255.255.255.255"), XDP_PASS, SAME,
        {"pass": 1}),
    row("ping with a bad IPv4 header checksum: dropped", ING, broken_ip_csum(echo()), XDP_DROP, None,
        drop("bad_checksum")),
    # -- ingress: direct server return (encap.h) -------------------------------------------------
    row("DSR: a SYN is sent to its backend in IPIP", ING, tcp(CLIENT, DSR_VIP, "S"), XDP_REDIRECT, None,
        {"dsr": 1}, svc="dsr"),
    row("DSR: a packet the tunnel cannot carry is dropped", ING, tcp(CLIENT, DSR_VIP, "A", payload=b"x" * 1460),
        XDP_DROP, None, drop("dsr_too_big"), svc="dsr"),
    # -- return path (tc, backend side): heartbeats ---------------------------------------------
    row("heartbeat consumed", RET, hb_at("h0", seq=7), TC_ACT_SHOT, None, {"heartbeat": 1},
        after=[stamped("h0", 7)]),
    row("heartbeat with a wrong token", RET, heartbeat("h0", token=0xBAD), TC_ACT_SHOT, None,
        drop("spoofed_heartbeat"), after=[stamped("h0", 0)]),
    row("heartbeat from another address", RET, heartbeat("h0", src=CLIENT), TC_ACT_SHOT, None,
        drop("spoofed_heartbeat")),
    row("heartbeat replayed (same seq)", RET, hb_at("h0", seq=5), TC_ACT_SHOT, None,
        drop("replayed_heartbeat"), heard("h0", seq=5)),
    row("heartbeat of epoch 0: outside the window", RET, heartbeat("h0", seq=9, epoch=0), TC_ACT_SHOT, None,
        drop("stale_heartbeat")),
    row("heartbeat from beyond the window ahead", RET,
        hb_at("h0", seq=9, ahead=10 * abi.HB_WINDOW_S), TC_ACT_SHOT, None, drop("stale_heartbeat"),
        after=[stamped("h0", 0)]),
    row("heartbeat of an older epoch", RET, hb_at("h0", seq=9, ahead=-1), TC_ACT_SHOT, None,
        drop("replayed_heartbeat"), heard("h0", seq=5)),
    # -- return path: reverse NAT -----------------------------------------------------------------
    row("reply: reverse NAT, redirect (also with the VIP on lo)", RET, reply(B0), TC_ACT_REDIRECT, snat(VIP, 80),
        {"return_nat": 1, "return_redirect": 1}, connected("b0"), svc="web"),
    row("UDP reply: reverse NAT, redirect", RET, udp_reply(D0), TC_ACT_REDIRECT, snat(VIP, 53),
        {"return_nat": 1, "return_redirect": 1}, connected("d0", dport=53, proto=17), svc="dns"),
    row("SYN-ACK of the VIP's SYN: reverse NAT", RET, reply(B0, "SA", ack=1001), TC_ACT_REDIRECT, snat(VIP, 80),
        {"return_nat": 1, "return_redirect": 1}, connected("b0", flags=abi.CT_F_SYN, syn_seq=1000), svc="web"),
    row("stateless reverse NAT: no entry, the Maglev slot names it", RET, reply(B0), TC_ACT_REDIRECT,
        snat(VIP, 80), {"return_nat": 1, "return_redirect": 1, "return_stateless": 1}, svc="web"),
    row("TCP of a backend the flow is not pinned to: dropped", RET, reply(H0), TC_ACT_SHOT, None,
        drop("other_backend"), connected("h1", vip=HB_VIP), svc="hb"),
    row("TCP of a backend the flow is not pinned to, directly connected: untouched", RET, reply(H0),
        TC_ACT_UNSPEC, SAME, {}, connected("h1", vip=HB_VIP), lambda w: w.direct("h0")),
    row("SYN-ACK of a half-open flow: reverse NAT, its sequence noted", RET, reply(B0, "SA", seq=5000, ack=1001),
        TC_ACT_REDIRECT, snat(VIP, 80), {"return_nat": 1, "return_redirect": 1}, half_open("b0"),
        after=[half_open_to("b0"), ("the SYN-ACK's sequence + 1 noted", lambda w: w.answered() == 5001)], svc="web"),
    row("SYN-ACK without an entry, the slot names it: reverse NAT (never the backend's address)", RET,
        reply(B0, "SA", ack=1001), TC_ACT_REDIRECT, snat(VIP, 80),
        {"return_nat": 1, "return_redirect": 1, "return_stateless": 1}, svc="web"),
    row("SYN-ACK not answering the VIP's SYN: reverse NAT all the same", RET, reply(B0, "SA", ack=2_000_000),
        TC_ACT_REDIRECT, snat(VIP, 80), {"return_nat": 1, "return_redirect": 1},
        connected("b0", flags=abi.CT_F_SYN, syn_seq=1000), after=[pinned_to("b0")], svc="web"),
    row("SYN-ACK of a direct connection on a VIP flow's port: untouched, the entry goes", RET,
        reply(B0, "SA", ack=2_000_000), TC_ACT_UNSPEC, SAME, {}, connected("b0", flags=abi.CT_F_SYN, syn_seq=1000),
        lambda w: w.direct("b0"), after=[pinned_to(None)]),
    row("SYN-ACK of a direct connection: untouched", RET, reply(B0, "SA", ack=1001), TC_ACT_UNSPEC, SAME, {},
        lambda w: w.direct("b0")),
    row("SYN from a backend: direct, untouched", RET, reply(B0, "S"), TC_ACT_UNSPEC, SAME, {}),
    row("passive: a third RST answering a SYN ejects", RET, reply(P0, "RA", ack=1001), TC_ACT_REDIRECT,
        snat(PAS_VIP, 80), {"return_nat": 1, "return_redirect": 1, "ejection": 1}, pas_flow("p0"),
        failing("p0", rsts=2), after=[health_says("p0", "ejected", lambda h: h.ejected_until_ns > 0)], svc="pas"),
    row("passive: a SYN-ACK clears the failures", RET, reply(P0, "SA", ack=1001), TC_ACT_REDIRECT,
        snat(PAS_VIP, 80), {"return_nat": 1, "return_redirect": 1}, pas_flow("p0"), failing("p0", syns=2),
        after=[health_says("p0", "no SYN outstanding", lambda h: h.syn_outstanding == 0)], svc="pas"),
    row("VLAN tagged reply: reverse NAT, to the stack", RET, reply(B0, vlan=True), TC_ACT_OK,
        unhopped_snat(VIP, 80), {"return_nat": 1}, connected("b0"), svc="web"),
    row("reply with IP options: reverse NAT, redirect", RET, with_ip_options(reply(B0)), TC_ACT_REDIRECT,
        snat(VIP, 80), {"return_nat": 1, "return_redirect": 1}, connected("b0"), svc="web"),
    row("reply with TTL 1: reverse NAT, to the stack", RET, reply(B0, ttl=1), TC_ACT_OK, unhopped_snat(VIP, 80),
        {"return_nat": 1}, connected("b0"), svc="web"),
    row("UDP reply without checksum: stays without", RET, udp_reply(D0, zero_csum=True), TC_ACT_REDIRECT,
        snat(VIP, 53), {"return_nat": 1, "return_redirect": 1}, connected("d0", dport=53, proto=17), svc="dns"),
    row("UDP reply checksum computing to 0: sent as 0xffff", RET,
        udp_summing_to_zero(D0[0], CLIENT, sport=D0[1], dport=CLIENT_PORT, nat_src=(str(VIP), 53)),
        TC_ACT_REDIRECT, snat(VIP, 53), {"return_nat": 1, "return_redirect": 1},
        connected("d0", dport=53, proto=17), svc="dns"),
    row("padded reply: reverse NAT, padding kept", RET, padded(reply(B0)), TC_ACT_REDIRECT, snat(VIP, 80),
        {"return_nat": 1, "return_redirect": 1}, connected("b0"), svc="web"),
    row("fragment from a backend: untouched", RET, reply(B0, ip_flags="MF"), TC_ACT_UNSPEC, SAME, {},
        connected("b0")),
    row("not from a backend endpoint: untouched", RET, tcp(B0[0], CLIENT, "A", sport=22, dport=CLIENT_PORT),
        TC_ACT_UNSPEC, SAME, {}),
    row("a backend's ICMP error about a client's packet goes back as the VIP's, redirected", RET,
        backend_error(IP(src=str(CLIENT), dst=str(B0[0])) / TCP(sport=CLIENT_PORT, dport=B0[1], flags="A")),
        TC_ACT_REDIRECT, icmp_back(B0), {"icmp_return": 1}, connected("b0"), svc="web"),
    row("a backend's ICMP error with a TTL about to expire: translated, to the stack", RET,
        backend_error(IP(src=str(CLIENT), dst=str(B0[0])) / TCP(sport=CLIENT_PORT, dport=B0[1], flags="A"), ttl=1),
        TC_ACT_OK, None, {"icmp_return": 1}, connected("b0"), svc="web"),
    # -- edge_reply (XDP, backend side): the replies' fast path --------------------------------
    row("reply: reverse NAT, redirect (XDP)", REP, reply(B0, payload=b"HTTP/1.1 200"), XDP_REDIRECT,
        snat(VIP, 80), {"return_xdp": 1}, connected("b0"), svc="web"),
    row("UDP reply: reverse NAT, redirect (XDP)", REP, udp_reply(D0), XDP_REDIRECT, snat(VIP, 53),
        {"return_xdp": 1}, connected("d0", dport=53, proto=17), svc="dns"),
    row("UDP reply without checksum (XDP): stays without", REP, udp_reply(D0, zero_csum=True), XDP_REDIRECT,
        snat(VIP, 53), {"return_xdp": 1}, connected("d0", dport=53, proto=17), svc="dns"),
    row("UDP reply checksum computing to 0 (XDP): sent as 0xffff", REP,
        udp_summing_to_zero(D0[0], CLIENT, sport=D0[1], dport=CLIENT_PORT, nat_src=(str(VIP), 53)),
        XDP_REDIRECT, snat(VIP, 53), {"return_xdp": 1}, connected("d0", dport=53, proto=17), svc="dns"),
    row("SYN-ACK: to tc", REP, reply(B0, "SA", ack=1001), XDP_PASS, SAME, {},
        connected("b0", flags=abi.CT_F_SYN, syn_seq=1000)),
    row("FIN: to tc", REP, reply(B0, "FA"), XDP_PASS, SAME, {}, connected("b0")),
    row("heartbeat: to tc", REP, heartbeat("h0"), XDP_PASS, SAME, {}),
    row("no entry: to tc", REP, reply(B0), XDP_PASS, SAME, {}),
    row("pinned to another backend: to tc", REP, reply(H0), XDP_PASS, SAME, {}, connected("h1", vip=HB_VIP)),
    row("a wire sample pending: to tc", REP, reply(B0), XDP_PASS, SAME, {},
        connected("b0", flags=abi.CT_F_RESP_WAIT)),
    row("partial checksum: to tc", REP, partial_csum(reply(B0)), XDP_PASS, SAME, {}, connected("b0")),
    row("VLAN tagged: to tc", REP, reply(B0, vlan=True), XDP_PASS, SAME, {}, connected("b0")),
    row("IP options: to tc", REP, with_ip_options(reply(B0)), XDP_PASS, SAME, {}, connected("b0")),
    row("padded reply: reverse NAT, padding kept (XDP)", REP, padded(reply(B0)), XDP_REDIRECT, snat(VIP, 80),
        {"return_xdp": 1}, connected("b0"), svc="web"),
    row("TTL 1: to tc", REP, reply(B0, ttl=1), XDP_PASS, SAME, {}, connected("b0")),
    row("client behind another interface: to tc", REP, reply(B0), XDP_PASS, SAME, {}, connected("b0"),
        lambda w: w.reply_hop(CLIENT, VIP, 99)),
]
# fmt: on
