/* SPDX-License-Identifier: Apache-2.0 */
/* icmp6.h: ICMPv6 errors about IPv6 VIP flows, IPv6's twin of icmp.h. Path
 * MTU discovery needs them more than IPv4 does: IPv6 routers never fragment,
 * so a hop that cannot carry a backend's segments answers each with "packet
 * too big" to their source, the VIP, and only the backend can act on it.
 *
 * Forward (XDP, edge_ingress6_scan, which edge_ingress6 tail-calls for
 * ICMPv6 errors and echo requests: the slow program has less verifier room
 * left; called from ingress6.h): an ICMPv6
 * destination-unreachable, packet-too-big or time-exceeded to a VIP address
 * whose quoted packet is one from that VIP (the reply direction of a VIP
 * flow) goes to the backend edge_ct6 names for the flow, or with no entry
 * the backend of its first Maglev pick, translated as the flow is: outer
 * destination, quoted source address and port, the quoted TCP or UDP
 * checksum when the quote holds it, and the ICMPv6 checksum (its
 * pseudo-header holds the outer destination). ingress6.h forwards it as the
 * flow's packets (forward6). An error about a DSR service's flow is not
 * translated: the backend has the VIP on lo, so it goes to the backend
 * unchanged in IPv6-in-IPv6 (encap6.h, dsr_forward6), as icmp.h sends
 * IPv4's, counted icmp_to_backend and dsr. Cut short, quoting ICMPv6 (nested), quoting
 * extension headers (a VIP's packets never carry any: return6.h sends only
 * TCP and UDP right after the IPv6 header) or naming no flow: dropped with
 * icmp.h's reasons, under no service. Every other ICMPv6 message passes,
 * neighbour discovery above all.
 *
 * Return (tc, return6.h): an ICMPv6 error a backend sends about a client's
 * packet (the quoted destination is the backend's endpoint of a VIP flow
 * edge_ct6 pins to it) gets the VIP back as outer source and quoted
 * destination address and port, checksums to match, and is sent to the
 * client as replies are (reply_out6). edge_reply (XDP, reply6.h) passes
 * ICMPv6 to tc, as edge_reply.c does IPv4's ICMP: errors are rare, and tc's
 * helpers know partial checksums.
 *
 * Echo requests to an IPv6 VIP address are answered in XDP from the VIP
 * (icmp6_echo), as icmp.h answers IPv4's, unless node.answer_ping is off.
 *
 * Both directions read and write the message with the load/store helpers,
 * not packet pointers: the ICMPv6 header's offset depends on the extension
 * headers before it, which the verifier follows better as a helper's
 * argument. Counters are icmp.h's: icmp_to_backend, icmp_return and the
 * icmp_* drop reasons, shared by both families. */
#ifndef EDGE_ICMP6_H
#define EDGE_ICMP6_H

#include <uapi/linux/ipv6.h>
#include "maps.h"
#include "csum.h"
#include "flow.h"
#include "stats.h"
#include "hop6.h"

#define ICMP6_DST_UNREACH  1
#define ICMP6_PKT_TOOBIG   2
#define ICMP6_TIME_EXCEED  3
#define ICMP6_ECHO_REQUEST 128
#define ICMP6_ECHO_REPLY   129
#define ECHO6_HOP_LIMIT	   64	/* of an echo reply from a VIP, as Linux's default */
#define EDGE_ICMP6_DSR	   (-4) /* icmp6_ingress: an error about a DSR flow, to encapsulate */

/* What an ICMPv6 error starts with: its header, then the offending packet
 * (as much as fits in 1,280 bytes), here its IPv6 header and first 8 bytes. */
struct icmp6_err {
	__u8 type;
	__u8 code;
	__u16 check;
	__be32 data; /* packet too big: the MTU */
	struct ipv6hdr inner;
	__be16 sport;
	__be16 dport;
	__be32 l4_rest;
};

/* 1 for the types that quote a packet and mean something to its sender. */
static __always_inline int icmp6_is_error(__u8 type)
{
	return type == ICMP6_DST_UNREACH || type == ICMP6_PKT_TOOBIG || type == ICMP6_TIME_EXCEED;
}

/* 1 for the types icmp6_ingress looks at: errors and echo requests. The
 * ingress (ingress6.h) passes every other one without a lookup: neighbour
 * discovery above all. */
static __always_inline int icmp6_taken(__u8 type)
{
	return icmp6_is_error(type) || type == ICMP6_ECHO_REQUEST;
}

