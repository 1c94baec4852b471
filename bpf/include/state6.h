/* SPDX-License-Identifier: Apache-2.0 */
/* state6.h: the connection-state protections of IPv6 flows, IPv4's
 * (flow.h, stateless.h) for edge_ct6. A TCP SYN through an IPv6 VIP waits
 * in edge_half_open6 (flow.h, flow_insert, puts it there) until the
 * client's ACK acknowledges the backend's SYN-ACK, which only the client
 * that got it can; only then does it take a place in edge_ct6, so a flood
 * of spoofed SYNs evicts only other half-open flows. Over the budget of
 * entries for TCP packets that are no SYN (flow.h, ct_budget_take), such a
 * packet goes to its first Maglev pick without an entry, and a backend's
 * reply without an entry is reverse-NATed when the Maglev slot of its
 * (client, VIP) names the sender: a connection ECMP moves here from
 * another router keeps going. Direct connections to a backend's own IPv6
 * address are known by their SYN (edge_direct6) and left alone. Nothing
 * here makes an edge_ct6 entry for a reply. Called by a few lines of
 * ingress6.h (edge_ingress6) and return6.h (edge_tc.c); the counters and
 * drop reasons are IPv4's. Kernel side only. */
#ifndef EDGE_STATE6_H
#define EDGE_STATE6_H

#include "maps.h"
#include "flow.h"
#include "health.h"
#include "stats.h"
#include "stateless.h"
#include "select.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif
/* The compiler forgets what it knows of x's value (as libbpf's
 * barrier_var), so a mask the verifier needs stays in the code. */
/* clang-format off */
#define EDGE_OPAQUE(x) asm volatile("" : "+r"(x))
/* clang-format on */

/* hash_flow (flow.h) of an IPv6 flow: of its 5-tuple with both addresses
 * folded to 32 bits, as ingress6.h's parse6 fills pkt.flow, so the ingress
 * and the return path find the same Maglev slot. */
static __always_inline __u32 hash_flow6(const struct flow_key6 *k)
{
	struct flow_key f = {
		.src = k->src.w[0] ^ k->src.w[1] ^ k->src.w[2] ^ k->src.w[3],
		.dst = k->dst.w[0] ^ k->dst.w[1] ^ k->dst.w[2] ^ k->dst.w[3],
		.sport = k->sport,
		.dport = k->dport,
		.proto = k->proto,
	};

	return hash_flow(&f);
}

/* The edge_ct6 entry a TCP packet (no SYN) of the client's key, which has
 * none, makes when it acknowledges the backend's SYN-ACK of its half-open
 * connection (the entry moves over), else NULL. A SYN sent again on a
 * half-open connection is not looked up: it takes its Maglev pick anew and
 * replaces the entry (flow_insert), where IPv4's keeps the entry's backend
 * (flow.h, flow_lookup). verifier: an entry of either map after this point
 * took edge_ingress6 from 53 % to 81 % of the budget (map values of two
 * maps are states the verifier cannot prune against each other). */
static __always_inline struct flow_info *half_open6(const struct pkt *pkt, struct flow_key6 *key)
{
	struct half_open *ho = edge_half_open6.lookup(key);

	if (!ho || !(ho->flags & EDGE_HO_F_ANSWERED) || ho->ack_seq != pkt->ack_seq)
		return NULL;
	edge_ct6.update(key, &ho->ct);
	edge_half_open6.delete(key);
	return edge_ct6.lookup(key);
}

/* Over the budget: the backend of a TCP packet (no SYN) without an entry,
 * its first Maglev pick when that is usable for new flows without the walk
 * (as IPv4's fast path judges it), counted EDGE_CNT_STATELESS; no entry is
 * made. As IPv4's fast path (select.h, pick_new): a two_choices service's
 * pick is the lesser loaded of it and its second candidate, a DSR service's
 * goes out encapsulated (the caller), and a least_loaded service's flows
 * take no stateless path (its loop is the slow path's). NULL with *drop
 * EDGE_DROP_UNTRACKED otherwise. */
