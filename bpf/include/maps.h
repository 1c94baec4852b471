/* SPDX-License-Identifier: Apache-2.0 */
/* maps.h: every map of the data path, pinned under EDGE_PIN_DIR, which the
 * loader sets to <bpffs>/edge/v<EDGE_ABI_VERSION>/<instance>. Kernel side
 * only; key and value types come from abi.h. Sizes are chosen at deploy time
 * and arrive as -D flags (loader.cflags); their defaults are declared once,
 * in controlplane/config.py (Node), so there are none here. */
#ifndef EDGE_MAPS_H
#define EDGE_MAPS_H

#include "abi.h"

#ifndef EDGE_PIN_DIR
#error "EDGE_PIN_DIR must be set by the loader"
#endif
/* EDGE_MAGLEV_M: slots per Maglev table; prime; Python builds the same M.
 * EDGE_MAX_SERVICES: VIPs; each owns two Maglev tables (A/B).
 * EDGE_MAX_BACKENDS: backend ids, across all VIPs.
 * EDGE_CT_SIZE: conntrack entries (and as many reverse-NAT entries).
 * EDGE_CT6_SIZE: IPv6 conntrack entries (loader: a quarter of EDGE_CT_SIZE,
 * at least 1024).
 * EDGE_HALF_OPEN_SIZE: half-open TCP connections (loader: a quarter of
 * EDGE_CT_SIZE, at least 1024). */
#ifndef EDGE_MAGLEV_M
#error "EDGE_MAGLEV_M must be set by the loader"
#endif
#ifndef EDGE_MAX_SERVICES
#error "EDGE_MAX_SERVICES must be set by the loader"
#endif
#ifndef EDGE_MAX_BACKENDS
#error "EDGE_MAX_BACKENDS must be set by the loader"
#endif
#ifndef EDGE_CT_SIZE
#error "EDGE_CT_SIZE must be set by the loader"
#endif
#ifndef EDGE_HALF_OPEN_SIZE
#error "EDGE_HALF_OPEN_SIZE must be set by the loader"
#endif
#ifndef EDGE_CT6_SIZE
#error "EDGE_CT6_SIZE must be set by the loader"
#endif

#define EDGE_PIN(name) EDGE_PIN_DIR "/" #name

/* (VIP address, port, protocol) -> vip_info. */
BPF_TABLE_PINNED("hash", struct vip_key, struct vip_info, edge_vips,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_vips));
/* VIP address -> number of VIPs on it: the cheap "is this for us?" test. */
BPF_TABLE_PINNED("hash", __be32, __u32, edge_vip_addrs,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_vip_addrs));
/* One entry: a bit per hash of VIP addresses (abi.h, vip_filter). */
BPF_TABLE_PINNED("array", __u32, struct vip_filter, edge_vip_filter,
		 1, EDGE_PIN(edge_vip_filter));
/* backend id -> address, port, flags. */
BPF_TABLE_PINNED("array", __u32, struct backend_info, edge_backends,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_backends));
/* VIP id -> health settings and backend list of the service. */
BPF_TABLE_PINNED("array", __u32, struct service_cfg, edge_svc_cfg,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_svc_cfg));
/* health id -> heartbeat and passive-detection state (kernel-written). */
BPF_TABLE_PINNED("array", __u32, struct backend_health, edge_health,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_health));
/* (backend address, service port, heartbeat port) -> who it stamps. */
BPF_TABLE_PINNED("hash", struct hb_key, struct hb_target, edge_hb,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_hb));
/* UDP ports heartbeats are sent to (network order) -> 1. */
BPF_TABLE_PINNED("hash", __be16, __u32, edge_hb_ports,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_hb_ports));
/* Maglev tables: slot [(vip id * 2 + half) * M + slot] -> backend id, two
 * slots a value (abi.h, maglev_slots; read through flow.h, maglev_slot).
 * mmapable, so user space writes a whole half with one memcpy before the
 * flip, and sees one plain u32 array. */