/* The quoted packet of an ICMPv6 error: 0 when it is TCP or UDP right after
 * its IPv6 header; EDGE_DROP_ICMP_NESTED for quoted ICMPv6;
 * EDGE_DROP_ICMP_MALFORMED else (extension headers included). */
static __always_inline __u32 icmp6_quote(const struct ipv6hdr *in)
{
	if (in->version != 6)
		return EDGE_DROP_ICMP_MALFORMED;
	if (in->nexthdr == IPPROTO_ICMPV6)
		return EDGE_DROP_ICMP_NESTED;
	if (in->nexthdr != IPPROTO_TCP && in->nexthdr != IPPROTO_UDP)
		return EDGE_DROP_ICMP_MALFORMED;
	return 0;
}

/* The checksum change of an address a -> b, unfolded (below 2^20). */
static __always_inline __u32 icmp6_addr_delta(const struct addr6 *a, const struct addr6 *b)
{
	return csum_fold(csum_delta32(a->w[0], b->w[0]) + csum_delta32(a->w[1], b->w[1]) +
			 csum_delta32(a->w[2], b->w[2]) + csum_delta32(a->w[3], b->w[3]));
}

/* Offset of the TCP or UDP checksum from the start of its header. */
static __always_inline __u32 icmp6_l4_check_off(__u8 proto)
{
	return proto == IPPROTO_TCP ? 16 : 6;
}

/* The quoted TCP or UDP checksum after a change of delta (its pseudo-header
 * and port); a UDP checksum of 0 (none: not valid in IPv6, left as it is)
 * stays 0, one computing to 0 becomes 0xffff. */
static __always_inline __u16 icmp6_quoted_check(__u16 check, __u32 delta, __u8 proto)
{
	__u16 c;

	if (proto == IPPROTO_UDP && !check)
		return 0;
	c = csum_apply(check, delta);
	return (proto == IPPROTO_UDP && !c) ? 0xffff : c;
}

/* Backend id of the IPv6 VIP flow k (client -> VIP) from edge_ct6, or from
 * the VIP's active Maglev table when edge_ct6 has none (the first pick, as
 * icmp.h's icmp_flow_backend; the flow hash is ingress6.h's, over the folded
 * addresses); EDGE_NO_BACKEND when no service has that VIP, port and
 * protocol. */
static __always_inline __u32 icmp6_flow_backend(struct flow_key6 *k)
{
	struct flow_info *fi = edge_ct6.lookup(k);
	struct vip_key6 vk = {};
	struct flow_key f = {};
	struct vip_info *vip;
	__u32 *id;

	if (fi)
		return fi->backend_id;
	vk.addr = k->dst;
	vk.port = k->dport;
	vk.proto = k->proto;
	vip = edge_vips6.lookup(&vk);
	if (!vip || vip->id >= EDGE_MAX_SERVICES)
		return EDGE_NO_BACKEND;
	f.src = k->src.w[0] ^ k->src.w[1] ^ k->src.w[2] ^ k->src.w[3];
	f.dst = k->dst.w[0] ^ k->dst.w[1] ^ k->dst.w[2] ^ k->dst.w[3];
	f.sport = k->sport;
	f.dport = k->dport;
	f.proto = k->proto;
	id = maglev_slot(maglev_index(maglev_base(vip), hash_flow(&f)));
	return id ? *id : EDGE_NO_BACKEND;
}

/* 1 when be's service forwards by direct server return (encap6.h). */
static __always_inline int icmp6_dsr(const struct backend_info *be)
{
	__u32 vid = be->vip_id;
	struct service_cfg *sc = edge_svc_cfg.lookup(&vid);

	return sc && (sc->flags & EDGE_SVC_F_DSR);
}

/* 1 when addr may be answered: neither :: nor multicast (ff00::/8). */
static __always_inline int icmp6_unicast_src(const struct addr6 *addr)
{
	return (addr->w[0] | addr->w[1] | addr->w[2] | addr->w[3]) && ((const __u8 *)addr)[0] != 0xff;
}

/* XDP: an echo request to a VIP address (ICMPv6 header at frame offset l4,
 * right after the IPv6 header ip6), answered in place from the VIP as
 * icmp.h's icmp_echo does for IPv4: MACs and addresses swapped (the
 * checksum's pseudo-header sums both: unchanged), hop limit 64, type echo
 * reply and the checksum with it, back out of the interface it came in on.
 * With node.answer_ping off, a code other than 0, extension headers (a
 * routing header would not read backwards) or a source that is :: or
 * multicast: to the stack, as before. */
