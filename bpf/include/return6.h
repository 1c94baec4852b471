/* SPDX-License-Identifier: Apache-2.0 */
/* return6.h: the IPv6 side of the return path (edge_tc.c, tc ingress of the
 * backend-facing interfaces). A backend's TCP or UDP reply to a client, with
 * no extension headers, whose endpoint is in edge_rnat6 and whose connection
 * edge_ct6 pins to that backend gets the VIP back as its source address and
 * port (the L4 checksum through the kernel's helpers, which know partial
 * checksums), its SYN-ACK or RST is noted for passive detection, and it is
 * redirected towards the client by the FIB result cached per (client, VIP)
 * (hop6.h). A TCP packet of a connection edge_ct6
 * gives to another backend is dropped (EDGE_DROP_OTHER_BACKEND), so it never
 * leaves with the backend's address, as is a UDP reply with checksum 0
 * (malformed: IPv6 forbids it, and the helpers would keep it 0); everything else continues untouched,
 * neighbour discovery above all. Heartbeats of IPv6 backends are consumed
 * first (heartbeat6.h). A SYN-ACK or RST finds a half-open connection's
 * entry too; a reply with no entry is reverse-NATed when the Maglev table
 * gives its flow to the sender, unless its connection is a direct one; a
 * direct connection's SYN-ACK on a VIP flow's port is left alone and the
 * stale entry goes (state6.h). Wire signals: wire6.h. ICMPv6 errors about
 * VIP flows: icmp6.h. */
#ifndef EDGE_RETURN6_H
#define EDGE_RETURN6_H

#include <uapi/linux/ipv6.h>
#include "maps.h"
#include "health.h"
#include "stats.h"
#include "stateless.h"
#include "nat.h"
#include "hop6.h"
#include "icmp6.h"
#include "heartbeat6.h"
#include "state6.h"
#include "wire6.h"
#include "rnat6.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif

/* Passive detection of an IPv6 flow: as edge_tc.c's classify_answer for
 * the exact answer (ack = seq + 1) to the SYN it waits for. */
static __always_inline void note_answer6(struct flow_info *fi, const struct rnat_info6 *ri, __u8 flags,
					 __be32 ack_seq)
{
	int syn_ack = (flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == (TCP_FLAG_SYN_ | TCP_FLAG_ACK_);
	__u32 bid = ri->backend_id, vid = ri->vip_id;
	struct backend_info *be;
	struct service_cfg *sc;

	if (!(fi->flags & EDGE_CT_F_SYN_PENDING) || !(flags & TCP_FLAG_ACK_) ||
	    bpf_ntohl(ack_seq) != bpf_ntohl(fi->syn_seq) + 1 || !(syn_ack || (flags & TCP_FLAG_RST_)))
		return;
	ct_flags_clear(fi, EDGE_CT_F_SYN_PENDING); /* wire.h: atomic */
	be = edge_backends.lookup(&bid);
	sc = edge_svc_cfg.lookup(&vid);
	if (be && sc && (sc->flags & EDGE_SVC_F_PASSIVE))
		note_syn_answer(be, sc, syn_ack, bpf_ktime_get_ns());
}

/* Sends a reverse-NATed reply from vip to its client: the cached FIB result
 * (hop6.h), hop limit - 1, MACs, bpf_redirect; with no neighbour entry yet,
 * bpf_redirect_neigh. Anything else the stack takes (TC_ACT_OK). */
static __always_inline int reply_out6(struct __sk_buff *skb, __u32 l3_off, __u32 vid, const struct addr6 *client,
				      const struct addr6 *vip, __u8 proto)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct bpf_fib_lookup fib; /* filled by reply_hop6_at on a cache miss */
	struct reply_hop6 *hop = NULL;
	int rc;

	if (l3_off != sizeof(*eth) || (void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1)
		return TC_ACT_OK;
	rc = reply_hop6_at(skb, skb->ingress_ifindex, skb->len, skb->gso_size, client, vip, proto, &fib, &hop);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end)
		return TC_ACT_OK;
	ip6->hop_limit--;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH || !hop) {
		struct bpf_redir_neigh nb = {};

		nb.nh_family = AF_INET6;
		__builtin_memcpy(nb.ipv6_nh, fib.ipv6_dst, 16); /* the gateway, or the client */
		return count_verdict(vid, EDGE_CNT_RETURN_REDIRECT, redirect_neigh(fib.ifindex, &nb, sizeof(nb), 0));
	}
	set_macs(eth, hop->dmac, hop->smac);
	return count_verdict(vid, EDGE_CNT_RETURN_REDIRECT, bpf_redirect(hop->ifindex, 0));
}

/* The return path of an IPv6 frame whose IPv6 header starts at l3_off;
 * the tc verdict. */
