/* SPDX-License-Identifier: Apache-2.0 */
/* heartbeat6.h: heartbeats of IPv6 backends, as heartbeat.h's for IPv4: the
 * same wire format and checks, registered in edge_hb6 (keyed by the IPv6
 * address). The return path (return6.h) consumes a UDP datagram to a
 * heartbeat port that carries the magic, stamping the backend's health or
 * counting why not; the IPv6 ingress (ingress6.h) drops one that arrives on
 * the client side, or from an unregistered address. Only a heartbeat right
 * after the IPv6 header is taken: the agent sends none with extension
 * headers, and one behind them is dropped on the client side as any other
 * IPv6 packet with them would be, or passes the return path untouched. */
#ifndef EDGE_HEARTBEAT6_H
#define EDGE_HEARTBEAT6_H

#include <uapi/linux/ipv6.h>
#include "heartbeat.h"

/* Where this IPv6 heartbeat is registered, or NULL; checks magic and version. */
static __always_inline struct hb_target *hb_lookup6(const struct heartbeat *hb, const struct ipv6hdr *ip6,
						    __be16 dport)
{
	struct hb_key6 key = {};

	if (hb->magic != bpf_htonl(EDGE_HB_MAGIC) || hb->version != bpf_htons(EDGE_HB_VERSION))
		return NULL;
	__builtin_memcpy(&key.addr, &ip6->saddr, sizeof(key.addr));
	key.port = hb->port;
	key.hb_port = dport;
	return edge_hb6.lookup(&key);
}

/* XDP ingress: 1 when the UDP datagram whose IPv6 header is at l3_off and
 * UDP header at l4_off is a heartbeat that may not enter here: unregistered,
 * or registered to another interface (hb_misrouted's rule). */
static __always_inline int hb_misrouted6(struct xdp_md *ctx, __u32 l3_off, __u32 l4_off)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + (l3_off & 0x1f);
	struct udphdr *uh = (void *)(ip6 + 1);
	struct heartbeat *hb = (void *)(uh + 1);
	struct hb_target *t;

	if (l4_off != l3_off + sizeof(*ip6) || (void *)(hb + 1) > data_end || !is_hb_port(uh->dest))
		return 0;
	if (hb->magic != bpf_htonl(EDGE_HB_MAGIC) || hb->version != bpf_htons(EDGE_HB_VERSION))
		return 0;
	t = hb_lookup6(hb, ip6, uh->dest);
	return !t || t->ifindex != ctx->ingress_ifindex;
}

/* tc, backend-facing ingress: a UDP datagram to dport whose payload starts
 * at pay_off. TC_ACT_SHOT for a heartbeat (stamped or rejected),
 * TC_ACT_UNSPEC for anything else. */
static __always_inline int consume_heartbeat6(struct __sk_buff *skb, const struct ipv6hdr *ip6, __u32 pay_off,
					      __be16 dport)
{
	struct heartbeat hb;

	if (!is_hb_port(dport))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, pay_off, &hb, sizeof(hb)) < 0 || hb.magic != bpf_htonl(EDGE_HB_MAGIC))
		return TC_ACT_UNSPEC; /* not a heartbeat after all */
	return hb_take(&hb, hb_lookup6(&hb, ip6, dport), skb->ingress_ifindex);
}

#endif /* EDGE_HEARTBEAT6_H */
