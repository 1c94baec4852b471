/* SPDX-License-Identifier: Apache-2.0 */
/* ingress6.h: the IPv6 ingress, a program of its own (edge_ingress6), which
 * edge_ingress tail-calls (edge_tails[EDGE_TAIL_V6]) for every IPv6 frame
 * once it has read the EtherType, so IPv4 pays nothing for it. It parses
 * the IPv6 header and walks at most EDGE_V6_EXT_MAX extension headers
 * (hop-by-hop, routing, destination options); a fragment header, a routing
 * header with segments left, or a next header other than TCP, UDP or ICMPv6
 * after them, drops a packet for a VIP
 * address with its reason and passes anything else; ICMPv6 goes to icmp6.h
 * (errors about VIP flows go to their backend; neighbour discovery and the
 * rest pass untouched). A TCP or UDP packet for an IPv6 VIP
 * (edge_vips6) then takes the IPv4 slow path's steps on the shared per-id
 * maps: conntrack (edge_ct6), the Maglev pick judged by per-packet health,
 * the walk, and the fallback scan (edge_ingress6_scan, tail-called through
 * edge_tails[EDGE_TAIL_V6_SCAN]); the destination becomes the backend's
 * (edge_backends6), the TCP/UDP checksum follows (its pseudo-header holds
 * the address), and the frame is redirected by a FIB lookup cached per
 * backend (edge_nexthop, shared: an id is one backend's). A packet (no SYN)
 * of an established flow takes a shortcut first (established6, as IPv4's
 * established): no edge_vips6 lookup, the cached clock. A backend's
 * heartbeat arriving here is dropped (heartbeat6.h); a DSR service's packets
 * go out in IPv6-in-IPv6 instead of NAT (encap6.h, a program of its own),
 * its established flows by the full path. Half-open entries, the stateless
 * path over the budget and direct connections: state6.h. Wire signals:
 * wire6.h. ICMPv6 errors about VIP flows: icmp6.h.
 * Included by edge_xdp.c after health_now. */
#ifndef EDGE_INGRESS6_H
#define EDGE_INGRESS6_H

#include <uapi/linux/ipv6.h>
#include "maps.h"
#include "parse.h"
#include "flow.h"
#include "stats.h"
#include "select.h"
#include "nat.h"
#include "hop6.h"
#include "icmp6.h"
#include "heartbeat6.h"
#include "encap6.h"
#include "state6.h"
#include "wire6.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif
#define EDGE_V6_L4_MAX 512 /* L4 header offset in the frame beyond which a packet counts as unparsed */

/* What parsing an IPv6 packet for a VIP learned besides struct pkt. */
struct pkt6 {
	struct flow_key6 key; /* edge_ct6's key: the client's 5-tuple as received */
	__u32 l3_off;	      /* frame offset of the IPv6 header */
	__u32 l4_off;	      /* of the TCP or UDP header */
	__u8 udp_csum0;	      /* UDP checksum 0: invalid in IPv6 (RFC 8200 8.1) */
};

/* Verdict for an IPv6 packet the ingress does not take: dropped with its
 * reason when it is for a VIP address, else left to the stack. */
static __always_inline int unusual6(struct ipv6hdr *ip6, __u32 reason)
{
	if (!edge_vip_addrs6.lookup((struct addr6 *)&ip6->daddr))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	return count_drop(EDGE_NO_SERVICE, reason);
}

/* The 32 bits of an address folded, for the flow hash (flow.h, hash_flow):
 * the Maglev pick of an IPv6 flow hashes its folded 5-tuple. */
static __always_inline __be32 fold6(const struct addr6 *a)
{
	return a->w[0] ^ a->w[1] ^ a->w[2] ^ a->w[3];
}

/* A routing header at rh: 1 when segments are left (the packet's final
 * destination is another address, the one its TCP/UDP checksum covers: not
 * a packet for the VIP to take), -1 when cut short, else 0. */
static __always_inline int routed_on6(void *rh, void *data_end)
{
	struct ipv6_rt_hdr *r = rh;

	if ((void *)(r + 1) > data_end)
		return -1;
	return r->segments_left ? 1 : 0;
}

/* Fills pkt and p6 for a well-formed IPv6 TCP/UDP packet. Returns
 * EDGE_CONTINUE, or the verdict for everything else. */
