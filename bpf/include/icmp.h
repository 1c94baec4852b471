/* SPDX-License-Identifier: Apache-2.0 */
/* icmp.h: ICMP errors about VIP flows (IPv4). Path MTU discovery needs them:
 * a hop between the router and a client that cannot carry a backend's
 * segments sends "fragmentation needed" to their source, the VIP, and only
 * the backend can act on it.
 *
 * Forward (XDP, edge_xdp.c): an ICMP destination-unreachable or
 * time-exceeded to a VIP address whose quoted header is a packet from that
 * VIP (the reply direction of a VIP flow) goes to the backend conntrack
 * names for the flow, or with no entry the backend of its Maglev slot,
 * translated as the flow is: outer destination, quoted source address and
 * port, and the outer IP, ICMP and quoted IP checksums (the quoted L4
 * checksum is left as it is, as the kernel's own NAT leaves it). Cut short,
 * nested (quoting ICMP) or naming no flow: dropped with its reason.
 *
 * Return (tc, edge_tc.c): an ICMP error a backend sends about a client's
 * packet (the quoted destination is the backend's endpoint of a VIP flow)
 * gets the VIP back as outer source and quoted destination address and
 * port, and is sent to the client as replies are (icmp_out). For a service with direct server
 * return the error goes to the backend encapsulated as it is (encap.h): the
 * backend's socket is the VIP's.
 *
 * Echo requests to a VIP address are answered in XDP from the VIP (icmp_echo,
 * Katran does the same), unless node.answer_ping is off.
 *
 * Family-specific parsing is in icmp4_quote (parse.h style); an IPv6 twin
 * would add icmp6_quote and share the rest. */
#ifndef EDGE_ICMP_H
#define EDGE_ICMP_H

#include <uapi/linux/icmp.h>
#include "csum.h"
#include "flow.h"
#include "nat.h"
#include "stats.h"
#include "encap.h"

#define ECHO_TTL 64 /* of an echo reply from a VIP, as Linux's default */

/* What an ICMP error quotes: the first 28 bytes of the offending packet. */
struct icmp4_err {
	struct icmphdr icmp;
	struct iphdr inner;
	__be16 sport;
	__be16 dport;
	__be32 l4_rest;
};

/* 1 for the types that quote a packet and mean something to its sender. */
static __always_inline int icmp4_is_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED;
}

/* The quoted header of an ICMP error: 0 when it is a TCP or UDP packet with
 * a 20-byte header and its ports (no options, not a later fragment);
 * EDGE_DROP_ICMP_NESTED for quoted ICMP; EDGE_DROP_ICMP_MALFORMED else. */
static __always_inline __u32 icmp4_quote(const struct iphdr *in)
{
	if (in->version != 4 || in->ihl != 5 || (in->frag_off & bpf_htons(IP_OFFSET)))
		return EDGE_DROP_ICMP_MALFORMED;
	if (in->protocol == IPPROTO_ICMP)
		return EDGE_DROP_ICMP_NESTED;
	if (in->protocol != IPPROTO_TCP && in->protocol != IPPROTO_UDP)
		return EDGE_DROP_ICMP_MALFORMED;
	return 0;
}

/* Backend id of the VIP flow k (client -> VIP) from conntrack, or from the
 * VIP's active Maglev table when conntrack has none; EDGE_NO_BACKEND when
 * no service has that VIP, address, port and protocol. */
static __always_inline __u32 icmp_flow_backend(struct flow_key *k)
{
	struct flow_info *fi = edge_ct.lookup(k);
	struct vip_key vk = {};
	struct vip_info *vip;
	__u32 idx, *id;

	if (fi)
		return fi->backend_id;
	vk.addr = k->dst;
	vk.port = k->dport;
	vk.proto = k->proto;
	vip = edge_vips.lookup(&vk);
	if (!vip || vip->id >= EDGE_MAX_SERVICES)
		return EDGE_NO_BACKEND;
	idx = maglev_index(maglev_base(vip), hash_flow(k));
	id = maglev_slot(idx); /* two slots a value (abi.h, maglev_slots) */
	return id ? *id : EDGE_NO_BACKEND;
}

/* 1 when be's service forwards by direct server return (encap.h). */
static __always_inline int icmp_dsr(const struct backend_info *be)
{
	__u32 vid = be->vip_id;
	struct service_cfg *sc = edge_svc_cfg.lookup(&vid);

	return sc && (sc->flags & EDGE_SVC_F_DSR);
}

/* Rewrites the ICMP error e (to VIP, quoting VIP -> client) for backend be:
 * one checksum delta per header. */
