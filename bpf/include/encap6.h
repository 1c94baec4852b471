/* SPDX-License-Identifier: Apache-2.0 */
/* encap6.h: direct server return for IPv6 services (forwarding: dsr), as
 * encap.h does for IPv4: the packet keeps the VIP as its destination and
 * gets an outer IPv6 header (IPv6-in-IPv6, next header 41) from the router's
 * address towards the backend to the backend, which decapsulates it (the
 * kernel's ip6tnl0, or bpf/dsr_decap.c as XDP), has the VIP on lo and
 * answers the client directly from the VIP (tools/dsr-backend).
 *
 * The outer header carries the inner one's traffic class and flow label
 * (a per-flow hash on Linux clients: ECMP on the way keeps a flow on one
 * path), hop limit 64; the inner hop limit drops by one. The way out is a
 * per-CPU cache per backend (edge_hop6: egress interface, MACs, MTU and the
 * source address a FIB lookup with BPF_FIB_LOOKUP_SRC derived). Until the
 * router has a neighbour entry for the hop, the encapsulated packet goes to
 * its stack, with the client's address as outer source (the router's own
 * would be refused as a packet from itself). The encapsulated packet is 40
 * bytes longer; one that no longer fits the backend link is dropped and
 * counted (dsr_too_big): backends advertise an MSS 40 bytes lower
 * (tools/dsr-backend sets advmss = MTU - 100 on the IPv6 default route), or
 * the backend links carry 40 bytes more. */
#ifndef EDGE_ENCAP6_H
#define EDGE_ENCAP6_H

#include <uapi/linux/ipv6.h>
#include "maps.h"
#include "nat.h"
#include "stats.h"

#ifndef BPF_FIB_LOOKUP_SRC
#define BPF_FIB_LOOKUP_SRC (1U << 4) /* uapi/linux/bpf.h, kernel 6.7 */
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

#define ENCAP6_HLIM	  64
#define ENCAP6_L3_MAX_OFF 22 /* the IPv6 header's offset with two VLAN tags: at most this */

/* The way to backend bid (address to) for an encapsulated packet: the cache,
 * or a FIB lookup that refills it. Returns the lookup's BPF_FIB_LKUP_RET_*:
 * SUCCESS with *out set; NO_NEIGH while the router has no neighbour entry
 * for the next hop yet; anything else: no way there. */
static __always_inline int encap6_hop(struct xdp_md *ctx, const struct addr6 *to, __u32 bid, struct nexthop6 **out)
{
	struct nexthop6 *nh = edge_hop6.lookup(&bid);
	struct bpf_fib_lookup fib;
	__u64 now = bpf_jiffies64();
	int rc;

	if (!nh)
		return BPF_FIB_LKUP_RET_NOT_FWDED;
	*out = nh;
	if (nh->ifindex && hop_fresh(nh->expires, now))
		return BPF_FIB_LKUP_RET_SUCCESS;
	__builtin_memset(&fib, 0, sizeof(fib));
	fib.family = AF_INET6;
	fib.l4_protocol = IPPROTO_IPV6;
	__builtin_memcpy(fib.ipv6_dst, to, sizeof(*to));
	fib.ifindex = ctx->ingress_ifindex;
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		nh->ifindex = 0;
		return rc;
	}
	nh->ifindex = fib.ifindex;
	nh->mtu = fib.mtu_result;
	__builtin_memcpy(&nh->src, fib.ipv6_src, sizeof(nh->src));
	__builtin_memcpy(nh->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(nh->dmac, fib.dmac, ETH_ALEN);
	nh->expires = now + EDGE_NEXTHOP_TTL_JIFFIES;
	return rc;
}

/* edge_ingress6 hands the packet it sends by DSR over to edge_ingress6_dsr
 * (maps.h, struct dsr6_hand): the backend, its service and the packet's
 * offsets, with the frame's length as the mark of the packet it is for. */