static __always_inline int parse6(struct xdp_md *ctx, struct pkt *pkt, struct pkt6 *p6)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ipv6hdr *ip6;
	struct ethhdr *eth;
	__u32 l4_len, off;
	__u8 next;
	int proto, i;

	proto = parse_eth(&nh, data_end, &eth, &pkt->vlans);
	if (proto != bpf_htons(ETH_P_IPV6))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	ip6 = nh.pos;
	if ((void *)(ip6 + 1) > data_end)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_MALFORMED);
	if (ip6->version != 6 || (void *)(ip6 + 1) + bpf_ntohs(ip6->payload_len) > data_end)
		return unusual6(ip6, EDGE_DROP_MALFORMED);
	next = ip6->nexthdr;
	nh.pos = ip6 + 1;
#pragma unroll
	for (i = 0; i < EDGE_V6_EXT_MAX; i++) {
		struct ipv6_opt_hdr *oh = nh.pos;

		if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING && next != IPPROTO_DSTOPTS)
			break;
		if ((void *)(oh + 1) > data_end)
			return unusual6(ip6, EDGE_DROP_MALFORMED);
		if (next == IPPROTO_ROUTING) {
			int on = routed_on6(nh.pos, data_end);

			if (on)
				return unusual6(ip6, on < 0 ? EDGE_DROP_MALFORMED : EDGE_DROP_V6_EXT_HEADER);
		}
		next = oh->nexthdr;
		nh.pos += (oh->hdrlen + 1) * 8;
	}
	if (next == IPPROTO_FRAGMENT)
		return unusual6(ip6, EDGE_DROP_V6_FRAGMENT);
	if (next != IPPROTO_TCP && next != IPPROTO_UDP && next != IPPROTO_ICMPV6)
		return unusual6(ip6, EDGE_DROP_V6_EXT_HEADER);

	p6->l3_off = (void *)ip6 - data;
	off = nh.pos - data;
	if (off > EDGE_V6_L4_MAX || nh.pos > (void *)(ip6 + 1) + bpf_ntohs(ip6->payload_len))
		return unusual6(ip6, EDGE_DROP_MALFORMED);
	p6->l4_off = off;
	l4_len = (void *)(ip6 + 1) + bpf_ntohs(ip6->payload_len) - nh.pos;
	pkt->l3_len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
	if (next == IPPROTO_ICMPV6) { /* icmp6.h: errors about VIP flows, echo requests */
		__u8 *type = nh.pos;

		if ((void *)(type + 1) <= data_end && !icmp6_taken(*type)) /* neighbour discovery */
			return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
		p6->key.proto = IPPROTO_ICMPV6;
		return EDGE_ICMP;
	}
	if (next == IPPROTO_UDP) {
		struct udphdr *uh = nh.pos;

		if ((void *)(uh + 1) <= data_end)
			p6->udp_csum0 = !uh->check;
	}
	__builtin_memcpy(&p6->key.src, &ip6->saddr, sizeof(struct addr6));
	__builtin_memcpy(&p6->key.dst, &ip6->daddr, sizeof(struct addr6));
	if (parse_l4(&nh, data_end, l4_len, next, pkt) < 0) /* flow.h, as IPv4's */
		return unusual6(ip6, EDGE_DROP_MALFORMED);
	p6->key.sport = pkt->flow.sport;
	p6->key.dport = pkt->flow.dport;
	p6->key.proto = pkt->flow.proto;
	pkt->flow.src = fold6(&p6->key.src);
	pkt->flow.dst = fold6(&p6->key.dst);
	return EDGE_CONTINUE;
}

/* One's complement sum of an IPv6 address's four words, unfolded. */
static __always_inline __u64 sum6(const struct addr6 *a)
{
	return (__u64)a->w[0] + a->w[1] + a->w[2] + a->w[3];
}

/* TCP checksum of a SYN that carries no data, over IPv6's pseudo-header: 1
 * right, 0 wrong, -1 not checked (as edge_xdp.c's syn_csum). */
static __always_inline int syn_csum6(struct xdp_md *ctx, const struct pkt *pkt, const struct pkt6 *p6)
{
	__u32 buf[15] = {}; /* the longest TCP header */
	__u32 hlen = pkt->tcp_hlen;
	__u64 sum;

	if (pkt->l3_len != sizeof(struct ipv6hdr) + hlen || p6->l4_off != p6->l3_off + sizeof(struct ipv6hdr))
		return -1; /* data, or extension headers: not checked */
	hlen &= 0x3c;
	if (hlen < sizeof(struct tcphdr))
		return 0;
	if (bpf_xdp_load_bytes(ctx, p6->l4_off & 0xff, buf, hlen) < 0)
		return 0;
	sum = (__u32)bpf_csum_diff(NULL, 0, (void *)buf, hlen, 0);
	sum += sum6(&p6->key.src) + sum6(&p6->key.dst) + bpf_htonl(hlen) + bpf_htonl(IPPROTO_TCP);
	return csum_fold64(sum) == 0xffff;
}

