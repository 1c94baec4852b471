/* SPDX-License-Identifier: Apache-2.0 */
/* encap.h: direct server return (a service's forwarding: dsr). The packet
 * is not NATed: it keeps the VIP as its destination and gets an outer IPv4
 * header (IPIP, protocol 4) from the router's address towards the backend
 * to the backend, which decapsulates it (an ipip device), has the VIP on
 * lo and answers the client directly from the VIP (tools/dsr-backend).
 *
 * The way out is nat.h's: the per-CPU next-hop cache of the backend, here
 * filled by a FIB lookup that also derives the source address
 * (BPF_FIB_LOOKUP_SRC) and notes the egress MTU; until the router has a
 * neighbour entry for the hop, the encapsulated packet goes to its stack
 * (dsr_forward says with which source). The encapsulated packet
 * is 20 bytes longer; one that no longer fits the backend link is dropped
 * and counted (dsr_too_big): backends advertise an MSS 20 bytes lower
 * (tools/dsr-backend sets advmss), or the backend links carry 20 bytes more.
 * An IPv6 twin would add encap6 with the same exits. */
#ifndef EDGE_ENCAP_H
#define EDGE_ENCAP_H

#include "csum.h"
#include "flow.h"
#include "nat.h"
#include "stats.h"

#ifndef BPF_FIB_LOOKUP_SRC
#define BPF_FIB_LOOKUP_SRC (1U << 4) /* uapi/linux/bpf.h, kernel 6.7 */
#endif

#define ENCAP_TTL 64

/* Egress interface, MACs, source address and MTU towards backend be: the
 * cache, or a FIB lookup that refills it (src 0 marks an entry the NAT
 * path filled, which has none). Returns the lookup's BPF_FIB_LKUP_RET_*:
 * SUCCESS with *out set; NO_NEIGH while the router has no neighbour entry
 * for the next hop yet; anything else: no way there. */
static __always_inline int encap_hop(struct xdp_md *ctx, const struct iphdr *inner,
				     const struct backend_info *be, __u32 bid, struct nexthop **out)
{
	struct nexthop *nh = edge_nexthop.lookup(&bid);
	struct bpf_fib_lookup fib;
	__u64 now = bpf_jiffies64();
	int rc;

	if (!nh)
		return BPF_FIB_LKUP_RET_NOT_FWDED;
	if (nh->ifindex && nh->src && hop_fresh(nh->expires, now)) {
		*out = nh;
		return BPF_FIB_LKUP_RET_SUCCESS;
	}
	__builtin_memset(&fib, 0, sizeof(fib));
	fib.family = AF_INET;
	fib.tos = inner->tos;
	fib.l4_protocol = IPPROTO_IPIP;
	fib.ipv4_dst = be->addr;
	fib.ifindex = ctx->ingress_ifindex;
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || !fib.ipv4_src) {
		nh->ifindex = 0;
		return rc == BPF_FIB_LKUP_RET_SUCCESS ? BPF_FIB_LKUP_RET_NOT_FWDED : rc;
	}
	nh->ifindex = fib.ifindex;
	nh->src = fib.ipv4_src;
	nh->mtu = fib.mtu_result;
	__builtin_memcpy(nh->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(nh->dmac, fib.dmac, ETH_ALEN);
	nh->expires = now + EDGE_NEXTHOP_TTL_JIFFIES;
	*out = nh;
	return rc;
}

/* The outer header's checksum: the one's complement of its 16-bit sum. */
static __always_inline void encap_csum(struct iphdr *o)
{
	const __u32 *w = (const void *)o;

	o->check = 0;
	o->check = ~csum_fold64((__u64)w[0] + w[1] + w[2] + w[3] + w[4]);
}

/* Sends pkt (its IPv4 header pkt->iph, whole in the frame, TTL > 1) to
 * backend bid in IPIP: TTL - 1 inside, outer header in front (a VLAN tag
 * goes: the backend link is untagged), MACs of the cached hop, redirect. */
static __always_inline int dsr_forward(struct xdp_md *ctx, struct pkt *pkt,
				       const struct backend_info *be, __u32 bid)
{
	struct iphdr *in = pkt->iph, *o;
	struct ethhdr *eth;
	struct nexthop *nh = NULL;
	void *data, *data_end;
	__u8 macs[2 * ETH_ALEN];
	__u16 len;
	__u8 tos;
	__be16 df;
	int grow = sizeof(struct iphdr) - (pkt->vlans ? sizeof(struct vlan_hdr) : 0);

	__be32 src;
	int rc;

	if ((void *)(in + 1) > (void *)(long)ctx->data_end)
		return count_drop(be->vip_id, EDGE_DROP_MALFORMED);
	rc = encap_hop(ctx, in, be, bid, &nh);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS ? !nh : rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return count_drop(be->vip_id, EDGE_DROP_NO_BACKEND);
	len = bpf_ntohs(in->tot_len);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && (__u32)len + sizeof(struct iphdr) > nh->mtu)
		return count_drop(be->vip_id, EDGE_DROP_DSR_TOO_BIG);
	/* No neighbour entry yet: the stack sends this one and resolves the
	 * next hop. Its outer source is the client's: the router's own would
	 * be a martian source to its stack. */
	src = rc == BPF_FIB_LKUP_RET_SUCCESS ? nh->src : in->saddr;
	eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return count_drop(be->vip_id, EDGE_DROP_MALFORMED);
	__builtin_memcpy(macs, eth, sizeof(macs)); /* for the stack: to the router, as it came */
	decrease_ttl(in);
	tos = in->tos;
	df = in->frag_off & bpf_htons(0x4000);
	if (bpf_xdp_adjust_head(ctx, -grow))
		return count_drop(be->vip_id, EDGE_DROP_MALFORMED);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	o = (void *)(eth + 1);
	if ((void *)(o + 1) > data_end)
		return count_drop(be->vip_id, EDGE_DROP_MALFORMED);
	__builtin_memcpy(eth, macs, sizeof(macs));
	eth->h_proto = bpf_htons(ETH_P_IP);
	*(__u16 *)o = bpf_htons(0x4500 | tos); /* version 4, IHL 5, the inner TOS */
	o->tot_len = bpf_htons(len + sizeof(struct iphdr));
	o->id = 0;
	o->frag_off = df;
	o->ttl = ENCAP_TTL;
	o->protocol = IPPROTO_IPIP;
	o->saddr = src;
	o->daddr = be->addr;
	encap_csum(o);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || !nh)
		return count_verdict(be->vip_id, EDGE_CNT_DSR, XDP_PASS);
	set_macs(eth, nh->dmac, nh->smac);
	/* verifier: masked, the verdict cannot be the callers' EDGE_CONTINUE,
	 * so no path goes on with the packet pointers adjust_head voided */
	return count_verdict(be->vip_id, EDGE_CNT_DSR, bpf_redirect(nh->ifindex, 0) & 0xff);
}

#endif /* EDGE_ENCAP_H */