static __always_inline int icmp6_echo(struct xdp_md *ctx, struct ipv6hdr *ip6, __u32 l4, struct icmp6_err *e)
{
	struct ethhdr *eth = (void *)(long)ctx->data;
	__u32 zero = 0;
	struct node_info *node = edge_node.lookup(&zero);
	struct addr6 client;
	__u8 mac[ETH_ALEN];

	__builtin_memcpy(&client, &ip6->saddr, sizeof(client));
	if ((node && (node->flags & EDGE_NODE_F_NO_ECHO)) || e->code || ip6->nexthdr != IPPROTO_ICMPV6 ||
	    !icmp6_unicast_src(&client))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_MALFORMED);
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	__builtin_memcpy(&ip6->saddr, &ip6->daddr, sizeof(client));
	__builtin_memcpy(&ip6->daddr, &client, sizeof(client));
	ip6->hop_limit = ECHO6_HOP_LIMIT;
	e->type = ICMP6_ECHO_REPLY;
	e->check = csum_replace16(e->check, bpf_htons(ICMP6_ECHO_REQUEST << 8), bpf_htons(ICMP6_ECHO_REPLY << 8));
	bpf_xdp_store_bytes(ctx, l4, e, 4);
	return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_ICMP_ECHO, bpf_redirect(ctx->ingress_ifindex, 0));
}

/* XDP: an ICMPv6 message (header at frame offset l4, after the IPv6 header
 * at l3) arriving on the client side. Returns EDGE_CONTINUE when it was an
 * error about a VIP flow, now translated to backend *bid of service *vid for
 * ingress6.h to forward; EDGE_ICMP6_DSR when that flow's service forwards by
 * DSR: untouched, for ingress6.h to encapsulate to *bid as the flow's
 * packets go (the backend's socket is bound to the VIP, so only the error
 * as the hop sent it matches it); else the verdict. */
static __always_inline int icmp6_ingress(struct xdp_md *ctx, __u32 l3, __u32 l4, __u32 *bid, __u32 *vid)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + (l3 & 0x1f);
	struct backend_info *be;
	struct flow_key6 k = {};
	struct icmp6_err e;
	struct addr6 *to, vip;
	__u32 why, addr, delta, coff;
	__u16 check, quoted;

	if ((void *)(ip6 + 1) > data_end)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_MALFORMED);
	__builtin_memcpy(&vip, &ip6->daddr, sizeof(vip));
	if (!edge_vip_addrs6.lookup(&vip))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if (bpf_xdp_load_bytes(ctx, l4, &e, 4) < 0)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_MALFORMED);
	if (e.type != ICMP6_ECHO_REQUEST && !icmp6_is_error(e.type))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if (e.type == ICMP6_ECHO_REQUEST)
		return icmp6_echo(ctx, ip6, l4, &e);
	if (bpf_xdp_load_bytes(ctx, l4, &e, sizeof(e)) < 0)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_MALFORMED);
	why = icmp6_quote(&e.inner);
	if (why)
		return count_drop(EDGE_NO_SERVICE, why);
	if (!addr6_eq((struct addr6 *)&e.inner.saddr, &vip)) /* not about a packet from this VIP */
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_MALFORMED);
	if (ip6->hop_limit <= 1) /* the stack answers it with time exceeded */
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	__builtin_memcpy(&k.src, &e.inner.daddr, sizeof(k.src));
	k.dst = vip;
	k.sport = e.dport;
	k.dport = e.sport;
	k.proto = e.inner.nexthdr;
	*bid = icmp6_flow_backend(&k);
	be = edge_backends.lookup(bid);
	to = edge_backends6.lookup(bid);
	if (!be || !(be->flags & EDGE_BE_F_VALID) || !to)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_ICMP_NO_FLOW);
	*vid = be->vip_id;
	count_index(be->vip_id, EDGE_CNT_ICMP_TO_BACKEND);
	if (icmp6_dsr(be)) /* the backend holds the VIP: the error goes as it is (encap6.h) */
		return EDGE_ICMP6_DSR;

	addr = icmp6_addr_delta(&vip, to);
	delta = addr + csum_delta16(e.sport, be->port); /* the quoted packet's */
	coff = l4 + sizeof(e) - 8 + icmp6_l4_check_off(k.proto);
	if (bpf_xdp_load_bytes(ctx, coff, &check, sizeof(check)) == 0) {
		quoted = icmp6_quoted_check(check, delta, k.proto);
		bpf_xdp_store_bytes(ctx, coff, &quoted, sizeof(quoted));
		delta += csum_delta16(check, quoted);
	}
	e.check = csum_apply(e.check, addr + delta); /* addr: the pseudo-header's destination */
	__builtin_memcpy(&e.inner.saddr, to, sizeof(*to));
	e.sport = be->port;
	bpf_xdp_store_bytes(ctx, l4, &e, sizeof(e) - 4);
	bpf_xdp_store_bytes(ctx, (l3 & 0x1f) + offsetof(struct ipv6hdr, daddr), to, sizeof(*to));
	return EDGE_CONTINUE;
}