/* The checksum change of an address a -> b, folded. */
static __always_inline __u32 csum_delta6(const struct addr6 *a, const struct addr6 *b)
{
	return csum_fold(csum_delta32(a->w[0], b->w[0]) + csum_delta32(a->w[1], b->w[1]) +
			 csum_delta32(a->w[2], b->w[2]) + csum_delta32(a->w[3], b->w[3]));
}

/* Destination address and port become the backend's; the TCP/UDP checksum
 * follows (IPv6 has no header checksum). Returns -1 if the headers parse6
 * checked are not there. */
static __always_inline int dnat6(struct xdp_md *ctx, const struct pkt6 *p6, const struct addr6 *to,
				 __be16 port)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + (p6->l3_off & 0x1f);
	void *l4 = data + (p6->l4_off & 0x3ff);
	__u32 delta;

	if ((void *)(ip6 + 1) > data_end)
		return -1;
	delta = csum_delta6(&p6->key.dst, to);
	if (p6->key.proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;

		if ((void *)(th + 1) > data_end)
			return -1;
		th->check = csum_apply(th->check, delta + csum_delta16(th->dest, port));
		th->dest = port;
	} else {
		struct udphdr *uh = l4;
		__u16 c;

		if ((void *)(uh + 1) > data_end)
			return -1;
		c = csum_apply(uh->check, delta + csum_delta16(uh->dest, port));
		uh->check = c ? c : 0xffff; /* IPv6: a UDP checksum is never 0 */
		uh->dest = port;
	}
	__builtin_memcpy(&ip6->daddr, to, sizeof(*to));
	return 0;
}

/* Sends the rewritten packet towards backend bid: its cached hop, or a FIB
 * lookup that refills the cache (nat.h, next_hop, for IPv4); hop limit - 1.
 * A VLAN tag or no neighbour entry yet: the stack delivers it. */
static __always_inline int forward6(struct xdp_md *ctx, const struct pkt *pkt, const struct pkt6 *p6,
				    __u32 bid, __u32 vid)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct nexthop *nh = edge_nexthop.lookup(&bid);
	__u64 now = bpf_jiffies64();

	if (pkt->vlans || !nh || (void *)(ip6 + 1) > data_end)
		return count_verdict(vid, EDGE_CNT_NAT_PASS, XDP_PASS);
	if (!nh->ifindex || !hop_fresh(nh->expires, now)) {
		struct bpf_fib_lookup fib = {};

		fib.family = AF_INET6;
		fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0fffffff);
		fib.l4_protocol = p6->key.proto;
		fib.tot_len = pkt->l3_len;
		__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
		fib.ifindex = ctx->ingress_ifindex;
		if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS) {
			nh->ifindex = 0;
			return count_verdict(vid, EDGE_CNT_NAT_PASS, XDP_PASS);
		}
		nh->ifindex = fib.ifindex;
		__builtin_memcpy(nh->smac, fib.smac, ETH_ALEN);
		__builtin_memcpy(nh->dmac, fib.dmac, ETH_ALEN);
		nh->expires = now + EDGE_NEXTHOP_TTL_JIFFIES;
	}
	ip6->hop_limit--;
	set_macs(eth, nh->dmac, nh->smac);
	return count_verdict(vid, EDGE_CNT_REDIRECT, bpf_redirect(nh->ifindex, 0));
}

/* An ICMPv6 error about a DSR flow of service vid (icmp6_ingress): to its
 * backend bid in IPv6-in-IPv6, unchanged (encap6.h). */
static __always_inline int icmp6_dsr_forward(struct xdp_md *ctx, const struct pkt *pkt, const struct pkt6 *p6,
					     __u32 bid, __u32 vid)
{
	struct addr6 *to = edge_backends6.lookup(&bid);

	if (!to)
		return count_drop(vid, EDGE_DROP_NO_BACKEND);
	return dsr_forward6(ctx, p6->l3_off, pkt->l3_len, to, bid, vid);
}

