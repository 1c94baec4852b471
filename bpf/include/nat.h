/* SPDX-License-Identifier: Apache-2.0 */
/* nat.h: destination NAT of a VIP packet to its backend, and the way out:
 * bpf_fib_lookup (cached per backend and CPU) picks the egress interface
 * and MACs and the frame is redirected; when the kernel has no neighbour
 * entry yet (or the frame is VLAN tagged) the rewritten packet goes to the
 * stack, which resolves it. The reply direction (tc, reply_out) looks the
 * client up in the FIB per packet and redirects too, so replies never enter
 * the kernel's forwarding path (which drops them as martians when the VIP is
 * a local address); an unresolved neighbour is left to bpf_redirect_neigh. */
#ifndef EDGE_NAT_H
#define EDGE_NAT_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "csum.h"
#include "flow.h"
#include "stats.h"

#ifndef AF_INET
#define AF_INET 2
#endif

/* Rewrites destination address and port, fixing IPv4 and L4 checksums (the
 * address change computed once for both, each checksum folded once).
 * verifier: the L4 header is re-checked here because the pointer the parser
 * checked loses its range once spilled (LLVM merges the TCP and UDP paths).
 * Returns -1 only if those already checked headers are not there. */
static __always_inline int dnat(struct pkt *pkt, const struct backend_info *be,
				void *data_end)
{
	struct iphdr *iph = pkt->iph;
	__u32 addr = csum_delta32(iph->daddr, be->addr);

	if (pkt->flow.proto == IPPROTO_TCP) {
		struct tcphdr *th = (void *)(iph + 1);

		if ((void *)(th + 1) > data_end)
			return -1;
		th->check = csum_apply(th->check, addr + csum_delta16(th->dest, be->port));
		th->dest = be->port;
	} else {
		struct udphdr *uh = (void *)(iph + 1);

		if ((void *)(uh + 1) > data_end)
			return -1;
		/* A zero UDP checksum means "none" and stays so. */
		if (uh->check) {
			__u16 c = csum_apply(uh->check, addr + csum_delta16(uh->dest, be->port));

			uh->check = c ? c : 0xffff;
		}
		uh->dest = be->port;
	}
	iph->check = csum_apply(iph->check, addr);
	iph->daddr = be->addr;
	return 0;
}

/* The frame's destination and source MACs from a cached hop, each as a 4-
 * and a 2-byte copy. memcpy into struct ethhdr (packed: alignment 1) and
 * from a 6-byte array compiles to six byte loads and stores per MAC, as
 * BPF's LLVM splits every access it cannot prove aligned; the casts of
 * the untyped frame pointer are taken as aligned. Unaligned loads and
 * stores of packet data and map values are allowed by the verifier where
 * the architecture handles them (x86-64, arm64: no strict alignment). */
static __always_inline void set_macs(struct ethhdr *eth, const __u8 *dmac, const __u8 *smac)
{
	void *f = eth;

	*(__u32 *)f = *(const __u32 *)dmac;
	*(__u16 *)(f + 4) = *(const __u16 *)(dmac + 4);
	*(__u32 *)(f + ETH_ALEN) = *(const __u32 *)smac;
	*(__u16 *)(f + ETH_ALEN + 4) = *(const __u16 *)(smac + 4);
}

/* TTL - 1 with its checksum update; the TTL sits in the high byte of the
 * 16-bit word it shares with the protocol. */
static __always_inline void decrease_ttl(struct iphdr *iph)
{
	__be16 old = *(__be16 *)&iph->ttl;

	iph->ttl--;
	iph->check = csum_replace16(iph->check, old, *(__be16 *)&iph->ttl);
}

#ifndef EDGE_NEXTHOP_TTL_JIFFIES
#define EDGE_NEXTHOP_TTL_JIFFIES 100 /* a cached FIB result is used this long: 0.1 s at HZ=1000 .. 1 s at HZ=100 */
#endif

/* The caches' clock is bpf_jiffies64(), which the verifier turns into one
 * load (64-bit JITs): the clocks are helper calls, which cost an established
 * flow about a fifth of its time (tools/bench-datapath). Their TTL is
 * counted in jiffies, so it is a second at most whatever the kernel's HZ.
 * 1 while an entry expiring at expires is fresh at now; an entry that would
 * expire further ahead than one TTL (garbage, or nanoseconds an older build
 * kept in the same pinned field) is stale, so it is looked up again. */
static __always_inline int hop_fresh(__u64 expires, __u64 now)
{
	return expires - now - 1 < EDGE_NEXTHOP_TTL_JIFFIES;
}

