"""Mirror of bpf/include/abi.h: the same constants without the EDGE_ prefix,
and the map names of bpf/include/maps.h. Nothing else lives here; struct
layouts are not copied (maps.py uses the types bcc generates from the C).
controlplane/tests/test_abi.py compares this file with the headers."""

ABI_VERSION = 1

NAME_LEN = 32
MAX_RETURN_IFACES = 16
NO_BACKEND = 0xFFFFFFFF

VIP_F_KEEP_FLOWS = 0x1

BE_F_VALID = 0x1
BE_F_UP = 0x2
BE_F_STANDBY = 0x4
BE_F_DRAINING = 0x8

CNT_PASS = 0
CNT_REDIRECT = 1
CNT_NAT_PASS = 2
CNT_DROP = 3
CNT_RETURN_NAT = 4
CNT_MAX = 5

DROP_MALFORMED = 1
DROP_NO_BACKEND = 2
DROP_IP_OPTIONS = 3
DROP_FRAGMENT = 4
DROP_MAX = 5

CNT_NAMES = {
    CNT_PASS: "pass",
    CNT_REDIRECT: "redirect",
    CNT_NAT_PASS: "nat_pass",
    CNT_DROP: "drop",
    CNT_RETURN_NAT: "return_nat",
}
DROP_NAMES = {
    DROP_MALFORMED: "malformed",
    DROP_NO_BACKEND: "no_backend",
    DROP_IP_OPTIONS: "ip_options",
    DROP_FRAGMENT: "fragment",
}

MAP_VIPS = "edge_vips"
MAP_VIP_ADDRS = "edge_vip_addrs"
MAP_BACKENDS = "edge_backends"
MAP_MAGLEV = "edge_maglev"
MAP_CT = "edge_ct"
MAP_RNAT = "edge_rnat"
MAP_VIP_STATS = "edge_vip_stats"
MAP_BE_STATS = "edge_be_stats"
MAP_VERDICTS = "edge_verdicts"
MAP_DROPS = "edge_drops"
MAP_SVC_META = "edge_svc_meta"
MAP_BE_META = "edge_be_meta"
MAP_NODE = "edge_node"

MAP_NAMES = (
    MAP_VIPS, MAP_VIP_ADDRS, MAP_BACKENDS, MAP_MAGLEV, MAP_CT, MAP_RNAT,
    MAP_VIP_STATS, MAP_BE_STATS, MAP_VERDICTS, MAP_DROPS, MAP_SVC_META,
    MAP_BE_META, MAP_NODE,
)

# Program entry points (edge_xdp.c, edge_tc.c).
PROG_INGRESS = "edge_ingress"
PROG_RETURN = "edge_return"
