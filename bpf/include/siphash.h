/* SPDX-License-Identifier: Apache-2.0 */
/* siphash.h: SipHash-2-4 (Aumasson and Bernstein) of exactly two 64-bit
 * words, the MAC of a heartbeat (abi.h, struct heartbeat). The kernel has
 * no helper for it; written out without loops or branches, so the verifier
 * sees straight-line code: 8 rounds of 14 ALU instructions each, ~130 in
 * all (tools/bench-datapath measures a heartbeat). controlplane/siphash.py
 * computes the same for the senders. */
#ifndef EDGE_SIPHASH_H
#define EDGE_SIPHASH_H

#include <linux/types.h>

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIP_ROUND(v0, v1, v2, v3)      \
	do {                           \
		v0 += v1;              \
		v1 = SIP_ROTL(v1, 13); \
		v1 ^= v0;              \
		v0 = SIP_ROTL(v0, 32); \
		v2 += v3;              \
		v3 = SIP_ROTL(v3, 16); \
		v3 ^= v2;              \
		v0 += v3;              \
		v3 = SIP_ROTL(v3, 21); \
		v3 ^= v0;              \
		v2 += v1;              \
		v1 = SIP_ROTL(v1, 17); \
		v1 ^= v2;              \
		v2 = SIP_ROTL(v2, 32); \
	} while (0)

/* Little-endian 64-bit word of the message, as SipHash reads it. */
static __always_inline __u64 sip_le64(__u64 x)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return x;
#else
	return __builtin_bswap64(x);
#endif
}

/* SipHash-2-4 under key (k0, k1) of the 16 bytes whose little-endian words
 * are m0 and m1 (bytes 0-7 and 8-15). */
static __always_inline __u64 siphash24_16(__u64 k0, __u64 k1, __u64 m0, __u64 m1)
{
	__u64 v0 = k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k1 ^ 0x7465646279746573ULL;
	__u64 b = 16ULL << 56; /* message length in the last block, no tail bytes */

	v3 ^= m0;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= m0;
	v3 ^= m1;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= m1;
	v3 ^= b;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

#endif /* EDGE_SIPHASH_H */