static __always_inline int return6(struct __sk_buff *skb, __u32 l3_off)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + (l3_off & 0x1f);
	struct backend_key6 rk = {};
	struct flow_key6 fk = {};
	struct rnat_info6 *ri;
	struct half_open *ho;
	struct flow_info *fi;
	__u32 l4_off = l3_off + sizeof(*ip6);
	__be16 *ports;
	__u8 proto, tcp_flags = 0;
	__be32 ack_seq = 0;

	if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
		return TC_ACT_UNSPEC;
	proto = ip6->nexthdr;
	if (proto == IPPROTO_ICMPV6) { /* icmp6.h: a backend's error about a client's packet */
		struct addr6 client, vip;
		int vid = icmp6_return(skb, l3_off, &client, &vip);

		return vid < 0 ? TC_ACT_UNSPEC : reply_out6(skb, l3_off, vid, &client, &vip, IPPROTO_ICMPV6);
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return TC_ACT_UNSPEC; /* extension headers */
	ports = (void *)(ip6 + 1);
	if ((void *)(ports + 2) > data_end)
		return TC_ACT_UNSPEC;
	if (proto == IPPROTO_UDP) { /* heartbeat6.h */
		int hb = consume_heartbeat6(skb, ip6, l4_off + sizeof(struct udphdr), ports[1]);

		if (hb != TC_ACT_UNSPEC)
			return hb;
	}
	if (proto == IPPROTO_TCP) {
		__u8 *th = (void *)ports;

		if ((void *)(th + 14) > data_end)
			return TC_ACT_UNSPEC;
		tcp_flags = th[13];
		if ((tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == TCP_FLAG_SYN_) {
			__builtin_memcpy(&fk.src, &ip6->saddr, sizeof(fk.src));
			__builtin_memcpy(&fk.dst, &ip6->daddr, sizeof(fk.dst));
			fk.sport = ports[0];
			fk.dport = ports[1];
			fk.proto = IPPROTO_TCP;
			direct_syn6(&fk);     /* state6.h */
			return TC_ACT_UNSPEC; /* a connection opened from this side: no reply */
		}
	}
	__builtin_memcpy(&rk.addr, &ip6->saddr, sizeof(rk.addr));
	rk.port = ports[0];
	rk.proto = proto;
	ri = edge_rnat6.lookup(&rk);
	if (!ri)
		return TC_ACT_UNSPEC;
	__builtin_memcpy(&fk.src, &ip6->daddr, sizeof(fk.src));
	fk.dst = ri->vip_addr;
	fk.sport = ports[1];
	fk.dport = ri->vip_port;
	fk.proto = proto;
	fi = reply_entry6(&fk, tcp_flags, &ho); /* state6.h: edge_ct6, or a SYN-ACK's half-open entry */
	if (!fi) {
		/* the router's own probes, direct connections: untouched (state6.h) */
		if (!stateless_reply6(skb, &fk, &rk, ri, tcp_flags))
			return TC_ACT_UNSPEC;
	} else if (fi->backend_id != ri->backend_id) {
		if (proto != IPPROTO_TCP || is_direct6(&fk, &rk))
			return TC_ACT_UNSPEC;
		count_reason(ri->vip_id, EDGE_DROP_OTHER_BACKEND);
		return TC_ACT_SHOT;
	} else if (proto == IPPROTO_TCP && direct_answer6(skb, fi, &fk, &rk, ho, tcp_flags, l4_off)) {
		return TC_ACT_UNSPEC; /* state6.h: a direct connection's SYN-ACK; the stale entry went */
	}
	/* a UDP checksum of 0: invalid in IPv6 (RFC 8200 8.1), never sent as the VIP's */
	if (proto == IPPROTO_UDP && (void *)(ports + 4) <= data_end && !ports[3]) {
		count_reason(ri->vip_id, EDGE_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (fi && proto == IPPROTO_TCP && (tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_RST_))) {
		bpf_skb_load_bytes(skb, l4_off + 8, &ack_seq, sizeof(ack_seq));
		note_answer6(fi, ri, tcp_flags, ack_seq);
		if (ho)
			half_open6_answered(skb, ho, l4_off, tcp_flags); /* state6.h */
	}
	rnat6(skb, l3_off, proto, &rk.addr, rk.port, &fk.src, &ri->vip_addr, ri->vip_port);
	wire6_reply(skb, fi, ri->backend_id, proto, tcp_flags, l4_off);
	count_return(ri->vip_id, ri->backend_id);
	count_index(ri->vip_id, EDGE_CNT_RETURN_NAT);
	return reply_out6(skb, l3_off, ri->vip_id, &fk.src, &ri->vip_addr, proto);
}

#endif /* EDGE_RETURN6_H */
