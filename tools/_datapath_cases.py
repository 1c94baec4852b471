"""What tools/bench-datapath measures for IPv4: the program types and the actions each case must
return, the targets (a case's ratio to its floor), the conntrack map types, the bench's addresses
(all from 198.18.0.0/15), the 64-byte frames and their templates, the CASES table (one wrapper
program per case), and results(): each case's ns per packet and its ratio against its target.
The IPv6 cases are _datapath_v6.py's; the namespaces, loading and timing are bench-datapath's,
the checks that each case takes its path _datapath_checks.py's. Needs scapy (the bench's venv).
"""

from __future__ import annotations

import socket
import statistics
import struct
from ipaddress import IPv4Address

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import checksum

import _datapath_v6 as v6

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
ACTIONS = {
    "xdp": dict(enumerate(("XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_TX", "XDP_REDIRECT"))),
    "tc": {TC_ACT_OK: "TC_ACT_OK", TC_ACT_SHOT: "TC_ACT_SHOT", TC_ACT_REDIRECT: "TC_ACT_REDIRECT"},
}
# a case's kind -> its program type: "xdp" runs on the client-facing interface, "xdp_reply"
# on the backend-facing one (edge_reply), "tc" on tc ingress there (edge_return)
PROG_TYPE = {"xdp": "xdp", "xdp_reply": "xdp", "tc": "tc", **v6.PROG_TYPE6}

# case -> (the floor it is compared with, ratio at most); the reply's target is edge_reply's
# (XDP, the common case); tc's edge_return is kept beside it for reference
TARGETS = {
    "established": ("floor", 1.3),
    "new_flow": ("floor_new", 1.2),
    "reply_xdp": ("reply_xdp_floor", 1.3),
    "reply": ("reply_floor", 1.3),
}
# conntrack map types measured: name -> EDGE_CT_FLAGS (maps.h); "lru" is what deploy uses
CT_TYPES = {"lru": "0", "percpu_lru": "BPF_F_NO_COMMON_LRU"}
MAGLEV_M = 65537
VERIFIER_BUDGET = 1_000_000  # BPF_COMPLEXITY_LIMIT_INSNS: instructions the verifier processes at most

# Addresses, all from 198.18.0.0/15. The router namespace has a client-facing veth
# (where XDP would run) and a backend-facing one; both peers live in a second namespace.
ROUTER_CLIENT = ("198.18.0.1", 24)
ROUTER_BACKEND = ("198.18.1.1", 24)
CLIENT = IPv4Address("198.18.0.2")
NEW_CLIENTS = IPv4Address("198.19.0.0")  # (b): 198.19.X.Y, X.Y and source port from a counter
VIP, VIP_PORT = IPv4Address("198.18.255.1"), 8000
BACKENDS = [(f"b{i}", IPv4Address(f"198.18.1.{i + 2}"), 8000) for i in range(3)]
NON_VIP, NON_VIP_PORT = IPv4Address("198.18.0.1"), 22  # the router's own address: ssh, say

EXTRA: list[tuple[str, IPv4Address, int]] = []  # --backends N: the N - 3 more (_datapath_many), set by run()
FAILOVER_CASES = ("restore_new_dead", "failover")  # only with EXTRA: one of them is dead
FAMILIES: set[int] = {4, 6}  # --family: IPv4's cases always run, IPv6's with "both"; set by run()

# Frames: 14 eth + 20 IPv4 + 20 TCP + 10 payload = 64 bytes. The wrappers restore the first
# HDR_LEN bytes every repetition; (b) keeps its per-repetition counter at SEQ_OFF, in the
# payload, which the data path never touches (the kernel reuses the buffer between repetitions).
FRAME_LEN = 64
HDR_LEN = 54
SEQ_OFF = 56
SADDR_LOW_OFF = 14 + 14  # the last two bytes of the IPv4 source address
IP_ID_OFF = 14 + 4  # (b) writes ~(low half of the source) here: the IPv4 checksum stays right
NEW_IP_ID = 0xFFFF  # (b)'s template: low half 0 + 0xffff, the same one's complement sum as x + ~x
SPORT_OFF = 14 + 20  # TCP source port
TCP_ACK, TCP_SYN = 0x10, 0x02


def frame(
    dst_mac: bytes,
    src_mac: bytes,
    src: IPv4Address,
    dst: IPv4Address,
    sport: int,
    dport: int,
    flags: int,
    ip_id: int = 1,
) -> bytes:
    """A 64-byte Ethernet/IPv4/TCP frame with correct checksums (scapy computes them)."""
    tcp = TCP(sport=sport, dport=dport, seq=1, ack=1 if flags & TCP_ACK else 0, flags=flags, window=64240)
    ip = IP(src=str(src), dst=str(dst), id=ip_id, flags="DF", ttl=64)
    return bytes(Ether(dst=dst_mac.hex(":"), src=src_mac.hex(":")) / ip / tcp / bytes(FRAME_LEN - HDR_LEN))


