/* SPDX-License-Identifier: Apache-2.0 */
/* reply6.h: the IPv6 side of edge_reply (XDP on the backend-facing
 * interfaces, edge_reply.c): the common case of an IPv6 reply, a TCP segment
 * without SYN, RST or FIN or a UDP datagram, no extension headers, of a
 * connection edge_ct6 pins to the backend edge_rnat6 names, gets the VIP back
 * as its source (the L4 checksum updated incrementally), hop limit - 1, and
 * is redirected to the client-facing interface the ingress runs on, by the
 * FIB result cached per (client, VIP) (hop6.h). The edge_rnat6 entry comes
 * from a per-CPU copy while edge_rnat6 is unchanged (rnat6_cached), as
 * IPv4's does (edge_reply.c, rnat_cached).
 * Everything else goes on to tc (return6.h): UDP checksums of 0, SYN-ACKs and RSTs (passive
 * detection), replies a wire sample waits for (wire6.h), replies without an entry, partial checksums, another egress
 * interface, an MTU exceeded, no neighbour entry yet. */
#ifndef EDGE_REPLY6_H
#define EDGE_REPLY6_H

#include <uapi/linux/ipv6.h>
#include "maps.h"
#include "stats.h"
#include "csum.h"
#include "hop6.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif

/* One's complement sum of an IPv6 address's four words, unfolded. */
static __always_inline __u64 reply6_sum(const struct addr6 *a)
{
	return (__u64)a->w[0] + a->w[1] + a->w[2] + a->w[3];
}

/* struct backend_key6 as five words */
union rnat6_tag {
	struct backend_key6 key;
	__u32 w[5];
};

/* The edge_rnat6 entry of the backend endpoint rk, from this CPU's copy when
 * it was made under gen (node_info.rnat_gen, read before this call), else
 * looked up and copied into the endpoint's slot with the checksum change of
 * its reverse NAT: edge_reply.c's rnat_cached for IPv6. A reply then takes
 * one hash lookup, conntrack's, as an IPv4 one does (edge_rnat6's took ~20
 * ns of (i6)'s ~110, tools/bench-datapath). NULL: no entry. */
static __always_inline const struct rnat6_slot *rnat6_cached(const struct backend_key6 *rk, __u64 gen)
{
	const union rnat6_tag *tag = (const void *)rk;
	__u32 idx = hash_mix(tag->w[0] ^ tag->w[1] ^ tag->w[2] ^ tag->w[3] ^ tag->w[4]) & (EDGE_RNAT_CACHE_SLOTS - 1);
	struct rnat6_slot *slot = edge_rnat6_cache.lookup(&idx);
	union rnat6_tag *have;
	struct rnat_info6 *ri;

	if (!slot)
		return NULL;
	have = (void *)&slot->key;
	if (!((have->w[0] ^ tag->w[0]) | (have->w[1] ^ tag->w[1]) | (have->w[2] ^ tag->w[2]) |
	      (have->w[3] ^ tag->w[3]) | (have->w[4] ^ tag->w[4])) &&
	    slot->gen == gen)
		return slot;
	ri = edge_rnat6.lookup((struct backend_key6 *)rk);
	if (!ri)
		return NULL;
	slot->key = *rk;
	slot->gen = gen;
	slot->info = *ri;
	slot->csum_l4 = csum_fold(csum_delta32(rk->addr.w[0], ri->vip_addr.w[0]) +
				  csum_delta32(rk->addr.w[1], ri->vip_addr.w[1]) +
				  csum_delta32(rk->addr.w[2], ri->vip_addr.w[2]) +
				  csum_delta32(rk->addr.w[3], ri->vip_addr.w[3]) + csum_delta16(rk->port, ri->vip_port));
	return slot;
}

static __always_inline int reply6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct bpf_fib_lookup fib; /* filled by reply_hop6_at on a cache miss */
	struct reply_hop6 *hop = NULL;
	struct backend_key6 rk = {};
	struct flow_key6 fk = {};
	const struct rnat6_slot *rs;
	const struct rnat_info6 *ri;
	struct node_info *node;
	struct flow_info *fi;
	__u32 zero = 0, len = data_end - data, l4_len;
	__u16 *check, c;
	__be16 *ports;
	__u64 sum;
	int udp;

	if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1)
		return XDP_PASS;
	l4_len = bpf_ntohs(ip6->payload_len);
	if (l4_len + sizeof(*ip6) > len - sizeof(*eth))
		return XDP_PASS;
	ports = (void *)(ip6 + 1);
	if (ip6->nexthdr == IPPROTO_TCP) {
		struct tcphdr *th = (void *)ports;

		if ((void *)(th + 1) > data_end || (((__u8 *)th)[13] & 0x07)) /* FIN | SYN | RST: tc's */
			return XDP_PASS;
		check = &th->check;
		udp = 0;
	} else if (ip6->nexthdr == IPPROTO_UDP) {
		struct udphdr *uh = (void *)ports;

		if ((void *)(uh + 1) > data_end || !uh->check) /* checksum 0, invalid in IPv6: tc drops it */
			return XDP_PASS;
		check = &uh->check;
		udp = 1;
	} else {
		return XDP_PASS;
	}
	__builtin_memcpy(&rk.addr, &ip6->saddr, sizeof(rk.addr));
	__builtin_memcpy(&fk.src, &ip6->daddr, sizeof(fk.src));
	/* a partial checksum (the pseudo-header's sum) needs tc's helpers */
	sum = reply6_sum(&rk.addr) + reply6_sum(&fk.src) + bpf_htonl(l4_len) + bpf_htonl(ip6->nexthdr);
	if (csum_fold64(sum) == *check)
		return XDP_PASS;
	node = edge_node.lookup(&zero); /* rnat_gen; ingress_ifindex below */
	if (!node)
		return XDP_PASS;
	rk.port = ports[0];
	rk.proto = ip6->nexthdr;
	rs = rnat6_cached(&rk, *(volatile __u64 *)&node->rnat_gen);
	if (!rs)
		return XDP_PASS;
	ri = &rs->info;
	fk.dst = ri->vip_addr;
	fk.sport = ports[1];
	fk.dport = ri->vip_port;
	fk.proto = rk.proto;
	fi = edge_ct6.lookup(&fk);
	if (!fi || fi->backend_id != ri->backend_id || (fi->flags & EDGE_CT_F_WIRE_WAIT)) /* wire6.h: tc's */
		return XDP_PASS;

	/* only to the interface edge_ingress runs on (edge_reply.c) */
	if (reply_hop6_at(ctx, ctx->ingress_ifindex, len, 0, &fk.src, &ri->vip_addr, rk.proto, &fib, &hop) !=
		    BPF_FIB_LKUP_RET_SUCCESS ||
	    !hop || hop->ifindex != node->ingress_ifindex || len > hop->mtu + sizeof(*eth))
		return XDP_PASS;

	c = csum_apply(*check, rs->csum_l4);
	*check = (udp && !c) ? 0xffff : c;
	__builtin_memcpy(&ip6->saddr, &ri->vip_addr, sizeof(ri->vip_addr));
	ports[0] = ri->vip_port;
	ip6->hop_limit--;
	set_macs(eth, hop->dmac, hop->smac);
	count_return(ri->vip_id, ri->backend_id);
	return count_verdict(ri->vip_id, EDGE_CNT_RETURN_XDP, bpf_redirect(hop->ifindex, 0));
}

#endif /* EDGE_REPLY6_H */