/* tc: an ICMPv6 message (after the IPv6 header at l3, no extension headers)
 * from a backend. An error quoting a client's packet to that backend's
 * endpoint of a VIP flow edge_ct6 pins to it gets the VIP back as outer
 * source and quoted destination address and port, every checksum with them,
 * and counts icmp_return: returns the service's id, with the client's and
 * the VIP's addresses, for return6.h to send it as a reply. Anything else,
 * -1: left untouched (neighbour discovery, the backend's own traffic). */
static __always_inline int icmp6_return(struct __sk_buff *skb, __u32 l3, struct addr6 *client, struct addr6 *vip)
{
	__u32 l4 = l3 + sizeof(struct ipv6hdr), ic = l4 + 2, in = l4 + 8, coff, i;
	struct icmp6_err e;
	struct backend_key6 rk = {};
	struct flow_key6 fk = {};
	struct rnat_info6 *ri;
	struct flow_info *fi;
	struct addr6 outer;
	__u32 delta;
	__u16 check, quoted;

	if (bpf_skb_load_bytes(skb, l4, &e, sizeof(e)) < 0 || !icmp6_is_error(e.type) || icmp6_quote(&e.inner) ||
	    bpf_skb_load_bytes(skb, l3 + offsetof(struct ipv6hdr, saddr), &outer, sizeof(outer)) < 0 ||
	    !addr6_eq((struct addr6 *)&e.inner.daddr, &outer))
		return -1;
	rk.addr = outer;
	rk.port = e.dport;
	rk.proto = e.inner.nexthdr;
	ri = edge_rnat6.lookup(&rk);
	if (!ri)
		return -1;
	__builtin_memcpy(&fk.src, &e.inner.saddr, sizeof(fk.src));
	fk.dst = ri->vip_addr;
	fk.sport = e.sport;
	fk.dport = ri->vip_port;
	fk.proto = rk.proto;
	fi = edge_ct6.lookup(&fk);
	if (!fi || fi->backend_id != ri->backend_id)
		return -1;

	delta = icmp6_addr_delta(&outer, &ri->vip_addr) + csum_delta16(rk.port, ri->vip_port);
	coff = in + sizeof(struct ipv6hdr) + icmp6_l4_check_off(rk.proto);
	if (bpf_skb_load_bytes(skb, coff, &check, sizeof(check)) == 0) {
		quoted = icmp6_quoted_check(check, delta, rk.proto);
		bpf_skb_store_bytes(skb, coff, &quoted, sizeof(quoted), 0);
		delta += csum_delta16(check, quoted);
	}
	/* the quoted packet's changes (a precomputed difference: size 0), then
	 * the pseudo-header's source word by word */
	bpf_l4_csum_replace(skb, ic, 0, delta, 0);
#pragma unroll
	for (i = 0; i < 4; i++)
		bpf_l4_csum_replace(skb, ic, outer.w[i], ri->vip_addr.w[i], BPF_F_PSEUDO_HDR | sizeof(__be32));
	bpf_skb_store_bytes(skb, in + offsetof(struct ipv6hdr, daddr), &ri->vip_addr, sizeof(ri->vip_addr), 0);
	bpf_skb_store_bytes(skb, in + sizeof(struct ipv6hdr) + 2, &ri->vip_port, sizeof(ri->vip_port), 0);
	bpf_skb_store_bytes(skb, l3 + offsetof(struct ipv6hdr, saddr), &ri->vip_addr, sizeof(ri->vip_addr), 0);
	count_index(ri->vip_id, EDGE_CNT_ICMP_RETURN);
	*client = fk.src;
	*vip = ri->vip_addr;
	return ri->vip_id;
}

#endif /* EDGE_ICMP6_H */