def checksums_ok(pkt: bytes) -> bool:
    """IPv4 header and TCP checksums of a frame built by frame() (and NATed) verify."""
    ip, l4 = pkt[14:34], pkt[34:]
    pseudo = ip[12:20] + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(l4))
    return checksum(ip) == 0 and checksum(pseudo + l4) == 0


def xdp_md(ingress_ifindex: int, frame_len: int = FRAME_LEN) -> bytes:
    """struct xdp_md for the test run: data, data_end, data_meta, ingress_ifindex, rx_queue, egress."""
    return struct.pack("=6I", 0, frame_len, 0, ingress_ifindex, 0, 0)


def sk_buff(ifindex: int) -> bytes:
    """struct __sk_buff up to ifindex for the test run: arriving on (and its device) ifindex."""
    return struct.pack("=11I", *([0] * 9), ifindex, ifindex)


def net_samples(cases: dict, key: str) -> list[float]:
    """Case key's ns per packet round by round: each round's sample minus its wrapper's sample of
    the same round (the rounds run every case in turn, so sample i of every case is round i)."""
    case = cases[key]
    if case.wrapper == case.key:
        return [float(x) for x in case.samples]
    return [x - w for x, w in zip(case.samples, cases[case.wrapper].samples)]


def paired_ratios(case: list[float], floor: list[float]) -> list[float]:
    """A case's ratio to its floor in each round (pairs measured seconds apart, so what drifts
    between rounds, e.g. the LRU's state as a full table turns over, moves both alike); rounds
    whose floor is not above zero are left out."""
    return [c / f for c, f in zip(case, floor) if f > 0]


def results(cases: dict, measured: dict) -> dict:
    """ns per packet (raw minus wrapper) of each case, and the ratios to the reference."""

    def row(case, label: str, samples: list[int]) -> dict:
        raw, sub = statistics.median(samples), cases[case.wrapper].raw if case.wrapper != case.key else 0.0
        return {
            "label": label,
            "ns_per_packet": round(raw - sub, 2),
            "raw_ns_per_packet": raw,
            "wrapper_ns_per_packet": sub,
            "samples_raw_ns": list(samples),
            "action": ACTIONS[PROG_TYPE[case.kind]][case.expect],
        }

    out: dict = {"cases": {key: row(case, case.label, case.samples) for key, case in cases.items()}, "ratios": {}}
    if measured["new_flow_room"]["samples_raw_ns"]:
        out["cases"]["new_flow_room"] = row(
            cases["new_flow"], "(b) before half-open is full (info only)", measured["new_flow_room"]["samples_raw_ns"]
        )
    ref = out["cases"]["reference"]["ns_per_packet"]
    for key, (floor, target) in {**TARGETS, **v6.TARGETS6}.items():
        if key not in cases:
            continue
        base, ns = out["cases"][floor]["ns_per_packet"], out["cases"][key]["ns_per_packet"]
        of_medians = ns / base if base > 0 else float("inf")
        rounds = paired_ratios(net_samples(cases, key), net_samples(cases, floor))
        value = statistics.median(rounds) if rounds else of_medians
        out["ratios"][key] = {
            "floor": floor,
            "value": round(value, 2),
            "rounds": [round(r, 2) for r in rounds],
            "of_medians": round(of_medians, 2),
            "target_max": target,
            "met": value <= target,  # (d) is XDP: no reference for the tc reply
            "to_reference": round(ns / ref, 2) if ref > 0 and cases[key].kind == "xdp" else None,
        }
    return out


