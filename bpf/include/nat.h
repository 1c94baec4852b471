/* SPDX-License-Identifier: Apache-2.0 */
/* nat.h: destination NAT of a VIP packet to its backend, and the way out:
 * bpf_fib_lookup (cached per backend and CPU) picks the egress interface
 * and MACs and the frame is redirected; when the kernel has no neighbour
 * entry yet (or the frame is VLAN tagged) the rewritten packet goes to the
 * stack, which resolves it. */
#ifndef EDGE_NAT_H
#define EDGE_NAT_H

#include <uapi/linux/bpf.h>
#include "csum.h"
#include "flow.h"
#include "stats.h"

#ifndef AF_INET
#define AF_INET		2
#endif

static __always_inline void dnat_l3(struct iphdr *iph, __be32 addr)
{
	iph->check = csum_replace32(iph->check, iph->daddr, addr);
	iph->daddr = addr;
}

/* Rewrites destination address and port, fixing IPv4 and L4 checksums.
 * verifier: the L4 header is re-checked here because the pointer the parser
 * checked loses its range once spilled (LLVM merges the TCP and UDP paths).
 * Returns -1 only if those already checked headers are not there. */
static __always_inline int dnat(struct pkt *pkt, const struct backend_info *be,
				void *data_end)
{
	struct iphdr *iph = pkt->iph;
	__be32 old_addr = iph->daddr;

	if (pkt->flow.proto == IPPROTO_TCP) {
		struct tcphdr *th = (void *)(iph + 1);

		if ((void *)(th + 1) > data_end)
			return -1;
		dnat_l3(iph, be->addr);
		th->check = csum_replace32(th->check, old_addr, be->addr);
		th->check = csum_replace16(th->check, th->dest, be->port);
		th->dest = be->port;
	} else {
		struct udphdr *uh = (void *)(iph + 1);

		if ((void *)(uh + 1) > data_end)
			return -1;
		dnat_l3(iph, be->addr);
		/* A zero UDP checksum means "none" and stays so. */
		if (uh->check) {
			__u16 c = csum_replace32(uh->check, old_addr, be->addr);

			c = csum_replace16(c, uh->dest, be->port);
			uh->check = c ? c : 0xffff;
		}
		uh->dest = be->port;
	}
	return 0;
}

/* TTL - 1 with its checksum update; the TTL sits in the high byte of the
 * 16-bit word it shares with the protocol. */
static __always_inline void decrease_ttl(struct iphdr *iph)
{
	__be16 old = *(__be16 *)&iph->ttl;

	iph->ttl--;
	iph->check = csum_replace16(iph->check, old, *(__be16 *)&iph->ttl);
}

#ifndef EDGE_NEXTHOP_TTL_NS
#define EDGE_NEXTHOP_TTL_NS	1000000000	/* a cached FIB result is used this long */
#endif

/* Egress interface and MACs towards the backend: the per-CPU cache, or a
 * FIB lookup that refills it. Returns 0, or -1 to let the stack deliver
 * (no neighbour entry yet, or no route). The cache is per backend, so
 * source-based policy routing is applied once per TTL, not per client. */
static __always_inline int next_hop(struct xdp_md *ctx, struct iphdr *iph,
				    __u32 bid, struct nexthop **out)
{
	struct nexthop *nh = edge_nexthop.lookup(&bid);
	struct bpf_fib_lookup fib = {};
	__u64 now = bpf_ktime_get_coarse_ns();

	if (!nh)
		return -1;
	if (nh->ifindex && now < nh->expires_ns) {
		*out = nh;
		return 0;
	}
	fib.family = AF_INET;
	fib.tos = iph->tos;
	fib.l4_protocol = iph->protocol;
	fib.tot_len = bpf_ntohs(iph->tot_len);
	fib.ipv4_src = iph->saddr;
	fib.ipv4_dst = iph->daddr;
	fib.ifindex = ctx->ingress_ifindex;
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS) {
		nh->ifindex = 0;
		return -1;
	}
	nh->ifindex = fib.ifindex;
	__builtin_memcpy(nh->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(nh->dmac, fib.dmac, ETH_ALEN);
	nh->expires_ns = now + EDGE_NEXTHOP_TTL_NS;
	*out = nh;
	return 0;
}

/* Sends the rewritten packet towards backend bid. */
static __always_inline int forward(struct xdp_md *ctx, struct pkt *pkt, __u32 bid)
{
	struct iphdr *iph = pkt->iph;
	struct ethhdr *eth = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct nexthop *nh;

	if (pkt->vlans || next_hop(ctx, iph, bid, &nh) < 0)
		return count_verdict(EDGE_CNT_NAT_PASS, XDP_PASS);
	if ((void *)(eth + 1) > data_end)
		return count_drop(EDGE_DROP_MALFORMED);
	decrease_ttl(iph);
	__builtin_memcpy(eth->h_dest, nh->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, nh->smac, ETH_ALEN);
	return count_verdict(EDGE_CNT_REDIRECT, bpf_redirect(nh->ifindex, 0));
}

#endif /* EDGE_NAT_H */
