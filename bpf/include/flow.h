/* SPDX-License-Identifier: Apache-2.0 */
/* flow.h: the packet summary the stages pass along, the flow hash, and the
 * conntrack entries of a connection: a TCP connection begun with a SYN
 * through the VIP is half-open (edge_half_open) until its client's ACK
 * acknowledges the backend's SYN-ACK, and only then takes a place in
 * edge_ct, so a flood of SYNs cannot evict established connections. */
#ifndef EDGE_FLOW_H
#define EDGE_FLOW_H

#include "maps.h"
#include "parse.h"
#include "wire.h"

#define EDGE_HASH_SEED 0x9e3779b9

/* What parsing learned about a VIP-bound packet. */
struct pkt {
	struct flow_key flow; /* client 5-tuple, as received */
	struct iphdr *iph;
	__u32 l3_len;	      /* IPv4 total length, for byte counters */
	int vlans;	      /* 802.1Q tags in front of IPv4 */
	int syn;	      /* TCP SYN without ACK, RST or FIN: a connection attempt */
	int syn_counted;      /* that SYN counts for passive detection (checksum checked) */
	__be32 seq;	      /* TCP sequence number */
	__be32 ack_seq;	      /* TCP acknowledgment number */
	__u32 tcp_hlen;	      /* TCP header length in bytes */
	int end;	      /* TCP FIN or RST */
	struct flow_info *ct; /* the conntrack entry select_backend found (wire.h), else NULL */
};

/* The TCP (proto IPPROTO_TCP) or UDP header at the cursor, l4_len bytes of
 * IP payload: pkt's ports and protocol, and for TCP its SYN, sequence
 * numbers, FIN/RST and header length. 0, or -1 when the header is cut
 * short. Shared by IPv4 (edge_xdp.c, parse_packet) and IPv6 (ingress6.h,
 * parse6); addresses are the caller's. */
static __always_inline int parse_l4(struct hdr_cursor *nh, void *data_end, __u32 l4_len, int proto,
				    struct pkt *pkt)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th;

		if (parse_tcp(nh, data_end, l4_len, &th) < 0)
			return -1;
		/* verifier: constants, so later branches on proto are tracked */
		pkt->flow.proto = IPPROTO_TCP;
		pkt->flow.sport = th->source;
		pkt->flow.dport = th->dest;
		pkt->syn = th->syn && !(th->ack | th->rst | th->fin);
		pkt->seq = th->seq;
		pkt->ack_seq = th->ack_seq;
		pkt->end = th->fin | th->rst;
		pkt->tcp_hlen = th->doff * 4;
	} else {
		struct udphdr *uh;

		if (parse_udp(nh, data_end, l4_len, &uh) < 0)
			return -1;
		pkt->flow.proto = IPPROTO_UDP;
		pkt->flow.sport = uh->source;
		pkt->flow.dport = uh->dest;
	}
	return 0;
}

/* 32-bit finaliser of MurmurHash3 (public domain): full avalanche. */
static __always_inline __u32 hash_mix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* Hash of the 5-tuple; user space never needs to reproduce it. */
static __always_inline __u32 hash_flow(const struct flow_key *k)
{
	__u32 h = EDGE_HASH_SEED;

	h = hash_mix(h ^ k->src);
	h = hash_mix(h ^ k->dst);
	h = hash_mix(h ^ (((__u32)k->sport << 16) | k->dport));
	return hash_mix(h ^ k->proto);
}

/* Slot index (maglev_slot) of the first slot of vip's active table (maps.h:
 * [(vip id * 2 + half) * M + slot]). The caller checks vip->id is below
 * EDGE_MAX_SERVICES. */
static __always_inline __u32 maglev_base(const struct vip_info *vip)
{
	return ((vip->id << 1) | (vip->table & 1)) * EDGE_MAGLEV_M;
}

/* Slot index (maglev_slot) of slot hash % M of the table starting at base
 * (maglev_base). verifier: the base is a value, so a walk over several
 * slots reads the VIP's map value once (reading it per slot in the slow
 * path's walk cost ~12.6k instructions processed). */
static __always_inline __u32 maglev_index(__u32 base, __u32 hash)
{
	return base + hash % EDGE_MAGLEV_M;
}

/* The backend id in slot idx of the flat Maglev table [(vip id * 2 + half)
 * * M + slot] (maps.h), or NULL past its end: two slots share a value. */
static __always_inline __u32 *maglev_slot(__u32 idx)
{
	__u32 key = idx / EDGE_MAGLEV_PER_VALUE;
	struct maglev_slots *v = edge_maglev.lookup(&key);

	return v ? &v->id[idx % EDGE_MAGLEV_PER_VALUE] : NULL;
}

#ifndef EDGE_CT_MISS_PER_S
#define EDGE_CT_MISS_PER_S 64 /* entries per CPU and second TCP packets other than SYNs may create */
#endif

/* 1 when a TCP packet that is no SYN may create a conntrack entry: this
 * CPU has not used up its budget for the current second. A flood of such
 * packets (spoofed ACKs) thus cannot push real connections out of the LRU;
 * the budget lets connections whose entry was lost get one back. */
