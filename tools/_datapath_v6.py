"""tools/bench-datapath's IPv6 cases: an IPv6 service beside the IPv4 one, its frames (84 bytes:
14 eth + 40 IPv6 + 20 TCP + 10 payload), the C text of its wrappers and floors, and the checks that
each IPv6 case takes its path. (a6) established, (b6) new flow, (i6) reply through edge_reply (XDP),
(g6) reply through edge_return (tc), each against a floor program of its own family: (e6) parse
eth/IPv6/TCP, look up edge_vips6 and edge_ct6, redirect; (f6) (e6) + an edge_half_open6 insert (the table a SYN goes into); (j6), (h6)
parse, edge_rnat6 and edge_ct6, redirect (XDP, tc). (a6) and (b6) run edge_ingress, which tail-calls
edge_ingress6 for an IPv6 frame as deployed: the tail call is part of what they pay, not of the floor.
Addresses from 2001:2::/48 only, in the bench's own namespaces.
"""

from __future__ import annotations

import socket
import struct
from ipaddress import IPv6Address
from typing import Callable

from _datapath_c import WRAPPER

FRAME_LEN6 = 84
HDR_LEN6 = 74
SEQ_OFF6 = 76  # in the payload: the counter of (b6), (f6)
SADDR6_LOW_OFF = 14 + 8 + 14  # the last two bytes of the IPv6 source address
SPORT6_OFF = 14 + 40  # TCP source port

ROUTER_CLIENT6 = ("2001:2::1", 64)
ROUTER_BACKEND6 = ("2001:2:0:1::1", 64)
CLIENT6 = IPv6Address("2001:2::2")
NEW_CLIENTS6 = IPv6Address("2001:2:0:100::")  # (b6): the low 16 bits and the source port from a counter
VIP6, VIP6_PORT = IPv6Address("2001:2:0:ffff::1"), 8000
BACKENDS6 = [(f"v6b{i}", IPv6Address(f"2001:2:0:1::{i + 2}"), 8000) for i in range(3)]
CLIENT6_PORT = 40000
TCP_ACK, TCP_SYN = 0x10, 0x02

# case -> (floor, ratio at most): the issue's targets, as IPv4's
TARGETS6 = {
    "established6": ("floor6", 1.3),
    "new_flow6": ("floor6_new", 1.2),
    "reply6_xdp": ("reply6_xdp_floor", 1.3),
    "reply6": ("reply6_floor", 1.3),
}
# kind -> program type (bench-datapath's PROG_TYPE): the IPv6 kinds have their own frame length
PROG_TYPE6 = {"xdp6": "xdp", "xdp_reply6": "xdp", "tc6": "tc"}
# case -> the case run once before it, so its flow is in edge_ct6 ((b6) may have evicted it)
PINNED6 = {k: "established6" for k in ("established6", "reply6", "reply6_floor", "reply6_xdp", "reply6_xdp_floor")}

XDP_DROP, XDP_PASS, XDP_REDIRECT = 1, 2, 4
TC_ACT_SHOT, TC_ACT_REDIRECT = 2, 7

