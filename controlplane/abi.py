"""Mirror of bpf/include/abi.h: the same constants without the EDGE_ prefix,
and the map names of bpf/include/maps.h. Nothing else lives here; struct
layouts are not copied (maps.py uses the types bcc generates from the C),
except the heartbeat wire format, which senders build without bcc.
controlplane/tests/test_abi.py compares this file with the headers."""

import struct

from controlplane.siphash import siphash24

ABI_VERSION = 24

NAME_LEN = 32
MAX_RETURN_IFACES = 16
NO_BACKEND = 0xFFFFFFFF
MAX_PER_SERVICE = 1024
TAIL_SLOW = 0  # edge_tails slot of the ingress slow path
TAIL_SCAN = 1  # edge_tails slot of its fallback scan
TAIL_SCAN_MORE = 2  # edge_tails slot of the scan's next chunk (the scan program again)
TAIL_V6 = 3  # edge_tails slot of the IPv6 ingress
TAIL_V6_SCAN = 4  # edge_tails slot of its fallback scan (and the scan's next chunk)
TAIL_V6_DSR = 5  # edge_tails slot of an IPv6 DSR service's encapsulation
TAIL_V6_STATELESS = 6  # edge_tails slot of an IPv6 TCP packet over the budget, forwarded without an entry
TAIL_MAX = 7
V6_EXT_MAX = 4  # IPv6 extension headers walked before the L4 header
MAGLEV_PER_VALUE = 2  # Maglev slots per edge_maglev value: 4 bytes a slot

VIP_F_KEEP_FLOWS = 0x1

NODE_F_NO_ECHO = 0x1  # node.answer_ping off

BE_F_VALID = 0x1
BE_F_UP = 0x2
BE_F_STANDBY = 0x4
BE_F_DRAINING = 0x8

CT_F_SYN = 0x1
CT_F_SYN_PENDING = 0x2
CT_F_OPEN = 0x4  # wire.h: counted as opened, not yet closed
CT_F_HS_WAIT = 0x8
CT_F_REQ_WAIT = 0x10
CT_F_RESP_WAIT = 0x20
CT_F_WIRE_WAIT = 0x38

WIRE_BUCKETS = 24  # edge_wire histograms: bucket i = [2^i, 2^(i+1)) microseconds

VIP_FILTER_WORDS = 16  # edge_vip_filter: bit hash_mix(VIP address) % VIP_FILTER_BITS is set
VIP_FILTER_BITS = 1024

REPLY_HOP_SLOTS = 4096  # edge_reply_hop: per-CPU cache slots of reply FIB results
DIRECT_SLOTS = 16384  # edge_direct: LRU entries of direct (not VIP) connections to backends
DIRECT6_SLOTS = 4096  # edge_direct6: the same for IPv6 backends (a quarter, as edge_ct6 is of edge_ct)

UNKNOWN = 0xFFFFFFFF
PROBE_F_DRAINED = 0x1
PROBE_F_OVERRIDE = 0x2
PROBE_F_LEAVING = 0x4

SVC_F_HEARTBEAT = 0x1
SVC_F_PASSIVE = 0x2
SVC_F_PROBED = 0x4
SVC_F_DSR = 0x8
SVC_F_TWO_CHOICES = 0x10
SVC_F_LEAST_LOADED = 0x20
LEAST_CANDIDATES = 8
OPEN_SCALE_ONE = 1024
OPEN_SCALE_MASK = 0x7FFF

HB_MAGIC = 0x45444745
HB_VERSION = 3
HEARTBEAT_SIZE = 24
HB_MAC_LEN = 16  # the MAC covers magic .. epoch
HB_WINDOW_S = 60  # an epoch further than this from the router's CLOCK_TAI is refused
# struct heartbeat: magic, version, service port, seq, epoch, then the MAC (network order)
HEARTBEAT_BODY = struct.Struct("!IHHII")
HEARTBEAT = struct.Struct("!IHHIIQ")
HB_KEY_BYTES = 16  # a backend's SipHash-2-4 key

HO_F_ANSWERED = 0x1  # half_open.flags: the backend's SYN-ACK was seen

