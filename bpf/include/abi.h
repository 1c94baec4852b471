/* SPDX-License-Identifier: Apache-2.0 */
/* abi.h: everything the data path and user space must agree on: map key and
 * value structs, flag bits, counter indices, drop reasons. Types and integer
 * #defines only: no maps, no functions, no bcc macros.
 *
 * Shared with controlplane/abi.py; controlplane/tests/test_abi.py compares
 * them. Struct layouts are not mirrored: Python reads them from this file
 * (controlplane/maps/layouts.py), as bcc does; netns-tests/test_map_layouts.py
 * compares the two.
 * Changing a layout or a number here means bumping EDGE_ABI_VERSION, which is
 * part of the pin path, so a new build never reads an old layout. */
#ifndef EDGE_ABI_H
#define EDGE_ABI_H

#include <linux/types.h>

#define EDGE_ABI_VERSION 24

#define EDGE_NAME_LEN	       32	  /* service and backend names, NUL padded */
#define EDGE_MAX_RETURN_IFACES 16	  /* backend-facing interfaces per router */
#define EDGE_NO_BACKEND	       0xffffffff /* empty Maglev slot */
#define EDGE_MAX_PER_SERVICE   1024	  /* backends of one service (a power of two; fallback scan, ejection cap) */
#define EDGE_TAIL_SLOW	       0	  /* edge_tails slot: the ingress slow path (edge_ingress_slow) */
#define EDGE_TAIL_SCAN	       1	  /* edge_tails slot: its fallback scan (edge_ingress_scan) */
#define EDGE_TAIL_SCAN_MORE    2	  /* edge_tails slot: the scan's next chunk (edge_ingress_scan again) */
#define EDGE_TAIL_V6	       3	  /* edge_tails slot: the IPv6 ingress (edge_ingress6, ingress6.h) */
#define EDGE_TAIL_V6_SCAN      4	  /* edge_tails slot: its fallback scan and the scan's next chunk (edge_ingress6_scan) */
#define EDGE_TAIL_V6_DSR       5	  /* edge_tails slot: an IPv6 DSR service's encapsulation (edge_ingress6_dsr, encap6.h) */
#define EDGE_TAIL_V6_STATELESS 6	  /* edge_tails slot: an IPv6 TCP packet over the budget, forwarded without an entry (edge_ingress6_stateless, state6.h) */
#define EDGE_TAIL_MAX	       7
#define EDGE_V6_EXT_MAX	       4 /* IPv6 extension headers walked before the L4 header (ingress6.h) */
#define EDGE_MAGLEV_PER_VALUE  2 /* Maglev slots per edge_maglev value (struct maglev_slots) */

/* Value of edge_maglev: EDGE_MAGLEV_PER_VALUE consecutive slots, so a slot
 * takes 4 bytes (an array map rounds each value up to 8). Slot s of the
 * flat table [(vip id * 2 + half) * M + slot] is id[s % 2] of value s / 2;
 * through mmap the map is one plain array of u32 backend ids. */
struct maglev_slots {
	__u32 id[EDGE_MAGLEV_PER_VALUE];
};

