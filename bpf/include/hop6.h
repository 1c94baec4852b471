/* SPDX-License-Identifier: Apache-2.0 */
/* hop6.h: the next hop of IPv6 replies, cached (edge_reply_hop6, per CPU):
 * IPv6's reply_hop_at (nat.h). A reply's bpf_fib_lookup (its egress
 * interface, MACs and MTU) is kept for EDGE_NEXTHOP_TTL_JIFFIES in the slot
 * of hash(client, VIP), tagged with both whole addresses, so a reply pays
 * one array lookup and two address compares instead of the FIB (~250 ns of
 * the ~330 an XDP reply took, tools/bench-datapath (i6)). A frame longer
 * than the cached MTU (not GSO) is looked up again, so the kernel answers
 * FRAG_NEEDED. Shared by XDP (reply6.h) and tc (return6.h). */
#ifndef EDGE_HOP6_H
#define EDGE_HOP6_H

#include "maps.h"
#include "flow.h"
#include "nat.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif

static __always_inline int addr6_eq(const struct addr6 *a, const struct addr6 *b)
{
	return !((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2]) | (a->w[3] ^ b->w[3]));
}

/* The cached hop of a reply from vip to client (copies: not pointers into the
 * packet), or a FIB lookup into fib (the caller's, zeroed here on a miss) that
 * refills its slot. Returns the lookup's code; *out is the slot on success. */
static __always_inline int reply_hop6_at(void *ctx, __u32 in_ifindex, __u32 len, int gso, const struct addr6 *client,
					 const struct addr6 *vip, __u8 l4_proto, struct bpf_fib_lookup *fib,
					 struct reply_hop6 **out)
{
	__u32 slot = hash_mix(client->w[0] ^ client->w[1] ^ client->w[2] ^ client->w[3] ^ vip->w[0] ^ vip->w[1] ^
			      vip->w[2] ^ vip->w[3]) &
		     (EDGE_REPLY_HOP_SLOTS - 1);
	struct reply_hop6 *hop = edge_reply_hop6.lookup(&slot);
	__u64 now = bpf_jiffies64();
	int rc;

	if (!hop)
		return BPF_FIB_LKUP_RET_NOT_FWDED;
	if (hop->ifindex && addr6_eq(&hop->client, client) && addr6_eq(&hop->vip, vip) &&
	    hop_fresh(hop->expires, now) && (gso || len <= hop->mtu + sizeof(struct ethhdr))) {
		*out = hop;
		return BPF_FIB_LKUP_RET_SUCCESS;
	}
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET6;
	fib->l4_protocol = l4_proto;
	__builtin_memcpy(fib->ipv6_src, vip, 16);
	__builtin_memcpy(fib->ipv6_dst, client, 16);
	fib->ifindex = in_ifindex;
	/* tot_len 0: mtu_result is the egress device's MTU (nat.h, reply_hop_at) */
	hop->client = *client;
	hop->vip = *vip;
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		hop->ifindex = 0;
		return rc;
	}
	hop->ifindex = fib->ifindex;
	hop->mtu = fib->mtu_result;
	__builtin_memcpy(hop->smac, fib->smac, ETH_ALEN);
	__builtin_memcpy(hop->dmac, fib->dmac, ETH_ALEN);
	hop->expires = now + EDGE_NEXTHOP_TTL_JIFFIES;
	*out = hop;
	return rc;
}

#endif /* EDGE_HOP6_H */