/* A SYN on an existing edge_ct6 entry: its answer will be ours (flow.h,
 * flow_mark_syn, for IPv4). */
static __always_inline void flow_mark_syn6(const struct pkt *pkt, struct flow_key6 *key)
{
	struct flow_info *fi = edge_ct6.lookup(key);

	if (!fi)
		return;
	fi->syn_seq = pkt->seq;
	ct_flags_clear(fi, EDGE_CT_F_SYN_PENDING); /* wire.h: the return path changes flags too */
	ct_flags_set(fi, syn_flags(pkt));
}

/* A packet (no SYN) of an established IPv6 flow, whose edge_ct6 entry fi
 * names the service and backend: forwarded without the edge_vips6 lookup
 * when the service's config still names this VIP key (abi.h, vip_addr6)
 * and the backend is still the service's, valid and alive, reading the
 * cached clock (health_now). Everything else returns EDGE_CONTINUE and
 * takes the full path, which decides as it always did. */
static __always_inline int established6(struct xdp_md *ctx, struct pkt *pkt, struct pkt6 *p6, struct flow_info *fi)
{
	void *data = (void *)(long)ctx->data;
	struct ipv6hdr *ip6 = data + (p6->l3_off & 0x1f);
	__u32 vid = fi->vip_id, bid = fi->backend_id;
	struct service_cfg *sc = edge_svc_cfg.lookup(&vid);
	struct backend_info *be;
	struct addr6 *to;
	__u64 now = 0;

	if (!sc || sc->vip_port != p6->key.dport || sc->vip_proto != p6->key.proto ||
	    !addr6_eq(&sc->vip_addr6, &p6->key.dst) || (sc->flags & EDGE_SVC_F_DSR))
		return EDGE_CONTINUE;
	be = edge_backends.lookup(&bid);
	if (!be || be->vip_id != vid)
		return EDGE_CONTINUE;
	if (sc->flags)
		now = health_now();
	if (!backend_alive(be, sc, now)) /* also: valid and up */
		return EDGE_CONTINUE;
	to = edge_backends6.lookup(&bid);
	if (!to)
		return EDGE_CONTINUE;
	/* the full path's checks, in its order, now that this is VIP traffic */
	if ((void *)(ip6 + 1) > (void *)(long)ctx->data_end)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	if (ip6->hop_limit <= 1)
		return count_verdict(vid, EDGE_CNT_PASS, XDP_PASS);
	count_traffic(vid, bid, pkt->l3_len, 0, 0);
	wire6_forward(fi, bid, pkt, p6->l4_off - p6->l3_off, 0); /* no SYN takes this way */
	if (dnat6(ctx, p6, to, be->port) < 0)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	return forward6(ctx, pkt, p6, bid, vid);
}

/* The IPv6 ingress; stage EDGE_STAGE_SLOW (edge_ingress6) or
 * EDGE_STAGE_SCAN (edge_ingress6_scan): select.h decides as for IPv4. */