CNT_PASS = 0
CNT_REDIRECT = 1
CNT_NAT_PASS = 2
CNT_DROP = 3
CNT_RETURN_NAT = 4
CNT_HEARTBEAT = 5
CNT_EJECTION = 6
CNT_RETURN_REDIRECT = 7
CNT_STATELESS = 8
CNT_RETURN_STATELESS = 9
CNT_RETURN_XDP = 10
CNT_ICMP_TO_BACKEND = 11
CNT_ICMP_RETURN = 12
CNT_DSR = 13
CNT_ICMP_ECHO = 14
CNT_MAX = 15

DROP_MALFORMED = 1
DROP_NO_BACKEND = 2
DROP_IP_OPTIONS = 3
DROP_FRAGMENT = 4
DROP_SPOOFED_HB = 5
DROP_BAD_CSUM = 6
DROP_UNTRACKED = 7
DROP_REPLAYED_HB = 8
DROP_STALE_HB = 9
DROP_OTHER_BACKEND = 10
DROP_ICMP_MALFORMED = 11
DROP_ICMP_NESTED = 12
DROP_ICMP_NO_FLOW = 13
DROP_DSR_TOO_BIG = 14
DROP_V6_FRAGMENT = 15
DROP_V6_EXT_HEADER = 16
DROP_MAX = 17
# edge_svc_counts: slot s (a VIP id, or max_services: no service known) holds SVC_COUNTERS u64s
# from s * SVC_COUNTERS: the CNT_* verdicts, then the DROP_* reasons from CNT_MAX on
SVC_COUNTERS = 32

CNT_NAMES = {
    CNT_PASS: "pass",
    CNT_REDIRECT: "redirect",
    CNT_NAT_PASS: "nat_pass",
    CNT_DROP: "drop",
    CNT_RETURN_NAT: "return_nat",
    CNT_HEARTBEAT: "heartbeat",
    CNT_EJECTION: "ejection",
    CNT_RETURN_REDIRECT: "return_redirect",
    CNT_STATELESS: "stateless",
    CNT_RETURN_STATELESS: "return_stateless",
    CNT_RETURN_XDP: "return_xdp",
    CNT_ICMP_TO_BACKEND: "icmp_to_backend",
    CNT_ICMP_RETURN: "icmp_return",
    CNT_DSR: "dsr",
    CNT_ICMP_ECHO: "icmp_echo",
}
DROP_NAMES = {
    DROP_MALFORMED: "malformed",
    DROP_NO_BACKEND: "no_backend",
    DROP_IP_OPTIONS: "ip_options",
    DROP_FRAGMENT: "fragment",
    DROP_SPOOFED_HB: "spoofed_heartbeat",
    DROP_BAD_CSUM: "bad_checksum",
    DROP_UNTRACKED: "untracked",
    DROP_REPLAYED_HB: "replayed_heartbeat",
    DROP_STALE_HB: "stale_heartbeat",
    DROP_OTHER_BACKEND: "other_backend",
    DROP_ICMP_MALFORMED: "icmp_malformed",
    DROP_ICMP_NESTED: "icmp_nested",
    DROP_ICMP_NO_FLOW: "icmp_no_flow",
    DROP_DSR_TOO_BIG: "dsr_too_big",
    DROP_V6_FRAGMENT: "v6_fragment",
    DROP_V6_EXT_HEADER: "v6_ext_header",
}

MAP_VIPS = "edge_vips"
MAP_VIP_ADDRS = "edge_vip_addrs"
MAP_BACKENDS = "edge_backends"
MAP_MAGLEV = "edge_maglev"
MAP_CT = "edge_ct"
MAP_RNAT = "edge_rnat"
MAP_VIP_STATS = "edge_vip_stats"
MAP_BE_STATS = "edge_be_stats"
MAP_SVC_COUNTS = "edge_svc_counts"
MAP_SVC_META = "edge_svc_meta"
MAP_BE_META = "edge_be_meta"
MAP_NODE = "edge_node"
MAP_SVC_CFG = "edge_svc_cfg"
MAP_HEALTH = "edge_health"
MAP_HB = "edge_hb"
MAP_HB_PORTS = "edge_hb_ports"
MAP_NEXTHOP = "edge_nexthop"
MAP_BE_PROBE = "edge_be_probe"
MAP_CT_BUDGET = "edge_ct_budget"
MAP_TAILS = "edge_tails"
MAP_REPLY_HOP = "edge_reply_hop"
MAP_WIRE = "edge_wire"
MAP_DIRECT = "edge_direct"
MAP_HALF_OPEN = "edge_half_open"
MAP_VIP_FILTER = "edge_vip_filter"
MAP_VIPS6 = "edge_vips6"
MAP_VIP_ADDRS6 = "edge_vip_addrs6"
MAP_BACKENDS6 = "edge_backends6"
MAP_CT6 = "edge_ct6"
MAP_RNAT6 = "edge_rnat6"
MAP_HB6 = "edge_hb6"
MAP_HOP6 = "edge_hop6"
MAP_INFLIGHT = "edge_inflight"
MAP_REPLY_HOP6 = "edge_reply_hop6"
MAP_HALF_OPEN6 = "edge_half_open6"
MAP_DIRECT6 = "edge_direct6"