_Static_assert(EDGE_MAGLEV_PER_VALUE == 2, "maps: edge_maglev's size assumes 2 slots a value");
BPF_TABLE_PINNED("array", __u32, struct maglev_slots, edge_maglev,
		 EDGE_MAX_SERVICES *EDGE_MAGLEV_M, EDGE_PIN(edge_maglev),
		 BPF_F_MMAPABLE);
/* Conntrack: client 5-tuple -> backend. EDGE_CT_FLAGS: 0, one LRU list for
 * all CPUs; tools/bench-datapath also measures BPF_F_NO_COMMON_LRU. */
#ifndef EDGE_CT_FLAGS
#define EDGE_CT_FLAGS 0
#endif
BPF_TABLE_PINNED("lru_hash", struct flow_key, struct flow_info, edge_ct,
		 EDGE_CT_SIZE, EDGE_PIN(edge_ct), EDGE_CT_FLAGS);
/* Half-open TCP connections: client 5-tuple -> the entry edge_ct gets on the
 * client's ACK (flow.h). An LRU of its own, so SYNs evict only each other. */
BPF_TABLE_PINNED("lru_hash", struct flow_key, struct half_open, edge_half_open,
		 EDGE_HALF_OPEN_SIZE, EDGE_PIN(edge_half_open), EDGE_CT_FLAGS);
/* Per-CPU budget of conntrack entries for TCP packets that are no SYN. */
BPF_TABLE_PINNED("percpu_array", __u32, struct ct_budget, edge_ct_budget,
		 1, EDGE_PIN(edge_ct_budget));
/* Reverse NAT: backend endpoint -> VIP to restore. */
BPF_TABLE_PINNED("hash", struct backend_key, struct rnat_info, edge_rnat,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_rnat));
/* Direct (not VIP) TCP connections to a backend endpoint in edge_rnat, seen
 * by their SYN: the return path leaves them alone (stateless.h). */
BPF_TABLE_PINNED("lru_hash", struct direct_key, __u32, edge_direct,
		 EDGE_DIRECT_SLOTS, EDGE_PIN(edge_direct));
/* backend id -> cached egress interface and MACs (per CPU). */
BPF_TABLE_PINNED("percpu_array", __u32, struct nexthop, edge_nexthop,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_nexthop));
/* Tail-call targets of the ingress (EDGE_TAIL_*): its slow path. Pinned, so
 * the kernel keeps the entries after the loader that filled them exits. */
BPF_TABLE_PINNED("prog", __u32, __u32, edge_tails,
		 EDGE_TAIL_MAX, EDGE_PIN(edge_tails));
/* IPv6 (abi.h: struct addr6 and the keys with it): VIP key -> vip_info;
 * VIP address -> VIPs on it; backend id -> address (its edge_backends entry
 * holds the rest); conntrack (EDGE_CT6_SIZE entries); half-open TCP
 * connections (state6.h: an LRU of their own, as edge_half_open, sized as
 * it); reverse NAT; direct connections to a backend's own address
 * (state6.h, as edge_direct); heartbeats; the way to a DSR backend
 * (encap6.h). */
BPF_TABLE_PINNED("hash", struct vip_key6, struct vip_info, edge_vips6,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_vips6));
BPF_TABLE_PINNED("hash", struct addr6, __u32, edge_vip_addrs6,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_vip_addrs6));
BPF_TABLE_PINNED("array", __u32, struct addr6, edge_backends6,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_backends6));
BPF_TABLE_PINNED("lru_hash", struct flow_key6, struct flow_info, edge_ct6,
		 EDGE_CT6_SIZE, EDGE_PIN(edge_ct6), EDGE_CT_FLAGS);
BPF_TABLE_PINNED("lru_hash", struct flow_key6, struct half_open, edge_half_open6,
		 EDGE_HALF_OPEN_SIZE, EDGE_PIN(edge_half_open6), EDGE_CT_FLAGS);