CASES6 = (
    ("restore6", "wrapper: restore IPv6 headers", "xdp6", "established6", "XDP_DROP", XDP_DROP, "restore6"),
    ("restore_new6", "wrapper: restore IPv6 + new 5-tuple", "xdp6", "new6", "XDP_DROP", XDP_DROP, "restore_new6"),
    (
        "established6",
        "(a6) IPv6 established: tail call, ct6 hit, NAT, hop, redirect",
        "xdp6",
        "established6",
        "edge_ingress(ctx)",
        XDP_REDIRECT,
        "restore6",
    ),
    (
        "new_flow6",
        "(b6) IPv6 new flow: tail call, Maglev, half-open insert, NAT, redirect",
        "xdp6",
        "new6",
        "edge_ingress(ctx)",
        XDP_REDIRECT,
        "restore_new6",
    ),
    (
        "floor6",
        "(e6) IPv6 floor: parse eth/ipv6/tcp, 2 hash lookups, redirect",
        "xdp6",
        "established6",
        "bench_floor6_body(ctx, 0)",
        XDP_REDIRECT,
        "restore6",
    ),
    (
        "floor6_new",
        "(f6) IPv6 new-flow floor: (e6) + half-open6 insert",
        "xdp6",
        "new6",
        "bench_floor6_body(ctx, 1)",
        XDP_REDIRECT,
        "restore_new6",
    ),
    (
        "restore_tc6",
        "wrapper: restore IPv6 reply headers (tc)",
        "tc6",
        "reply6_{i}",
        "TC_ACT_SHOT",
        TC_ACT_SHOT,
        "restore_tc6",
    ),
    (
        "reply6",
        "(g6) IPv6 reply: rnat6 + ct6 hit, reverse NAT, fib, redirect (tc)",
        "tc6",
        "reply6_{i}",
        "edge_return(ctx)",
        TC_ACT_REDIRECT,
        "restore_tc6",
    ),
    (
        "reply6_floor",
        "(h6) IPv6 reply floor: parse, the 2 lookups, redirect (tc)",
        "tc6",
        "reply6_{i}",
        "bench_reply6_floor_body(ctx)",
        TC_ACT_REDIRECT,
        "restore_tc6",
    ),
    (
        "restore_xdp_reply6",
        "wrapper: restore IPv6 reply headers (XDP)",
        "xdp_reply6",
        "reply6_{i}",
        "XDP_DROP",
        XDP_DROP,
        "restore_xdp_reply6",
    ),
    (
        "reply6_xdp",
        "(i6) IPv6 reply: rnat6 + ct6 hit, reverse NAT, hop, redirect (XDP)",
        "xdp_reply6",
        "reply6_{i}",
        "edge_reply(ctx)",
        XDP_REDIRECT,
        "restore_xdp_reply6",
    ),
    (
        "reply6_xdp_floor",
        "(j6) IPv6 reply floor: parse, the 2 lookups, redirect (XDP)",
        "xdp_reply6",
        "reply6_{i}",
        "bench_reply6_xdp_floor_body(ctx)",
        XDP_REDIRECT,
        "restore_xdp_reply6",
    ),
)

HELPERS6 = r"""
/* ---- tools/bench-datapath: IPv6 wrappers and floors (tools/_datapath_v6.py) ---- */
#define BENCH_FRAME_LEN6 %(frame_len)d

/* (b6), (f6): a new 5-tuple every repetition, from the counter in the payload: the
 * low 16 bits of the source address and the source port (IPv6 has no header
 * checksum; the data path checks the TCP checksum only of SYNs without payload). */
static __always_inline void bench_next_flow6(void *data)
{
	__u32 seq = *(__u32 *)(data + %(seq_off)d);

	*(__u32 *)(data + %(seq_off)d) = seq + 1;
	*(__u16 *)(data + %(saddr_low_off)d) = (__u16)(seq >> 16);
	*(__u16 *)(data + %(sport_off)d) = (__u16)seq;
}

/* What any IPv6 forwarder does at least: parse eth/IPv6/TCP (sets ip6, th). */
#define BENCH_PARSE6(drop, pass)					\
	void *data = (void *)(long)ctx->data;				\
	void *data_end = (void *)(long)ctx->data_end;			\
	struct ethhdr *eth = data;					\
	struct ipv6hdr *ip6;						\
	struct tcphdr *th;						\
	if ((void *)(eth + 1) > data_end)				\
		return drop;						\
	if (eth->h_proto != bpf_htons(ETH_P_IPV6))			\
		return pass;						\
	ip6 = (void *)(eth + 1);					\
	if ((void *)(ip6 + 1) > data_end)				\
		return drop;						\
	if (ip6->nexthdr != IPPROTO_TCP)				\
		return pass;						\
	th = (void *)(ip6 + 1);						\
	if ((void *)(th + 1) > data_end)				\
		return drop

/* (e6), (f6): parse, look up the VIP (edge_vips6) and the flow (edge_ct6), for a new
 * flow insert it into the table a SYN goes into (edge_half_open6), redirect. */
static __always_inline int bench_floor6_body(struct xdp_md *ctx, const int insert)
{
	struct vip_key6 vk = {};
	struct flow_key6 fk = {};
	struct half_open ho = {};

	BENCH_PARSE6(XDP_DROP, XDP_PASS);
	__builtin_memcpy(&vk.addr, &ip6->daddr, 16);
	vk.port = th->dest;
	vk.proto = IPPROTO_TCP;
	if (!edge_vips6.lookup(&vk))
		return XDP_PASS;
	__builtin_memcpy(&fk.src, &ip6->saddr, 16);
	__builtin_memcpy(&fk.dst, &ip6->daddr, 16);
	fk.sport = th->source;
	fk.dport = th->dest;
	fk.proto = IPPROTO_TCP;
	if (!edge_ct6.lookup(&fk) && insert)
		edge_half_open6.update(&fk, &ho);
	return bpf_redirect(%(backend_ifindex)d, 0);
}

/* (j6), (h6): reverse NAT by backend endpoint (edge_rnat6), conntrack by the client's
 * 5-tuple (edge_ct6); 1: both hit. */
static __always_inline int bench_reply6_found(const struct ipv6hdr *ip6, const struct tcphdr *th)
{
	struct backend_key6 rk = {};
	struct flow_key6 fk = {};
	struct rnat_info6 *ri;

	__builtin_memcpy(&rk.addr, &ip6->saddr, 16);
	rk.port = th->source;
	rk.proto = IPPROTO_TCP;
	ri = edge_rnat6.lookup(&rk);
	if (!ri)
		return 0;
	__builtin_memcpy(&fk.src, &ip6->daddr, 16);
	fk.dst = ri->vip_addr;
	fk.sport = th->dest;
	fk.dport = ri->vip_port;
	fk.proto = IPPROTO_TCP;
	return edge_ct6.lookup(&fk) != NULL;
}

static __always_inline int bench_reply6_floor_body(struct __sk_buff *ctx)
{
	BENCH_PARSE6(TC_ACT_SHOT, TC_ACT_OK);
	if (!bench_reply6_found(ip6, th))
		return TC_ACT_OK;
	return bpf_redirect(%(client_ifindex)d, 0);
}

static __always_inline int bench_reply6_xdp_floor_body(struct xdp_md *ctx)
{
	BENCH_PARSE6(XDP_DROP, XDP_PASS);
	if (!bench_reply6_found(ip6, th))
		return XDP_PASS;
	return bpf_redirect(%(client_ifindex)d, 0);
}
"""