static __always_inline struct backend_info *stateless6(const struct vip_info *vip, const struct service_cfg *sc,
						       const struct flow_key6 *key, __u64 now, __u32 *bid,
						       int *new_flow, int *failover, __u32 *drop)
{
	struct backend_info *be;
	__u32 *id, hash;

	*new_flow = 0;
	*failover = 0;
	*drop = EDGE_DROP_UNTRACKED;
	if (vip->id >= EDGE_MAX_SERVICES || (sc->flags & EDGE_SVC_F_LEAST_LOADED))
		return NULL;
	hash = hash_flow6(key);
	id = maglev_slot(maglev_index(maglev_base(vip), hash));
	if (!id || *id == EDGE_NO_BACKEND)
		return NULL;
	*bid = *id;
	be = edge_backends.lookup(bid);
	if (!be || (be->flags & EDGE_BE_F_DRAINING) || !backend_health_ok(be, sc, now, 1, HEALTH_TRIAL) ||
	    !passive_quiet(be, sc, now))
		return NULL;
	if (sc->flags & EDGE_SVC_F_TWO_CHOICES) {
		*bid = two_choices(hash, *bid, sc, now);
		be = edge_backends.lookup(bid);
		if (!be)
			return NULL;
	}
	count_index(vip->id, EDGE_CNT_STATELESS);
	return be;
}

/* The key of edge_direct6 for client fk (client -> VIP) and backend
 * endpoint bk. */
static __always_inline struct direct_key6 direct_key6_of(const struct flow_key6 *fk, const struct backend_key6 *bk)
{
	struct direct_key6 dk = {
		.backend = bk->addr,
		.client = fk->src,
		.backend_port = bk->port,
		.client_port = fk->sport,
	};

	return dk;
}

static __always_inline void note_direct6(const struct flow_key6 *fk, const struct backend_key6 *bk)
{
	struct direct_key6 dk = direct_key6_of(fk, bk);
	__u32 one = 1;

	edge_direct6.update(&dk, &one);
}

static __always_inline int is_direct6(const struct flow_key6 *fk, const struct backend_key6 *bk)
{
	struct direct_key6 dk = direct_key6_of(fk, bk);

	return edge_direct6.lookup(&dk) != NULL;
}

/* A TCP SYN (as it travels: client -> destination) not for a VIP: when it
 * opens a connection to an IPv6 backend endpoint, that connection is direct
 * and its replies keep the backend's address (stateless.h's direct_syn). */
static __always_inline void direct_syn6(const struct flow_key6 *syn)
{
	struct backend_key6 bk = {
		.addr = syn->dst,
		.port = syn->dport,
		.proto = IPPROTO_TCP,
	};

	if (syn->proto == IPPROTO_TCP && edge_rnat6.lookup(&bk))
		note_direct6(syn, &bk);
}

/* direct_syn6 for a TCP segment of the ingress whose header is at l4_off
 * when it is a SYN (without ACK, RST or FIN). verifier: reading the flags
 * here, not the parsed pkt.syn, costs edge_ingress6 40k instructions less. */
static __always_inline void direct_syn6_xdp(struct xdp_md *ctx, __u32 l4_off, const struct flow_key6 *key)
{
	void *data = (void *)(long)ctx->data;
	__u8 *flags = data + (l4_off & 0x3ff) + 13;

	if ((void *)(flags + 1) > (void *)(long)ctx->data_end)
		return;
	if ((*flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_ | TCP_FLAG_RST_ | TCP_FLAG_FIN_)) == TCP_FLAG_SYN_)
		direct_syn6(key);
}

/* 1 when the router itself is the destination of a reply from saddr to
 * daddr: its own connection to the backend (edged's probes), whose SYN no
 * program of ours sees (stateless.h's to_router). */
static __always_inline int to_router6(struct __sk_buff *skb, const struct addr6 *saddr, const struct addr6 *daddr)
{
	struct bpf_fib_lookup fib = {};

	fib.family = AF_INET6;
	fib.l4_protocol = IPPROTO_TCP;
	__builtin_memcpy(fib.ipv6_src, saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, daddr, 16);
	fib.ifindex = skb->ingress_ifindex;
	return bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_NOT_FWDED;
}