BPF_TABLE_PINNED("lru_hash", struct direct_key6, __u32, edge_direct6,
		 EDGE_DIRECT6_SLOTS, EDGE_PIN(edge_direct6));
BPF_TABLE_PINNED("hash", struct backend_key6, struct rnat_info6, edge_rnat6,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_rnat6));
/* hash(client, VIP) -> cached egress interface and MACs of IPv6 replies (per CPU, hop6.h). */
BPF_TABLE_PINNED("percpu_array", __u32, struct reply_hop6, edge_reply_hop6,
		 EDGE_REPLY_HOP_SLOTS, EDGE_PIN(edge_reply_hop6));
BPF_TABLE_PINNED("hash", struct hb_key6, struct hb_target, edge_hb6,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_hb6));
BPF_TABLE_PINNED("percpu_array", __u32, struct nexthop6, edge_hop6,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_hop6));
/* Per-CPU hand-over from edge_ingress6 to edge_ingress6_dsr of the packet
 * being sent (ingress6.h, edge_xdp.c), so that the DSR program needs no
 * second parse and conntrack lookup; kernel only, not pinned. Taken once:
 * the DSR program clears len, and parses again when it finds none or one
 * of another length (a tail program of another compile, during a deploy). */
struct dsr6_hand {
	__u32 len;    /* the frame's length when handed over; 0: nothing handed */
	__u32 bid;    /* the backend edge_ingress6 chose */
	__u32 vip_id; /* its service */
	__u32 l3_off; /* where the IPv6 header starts */
	__u32 l3_len; /* the IPv6 packet's length */
	__u32 pad;
};
BPF_PERCPU_ARRAY(edge_dsr6_hand, struct dsr6_hand, 1);
/* Per-CPU state of the fallback scan between its runs over one packet
 * (select.h, scan_backends); kernel only, not pinned. */
struct scan_state {
	__u32 hash;	 /* the flow hash of the packet being scanned for */
	__u32 vip_id;	 /* its service; EDGE_NO_BACKEND: no scan under way */
	__u32 pos;	 /* next index of service_cfg.backends to look at */
	__u32 primaries; /* usable primaries seen so far */
	__u32 standbys;	 /* usable standbys seen so far */
	__u32 best_p;	 /* of those primaries, the one of the highest score */
	__u32 score_p;
	__u32 best_s; /* of those standbys, the one of the highest score */
	__u32 score_s;
};
BPF_PERCPU_ARRAY(edge_scan_state, struct scan_state, 1);
/* Per-CPU clock of the fast path's health decisions (edge_xdp.c,
 * health_now); kernel only, not pinned. */
struct clock_cache {
	__u64 jiffies; /* bpf_jiffies64() when ns was read */
	__u64 ns;      /* bpf_ktime_get_ns() then */
};
BPF_PERCPU_ARRAY(edge_clock, struct clock_cache, 1);
/* Per-CPU copies of edge_rnat entries for edge_reply, direct-mapped by a hash
 * of the backend endpoint (edge_reply.c, rnat_cached); kernel only, not
 * pinned. A copy is used only while node_info.rnat_gen is the one it was
 * made under; the checksum changes of the reverse NAT come with it. */
#define EDGE_RNAT_CACHE_SLOTS 1024 /* a power of two */
struct rnat_slot {
	__u64 key;	       /* the struct backend_key it copies, as one word */
	__u64 gen;	       /* node_info.rnat_gen when copied */
	struct rnat_info info; /* the edge_rnat entry */
	__u16 csum_ip;	       /* IPv4 checksum change: source address -> VIP, TTL - 1 (folded) */
	__u16 csum_l4;	       /* L4 checksum change: source address and port -> the VIP's (folded) */
	__u32 pad;
};
BPF_PERCPU_ARRAY(edge_rnat_cache, struct rnat_slot, EDGE_RNAT_CACHE_SLOTS);
/* The same for edge_rnat6 entries (reply6.h, rnat6_cached), under the same
 * node_info.rnat_gen; kernel only, not pinned. */