WRAPPER6 = WRAPPER.replace("BENCH_FRAME_LEN", "BENCH_FRAME_LEN6")


def helpers6(backend_ifindex: int, client_ifindex: int) -> str:
    return HELPERS6 % {
        "frame_len": FRAME_LEN6,
        "seq_off": SEQ_OFF6,
        "saddr_low_off": SADDR6_LOW_OFF,
        "sport_off": SPORT6_OFF,
        "backend_ifindex": backend_ifindex,
        "client_ifindex": client_ifindex,
    }


def frame6(
    dst_mac: bytes, src_mac: bytes, src: IPv6Address, dst: IPv6Address, sport: int, dport: int, flags: int
) -> bytes:
    """An 84-byte Ethernet/IPv6/TCP frame with a correct TCP checksum (scapy computes it)."""
    from scapy.layers.inet import TCP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    tcp = TCP(sport=sport, dport=dport, seq=1, ack=1 if flags & TCP_ACK else 0, flags=flags, window=64240)
    ip6 = IPv6(src=str(src), dst=str(dst), hlim=64)
    return bytes(Ether(dst=dst_mac.hex(":"), src=src_mac.hex(":")) / ip6 / tcp / bytes(FRAME_LEN6 - HDR_LEN6))


def templates6(router_mac: bytes, client_mac: bytes) -> dict[str, bytes]:
    return {
        "established6": frame6(router_mac, client_mac, CLIENT6, VIP6, CLIENT6_PORT, VIP6_PORT, TCP_ACK),
        "new6": frame6(router_mac, client_mac, NEW_CLIENTS6, VIP6, 0, VIP6_PORT, TCP_SYN),
        **{
            f"reply6_{i}": frame6(router_mac, client_mac, addr, CLIENT6, port, CLIENT6_PORT, TCP_ACK)
            for i, (_, addr, port) in enumerate(BACKENDS6)
        },
    }


def service6(health: str) -> dict:
    """The bench's IPv6 service (the config's second: the first is IPv4's)."""
    return {
        "name": "bench6",
        "vip": str(VIP6),
        "port": VIP6_PORT,
        "protocol": "tcp",
        **({"health": {"passive": {}}} if health == "passive" else {}),
        "backends": [{"name": n, "address": str(a), "port": p} for n, a, p in BACKENDS6],
    }