/* Egress interface and MACs towards the backend: the per-CPU cache, or a
 * FIB lookup that refills it. Returns 0, or -1 to let the stack deliver
 * (no neighbour entry yet, or no route). The cache is per backend, so
 * source-based policy routing is applied once per TTL, not per client. */
static __always_inline int next_hop(struct xdp_md *ctx, struct iphdr *iph,
				    __u32 bid, struct nexthop **out)
{
	struct nexthop *nh = edge_nexthop.lookup(&bid);
	struct bpf_fib_lookup fib;
	__u64 now = bpf_jiffies64();

	if (!nh)
		return -1;
	if (nh->ifindex && hop_fresh(nh->expires, now)) {
		*out = nh;
		return 0;
	}
	/* zeroed here, not where declared: a cache hit skips the stores */
	__builtin_memset(&fib, 0, sizeof(fib));
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
	nh->expires = now + EDGE_NEXTHOP_TTL_JIFFIES;
	*out = nh;
	return 0;
}

/* Sends the rewritten packet towards backend bid of service vid. */
static __always_inline int forward(struct xdp_md *ctx, struct pkt *pkt, __u32 vid, __u32 bid)
{
	struct iphdr *iph = pkt->iph;
	struct ethhdr *eth = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct nexthop *nh;

	if (pkt->vlans || next_hop(ctx, iph, bid, &nh) < 0)
		return count_verdict(vid, EDGE_CNT_NAT_PASS, XDP_PASS);
	if ((void *)(eth + 1) > data_end)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	decrease_ttl(iph);
	set_macs(eth, nh->dmac, nh->smac);
	return count_verdict(vid, EDGE_CNT_REDIRECT, bpf_redirect(nh->ifindex, 0));
}

/* tc: the rest of the reverse NAT of a reply whose L4 checksum the caller
 * has updated (with the kernel's helper, which knows partial checksums):
 * source address and port become the VIP's. */
static __always_inline void snat_rest(struct __sk_buff *skb, __u32 l3_off, __u32 l4_off,
				      __be32 vip_addr, __be16 vip_port)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *iph = data + sizeof(struct ethhdr);
	__be16 *sport = (void *)(iph + 1);
	__be32 old_addr;

	if (l3_off == sizeof(struct ethhdr) && l4_off == l3_off + sizeof(*iph) &&
	    (void *)(sport + 1) <= data_end) {
		iph->check = csum_replace32(iph->check, iph->saddr, vip_addr);
		iph->saddr = vip_addr;
		*sport = vip_port;
		return;
	}
	/* VLAN tags or IPv4 options: offsets the verifier cannot bound */
	if (bpf_skb_load_bytes(skb, l3_off + offsetof(struct iphdr, saddr),
			       &old_addr, sizeof(old_addr)) < 0)
		return;
	bpf_skb_store_bytes(skb, l4_off, &vip_port, sizeof(vip_port), 0);
	bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), old_addr,
			    vip_addr, sizeof(old_addr));
	bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, saddr), &vip_addr,
			    sizeof(vip_addr), 0);
}

/* bcc's helpers.h declares bpf_redirect_neigh without its plen argument;
 * this is the kernel's signature (uapi/linux/bpf.h). */
static long (*redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params,
			      int plen, __u64 flags) = (void *)BPF_FUNC_redirect_neigh;

/* Egress interface and MACs of a reply from vip to the client iph names:
 * the per-CPU cache slot of (client, VIP), or a FIB lookup that refills it.
 * Returns the bpf_fib_lookup result (BPF_FIB_LKUP_RET_*); on SUCCESS *out
 * holds the hop, on NO_NEIGH fib->ipv4_dst the next hop's address. Like the
 * forward cache, a route or neighbour change is seen within its TTL. A reply
 * longer than the cached MTU (and not GSO) is looked up again, so the FIB
 * answers FRAG_NEEDED and the stack sends the ICMP error. Shared by tc
 * (reply_hop) and XDP (edge_reply.c): ctx is either's context, len the
 * frame's length with its Ethernet header. */
static __always_inline int reply_hop_at(void *ctx, __u32 in_ifindex, __u32 len, int gso,
					struct iphdr *iph, __be32 vip,
					struct bpf_fib_lookup *fib, struct reply_hop **out)
{
	__u32 slot = hash_mix(iph->daddr ^ vip) & (EDGE_REPLY_HOP_SLOTS - 1);
	struct reply_hop *hop = edge_reply_hop.lookup(&slot);
	__u64 now = bpf_jiffies64();
	int rc;