struct rnat6_slot {
	struct backend_key6 key; /* the endpoint it copies (pad 0) */
	__u16 csum_l4;		 /* L4 checksum change: source address and port -> the VIP's (folded) */
	__u16 pad;
	__u64 gen;		/* node_info.rnat_gen when copied */
	struct rnat_info6 info; /* the edge_rnat6 entry */
	__u32 pad2;
};
BPF_PERCPU_ARRAY(edge_rnat6_cache, struct rnat6_slot, EDGE_RNAT_CACHE_SLOTS);
/* hash(client, VIP) -> cached egress interface and MACs of replies (per CPU). */
BPF_TABLE_PINNED("percpu_array", __u32, struct reply_hop, edge_reply_hop,
		 EDGE_REPLY_HOP_SLOTS, EDGE_PIN(edge_reply_hop));
/* Per-CPU traffic counters per VIP id and per backend id. */
BPF_TABLE_PINNED("percpu_array", __u32, struct traffic_stats, edge_vip_stats,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_vip_stats));
BPF_TABLE_PINNED("percpu_array", __u32, struct traffic_stats, edge_be_stats,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_be_stats));
/* backend id -> its open TCP connections through the VIP (wire.h,
 * wire_count): one counter for all CPUs, changed by atomic adds, read by
 * the ingress's two_choices and least_loaded (select.h). Signed: a
 * connection opened before the counter was zeroed may close after it.
 * Slot EDGE_MAX_BACKENDS + id holds what user space found the count of id
 * off by (connections the LRU evicted while open, never counted closed:
 * controlplane/edged/openfix.py compares the count with conntrack's open
 * entries); the data path subtracts it and never writes it. Slot
 * 2 * EDGE_MAX_BACKENDS + id holds least_loaded's scale of id (select.h,
 * open_cost: EDGE_OPEN_SCALE_ONE over the backend's share of the
 * service's largest slots; 0 counts as EDGE_OPEN_SCALE_ONE), written by
 * edged only. */
BPF_TABLE_PINNED("array", __u32, __s64, edge_inflight,
		 3 * EDGE_MAX_BACKENDS, EDGE_PIN(edge_inflight));
/* Per-CPU latency histograms and open/close counts per backend id (wire.h). */
BPF_TABLE_PINNED("percpu_array", __u32, struct wire_stats, edge_wire,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_wire));
/* Per-CPU packet counts by EDGE_CNT_* verdict and EDGE_DROP_* reason, per
 * service: slot VIP id, and EDGE_NO_SERVICE for packets dropped or passed
 * before a service is known (abi.h, EDGE_SVC_COUNTERS; stats.h). */
#define EDGE_NO_SERVICE EDGE_MAX_SERVICES
BPF_TABLE_PINNED("percpu_array", __u32, __u64, edge_svc_counts,
		 (EDGE_MAX_SERVICES + 1) * EDGE_SVC_COUNTERS, EDGE_PIN(edge_svc_counts));
/* User space only: names, weights, and what deploy did to the node. */
BPF_TABLE_PINNED("array", __u32, struct service_meta, edge_svc_meta,
		 EDGE_MAX_SERVICES, EDGE_PIN(edge_svc_meta));
BPF_TABLE_PINNED("array", __u32, struct backend_meta, edge_be_meta,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_be_meta));
BPF_TABLE_PINNED("array", __u32, struct backend_probe, edge_be_probe,
		 EDGE_MAX_BACKENDS, EDGE_PIN(edge_be_probe));
BPF_TABLE_PINNED("array", __u32, struct node_info, edge_node,
		 1, EDGE_PIN(edge_node));

#endif /* EDGE_MAPS_H */
