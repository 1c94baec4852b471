/* SPDX-License-Identifier: Apache-2.0 */
/* flow.h: the packet summary the stages pass along, the flow hash, and the
 * conntrack / reverse-NAT entries of a connection. */
#ifndef EDGE_FLOW_H
#define EDGE_FLOW_H

#include "maps.h"
#include "wire.h"

#define EDGE_HASH_SEED	0x9e3779b9

/* What parsing learned about a VIP-bound packet. */
struct pkt {
	struct flow_key flow;	/* client 5-tuple, as received */
	struct iphdr *iph;
	__u32 l3_len;		/* IPv4 total length, for byte counters */
	int vlans;		/* 802.1Q tags in front of IPv4 */
	int syn;		/* TCP SYN without ACK, RST or FIN: a connection attempt */
	int syn_counted;	/* that SYN counts for passive detection (checksum checked) */
	__be32 seq;		/* TCP sequence number */
	__u32 tcp_hlen;		/* TCP header length in bytes */
	int end;		/* TCP FIN or RST */
	struct flow_info *ct;	/* the conntrack entry select_backend found (wire.h), else NULL */
};

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

/* Index into edge_maglev of the first slot of vip's active table (maps.h:
 * [(vip id * 2 + half) * M + slot]). The caller checks vip->id is below
 * EDGE_MAX_SERVICES. */
static __always_inline __u32 maglev_base(const struct vip_info *vip)
{
	return ((vip->id << 1) | (vip->table & 1)) * EDGE_MAGLEV_M;
}

/* Index into edge_maglev of slot hash % M of the table starting at base
 * (maglev_base). verifier: the base is a value, so a walk over several
 * slots reads the VIP's map value once (reading it per slot in the slow
 * path's walk cost ~12.6k instructions processed). */
static __always_inline __u32 maglev_index(__u32 base, __u32 hash)
{
	return base + hash % EDGE_MAGLEV_M;
}

#ifndef EDGE_CT_MISS_PER_S
#define EDGE_CT_MISS_PER_S	64	/* entries per CPU and second TCP packets other than SYNs may create */
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

/* Pins a new connection to a backend. The reply direction needs no entry:
 * edge_rnat is keyed by the backend endpoint. */
static __always_inline void flow_insert(const struct pkt *pkt,
					const struct vip_info *vip,
					__u32 backend_id)
{
	struct flow_info fi = {
		.backend_id = backend_id,
		.vip_id = vip->id,
		.syn_seq = pkt->seq,
	};

	fi.flags = syn_flags(pkt) | wire_open(pkt->syn, backend_id, &fi.wire_ns);
	edge_ct.update((struct flow_key *)&pkt->flow, &fi);
}

/* A SYN for an existing entry (the client reuses its port, or retransmits):
 * its answer will be ours. */
static __always_inline void flow_mark_syn(const struct pkt *pkt)
{
	struct flow_info *fi = edge_ct.lookup((struct flow_key *)&pkt->flow);

	if (!fi)
		return;
	fi->syn_seq = pkt->seq;
	fi->flags = (fi->flags & ~EDGE_CT_F_SYN_PENDING) | syn_flags(pkt);
}

#endif /* EDGE_FLOW_H */