/* Key of edge_vips: what a client addresses. */
struct vip_key {
	__be32 addr; /* network byte order */
	__be16 port; /* network byte order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

/* Value of edge_vips. Replaced as a whole (hash update), which is what makes
 * the Maglev A/B flip atomic. */
struct vip_info {
	__u32 id;    /* index into per-VIP arrays: 0..max_services-1 */
	__u32 table; /* active Maglev half, 0 or 1 */
	__u32 flags; /* EDGE_VIP_F_* */
	__u32 pad;
};

/* vip_info.flags */
#define EDGE_VIP_F_KEEP_FLOWS 0x1 /* existing_flows: keep (else reselect) */

/* Value of edge_backends, indexed by backend id. */
struct backend_info {
	__be32 addr;	 /* network byte order */
	__be16 port;	 /* network byte order */
	__u16 flags;	 /* EDGE_BE_F_* */
	__u32 vip_id;	 /* the service this backend serves */
	__u32 health_id; /* index into edge_health, shared by one address:port */
};

/* backend_info.flags */
#define EDGE_BE_F_VALID	   0x1 /* slot in use */
#define EDGE_BE_F_UP	   0x2 /* administratively up */
#define EDGE_BE_F_STANDBY  0x4 /* used only when no primary is usable */
#define EDGE_BE_F_DRAINING 0x8 /* weight 0: keeps its flows, gets no new ones */

/* Value of edge_svc_cfg, indexed by VIP id: what the data path needs to
 * judge health for this service, and its backends for the fallback scan. */
/* An IPv6 address, network byte order (IPv6's maps below; service_cfg). */
struct addr6 {
	__be32 w[4];
};

struct service_cfg {
	__u64 hb_timeout_ns;		      /* heartbeat silence that makes a backend down */
	__u64 syn_timeout_ns;		      /* passive: a SYN unanswered this long is a failure */
	__u64 ejection_ns;		      /* passive: base ejection time, doubled on repeat */
	__u32 flags;			      /* EDGE_SVC_F_* */
	__u32 rise;			      /* heartbeats in a row that bring a backend up */
	__u32 consecutive;		      /* passive: failures in a row that eject */
	__u32 max_ejected_pct;		      /* passive: cap on ejected backends, percent */
	__u32 n_backends;		      /* entries used in backends[] */
	__u32 panic_below;		      /* panic mode while fewer primaries are usable; 0 = off */
	__u32 backends[EDGE_MAX_PER_SERVICE]; /* backend ids, primaries first */
	/* The service's edge_vips key, named once that entry is this
	 * service's and cleared before it goes or changes owner (maps): a
	 * conntrack hit to this address, port and protocol is an established
	 * flow of this service without the edge_vips lookup (edge_xdp.c,
	 * established). All zero: none. */
	__be32 vip_addr; /* network byte order */
	__be16 vip_port; /* network byte order */
	__u8 vip_proto;
	__u8 pad;
	/* an IPv6 service's VIP address (its vip_addr stays 0), named and
	 * cleared with vip_port and vip_proto as above: ingress6.h's
	 * established6 takes a conntrack hit to it without edge_vips6 */
	struct addr6 vip_addr6;
};

/* service_cfg.flags */
#define EDGE_SVC_F_HEARTBEAT	0x1  /* backends are down without heartbeats */
#define EDGE_SVC_F_PASSIVE	0x2  /* passive outlier detection on */
#define EDGE_SVC_F_PROBED	0x4  /* edged probes the backends: a probation ends on a passing probe, never by a trial flow */
#define EDGE_SVC_F_DSR		0x8  /* direct server return: packets go to the backend in IPIP (encap.h), not NATed */
#define EDGE_SVC_F_TWO_CHOICES	0x10 /* a new flow takes its Maglev pick or a second backend, whichever has fewer open connections (select.h, two_choices) */
#define EDGE_SVC_F_LEAST_LOADED 0x20 /* a new flow takes the backend with the fewest open connections of its Maglev pick and up to EDGE_LEAST_CANDIDATES - 1 others (select.h, least_loaded) */
#define EDGE_LEAST_CANDIDATES	8    /* least_loaded's candidates: every backend of a service this small */

/* least_loaded's scales (select.h, open_cost; edge_inflight's third part) */
#define EDGE_OPEN_SCALE_ONE  1024   /* the scale of a backend with the service's largest slots */
#define EDGE_OPEN_SCALE_MASK 0x7fff /* the extra scale held, at most (20 x ONE - ONE fits) */

/* Value of edge_health, indexed by health id. Written by the data path
 * (heartbeats, SYN / SYN-ACK tracking); user space reads it, and ends a
 * probation on a passing probe (probation, trial_ns: maps.readmit). */
struct backend_health {
	__u64 last_seen_ns;	/* bpf_ktime_get_ns() of the last valid heartbeat */
	__u64 ejected_until_ns; /* passive ejection ends at this time */
	__u64 first_syn_ns;	/* oldest SYN still unanswered */
	__u64 trial_ns;		/* probation: when the trial flow was let through; 0 = not yet */
	__u32 rise_count;	/* valid heartbeats in a row (no gap > timeout) */
	__u32 syn_outstanding;	/* SYNs forwarded since the last SYN-ACK */
	__u32 rst_count;	/* RSTs answering SYNs since the last SYN-ACK */
	__u32 ejections;	/* times ejected; doubles the next ejection */
	__u32 hb_seq;		/* sequence number of the last heartbeat taken */
	__u32 hb_epoch;		/* epoch (sender's clock, s) of the last heartbeat taken; an older one, or no higher seq in it, is a replay */
	__u32 probation;	/* 1 from an ejection until evidence: a matched SYN-ACK or a heartbeat after it */
	__u32 pad;
};

/* Key of edge_hb: who may send a heartbeat, for which backend, to which port. */
struct hb_key {
	__be32 addr;	/* the backend's registered address */
	__be16 port;	/* the backend's service port (from the payload) */
	__be16 hb_port; /* UDP port of the router the heartbeat went to */
};

/* Value of edge_hb. */
struct hb_target {
	__u64 key[2];	  /* the backend's own SipHash-2-4 key: k0, k1 (the key's bytes 0-7 and 8-15, little endian) */
	__u64 timeout_ns; /* gap that restarts the rise count */
	__u32 health_id;
	__u32 ifindex; /* backend-facing interface it must arrive on */
};

/* Heartbeat wire format: the UDP payload a backend's agent sends. All fields
 * in network byte order. mac is SipHash-2-4 under the backend's key over the
 * 16 bytes before it (siphash.h); the data path recomputes it. */
#define EDGE_HB_MAGIC	    0x45444745 /* "EDGE" */
#define EDGE_HB_VERSION	    3
#define EDGE_HEARTBEAT_SIZE 24
#define EDGE_HB_MAC_LEN	    16 /* bytes the MAC covers: magic .. epoch */
#define EDGE_HB_WINDOW_S    60 /* an epoch further than this from the router's CLOCK_TAI is refused */
struct heartbeat {
	__be32 magic;
	__be16 version;
	__be16 port;  /* service port of the backend it speaks for */
	__be32 seq;   /* rises within an epoch */
	__be32 epoch; /* the sender's CLOCK_TAI second when it sent it */
	__be64 mac;   /* SipHash-2-4(backend key, magic .. epoch) */
};

/* Key of edge_ct: a client's connection to a VIP. */
struct flow_key {
	__be32 src;
	__be32 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* Value of edge_ct: the backend a connection is pinned to. Only a TCP SYN
 * (or any UDP datagram) creates one. */
struct flow_info {
	__u32 backend_id;
	__u32 vip_id;
	__u32 flags;	/* EDGE_CT_F_* */
	__be32 syn_seq; /* sequence number of the last SYN through the VIP (EDGE_CT_F_SYN) */
	__u64 wire_ns;	/* bpf_ktime_get_ns() of what EDGE_CT_F_HS_WAIT or _RESP_WAIT times (wire.h) */
};

/* Value of edge_half_open: a TCP connection whose SYN went through the VIP
 * and whose handshake the client has not completed. Its client's first ACK
 * that acknowledges the backend's SYN-ACK (ack_seq) moves ct into edge_ct;
 * until then a SYN flood evicts only other half-open flows. */
struct half_open {
	struct flow_info ct; /* what edge_ct will hold */
	__be32 ack_seq;	     /* the backend's SYN-ACK sequence number + 1 (EDGE_HO_F_ANSWERED) */
	__u32 flags;	     /* EDGE_HO_F_* */
};

/* half_open.flags */
#define EDGE_HO_F_ANSWERED 0x1 /* the backend's SYN-ACK was seen: ack_seq holds */

/* flow_info.flags */
#define EDGE_CT_F_SYN	      0x1  /* a SYN went through the VIP: SYN-ACKs acking syn_seq are ours */
#define EDGE_CT_F_SYN_PENDING 0x2  /* passive detection awaits the answer to that SYN */
#define EDGE_CT_F_OPEN	      0x4  /* counted in wire_stats.opened and not yet closed */
#define EDGE_CT_F_HS_WAIT     0x8  /* wire_ns is the SYN's time; its SYN-ACK is awaited */
#define EDGE_CT_F_REQ_WAIT    0x10 /* handshake done; the first client packet with payload is awaited */
#define EDGE_CT_F_RESP_WAIT   0x20 /* wire_ns is the first request's time; the first reply payload is awaited */
#define EDGE_CT_F_WIRE_WAIT   0x38 /* HS_WAIT | REQ_WAIT | RESP_WAIT: a wire signal is pending */

/* Key of edge_rnat: a backend endpoint. Each endpoint serves one service
 * (config enforces it), so replies need no per-flow state. */
struct backend_key {
	__be32 addr; /* network byte order */
	__be16 port; /* network byte order */
	__u8 proto;
	__u8 pad;
};

/* Value of edge_rnat: what the return path rewrites the source back to. */
struct rnat_info {
	__be32 vip_addr; /* network byte order */
	__be16 vip_port; /* network byte order */
	__u16 pad;
	__u32 backend_id;
	__u32 vip_id;
};

/* Value of edge_vip_filter (one entry): bit hash_mix(address) % EDGE_VIP_FILTER_BITS
 * (flow.h; the address as stored, network order) is set for every VIP address,
 * so the fast path spares most traffic not for a VIP the conntrack lookup it
 * makes first. A clear bit only moves that lookup after the VIP's: no flow
 * depends on the filter. */
#define EDGE_VIP_FILTER_WORDS 16
#define EDGE_VIP_FILTER_BITS  1024 /* EDGE_VIP_FILTER_WORDS * 64 */
struct vip_filter {
	__u64 bits[EDGE_VIP_FILTER_WORDS];
};

/* Value of edge_nexthop (per CPU), indexed by backend id: a cached
 * bpf_fib_lookup result, so most packets skip the FIB. */
struct nexthop {
	__u64 expires; /* bpf_jiffies64() from which on it is looked up again */
	__u32 ifindex;
	__u8 smac[6];
	__u8 dmac[6];
	__be32 src; /* DSR (encap.h): the router's address towards the backend; 0 = not looked up */
	__u32 mtu;  /* DSR: of ifindex, which an encapsulated packet must fit */
};

/* Value of edge_reply_hop (per CPU), a direct-mapped cache indexed by a hash
 * of (client, VIP): the bpf_fib_lookup result of a reply to that client. */
#define EDGE_REPLY_HOP_SLOTS 4096 /* a power of two */
struct reply_hop {
	__u64 expires; /* bpf_jiffies64() from which on it is looked up again */
	__be32 client; /* the tag: which client and VIP the slot holds */
	__be32 vip;
	__u32 ifindex;
	__u8 smac[6];
	__u8 dmac[6];
	__u32 mtu; /* of ifindex: a longer non-GSO reply is looked up again */
	__u32 pad;
};

/* Value of edge_ct_budget (per CPU, one entry): conntrack entries that TCP
 * packets other than SYNs created in the current one-second window. */
struct ct_budget {
	__u64 window_ns; /* bpf_ktime_get_coarse_ns() the window started */
	__u32 used;
	__u32 pad;
};

/* Key of edge_direct: a TCP connection to a backend's own address that did
 * not come through a VIP, learnt from its SYN (to the backend's address, seen
 * by the ingress or the return path): the return path leaves its replies
 * alone. Value: __u32, unused (1). */
#define EDGE_DIRECT_SLOTS 16384 /* LRU entries */
struct direct_key {
	__be32 backend;	     /* the backend's address, network byte order */
	__be32 client;	     /* the peer's address */
	__be16 backend_port; /* network byte order */
	__be16 client_port;
};

/* Value of edge_vip_stats and edge_be_stats (per CPU). */
struct traffic_stats {
	__u64 packets;	      /* forwarded client -> backend */
	__u64 bytes;	      /* L3 bytes of those packets */
	__u64 new_flows;      /* conntrack misses that picked this VIP/backend */
	__u64 return_packets; /* reverse-NATed backend -> client */
	__u64 failovers;      /* flows sent elsewhere because the pick was unusable */
	__u64 pad;
};

/* Value of edge_wire (per CPU), indexed by backend id: latency seen in real
 * traffic (wire.h). Histogram bucket i counts samples in [2^i, 2^(i+1))
 * microseconds; bucket 0 also takes [0, 1), the last everything above. */
#define EDGE_WIRE_BUCKETS 24
struct wire_stats {
	__u64 handshake[EDGE_WIRE_BUCKETS];  /* SYN forwarded -> its SYN-ACK seen */
	__u64 first_byte[EDGE_WIRE_BUCKETS]; /* first request payload -> first reply payload */
	__u64 handshake_ns;		     /* sum of the handshake samples */
	__u64 first_byte_ns;		     /* sum of the first-byte samples */
	__u64 opened;			     /* connections begun with a SYN (conntrack entry made or reused) */
	__u64 closed;			     /* of those, FIN or RST seen (either way); LRU evictions are not counted */
};

/* Value of edge_svc_meta, indexed by VIP id. User space only: names and
 * settings that status shows without a config file. */
struct service_meta {
	char name[EDGE_NAME_LEN];
	__u32 in_use; /* 1 while the id is allocated */
	__u32 pad;
};

/* Value of edge_be_meta, indexed by backend id. User space only. */
struct backend_meta {
	char name[EDGE_NAME_LEN];
	__u32 weight; /* weight of the active Maglev table; 0 = draining */
	__u32 slots;  /* Maglev slots owned in the active table */
};

/* Value of edge_be_probe, indexed by backend id. User space only: what edged
 * measured and decided, so that status reads it without edged and a
 * restarted edged adopts it instead of starting over. Strings NUL padded. */
#define EDGE_UNKNOWN	      0xffffffff /* a load signal not known */
#define EDGE_PROBE_F_DRAINED  0x1	 /* operator drain: weight 0 until undrained */
#define EDGE_PROBE_F_OVERRIDE 0x2	 /* operator weight override in override_weight */
#define EDGE_PROBE_F_LEAVING  0x4	 /* removed by a reload: draining out until leave_until_s */
struct backend_probe {
	__u64 updated_ns;    /* CLOCK_MONOTONIC of edged's last write; 0 = never */
	__u32 config_weight; /* weight in the config; backend_meta.weight is the table's */
	__u32 rtt_p50_us;    /* over the probe window; 0 = no sample */
	__u32 rtt_p99_us;
	__u32 rtt_smoothed_us; /* what the weight policy uses */
	__u32 waiting;	       /* requests queued on the engine, or EDGE_UNKNOWN */
	__u32 running;	       /* requests being served, or EDGE_UNKNOWN */
	__u32 kv_permille;     /* KV-cache use x 1000, or EDGE_UNKNOWN */
	__u32 probes_ok;       /* since edged adopted the backend */
	__u32 probes_failed;
	__u32 flags; /* EDGE_PROBE_F_* */
	__u32 override_weight;
	__u32 leave_until_s; /* CLOCK_MONOTONIC second its drain ends (EDGE_PROBE_F_LEAVING) */
	char state[16];	     /* up, down, hung, slow-start, ... */
	char reason[64];     /* why, in a few words */
};

/* Value of edge_node (one entry). Written by user space: what undeploy must undo
 * and the sizes the pinned maps were made with; edge_reply reads
 * ingress_ifindex (the one interface it redirects replies to) and rnat_gen. */
struct node_info {
	__u32 maglev_m;
	__u32 max_services;
	__u32 max_backends;
	__u32 ct_size;
	__u32 ingress_ifindex;
	__u32 xdp_flags;      /* XDP_FLAGS_* used to attach */
	__u32 ip_forward_was; /* net.ipv4.ip_forward before deploy, +1; 0 = unknown */
	__u32 n_return;	      /* entries used in return_ifindex */
	__u32 return_ifindex[EDGE_MAX_RETURN_IFACES];
	__u32 return_clsact_added; /* bit i: deploy created clsact on return_ifindex[i] */
	__u32 flags;		   /* EDGE_NODE_F_* (node settings the data path reads) */
	/* Raised (never lowered, never reused) after every change of edge_rnat:
	 * edge_reply's per-CPU copies of edge_rnat entries (edge_rnat_cache,
	 * maps.h) hold the value they were copied under and are used only
	 * while it is current. */
	__u64 rnat_gen;
};

/* IPv6 (ingress6.h, return6.h). Separate maps where a key or value holds an
 * address, so IPv4's entries stay as small as they were; VIP ids, backend ids,
 * the Maglev tables, health, stats and the other per-id arrays are shared.
 * An IPv6 backend's edge_backends entry has addr 0 and its address in
 * edge_backends6; an IPv6 service's service_cfg names its VIP key in
 * vip_addr6, vip_port and vip_proto (vip_addr 0). Addresses in network order. */
/* Key of edge_vips6 (value: struct vip_info). */
struct vip_key6 {
	struct addr6 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* Key of edge_ct6 (value: struct flow_info): a client's connection to an IPv6 VIP. */
struct flow_key6 {
	struct addr6 src;
	struct addr6 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* Key of edge_rnat6: an IPv6 backend endpoint. */
struct backend_key6 {
	struct addr6 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* Key of edge_direct6 (value: __u32, unused): edge_direct's key for an IPv6
 * backend endpoint, a TCP connection to the backend's own address that did
 * not come through a VIP (state6.h). EDGE_DIRECT6_SLOTS entries: a quarter
 * of edge_direct's, as edge_ct6 is of edge_ct. */
#define EDGE_DIRECT6_SLOTS 4096 /* LRU entries */
struct direct_key6 {
	struct addr6 backend; /* the backend's address */
	struct addr6 client;  /* the peer's address */
	__be16 backend_port;  /* network byte order */
	__be16 client_port;
};

/* Key of edge_hb6 (value: struct hb_target): edge_hb's key for an IPv6
 * backend (heartbeat6.h). */
struct hb_key6 {
	struct addr6 addr; /* the backend's registered address */
	__be16 port;	   /* the backend's service port (from the payload) */
	__be16 hb_port;	   /* UDP port of the router the heartbeat went to */
};

/* Value of edge_hop6 (per CPU, by backend id): the way to an IPv6 backend
 * of a DSR service (encap6.h), the outer header's source with it. */
struct nexthop6 {
	__u64 expires; /* bpf_jiffies64() from which on it is looked up again */
	__u32 ifindex; /* 0: not looked up */
	__u32 mtu;     /* of ifindex, which an encapsulated packet must fit */
	__u8 smac[6];
	__u8 dmac[6];
	__u32 pad;
	struct addr6 src; /* the router's address towards the backend */
};

/* Value of edge_rnat6: what the return path rewrites the source back to. */
struct rnat_info6 {
	struct addr6 vip_addr;
	__be16 vip_port;
	__u16 pad;
	__u32 backend_id;
	__u32 vip_id;
};

/* Value of edge_reply_hop6 (per CPU, EDGE_REPLY_HOP_SLOTS slots), IPv6's
 * edge_reply_hop: the bpf_fib_lookup result of a reply from a VIP to a
 * client, tagged with both whole addresses (hop6.h). */
struct reply_hop6 {
	__u64 expires; /* bpf_jiffies64() from which on it is looked up again */
	struct addr6 client;
	struct addr6 vip;
	__u32 ifindex;
	__u8 smac[6];
	__u8 dmac[6];
	__u32 mtu; /* of ifindex: a longer non-GSO reply is looked up again */
	__u32 pad;
};

/* node_info.flags */
#define EDGE_NODE_F_NO_ECHO 0x1 /* node.answer_ping off: echo requests to a VIP go to the stack */

/* Counters of edge_svc_counts: slot s (a VIP id, or the slot after the last,
 * max_services, for packets no service is known for) holds EDGE_SVC_COUNTERS
 * u64s from index s * EDGE_SVC_COUNTERS: the EDGE_CNT_* verdicts, then the
 * EDGE_DROP_* reasons from EDGE_CNT_MAX on (stats.h). */
#define EDGE_SVC_COUNTERS 32 /* EDGE_CNT_MAX + EDGE_DROP_MAX */

/* Verdict counters: EDGE_CNT_* of a slot of edge_svc_counts. */
#define EDGE_CNT_PASS		  0  /* not for a VIP: handed to the stack untouched */
#define EDGE_CNT_REDIRECT	  1  /* NATed and redirected to the backend's interface */
#define EDGE_CNT_NAT_PASS	  2  /* NATed, handed to the stack (neighbour unresolved, VLAN) */
#define EDGE_CNT_DROP		  3  /* dropped; the slot's EDGE_DROP_* counter says why */
#define EDGE_CNT_RETURN_NAT	  4  /* return path: reverse NAT applied by tc; readers add RETURN_XDP (every reverse-NATed reply) */
#define EDGE_CNT_HEARTBEAT	  5  /* valid heartbeat consumed */
#define EDGE_CNT_EJECTION	  6  /* passive detection ejected a backend */
#define EDGE_CNT_RETURN_REDIRECT  7  /* return path: reverse NATed and redirected by tc */
#define EDGE_CNT_STATELESS	  8  /* TCP, no SYN, no entry, budget spent: forwarded by its Maglev pick, no entry made */
#define EDGE_CNT_RETURN_STATELESS 9  /* return path: no entry, reverse NATed because the Maglev slot names the sender */
#define EDGE_CNT_RETURN_XDP	  10 /* return path: reverse NATed and redirected by XDP (edge_reply; its only count) */
#define EDGE_CNT_ICMP_TO_BACKEND  11 /* ICMP error about a VIP flow, translated to its backend (icmp.h; also counted redirect or nat_pass) */
#define EDGE_CNT_ICMP_RETURN	  12 /* return path: a backend's ICMP error about a client packet, translated back to the VIP (icmp.h) */
#define EDGE_CNT_DSR		  13 /* encapsulated in IPIP and redirected to its backend (direct server return, encap.h) */
#define EDGE_CNT_ICMP_ECHO	  14 /* ICMP echo request to a VIP address, answered from the VIP, redirected back out (icmp.h) */
#define EDGE_CNT_MAX		  15

/* Drop reasons: EDGE_CNT_MAX + EDGE_DROP_* of a slot of edge_svc_counts.
 * Never reuse a number; retire it. */
#define EDGE_DROP_MALFORMED	 1  /* truncated or inconsistent headers */
#define EDGE_DROP_NO_BACKEND	 2  /* the VIP has no usable backend */
#define EDGE_DROP_IP_OPTIONS	 3  /* IPv4 options on VIP traffic (not handled) */
#define EDGE_DROP_FRAGMENT	 4  /* IPv4 fragment for a VIP (not handled) */
#define EDGE_DROP_SPOOFED_HB	 5  /* heartbeat from the wrong address, port, interface or token */
#define EDGE_DROP_BAD_CSUM	 6  /* VIP packet with a wrong IPv4 header checksum, or SYN with a wrong TCP checksum */
#define EDGE_DROP_UNTRACKED	 7  /* TCP, no SYN, no conntrack entry, and this CPU's budget of new entries spent */
#define EDGE_DROP_REPLAYED_HB	 8  /* valid heartbeat of an older epoch, or without a higher seq in the same one */
#define EDGE_DROP_STALE_HB	 9  /* heartbeat with a valid MAC whose epoch is outside EDGE_HB_WINDOW_S of the router's clock */
#define EDGE_DROP_OTHER_BACKEND	 10 /* TCP from a backend whose connection conntrack gives to another, not known direct: it would leave with the backend's address */
#define EDGE_DROP_ICMP_MALFORMED 11 /* ICMP error to a VIP address cut short, or its quoted header not a VIP flow's (icmp.h) */
#define EDGE_DROP_ICMP_NESTED	 12 /* ICMP error to a VIP address quoting an ICMP packet */
#define EDGE_DROP_ICMP_NO_FLOW	 13 /* ICMP error quoting a VIP flow neither conntrack nor the Maglev table knows */
#define EDGE_DROP_DSR_TOO_BIG	 14 /* DSR: the packet with its IPIP header exceeds the backend link's MTU */
#define EDGE_DROP_V6_FRAGMENT	 15 /* IPv6 fragment header on VIP traffic (not handled) */
#define EDGE_DROP_V6_EXT_HEADER	 16 /* IPv6 VIP traffic whose next header is none of TCP, UDP, ICMPv6 after EDGE_V6_EXT_MAX extension headers, or with a routing header whose segments are left */
#define EDGE_DROP_MAX		 17

_Static_assert(EDGE_SVC_COUNTERS == EDGE_CNT_MAX + EDGE_DROP_MAX, "abi: svc_counters");
_Static_assert(sizeof(struct vip_key) == 8, "abi: vip_key");
_Static_assert(sizeof(struct vip_info) == 16, "abi: vip_info");
_Static_assert(sizeof(struct backend_info) == 16, "abi: backend_info");
_Static_assert(sizeof(struct flow_key) == 16, "abi: flow_key");
_Static_assert(sizeof(struct flow_info) == 24, "abi: flow_info");
_Static_assert(sizeof(struct wire_stats) == 416, "abi: wire_stats");
_Static_assert(sizeof(struct rnat_info) == 16, "abi: rnat_info");
_Static_assert(sizeof(struct backend_key) == 8, "abi: backend_key");
_Static_assert(sizeof(struct nexthop) == 32, "abi: nexthop");
_Static_assert(sizeof(struct vip_filter) * 8 == EDGE_VIP_FILTER_BITS, "abi: vip_filter");
_Static_assert(sizeof(struct reply_hop) == 40, "abi: reply_hop");
_Static_assert(sizeof(struct traffic_stats) == 48, "abi: traffic_stats");
_Static_assert(sizeof(struct ct_budget) == 16, "abi: ct_budget");
_Static_assert(sizeof(struct direct_key) == 12, "abi: direct_key");
_Static_assert(sizeof(struct service_cfg) == 4168, "abi: service_cfg");
_Static_assert(sizeof(struct maglev_slots) == 8, "abi: maglev_slots");
_Static_assert(sizeof(struct backend_health) == 64, "abi: backend_health");
_Static_assert(sizeof(struct hb_key) == 8, "abi: hb_key");
_Static_assert(sizeof(struct hb_target) == 32, "abi: hb_target");
_Static_assert(sizeof(struct half_open) == 32, "abi: half_open");
_Static_assert(sizeof(struct heartbeat) == EDGE_HEARTBEAT_SIZE, "abi: heartbeat");
_Static_assert(sizeof(struct service_meta) == 40, "abi: service_meta");
_Static_assert(sizeof(struct backend_meta) == 40, "abi: backend_meta");
_Static_assert(sizeof(struct node_info) == 112, "abi: node_info");
_Static_assert(sizeof(struct backend_probe) == 136, "abi: backend_probe");
_Static_assert(sizeof(struct vip_key6) == 20, "abi: vip_key6");
_Static_assert(sizeof(struct flow_key6) == 40, "abi: flow_key6");
_Static_assert(sizeof(struct backend_key6) == 20, "abi: backend_key6");
_Static_assert(sizeof(struct rnat_info6) == 28, "abi: rnat_info6");
_Static_assert(sizeof(struct reply_hop6) == 64, "abi: reply_hop6");
_Static_assert(sizeof(struct hb_key6) == 20, "abi: hb_key6");
_Static_assert(sizeof(struct nexthop6) == 48, "abi: nexthop6");
_Static_assert(sizeof(struct direct_key6) == 36, "abi: direct_key6");

#endif /* EDGE_ABI_H */