static __always_inline void icmp4_to_backend(struct iphdr *iph, struct icmp4_err *e,
					     const struct backend_info *be)
{
	__u32 addr = csum_delta32(e->inner.saddr, be->addr);
	__u16 inner_check = csum_apply(e->inner.check, addr);

	e->icmp.checksum = csum_apply(e->icmp.checksum,
				      addr + csum_delta16(e->sport, be->port) +
					      csum_delta16(e->inner.check, inner_check));
	e->inner.check = inner_check;
	e->inner.saddr = be->addr;
	e->sport = be->port;
	iph->check = csum_replace32(iph->check, iph->daddr, be->addr);
	iph->daddr = be->addr;
}

/* 1 when addr may be answered: not 0.0.0.0, multicast, class E or
 * broadcast (first byte 224 and above), which an echo reply must not go to. */
static __always_inline int icmp_unicast_src(__be32 addr)
{
	__u8 first = ((const __u8 *)&addr)[0];

	return addr && first < 224;
}

/* XDP: an echo request (e, whole in the frame) to a VIP address, answered
 * in place from the VIP, as the VIP's owner would: MACs and addresses
 * swapped, TTL 64, type echo reply, both checksums updated, back out of
 * the interface it came in on (a VLAN tag stays). A redirect to that
 * interface, not XDP_TX: on veth (kernel 6.18) XDP_TX of a frame that came
 * from the peer's stack was counted sent and never arrived, where the
 * redirect arrives (netns-tests/test_icmp_echo.py). With
 * node.answer_ping off (EDGE_NODE_F_NO_ECHO), or a code other than 0, a
 * source that is no unicast address: to the stack, as before (it answers
 * a VIP on lo itself). The ICMP checksum is not verified: updated
 * incrementally, a wrong one stays wrong and the sender drops the reply. */
static __always_inline int icmp_echo(struct xdp_md *ctx, struct iphdr *iph, struct icmphdr *icmp)
{
	struct ethhdr *eth = (void *)(long)ctx->data;
	__u32 zero = 0;
	struct node_info *node = edge_node.lookup(&zero);
	__u8 mac[ETH_ALEN];
	__be16 old_ttl = *(__be16 *)&iph->ttl;
	__be32 addr = iph->saddr;

	if ((node && (node->flags & EDGE_NODE_F_NO_ECHO)) || icmp->code || !icmp_unicast_src(addr))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if (!ipv4_csum_ok(iph))
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_BAD_CSUM);
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_MALFORMED);
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	iph->saddr = iph->daddr; /* a swap: the header's sum stays */
	iph->daddr = addr;
	iph->ttl = ECHO_TTL;
	iph->check = csum_replace16(iph->check, old_ttl, *(__be16 *)&iph->ttl);
	icmp->type = ICMP_ECHOREPLY;
	icmp->checksum = csum_replace16(icmp->checksum, bpf_htons(ICMP_ECHO << 8), bpf_htons(ICMP_ECHOREPLY << 8));
	return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_ICMP_ECHO, bpf_redirect(ctx->ingress_ifindex, 0));
}

/* XDP: an ICMP packet (pkt->iph: a 20-byte header, not a fragment, whole in
 * the frame) arriving on the client side. Not to a VIP address, or neither
 * an error nor an echo request: to the stack, as before. An echo request is
 * answered (icmp_echo). An error about a VIP flow
 * goes to its backend (forward, nat.h). */
static __always_inline int icmp_ingress(struct xdp_md *ctx, struct pkt *pkt)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *iph = pkt->iph;
	struct icmp4_err *e = (void *)(iph + 1);
	struct backend_info *be;
	struct flow_key k = {};
	__u32 bid, why;

	if ((void *)(iph + 1) > data_end || !edge_vip_addrs.lookup(&iph->daddr))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if ((void *)&e->icmp + sizeof(e->icmp) > data_end)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_MALFORMED);
	if (e->icmp.type == ICMP_ECHO)
		return icmp_echo(ctx, iph, &e->icmp);
	if (!icmp4_is_error(e->icmp.type))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if ((void *)(e + 1) > data_end)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_MALFORMED);
	why = icmp4_quote(&e->inner);
	if (why)
		return count_drop(EDGE_NO_SERVICE, why);
	if (e->inner.saddr != iph->daddr) /* not about a packet from this VIP */
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_MALFORMED);
	if (!ipv4_csum_ok(iph))
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_BAD_CSUM);
	if (iph->ttl <= 1)
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	k.src = e->inner.daddr;
	k.dst = e->inner.saddr;
	k.sport = e->dport;
	k.dport = e->sport;
	k.proto = e->inner.protocol;
	bid = icmp_flow_backend(&k);
	be = edge_backends.lookup(&bid);
	if (!be || !(be->flags & EDGE_BE_F_VALID))
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_NO_FLOW);
	count_index(be->vip_id, EDGE_CNT_ICMP_TO_BACKEND);
	if (icmp_dsr(be)) /* the backend's socket is the VIP's: the error goes as it is */
		return dsr_forward(ctx, pkt, be, bid);
	icmp4_to_backend(iph, e, be);
	return forward(ctx, pkt, be->vip_id, bid);
}

