/* SPDX-License-Identifier: Apache-2.0 */
/* csum.h: incremental Internet checksum updates (RFC 1624, eqn. 3) for the
 * XDP side, where the whole packet is in linear memory. The tc side uses the
 * kernel's bpf_l3/l4_csum_replace helpers instead (they handle partial
 * checksums). Values are in network byte order; the one's complement sum
 * does not care which. */
#ifndef EDGE_CSUM_H
#define EDGE_CSUM_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include <linux/stddef.h>

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* ~m + m' for a 32-bit field m -> m', unfolded: what a change adds to ~HC.
 * Changes covered by one checksum are summed and applied with one fold
 * (csum_apply) instead of one csum_replace* each; same result, fewer
 * instructions. */
static __always_inline __u32 csum_delta32(__be32 from, __be32 to)
{
	return (~from & 0xffff) + (~from >> 16) + (to & 0xffff) + (to >> 16);
}

/* The same for a 16-bit field. */
static __always_inline __u32 csum_delta16(__be16 from, __be16 to)
{
	return (__u16)~from + (__u32)to;
}

/* HC' = ~(~HC + delta), delta a sum of at most four csum_delta*: below
 * 2^20, so csum_fold's two rounds suffice. */
static __always_inline __u16 csum_apply(__u16 check, __u32 delta)
{
	return (__u16)~csum_fold((__u16)~check + delta);
}

/* HC' = ~(~HC + ~m + m') for a 32-bit field m -> m'. */
static __always_inline __u16 csum_replace32(__u16 check, __be32 from, __be32 to)
{
	return csum_apply(check, csum_delta32(from, to));
}

/* The same for a 16-bit field. */
static __always_inline __u16 csum_replace16(__u16 check, __be16 from, __be16 to)
{
	return csum_apply(check, csum_delta16(from, to));
}

/* A 64-bit one's complement accumulator folded to 16 bits. */
static __always_inline __u16 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return csum_fold((__u32)sum);
}

/* 1 when the 20-byte IPv4 header at iph (checked against the packet end by
 * the caller) sums to all ones, as a header with a correct checksum does. */
static __always_inline int ipv4_csum_ok(const struct iphdr *iph)
{
	const __u32 *w = (const void *)iph;
	__u64 sum = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];

	return csum_fold64(sum) == 0xffff;
}

/* For the tc side: the offset of the checksum of the TCP (proto
 * IPPROTO_TCP) or UDP header at l4_off, and the flags bpf_l4_csum_replace
 * takes for it (a UDP checksum 0, none in IPv4, stays 0:
 * BPF_F_MARK_MANGLED_0). One home for IPv4's (edge_tc.c) and IPv6's
 * (rnat6.h) reverse NAT. */
static __always_inline __u32 l4_csum_off(__u8 proto, __u32 l4_off, __u32 *csum_flags)
{
	if (proto == IPPROTO_TCP) {
		*csum_flags = 0;
		return l4_off + offsetof(struct tcphdr, check);
	}
	*csum_flags = BPF_F_MARK_MANGLED_0;
	return l4_off + offsetof(struct udphdr, check);
}

#endif /* EDGE_CSUM_H */
