/* SPDX-License-Identifier: Apache-2.0 */
/* rnat6.h: the reverse NAT of an IPv6 reply in tc (return6.h): its source
 * address and port become the VIP's. The address is in the TCP/UDP
 * checksum's pseudo-header only, so its change is one checksum difference
 * over the old and new 16 bytes (bpf_csum_diff) applied by one
 * bpf_l4_csum_replace with BPF_F_PSEUDO_HDR: the kernel's helper keeps a
 * partial checksum (CHECKSUM_PARTIAL: the pseudo-header's sum, the rest
 * summed on transmit) and skb->csum (CHECKSUM_COMPLETE) right, which a
 * checksum written by hand would not. The port is in the L4 header, not
 * the pseudo-header, so a partial checksum must not take its change: a
 * call of its own, only when the port changes. Source address, destination
 * address (unchanged) and source port lie in one run of 34 bytes: one
 * store. This was four bpf_l4_csum_replace calls, one per address word,
 * and two bpf_skb_store_bytes (docs/benchmarks.md, 2026-12-02). */
#ifndef EDGE_RNAT6_H
#define EDGE_RNAT6_H

#include <uapi/linux/ipv6.h>
#include "maps.h"
#include "csum.h"

/* The bytes from the IPv6 source address to the L4 source port of a
 * packet without extension headers. */
struct rnat6_run {
	struct addr6 saddr;
	struct addr6 daddr;
	__be16 sport;
} __attribute__((packed));

_Static_assert(sizeof(struct rnat6_run) == 34 &&
		       offsetof(struct ipv6hdr, saddr) + sizeof(struct rnat6_run) == sizeof(struct ipv6hdr) + 2,
	       "rnat6.h: saddr, daddr and the L4 source port are one run");

/* The reply at l3_off (its L4 header right after the IPv6 header), from
 * backend endpoint (from, from_port) to client, leaves from (vip,
 * vip_port); proto: IPPROTO_TCP or IPPROTO_UDP. */
static __always_inline void rnat6(struct __sk_buff *skb, __u32 l3_off, __u8 proto, const struct addr6 *from,
				  __be16 from_port, const struct addr6 *client, const struct addr6 *vip,
				  __be16 vip_port)
{
	__u32 l4_off = l3_off + sizeof(struct ipv6hdr), csum_off, csum_flags;
	struct rnat6_run run;
	__s64 diff;

	csum_off = l4_csum_off(proto, l4_off, &csum_flags); /* csum.h */
	diff = bpf_csum_diff((__be32 *)from, sizeof(*from), (__be32 *)vip, sizeof(*vip), 0);
	bpf_l4_csum_replace(skb, csum_off, 0, (__u32)diff, BPF_F_PSEUDO_HDR | csum_flags);
	if (from_port != vip_port)
		bpf_l4_csum_replace(skb, csum_off, from_port, vip_port, csum_flags | sizeof(__be16));
	__builtin_memcpy(&run.saddr, vip, sizeof(run.saddr));
	__builtin_memcpy(&run.daddr, client, sizeof(run.daddr));
	run.sport = vip_port;
	bpf_skb_store_bytes(skb, l3_off + offsetof(struct ipv6hdr, saddr), &run, sizeof(run), 0);
}

#endif /* EDGE_RNAT6_H */
