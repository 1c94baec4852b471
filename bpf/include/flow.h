/* SPDX-License-Identifier: Apache-2.0 */
/* flow.h: the packet summary the stages pass along, the flow hash, and the
 * conntrack / reverse-NAT entries of a connection. */
#ifndef EDGE_FLOW_H
#define EDGE_FLOW_H

#include "maps.h"

#define EDGE_HASH_SEED	0x9e3779b9

/* What parsing learned about a VIP-bound packet. */
struct pkt {
	struct flow_key flow;	/* client 5-tuple, as received */
	struct iphdr *iph;
	__u32 l3_len;		/* IPv4 total length, for byte counters */
	int vlans;		/* 802.1Q tags in front of IPv4 */
	int syn;		/* TCP SYN without ACK: a connection attempt */
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

/* Pins a new connection to a backend. The reply direction needs no entry:
 * edge_rnat is keyed by the backend endpoint. */
static __always_inline void flow_insert(const struct pkt *pkt,
					const struct vip_info *vip,
					__u32 backend_id)
{
	struct flow_info fi = {
		.backend_id = backend_id,
		.vip_id = vip->id,
		.flags = pkt->syn ? EDGE_CT_F_SYN : 0,
	};

	edge_ct.update((struct flow_key *)&pkt->flow, &fi);
}

/* A SYN for an existing entry (the client reuses its port): its SYN-ACK
 * will be ours. */
static __always_inline void flow_mark_syn(const struct pkt *pkt)
{
	struct flow_info *fi = edge_ct.lookup((struct flow_key *)&pkt->flow);

	if (fi)
		fi->flags |= EDGE_CT_F_SYN;
}

#endif /* EDGE_FLOW_H */