	if (!hop)
		return BPF_FIB_LKUP_RET_NOT_FWDED;
	if (hop->ifindex && hop->client == iph->daddr && hop->vip == vip && hop_fresh(hop->expires, now) &&
	    (gso || len <= hop->mtu + sizeof(struct ethhdr))) {
		*out = hop;
		return BPF_FIB_LKUP_RET_SUCCESS;
	}
	__builtin_memset(fib, 0, sizeof(*fib)); /* the caller's: zeroed on a miss only */
	fib->family = AF_INET;
	fib->tos = iph->tos;
	fib->l4_protocol = iph->protocol;
	fib->ipv4_src = vip;
	fib->ipv4_dst = iph->daddr;
	fib->ifindex = in_ifindex;
	/* tot_len stays 0: tc's kernel then checks the skb against the egress
	 * MTU itself, which knows GSO packets; XDP's caller compares the frame
	 * with mtu_result (the egress MTU either way). */
	hop->client = iph->daddr;
	hop->vip = vip;
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		hop->ifindex = 0;
		return rc;
	}
	hop->ifindex = fib->ifindex;
	hop->mtu = fib->mtu_result; /* the egress device's (tot_len was 0) */
	__builtin_memcpy(hop->smac, fib->smac, ETH_ALEN);
	__builtin_memcpy(hop->dmac, fib->dmac, ETH_ALEN);
	hop->expires = now + EDGE_NEXTHOP_TTL_JIFFIES;
	*out = hop;
	return rc;
}

static __always_inline int reply_hop(struct __sk_buff *skb, struct iphdr *iph, __be32 vip,
				     struct bpf_fib_lookup *fib, struct reply_hop **out)
{
	return reply_hop_at(skb, skb->ingress_ifindex, skb->len, skb->gso_size, iph, vip, fib, out);
}

/* tc: sends a packet from a VIP whose rewriting is done (no helper call
 * follows) to the client, by the reply_hop result rc (fib, hop): TTL - 1,
 * MACs, bpf_redirect, or bpf_redirect_neigh without a neighbour entry;
 * counted under cnt of service vid. TC_ACT_OK (not counted) hands it to the stack: no route,
 * MTU exceeded, forwarding off. */
static __always_inline int reply_send(struct __sk_buff *skb, int rc, struct bpf_fib_lookup *fib,
				      struct reply_hop *hop, __u32 vid, __u32 cnt)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);

	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	if ((void *)(iph + 1) > data_end)
		return TC_ACT_OK;
	decrease_ttl(iph);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH || !hop) {
		struct bpf_redir_neigh nb = {};

		nb.nh_family = AF_INET;
		nb.ipv4_nh = fib->ipv4_dst; /* the gateway, or the client */
		return count_verdict(vid, cnt, redirect_neigh(fib->ifindex, &nb, sizeof(nb), 0));
	}
	set_macs(eth, hop->dmac, hop->smac);
	return count_verdict(vid, cnt, bpf_redirect(hop->ifindex, 0));
}

/* tc: finishes the reverse NAT of a reply (snat_rest) and sends it to the
 * client: cached FIB result (reply_hop), TTL - 1, MACs, bpf_redirect; with
 * no neighbour entry yet, bpf_redirect_neigh lets the kernel resolve it on
 * the way out (the stack would drop a reply from a local VIP as a martian).
 * vid: the service, for the counters. Returns the tc verdict; TC_ACT_OK hands the packet to the stack (VLAN tag
 * or IPv4 options, TTL about to expire, no route, MTU exceeded, forwarding
 * off). The helper calls come first: they invalidate packet pointers. */
static __always_inline int reply_out(struct __sk_buff *skb, __u32 l3_off, __u32 l4_off,
				     __be32 vip_addr, __be16 vip_port, __u32 vid)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *iph = data + sizeof(struct ethhdr);
	struct bpf_fib_lookup fib; /* filled by reply_hop on a cache miss */
	struct reply_hop *hop = NULL;
	int rc;

	if (l3_off != sizeof(struct ethhdr) || (void *)(iph + 1) > data_end || iph->ttl <= 1) {
		snat_rest(skb, l3_off, l4_off, vip_addr, vip_port);
		return TC_ACT_OK;
	}
	rc = reply_hop(skb, iph, vip_addr, &fib, &hop);
	snat_rest(skb, l3_off, l4_off, vip_addr, vip_port);
	return reply_send(skb, rc, &fib, hop, vid, EDGE_CNT_RETURN_REDIRECT);
}

#endif /* EDGE_NAT_H */