/* The return path's entry of a reply of client fk: edge_ct6's; for a
 * SYN-ACK or RST without one, the half-open connection's (*ho set). */
static __always_inline struct flow_info *reply_entry6(struct flow_key6 *fk, __u8 tcp_flags, struct half_open **ho)
{
	struct flow_info *fi = edge_ct6.lookup(fk);

	*ho = NULL;
	if (fi || !(tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_RST_)))
		return fi;
	*ho = edge_half_open6.lookup(fk);
	return *ho ? &(*ho)->ct : NULL;
}

/* The backend's SYN-ACK of half-open connection ho (its own: the caller
 * checked): the client's ACK must acknowledge its sequence number + 1. */
static __always_inline void half_open6_answered(struct __sk_buff *skb, struct half_open *ho, __u32 l4_off,
						__u8 tcp_flags)
{
	__be32 seq;

	if (!(tcp_flags & TCP_FLAG_SYN_) || bpf_skb_load_bytes(skb, l4_off + 4, &seq, sizeof(seq)) < 0)
		return;
	ho->ack_seq = bpf_htonl(bpf_ntohl(seq) + 1);
	ho->flags |= EDGE_HO_F_ANSWERED;
}

/* A SYN-ACK from the backend of entry fi (ho: a half-open one) that does
 * not acknowledge the VIP's SYN (plus any data it carried) answers a SYN
 * that did not come through the VIP: when that SYN was seen (a direct
 * connection on the VIP flow's client port), the stale entry goes and 1
 * leaves the reply untouched; else 0, and it is NATed like the connection's,
 * so it never leaves with the backend's address (edge_tc.c's
 * classify_answer for IPv4). */
static __always_inline int direct_answer6(struct __sk_buff *skb, const struct flow_info *fi, struct flow_key6 *fk,
					  const struct backend_key6 *bk, const struct half_open *ho, __u8 tcp_flags,
					  __u32 l4_off)
{
	__be32 ack;

	if ((tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) != (TCP_FLAG_SYN_ | TCP_FLAG_ACK_) ||
	    bpf_skb_load_bytes(skb, l4_off + 8, &ack, sizeof(ack)) < 0)
		return 0;
	if ((fi->flags & EDGE_CT_F_SYN) && bpf_ntohl(ack) - bpf_ntohl(fi->syn_seq) - 1 <= 0xffff)
		return 0;
	if (!is_direct6(fk, bk))
		return 0;
	if (ho)
		edge_half_open6.delete(fk);
	else
		edge_ct6.delete(fk);
	return 1;
}

/* 1 when the reply from backend endpoint bk (ri: its edge_rnat6 entry) to
 * the client of fk (client -> VIP), with no entry, is to be reverse-NATed:
 * TCP, no direct connection, not to the router itself (a SYN-ACK there is
 * remembered as direct), and the VIP's active Maglev table gives the
 * tuple's slot to this backend. As stateless.h's stateless_reply. */
static __always_inline int stateless_reply6(struct __sk_buff *skb, const struct flow_key6 *fk,
					    const struct backend_key6 *bk, const struct rnat_info6 *ri, __u8 tcp_flags)
{
	struct vip_key6 vk = {
		.addr = ri->vip_addr,
		.port = ri->vip_port,
		.proto = IPPROTO_TCP,
	};
	struct vip_info *vip;
	__u32 *id;

	if (fk->proto != IPPROTO_TCP || is_direct6(fk, bk))
		return 0;
	if ((tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == (TCP_FLAG_SYN_ | TCP_FLAG_ACK_) &&
	    to_router6(skb, &bk->addr, &fk->src)) {
		note_direct6(fk, bk);
		return 0;
	}
	vip = edge_vips6.lookup(&vk);
	if (!vip || vip->id != ri->vip_id || vip->id >= EDGE_MAX_SERVICES)
		return 0;
	id = maglev_slot(maglev_index(maglev_base(vip), hash_flow6(fk)));
	if (!id || *id != ri->backend_id)
		return 0;
	count_index(ri->vip_id, EDGE_CNT_RETURN_STATELESS);
	return 1;
}

#endif /* EDGE_STATE6_H */