static __always_inline int ingress6(struct xdp_md *ctx, const int stage)
{
	struct pkt pkt = {};
	struct pkt6 p6 = {};
	struct vip_key6 vk = {};
	struct vip_info *vip;
	struct service_cfg *sc;
	struct backend_info *be;
	struct flow_info *fi = NULL;
	struct addr6 *to;
	__u64 now = 0;
	__u32 bid, drop;
	int verdict, new_flow, failover, looked;

	verdict = parse6(ctx, &pkt, &p6);
	if (verdict == EDGE_ICMP) { /* icmp6.h, in the scan's program: the slow one has less room */
		__u32 vid = EDGE_NO_SERVICE;

		if (stage != EDGE_STAGE_SCAN) {
			edge_tails.call(ctx, EDGE_TAIL_V6_SCAN);
			return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS); /* not installed */
		}
		verdict = icmp6_ingress(ctx, p6.l3_off, p6.l4_off, &bid, &vid);
		if (verdict == EDGE_ICMP6_DSR) /* about a DSR flow: untouched, in the tunnel */
			return icmp6_dsr_forward(ctx, &pkt, &p6, bid, vid);
		return verdict == EDGE_CONTINUE ? forward6(ctx, &pkt, &p6, bid, vid) : verdict;
	}
	if (verdict != EDGE_CONTINUE)
		return verdict;
	/* conntrack first for a packet that is no SYN (established6); a UDP
	 * checksum of 0 takes the full path, to its drop under the service */
	looked = stage == EDGE_STAGE_SLOW && !pkt.syn && !p6.udp_csum0;
	if (looked) {
		fi = edge_ct6.lookup(&p6.key);
		if (fi) {
			verdict = established6(ctx, &pkt, &p6, fi);
			if (verdict != EDGE_CONTINUE)
				return verdict;
		}
	}
	vk.addr = p6.key.dst;
	vk.port = p6.key.dport;
	vk.proto = p6.key.proto;
	vip = edge_vips6.lookup(&vk);
	if (!vip) {
		/* heartbeat6.h: a backend's heartbeat never enters here */
		if (p6.key.proto == IPPROTO_UDP && hb_misrouted6(ctx, p6.l3_off, p6.l4_off))
			return count_drop(EDGE_NO_SERVICE, EDGE_DROP_SPOOFED_HB);
		/* state6.h: a SYN to a backend's own address, a direct connection;
		 * in the scan's program (verifier: +4 % of the budget here) */
		if (pkt.syn && stage == EDGE_STAGE_SLOW)
			edge_tails.call(ctx, EDGE_TAIL_V6_SCAN);
		else if (pkt.syn)
			direct_syn6(&p6.key);
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	}
	{
		void *data = (void *)(long)ctx->data;
		struct ipv6hdr *ip6 = data + (p6.l3_off & 0x1f);

		if ((void *)(ip6 + 1) > (void *)(long)ctx->data_end)
			return count_drop(vip->id, EDGE_DROP_MALFORMED);
		/* the stack answers an expiring packet with time exceeded */
		if (ip6->hop_limit <= 1)
			return count_verdict(vip->id, EDGE_CNT_PASS, XDP_PASS);
	}
	if (p6.udp_csum0) /* NAT would make it a wrong checksum (dnat6) */
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	if (pkt.syn && stage == EDGE_STAGE_SLOW) {
		int csum = syn_csum6(ctx, &pkt, &p6);

		if (!csum)
			return count_drop(vip->id, EDGE_DROP_BAD_CSUM);
		pkt.syn_counted = csum > 0;
	}
	sc = edge_svc_cfg.lookup(&vip->id);
	if (!sc)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	/* health's clock, and a new flow's handshake stamp (flow_insert): one read */
	if (sc->flags || pkt.syn)
		now = bpf_ktime_get_ns();
	if (!looked)
		fi = edge_ct6.lookup(&p6.key);
	if (!fi && stage == EDGE_STAGE_SLOW && p6.key.proto == IPPROTO_TCP && !pkt.syn)
		fi = half_open6(&pkt, &p6.key); /* state6.h: the ACK that completes it moves it to edge_ct6 */
	/* a SYN sent again on a half-open flow keeps its backend, as IPv4's
	 * (syn_again6, in the stateless program: verifier, an entry of either
	 * map here costs a quarter of the budget); not installed: a new pick */
	if (!fi && stage == EDGE_STAGE_SLOW && p6.key.proto == IPPROTO_TCP && pkt.syn &&
	    edge_half_open6.lookup(&p6.key))
		edge_tails.call(ctx, EDGE_TAIL_V6_STATELESS);
	/* a flood of TCP packets that are no SYN must not push connections
	 * out of the LRU: as IPv4's budget (flow.h); over it, its stateless
	 * pick in a program of its own (state6.h; verifier: +4 % here) */
	if (stage == EDGE_STAGE_SLOW && !fi && p6.key.proto == IPPROTO_TCP && !pkt.syn && !ct_budget_take()) {
		edge_tails.call(ctx, EDGE_TAIL_V6_STATELESS);
		return count_drop(vip->id, EDGE_DROP_UNTRACKED); /* not installed */
	}
	be = select_backend(vip, sc, &pkt, fi, now, &bid, &new_flow, &failover, &drop, stage, &p6.key);
	if (!be) {
		if (drop == EDGE_TO_NEXT_STAGE) {
			edge_tails.call(ctx, EDGE_TAIL_V6_SCAN);
			drop = EDGE_DROP_NO_BACKEND; /* not installed */
		}
		return count_drop(vip->id, drop);
	}
	to = edge_backends6.lookup(&bid);
	if (!to)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	count_traffic(vip->id, bid, pkt.l3_len, new_flow, failover);
	if (sc->flags & EDGE_SVC_F_DSR) { /* encap6.h, a program of its own (verifier: ~57k instructions here) */
		dsr6_hand_over(ctx, bid, vip->id, p6.l3_off, pkt.l3_len);
		edge_tails.call(ctx, EDGE_TAIL_V6_DSR);
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND); /* not installed */
	}
	if (stage == EDGE_STAGE_SLOW && pkt.ct && !new_flow) /* wire6.h: before flow_mark_syn6, as IPv4's */
		wire6_forward(pkt.ct, bid, &pkt, p6.l4_off - p6.l3_off, pkt.syn);
	if (pkt.syn && !new_flow)
		flow_mark_syn6(&pkt, &p6.key);
	if (pkt.syn_counted && (sc->flags & EDGE_SVC_F_PASSIVE))
		note_syn(be, now);
	if (dnat6(ctx, &p6, to, be->port) < 0)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	return forward6(ctx, &pkt, &p6, bid, vip->id);
}