/* tc: an ICMP error from vip (translated: icmp_return) on its way to the
 * client, the way replies go (nat.h, reply_send): redirected, not through
 * the stack, which drops a packet from a VIP that is a local address (on
 * lo) as a martian. With a VLAN tag or IPv4 options, an expiring TTL, no
 * route: to the stack, as before. Counted as icmp_return either way. */
static __always_inline int icmp_out(struct __sk_buff *skb, __u32 l3_off, __be32 vip, __u32 vid)
{
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *iph = (void *)(long)skb->data + sizeof(struct ethhdr);
	struct bpf_fib_lookup fib; /* filled by reply_hop on a cache miss */
	struct reply_hop *hop = NULL;
	int rc;

	if (l3_off != sizeof(struct ethhdr) || (void *)(iph + 1) > data_end || iph->ttl <= 1)
		return count_verdict(vid, EDGE_CNT_ICMP_RETURN, TC_ACT_OK);
	rc = reply_hop(skb, iph, vip, &fib, &hop);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return count_verdict(vid, EDGE_CNT_ICMP_RETURN, TC_ACT_OK);
	return reply_send(skb, rc, &fib, hop, vid, EDGE_CNT_ICMP_RETURN);
}

/* tc: the return path's part. An ICMP error from a backend (outer source)
 * quoting a client's packet to that backend's endpoint of a VIP flow that
 * conntrack pins to it: the VIP goes back in as outer source and as the
 * quoted destination address and port. TC_ACT_UNSPEC leaves everything
 * else (the backend's own traffic, direct connections) untouched. */
static __always_inline int icmp_return(struct __sk_buff *skb, struct iphdr *iph, __u32 l3_off,
				       __u32 l4_off)
{
	__u32 ic = l4_off + offsetof(struct icmphdr, checksum);
	__u32 in = l4_off + sizeof(struct icmphdr);
	struct icmp4_err e;
	struct backend_key rk = {};
	struct flow_key fk = {};
	struct rnat_info *ri;
	struct flow_info *fi;
	__be32 saddr = iph->saddr;
	__u16 check;

	if (bpf_skb_load_bytes(skb, l4_off, &e, sizeof(e)) < 0 || !icmp4_is_error(e.icmp.type) ||
	    icmp4_quote(&e.inner) || e.inner.daddr != saddr)
		return TC_ACT_UNSPEC;
	rk.addr = e.inner.daddr;
	rk.port = e.dport;
	rk.proto = e.inner.protocol;
	ri = edge_rnat.lookup(&rk);
	if (!ri)
		return TC_ACT_UNSPEC;
	fk.src = e.inner.saddr;
	fk.dst = ri->vip_addr;
	fk.sport = e.sport;
	fk.dport = ri->vip_port;
	fk.proto = rk.proto;
	fi = edge_ct.lookup(&fk);
	if (!fi || fi->backend_id != ri->backend_id)
		return TC_ACT_UNSPEC;
	check = csum_replace32(e.inner.check, rk.addr, ri->vip_addr);
	bpf_l4_csum_replace(skb, ic, rk.addr, ri->vip_addr, sizeof(rk.addr));
	bpf_l4_csum_replace(skb, ic, rk.port, ri->vip_port, sizeof(rk.port));
	bpf_l4_csum_replace(skb, ic, e.inner.check, check, sizeof(check));
	bpf_skb_store_bytes(skb, in + offsetof(struct iphdr, check), &check, sizeof(check), 0);
	bpf_skb_store_bytes(skb, in + offsetof(struct iphdr, daddr), &ri->vip_addr,
			    sizeof(ri->vip_addr), 0);
	bpf_skb_store_bytes(skb, in + sizeof(struct iphdr) + 2, &ri->vip_port,
			    sizeof(ri->vip_port), 0);
	bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), saddr, ri->vip_addr,
			    sizeof(saddr));
	bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, saddr), &ri->vip_addr,
			    sizeof(ri->vip_addr), 0);
	return icmp_out(skb, l3_off, ri->vip_addr, ri->vip_id);
}

#endif /* EDGE_ICMP_H */