CASES = (
    # key, label, program type, template ({i}: one program per backend), C body, action, wrapper
    ("restore", "wrapper: restore headers", "xdp", "established", "XDP_DROP", XDP_DROP, "restore"),
    ("restore_new", "wrapper: restore + new 5-tuple", "xdp", "new", "XDP_DROP", XDP_DROP, "restore_new"),
    (
        "established",
        "(a) established: ct hit, NAT, fib, redirect",
        "xdp",
        "established",
        "edge_ingress(ctx)",
        XDP_REDIRECT,
        "restore",
    ),
    (
        "new_flow",
        "(b) new flow: Maglev, half-open insert, NAT, fib, redirect",
        "xdp",
        "new",
        "edge_ingress(ctx)",
        XDP_REDIRECT,
        "restore_new",
    ),
    ("pass", "(c) non-VIP: passed", "xdp", "pass", "edge_ingress(ctx)", XDP_PASS, "restore"),
    (
        "reference",
        "(d) reference: parse eth/ipv4/tcp, redirect",
        "xdp",
        "established",
        "bench_reference_body(ctx)",
        XDP_REDIRECT,
        "restore",
    ),
    (
        "floor",
        "(e) floor: (d) + 2 hash lookups (VIP, conntrack)",
        "xdp",
        "established",
        "bench_floor_body(ctx, 0)",
        XDP_REDIRECT,
        "restore",
    ),
    (
        "floor_new",
        "(f) new-flow floor: (e) + half-open insert",
        "xdp",
        "new",
        "bench_floor_body(ctx, 1)",
        XDP_REDIRECT,
        "restore_new",
    ),
    # --backends N > 3 only: (b) whose Maglev pick is the one dead backend (_datapath_many)
    (
        "restore_new_dead",
        "wrapper: restore + new 5-tuple + its slot names the dead backend",
        "xdp",
        "new",
        "XDP_DROP",
        XDP_DROP,
        "restore_new_dead",
    ),
    (
        "failover",
        "(l) new flow, its Maglev pick dead (1 of N): slow path, walk, insert, NAT, redirect",
        "xdp",
        "new",
        "edge_ingress(ctx)",
        XDP_REDIRECT,
        "restore_new_dead",
    ),
    (
        "hb_mac",
        "(k) heartbeat MAC: SipHash-2-4 of 16 bytes, compared",
        "xdp",
        "established",
        "bench_mac_body(ctx)",
        XDP_DROP,
        "restore",
    ),
    # tc: loaded for the backend (a)'s flow is pinned to, once check_paths has shown which
    ("restore_tc", "wrapper: restore reply headers (tc)", "tc", "reply_{i}", "TC_ACT_SHOT", TC_ACT_SHOT, "restore_tc"),
    (
        "reply",
        "(g) reply: rnat + ct hit, reverse NAT, fib, redirect (tc)",
        "tc",
        "reply_{i}",
        "edge_return(ctx)",
        TC_ACT_REDIRECT,
        "restore_tc",
    ),
    (
        "reply_floor",
        "(h) reply floor: parse, the 2 lookups, redirect (tc)",
        "tc",
        "reply_{i}",
        "bench_reply_floor_body(ctx)",
        TC_ACT_REDIRECT,
        "restore_tc",
    ),
    # XDP on the backend side: edge_reply, which passes to (g) what it does not handle
    (
        "restore_xdp_reply",
        "wrapper: restore reply headers (XDP)",
        "xdp_reply",
        "reply_{i}",
        "XDP_DROP",
        XDP_DROP,
        "restore_xdp_reply",
    ),
    (
        "reply_xdp",
        "(i) reply: rnat + ct hit, reverse NAT, cached hop, redirect (XDP)",
        "xdp_reply",
        "reply_{i}",
        "edge_reply(ctx)",
        XDP_REDIRECT,
        "restore_xdp_reply",
    ),
    (
        "reply_xdp_floor",
        "(j) reply floor: parse, the 2 lookups, redirect (XDP)",
        "xdp_reply",
        "reply_{i}",
        "bench_reply_xdp_floor_body(ctx)",
        XDP_REDIRECT,
        "restore_xdp_reply",
    ),
)
# need (a)'s (or (a6)'s) flow in conntrack: that case runs once before each call
PINNED = {k: "established" for k in ("established", "reply", "reply_floor", "reply_xdp", "reply_xdp_floor")}
PINNED.update(v6.PINNED6)


def templates(client_port: int) -> dict[str, bytes]:
    """The frames the wrappers restore, by name; client_port: (a)'s source port (bench-datapath's CLIENT_PORT)."""
    router_mac, client_mac = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")  # parsed only
    return {
        "established": frame(router_mac, client_mac, CLIENT, VIP, client_port, VIP_PORT, TCP_ACK),
        "new": frame(router_mac, client_mac, NEW_CLIENTS, VIP, 0, VIP_PORT, TCP_SYN, NEW_IP_ID),
        "pass": frame(router_mac, client_mac, CLIENT, NON_VIP, client_port, NON_VIP_PORT, TCP_ACK),
        # (g), (h): backend i answers (a)'s flow
        **{
            f"reply_{i}": frame(router_mac, client_mac, addr, CLIENT, port, client_port, TCP_ACK)
            for i, (_, addr, port) in enumerate(BACKENDS)
        },
        **v6.templates6(router_mac, client_mac),
    }