/* A half-open entry, for a SYN sent again (edge_ingress6_stateless, which
 * edge_ingress6 tail-calls for it): the step of ingress6 that IPv4's
 * flow_lookup takes for a SYN, on the half-open entry (its backend kept
 * while it takes new flows, else a new pick written over it, as select.h
 * does to any entry), then the rest of ingress6's steps for a SYN. */
static __always_inline int syn_again6(struct xdp_md *ctx, struct pkt *pkt, struct pkt6 *p6)
{
	void *data = (void *)(long)ctx->data;
	struct ipv6hdr *ip6 = data + (p6->l3_off & 0x1f);
	struct vip_key6 vk = {};
	struct vip_info *vip;
	struct service_cfg *sc;
	struct backend_info *be;
	struct half_open *ho;
	struct addr6 *to;
	__u32 bid, drop;
	int new_flow, failover, csum;
	__u64 now = 0;

	vk.addr = p6->key.dst;
	vk.port = p6->key.dport;
	vk.proto = p6->key.proto;
	vip = edge_vips6.lookup(&vk);
	if (!vip)
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	if ((void *)(ip6 + 1) > (void *)(long)ctx->data_end)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	if (ip6->hop_limit <= 1) /* the stack answers with time exceeded */
		return count_verdict(vip->id, EDGE_CNT_PASS, XDP_PASS);
	csum = syn_csum6(ctx, pkt, p6);
	if (!csum)
		return count_drop(vip->id, EDGE_DROP_BAD_CSUM);
	pkt->syn_counted = csum > 0;
	sc = edge_svc_cfg.lookup(&vip->id);
	if (!sc)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	now = bpf_ktime_get_ns(); /* health's, and a new pick's handshake stamp (flow_insert) */
	/* a DSR service's SYNs go to edge_ct6 (flow_insert): an entry left from
	 * before the service changed is not used */
	ho = (sc->flags & EDGE_SVC_F_DSR) ? NULL : edge_half_open6.lookup(&p6->key);
	be = select_backend(vip, sc, pkt, ho ? &ho->ct : NULL, now, &bid, &new_flow, &failover, &drop,
			    EDGE_STAGE_SLOW, &p6->key);
	if (!be) {
		if (drop == EDGE_TO_NEXT_STAGE) {
			edge_tails.call(ctx, EDGE_TAIL_V6_SCAN);
			drop = EDGE_DROP_NO_BACKEND; /* not installed */
		}
		return count_drop(vip->id, drop);
	}
	to = edge_backends6.lookup(&bid);
	if (!to)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	count_traffic(vip->id, bid, pkt->l3_len, new_flow, failover);
	if (sc->flags & EDGE_SVC_F_DSR) {
		dsr6_hand_over(ctx, bid, vip->id, p6->l3_off, pkt->l3_len);
		edge_tails.call(ctx, EDGE_TAIL_V6_DSR);
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND); /* not installed */
	}
	if (pkt->ct && !new_flow) { /* as ingress6: the wire step, then the SYN marked on the entry */
		wire6_forward(pkt->ct, bid, pkt, p6->l4_off - p6->l3_off, 1);
		pkt->ct->syn_seq = pkt->seq;
		ct_flags_clear(pkt->ct, EDGE_CT_F_SYN_PENDING);
		ct_flags_set(pkt->ct, syn_flags(pkt));
	}
	if (pkt->syn_counted && (sc->flags & EDGE_SVC_F_PASSIVE))
		note_syn(be, now);
	if (dnat6(ctx, p6, to, be->port) < 0)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	return forward6(ctx, pkt, p6, bid, vip->id);
}

#endif /* EDGE_INGRESS6_H */