def build6(router, ipr, ifindex: dict[str, int], macs: dict[str, tuple[bytes, bytes]]) -> None:
    """IPv6 forwarding, addresses (no DAD) on the router's veths and permanent neighbours for the
    IPv6 backends and client, so bpf_fib_lookup succeeds both ways."""
    router.sysctl("net.ipv6.conf.all.forwarding", 1)
    for name, (addr, plen) in (("client", ROUTER_CLIENT6), ("backend", ROUTER_BACKEND6)):
        ipr.addr("add", index=ifindex[name], address=addr, prefixlen=plen, flags=0x02)  # IFA_F_NODAD
    for addr, name in [(a, "backend") for _, a, _ in BACKENDS6] + [(CLIENT6, "client")]:
        ipr.neigh(
            "add",
            dst=str(addr),
            lladdr=macs[name][0].hex(":"),
            ifindex=ifindex[name],
            state=0x80,
            family=socket.AF_INET6,
        )  # NUD_PERMANENT


def checksum6_ok(pkt: bytes) -> bool:
    """The TCP checksum of an 84-byte frame built by frame6() (and NATed) verifies."""
    from scapy.utils import checksum

    ip6, l4 = pkt[14:54], pkt[54:]
    pseudo = ip6[8:40] + struct.pack("!I3xB", len(l4), socket.IPPROTO_TCP)
    return checksum(pseudo + l4) == 0


def check_frame6(
    what: str, out: bytes, macs: tuple[bytes, bytes], wanted: Callable[[tuple, tuple], bool], csum: bool = True
) -> tuple:
    """As bench-datapath's check_frame, for IPv6: ends wanted, the fib's MACs, hop limit 63,
    the TCP checksum right (unless csum is False: (b6)'s counter changes what it covers).
    Returns the destination."""
    src, dst = (
        (str(IPv6Address(out[a : a + 16])), struct.unpack("!H", out[p : p + 2])[0]) for a, p in ((22, 54), (38, 56))
    )
    if not wanted(src, dst):
        raise CheckFailed(f"{what} went [{src[0]}]:{src[1]} -> [{dst[0]}]:{dst[1]}")
    if (out[0:6], out[6:12]) != macs:
        raise CheckFailed(f"{what} does not carry the MACs bpf_fib_lookup should have given")
    if out[21] != 63 or (csum and not checksum6_ok(out)):
        raise CheckFailed(f"{what} has hop limit {out[21]} (want 63) or a wrong TCP checksum after NAT")
    return dst


class CheckFailed(Exception):
    pass


def check_paths6(run, cases: dict, macs_backend: tuple[bytes, bytes], repeat: int) -> str:
    """Before timing: (a6) is NATed to a backend right, (b6) too, the floors redirect. run(case,
    n) -> the test run's result. Returns (a6)'s backend as "[address]:port"."""
    backends = {(str(a), p) for _, a, p in BACKENDS6}
    dst = check_frame6("(a6)", run(cases["established6"], 1).data_out, macs_backend, lambda _, d: d in backends)
    run(cases["established6"], repeat)
    check_frame6("(b6)", run(cases["new_flow6"], 1).data_out, macs_backend, lambda _, d: d in backends, False)
    run(cases["new_flow6"], repeat)
    run(cases["floor6"], 1)
    run(cases["floor6_new"], repeat)
    return f"[{dst[0]}]:{dst[1]}"


def check_reply6(run, cases: dict, macs_client: tuple[bytes, bytes]) -> None:
    """(i6) and (g6) give the reply the VIP back and send it to the client; the floors redirect."""
    ends = ((str(VIP6), VIP6_PORT), (str(CLIENT6), CLIENT6_PORT))
    for key, name in (("reply6_xdp", "(i6)"), ("reply6", "(g6)")):
        check_frame6(name, run(cases[key], 1).data_out, macs_client, lambda s, d: (s, d) == ends)
    run(cases["reply6_xdp_floor"], 1)
    run(cases["reply6_floor"], 1)


def backend_index6(established_backend: str) -> int:
    return [f"[{a}]:{p}" for _, a, p in BACKENDS6].index(established_backend)