MAP_NAMES = (
    MAP_VIPS,
    MAP_VIP_ADDRS,
    MAP_BACKENDS,
    MAP_MAGLEV,
    MAP_CT,
    MAP_RNAT,
    MAP_VIP_STATS,
    MAP_BE_STATS,
    MAP_SVC_COUNTS,
    MAP_SVC_META,
    MAP_BE_META,
    MAP_NODE,
    MAP_SVC_CFG,
    MAP_HEALTH,
    MAP_HB,
    MAP_HB_PORTS,
    MAP_NEXTHOP,
    MAP_BE_PROBE,
    MAP_CT_BUDGET,
    MAP_TAILS,
    MAP_REPLY_HOP,
    MAP_WIRE,
    MAP_DIRECT,
    MAP_VIP_FILTER,
    MAP_HALF_OPEN,
    MAP_VIPS6,
    MAP_VIP_ADDRS6,
    MAP_BACKENDS6,
    MAP_CT6,
    MAP_RNAT6,
    MAP_HB6,
    MAP_HOP6,
    MAP_INFLIGHT,
    MAP_REPLY_HOP6,
    MAP_HALF_OPEN6,
    MAP_DIRECT6,
)


def hb_key(token: int) -> bytes:
    """The 16-byte SipHash key of a backend's heartbeat token (the config's `token`, up to 128
    bits; a 64-bit one fills the last 8 bytes)."""
    return token.to_bytes(HB_KEY_BYTES, "big")


def heartbeat(port: int, seq: int, token: int, epoch: int) -> bytes:
    """The UDP payload of one heartbeat for the backend serving port, MACed under its token's key
    (hb_key). epoch: the sender's CLOCK_TAI second (the router takes one within HB_WINDOW_S of
    its own clock and newer than the last it took, or a higher seq in the same second)."""
    body = HEARTBEAT_BODY.pack(HB_MAGIC, HB_VERSION, port, seq & 0xFFFFFFFF, epoch & 0xFFFFFFFF)
    return body + siphash24(hb_key(token), body).to_bytes(8, "big")


# Program entry points (edge_xdp.c, edge_tc.c).
PROG_INGRESS = "edge_ingress"
PROG_RETURN = "edge_return"
# XDP fast path of replies on the backend-facing interfaces (edge_reply.c); the rest goes on to PROG_RETURN.
PROG_REPLY = "edge_reply"
# The ingress slow path and its fallback scan, tail-called through edge_tails[TAIL_SLOW],
# [TAIL_SCAN] (select.h says what each holds).
PROG_INGRESS_SLOW = "edge_ingress_slow"
PROG_INGRESS_SCAN = "edge_ingress_scan"
# The IPv6 ingress (ingress6.h), tail-called by edge_ingress through edge_tails[TAIL_V6], and its
# fallback scan through [TAIL_V6_SCAN].
PROG_INGRESS6 = "edge_ingress6"
PROG_INGRESS6_SCAN = "edge_ingress6_scan"
# An IPv6 DSR service's encapsulation (encap6.h), tail-called by edge_ingress6 through [TAIL_V6_DSR].
PROG_INGRESS6_DSR = "edge_ingress6_dsr"
# An IPv6 TCP packet over the budget (state6.h), tail-called by edge_ingress6 through [TAIL_V6_STATELESS].
PROG_INGRESS6_STATELESS = "edge_ingress6_stateless"