static __always_inline void dsr6_hand_over(struct xdp_md *ctx, __u32 bid, __u32 vid, __u32 l3_off, __u32 l3_len)
{
	__u32 zero = 0;
	struct dsr6_hand *h = edge_dsr6_hand.lookup(&zero);

	if (!h)
		return;
	h->len = ctx->data_end - ctx->data;
	h->bid = bid;
	h->vip_id = vid;
	h->l3_off = l3_off;
	h->l3_len = l3_len;
}

/* edge_ingress6_dsr takes the hand-over: 1 and a copy in out when there is
 * one for a frame of this length (cleared: it is taken once), else 0. */
static __always_inline int dsr6_take(struct xdp_md *ctx, struct dsr6_hand *out)
{
	__u32 zero = 0;
	struct dsr6_hand *h = edge_dsr6_hand.lookup(&zero);

	if (!h || !h->len || h->len != ctx->data_end - ctx->data)
		return 0;
	*out = *h;
	h->len = 0;
	return 1;
}

/* Sends the IPv6 packet whose header is at l3_off (l3_len bytes with it,
 * hop limit > 1) to backend bid at address to, in IPv6-in-IPv6: hop limit - 1
 * inside, outer header in front (VLAN tags go: the backend link is
 * untagged), MACs of the cached hop, redirect. */
static __always_inline int dsr_forward6(struct xdp_md *ctx, __u32 l3_off, __u32 l3_len, const struct addr6 *to,
					__u32 bid, __u32 vid)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *in = data + (l3_off & 0x1f), *o;
	struct nexthop6 *nh = NULL;
	struct ethhdr *eth = data;
	struct addr6 src;
	__u8 macs[2 * ETH_ALEN];
	__be32 vtc_flow;
	int ok, grow;

	if ((void *)(eth + 1) > data_end || (void *)(in + 1) > data_end || l3_off > ENCAP6_L3_MAX_OFF)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	grow = encap6_hop(ctx, to, bid, &nh);
	ok = grow == BPF_FIB_LKUP_RET_SUCCESS && nh;
	if (!ok && grow != BPF_FIB_LKUP_RET_NO_NEIGH)
		return count_drop(vid, EDGE_DROP_NO_BACKEND);
	if (ok && l3_len + sizeof(struct ipv6hdr) > nh->mtu)
		return count_drop(vid, EDGE_DROP_DSR_TOO_BIG);
	/* no neighbour entry yet: to the stack, from the client (see above) */
	__builtin_memcpy(&src, ok ? (void *)&nh->src : (void *)&in->saddr, sizeof(src));
	__builtin_memcpy(macs, eth, sizeof(macs));
	in->hop_limit--;
	vtc_flow = *(__be32 *)in; /* version 6, the inner traffic class and flow label */
	grow = sizeof(struct ipv6hdr) + sizeof(struct ethhdr) - (l3_off & 0x1f);
	if (bpf_xdp_adjust_head(ctx, -grow))
		return count_drop(vid, EDGE_DROP_MALFORMED);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	o = (void *)(eth + 1);
	if ((void *)(o + 1) > data_end)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	__builtin_memcpy(eth, macs, sizeof(macs));
	eth->h_proto = bpf_htons(ETH_P_IPV6);
	*(__be32 *)o = vtc_flow;
	o->payload_len = bpf_htons(l3_len);
	o->nexthdr = IPPROTO_IPV6;
	o->hop_limit = ENCAP6_HLIM;
	__builtin_memcpy(&o->saddr, &src, sizeof(src));
	__builtin_memcpy(&o->daddr, to, sizeof(*to));
	if (!ok || !nh)
		return count_verdict(vid, EDGE_CNT_DSR, XDP_PASS);
	set_macs(eth, nh->dmac, nh->smac);
	/* verifier: masked, the verdict cannot be a caller's EDGE_CONTINUE */
	return count_verdict(vid, EDGE_CNT_DSR, bpf_redirect(nh->ifindex, 0) & 0xff);
}

#endif /* EDGE_ENCAP6_H */