static __always_inline int ct_budget_take(void)
{
	__u32 zero = 0;
	struct ct_budget *b = edge_ct_budget.lookup(&zero);
	__u64 now = bpf_ktime_get_coarse_ns();

	if (!b)
		return 0;
	if (b->window_ns + 1000000000ULL < now) {
		b->window_ns = now;
		b->used = 0;
	}
	if (b->used >= EDGE_CT_MISS_PER_S)
		return 0;
	b->used++;
	return 1;
}

/* flow_info.flags for a packet through the VIP: a SYN's answer is ours,
 * and passive detection waits for it when the SYN counts. */
static __always_inline __u32 syn_flags(const struct pkt *pkt)
{
	if (!pkt->syn)
		return 0;
	return EDGE_CT_F_SYN | (pkt->syn_counted ? EDGE_CT_F_SYN_PENDING : 0);
}

/* Pins a new connection to a backend: a SYN's in edge_half_open, anything
 * else (UDP, a TCP packet within the budget) in edge_ct. The reply direction
 * needs no entry: edge_rnat is keyed by the backend endpoint. dsr: the
 * service's replies bypass the router (encap.h), so no SYN-ACK would ever
 * promote a half-open entry: a SYN goes to edge_ct at once. flow6: an IPv6
 * flow's key (ingress6.h), whose entry goes into edge_half_open6 or
 * edge_ct6 alike (state6.h), with wire signals as IPv4's (wire6.h); NULL
 * (a constant) for IPv4. now: the caller's clock. IPv6's callers read it
 * with bpf_ktime_get_ns for every SYN (ingress6.h), so its handshake is
 * timed from it and the packet reads the clock once (bpf_ktime_get_ns was
 * ~4 % of an IPv6 new flow's samples, tools/bench-datapath (b6)); IPv4's
 * fast path caches its clock per jiffy (health_now): IPv4 reads its own. */
static __always_inline void flow_insert(const struct pkt *pkt,
					const struct vip_info *vip,
					__u32 backend_id, int dsr,
					const struct flow_key6 *flow6, __u64 now)
{
	struct half_open ho = {
		.ct = {
			.backend_id = backend_id,
			.vip_id = vip->id,
			.syn_seq = pkt->seq,
		},
	};

	ho.ct.flags = syn_flags(pkt) | wire_open(pkt->syn, backend_id, &ho.ct.wire_ns, now, flow6 != NULL);
	if (flow6) {
		if (pkt->syn && !dsr)
			edge_half_open6.update((struct flow_key6 *)flow6, &ho);
		else
			edge_ct6.update((struct flow_key6 *)flow6, &ho.ct);
		return;
	}
	if (pkt->syn && !dsr)
		edge_half_open.update((struct flow_key *)&pkt->flow, &ho);
	else
		edge_ct.update((struct flow_key *)&pkt->flow, &ho.ct);
}

/* The half-open connection of this TCP packet (no SYN) moves into edge_ct
 * when the packet acknowledges the backend's SYN-ACK, which only the client
 * that got it can: returns its edge_ct entry, or NULL. */
static __always_inline struct flow_info *flow_promote(const struct pkt *pkt)
{
	struct flow_key *key = (struct flow_key *)&pkt->flow;
	struct half_open *ho = edge_half_open.lookup(key);

	if (!ho || !(ho->flags & EDGE_HO_F_ANSWERED) || ho->ack_seq != pkt->ack_seq)
		return NULL;
	edge_ct.update(key, &ho->ct);
	edge_half_open.delete(key);
	return edge_ct.lookup(key);
}

/* The conntrack entry of this packet: edge_ct's; for a TCP SYN without one
 * its half-open entry; for other TCP packets without one the half-open entry
 * they complete (flow_promote). NULL: none. ct_only (the ingress's later
 * stages): edge_ct's alone. The fast path promoted what a packet completes
 * before it handed the packet on; a SYN whose half-open entry the fast path
 * could not keep gets a new one (flow_insert replaces it).
 * verifier: an entry of either map in the later stages made edge_ingress_scan
 * 970,018 instructions (from 554,686): map values of two maps are states
 * the verifier cannot prune against each other. */
static __always_inline struct flow_info *flow_lookup(const struct pkt *pkt, int ct_only)
{
	struct flow_key *key = (struct flow_key *)&pkt->flow;
	struct flow_info *fi = edge_ct.lookup(key);
	struct half_open *ho;

	if (fi || ct_only || pkt->flow.proto != IPPROTO_TCP)
		return fi;
	if (!pkt->syn)
		return flow_promote(pkt);
	ho = edge_half_open.lookup(key);
	return ho ? &ho->ct : NULL;
}

/* A SYN for an existing entry (the client reuses its port, or retransmits):
 * its answer will be ours. ct_only: as flow_lookup's. Looked up again, not
 * passed along, so no entry pointer stays live to the end of the program. */
static __always_inline void flow_mark_syn(const struct pkt *pkt, int ct_only)
{
	struct flow_key *key = (struct flow_key *)&pkt->flow;
	struct flow_info *fi = edge_ct.lookup(key);
	struct half_open *ho;

	if (!fi && !ct_only) {
		ho = edge_half_open.lookup(key);
		fi = ho ? &ho->ct : NULL;
	}
	if (!fi)
		return;
	fi->syn_seq = pkt->seq;
	ct_flags_clear(fi, EDGE_CT_F_SYN_PENDING); /* wire.h: the return path changes flags too */
	ct_flags_set(fi, syn_flags(pkt));
}

#endif /* EDGE_FLOW_H */
