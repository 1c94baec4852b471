/* SPDX-License-Identifier: Apache-2.0 */
/* wire6.h: wire signals of IPv6 flows, IPv4's (wire.h) on edge_ct6's
 * entries, which are struct flow_info too: per backend the handshake RTT,
 * the first request payload to the first reply payload, and connections
 * opened and closed, in the same per-id maps (edge_wire, edge_inflight), so
 * edged's steering, status and metrics see an IPv6 backend as an IPv4 one.
 * A new IPv6 entry and a moved one take their marks from wire_open and
 * wire_move (flow.h, select.h) as IPv4's do; this header has the per-packet
 * steps of an entry that exists, called from ingress6.h (the client side,
 * XDP) and return6.h (the backend side, tc): one flag test each unless a
 * signal is pending or the segment opens or ends a connection. edge_reply
 * (reply6.h) leaves a reply to tc while its entry waits for a sample. */
#ifndef EDGE_WIRE6_H
#define EDGE_WIRE6_H

#include "flow.h"
#include "wire.h"

/* A client's packet of the kept entry fi of backend bid, as parsed by
 * parse6; hdrs: the IPv6 header and its extension headers, in bytes; syn:
 * pkt->syn, or 0 (a constant) where the packet is known to be no SYN. */
static __always_inline void wire6_forward(struct flow_info *fi, __u32 bid, const struct pkt *pkt, __u32 hdrs,
					  int syn)
{
	if (pkt->flow.proto == IPPROTO_TCP)
		wire_forward(fi, bid, syn, pkt->end, pkt->seq, pkt->l3_len - hdrs - pkt->tcp_hlen);
}

/* A backend's reply on entry fi of backend bid, its TCP header at l4_off
 * (return6.h takes no extension headers), of protocol proto: only TCP is timed. */
static __always_inline void wire6_reply(struct __sk_buff *skb, struct flow_info *fi, __u32 bid, __u8 proto,
					__u8 tcp_flags, __u32 l4_off)
{
	if (fi && proto == IPPROTO_TCP) /* no entry: a stateless reply (state6.h) */
		wire_reply(skb, fi, bid, tcp_flags, l4_off);
}

#endif /* EDGE_WIRE6_H */
