/* SPDX-License-Identifier: Apache-2.0 */
/* edge_xdp.c: ingress of the edge router, on the client-facing interface.
 * parse -> conntrack hit of a live VIP flow? -> DNAT -> FIB redirect; else
 * VIP? -> conntrack or Maglev, judged by per-packet health -> DNAT -> FIB
 * redirect. Traffic that is not for a VIP passes untouched, except
 * heartbeats arriving where their backend is not; every exit is counted.
 * edge_ingress is the fast path; what it cannot decide cheaply it hands to
 * edge_ingress_slow and that to edge_ingress_scan, by tail calls (select.h). */
#include <uapi/linux/bpf.h>
#include "include/maps.h"
#include "include/parse.h"
#include "include/flow.h"
#include "include/stats.h"
#include "include/select.h"
#include "include/nat.h"
#include "include/heartbeat.h"
#include "include/stateless.h"
#include "include/icmp.h"
#include "include/encap.h"

#define EDGE_CONTINUE (-1)
#define EDGE_ICMP     (-2) /* parse_packet: an ICMP packet for icmp_ingress (icmp.h) */
#define EDGE_IPV6     (-3) /* parse_packet: an IPv6 packet for edge_ingress6 (ingress6.h) */

/* Verdict for a packet the fast path cannot take (IPv4 options, fragment,
 * L4 header cut short): dropped with its reason when it is for a VIP
 * address, else left to the stack. */
static __always_inline int unusual(struct iphdr *iph, __u32 reason)
{
	if (!edge_vip_addrs.lookup(&iph->daddr))
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	return count_drop(EDGE_NO_SERVICE, reason);
}

/* Fills pkt for a well-formed IPv4 TCP/UDP packet. Returns EDGE_CONTINUE,
 * or the verdict for everything else. */
static __always_inline int parse_packet(struct xdp_md *ctx, struct pkt *pkt)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor nh = { .pos = (void *)(long)ctx->data };
	struct ethhdr *eth;
	struct iphdr *iph;
	__u32 l4_len;
	int proto;

	proto = parse_eth(&nh, data_end, &eth, &pkt->vlans);
	if (proto < 0)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_MALFORMED);
	if (proto != bpf_htons(ETH_P_IP))
		return proto == bpf_htons(ETH_P_IPV6) ? EDGE_IPV6
						      : count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);

	proto = parse_ipv4(&nh, data_end, &iph, 1);
	if (proto < 0)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_MALFORMED);
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP) {
		/* after TCP/UDP's test: their packets pay nothing for ICMP */
		if (proto != IPPROTO_ICMP || iph->ihl != 5 || (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
		pkt->iph = iph;
		return EDGE_ICMP;
	}
	if (iph->ihl != 5)
		return unusual(iph, EDGE_DROP_IP_OPTIONS);
	if (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return unusual(iph, EDGE_DROP_FRAGMENT);
	/* verifier: with IHL known to be 5, restart from a constant offset so
	 * the L4 pointer keeps its checked range when spilled to the stack. */
	nh.pos = iph + 1;

	pkt->iph = iph;
	pkt->l3_len = bpf_ntohs(iph->tot_len);
	l4_len = pkt->l3_len - sizeof(*iph);
	pkt->flow.src = iph->saddr;
	pkt->flow.dst = iph->daddr;
	if (parse_l4(&nh, data_end, l4_len, proto, pkt) < 0) /* flow.h */
		return unusual(iph, EDGE_DROP_MALFORMED);
	return EDGE_CONTINUE;
}

/* TCP checksum of a SYN that carries no data: 1 right, 0 wrong, -1 not
 * checked (a SYN with data, as TCP Fast Open sends: forwarded, but passive
 * detection does not count it). A backend discards a SYN with a wrong
 * checksum unanswered, so only checked SYNs may count as unanswered. */
static __always_inline int syn_csum(struct xdp_md *ctx, const struct pkt *pkt)
{
	__u32 buf[15] = {}; /* the longest TCP header */
	__u32 hlen = pkt->tcp_hlen, off;
	__u64 sum;

	if (pkt->l3_len != sizeof(struct iphdr) + hlen)
		return -1;
	hlen &= 0x3c; /* doff * 4 is at most 60; verifier: a mask keeps the bound */
	if (hlen < sizeof(struct tcphdr))
		return 0;
	off = sizeof(struct ethhdr) + pkt->vlans * sizeof(struct vlan_hdr) + sizeof(struct iphdr);
	if (bpf_xdp_load_bytes(ctx, off, buf, hlen) < 0)
		return 0;
	sum = (__u32)bpf_csum_diff(NULL, 0, (void *)buf, hlen, 0);
	sum += (__u64)pkt->flow.src + pkt->flow.dst + bpf_htonl((IPPROTO_TCP << 16) | hlen);
	return csum_fold64(sum) == 0xffff;
}

/* The fast path's time for health decisions: bpf_ktime_get_ns() read at most
 * once per jiffy and CPU, so a packet pays two loads (the verifier inlines
 * bpf_jiffies64 and the per-CPU lookup) instead of a helper call, about a
 * fifth of an established flow's time (tools/bench-datapath). It lags the
 * clock by less than a jiffy (1 to 10 ms, by the kernel's HZ), which the
 * health timeouts (hundreds of ms) do not notice: a silent backend is down,
 * an ejection over, that much later. Comparisons stay "stamp + span < now",
 * which a stamp newer than now (another CPU's, the return path's) keeps
 * right. */
static __always_inline __u64 health_now(void)
{
	__u32 zero = 0;
	struct clock_cache *c = edge_clock.lookup(&zero);
	__u64 j = bpf_jiffies64();

	if (!c)
		return bpf_ktime_get_ns();
	if (c->jiffies != j) {
		c->ns = bpf_ktime_get_ns();
		c->jiffies = j;
	}
	return c->ns;
}

/* The fast path's common case: a packet (no SYN) of an established flow,
 * whose conntrack entry fi names the service and backend. The service's
 * config carries its VIP key (abi.h, service_cfg), so when the entry's
 * destination is still that VIP and the backend is still the service's,
 * valid and alive, the packet is forwarded without the edge_vips lookup:
 * one hash lookup (conntrack) instead of two. Everything else (a VIP that
 * moved or went, a backend not alive, keep_flows) returns EDGE_CONTINUE
 * and takes the full path, which decides as it always did. So does a flow
 * of a service with direct server return (encap.h): tested with the VIP key
 * here, it costs NAT's established flows no more than one flag test (a DSR
 * hook in the forwarding below cost them ~5 ns, tools/bench-datapath (a)). */
static __always_inline int established(struct xdp_md *ctx, struct pkt *pkt,
				       struct flow_info *fi)
{
	__u32 vid = fi->vip_id, bid = fi->backend_id;
	struct service_cfg *sc = edge_svc_cfg.lookup(&vid);
	struct backend_info *be;
	__u64 now = 0;

	if (!sc || sc->vip_addr != pkt->flow.dst || sc->vip_port != pkt->flow.dport ||
	    sc->vip_proto != pkt->flow.proto || (sc->flags & EDGE_SVC_F_DSR))
		return EDGE_CONTINUE;
	be = edge_backends.lookup(&bid);
	if (!be || be->vip_id != vid)
		return EDGE_CONTINUE;
	if (sc->flags)
		now = health_now();
	if (!backend_alive(be, sc, now)) /* also: valid and up */
		return EDGE_CONTINUE;
	/* the full path's checks, in its order, now that this is VIP traffic */
	if ((void *)(pkt->iph + 1) > (void *)(long)ctx->data_end)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	if (!ipv4_csum_ok(pkt->iph))
		return count_drop(vid, EDGE_DROP_BAD_CSUM);
	if (pkt->iph->ttl <= 1)
		return count_verdict(vid, EDGE_CNT_PASS, XDP_PASS);
	count_traffic(vid, bid, pkt->l3_len, 0, 0);
	wire_forward(fi, bid, 0, pkt->end, pkt->seq,
		     pkt->l3_len - sizeof(struct iphdr) - pkt->tcp_hlen);
	if (dnat(pkt, be, (void *)(long)ctx->data_end) < 0)
		return count_drop(vid, EDGE_DROP_MALFORMED);
	return forward(ctx, pkt, vid, bid);
}

/* 0 when daddr is no VIP address: its bit in edge_vip_filter is clear. An
 * inlined array lookup and a hash instead of a hash lookup: the fast path
 * spares most traffic not for a VIP the conntrack lookup. */
static __always_inline int maybe_vip(__be32 daddr)
{
	__u32 zero = 0, bit = hash_mix(daddr) & (EDGE_VIP_FILTER_BITS - 1);
	struct vip_filter *f = edge_vip_filter.lookup(&zero);

	return !f || ((f->bits[bit / 64] >> (bit % 64)) & 1);
}

/* The whole ingress; stage is a constant, EDGE_STAGE_* (see select.h). */
static __always_inline int ingress(struct xdp_md *ctx, const int stage)
{
	struct pkt pkt = {};
	struct vip_key vk = {};
	struct vip_info *vip;
	struct service_cfg *sc;
	struct backend_info *be;
	struct flow_info *fi;
	__u64 now = 0;
	__u32 bid, drop;
	int verdict, new_flow, failover, looked;

	verdict = parse_packet(ctx, &pkt);
	if (verdict != EDGE_CONTINUE) {
		/* only the fast path sees ICMP: no tail call takes it on */
		if (verdict == EDGE_ICMP)
			return stage == EDGE_STAGE_FAST ? icmp_ingress(ctx, &pkt)
							: count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
		/* IPv6 has a program of its own (ingress6.h): IPv4 pays nothing for it */
		if (verdict == EDGE_IPV6) {
			edge_tails.call(ctx, EDGE_TAIL_V6);
			return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS); /* not installed */
		}
		return verdict;
	}

	/* Conntrack first: an established flow needs no edge_vips lookup
	 * (established). A SYN, which established does not take, and
	 * traffic to an address the VIP filter rules out look it up where
	 * the full path needs it, after the VIP (for such an address that
	 * is a VIP after all: a filter not yet written). */
	looked = stage != EDGE_STAGE_FAST || (!pkt.syn && maybe_vip(pkt.flow.dst));
	fi = looked ? flow_lookup(&pkt, stage != EDGE_STAGE_FAST) : NULL;
	if (stage == EDGE_STAGE_FAST && fi && !pkt.syn) {
		verdict = established(ctx, &pkt, fi);
		if (verdict != EDGE_CONTINUE)
			return verdict;
	}

	vk.addr = pkt.flow.dst;
	vk.port = pkt.flow.dport;
	vk.proto = pkt.flow.proto;
	vip = edge_vips.lookup(&vk);
	if (!vip) {
		if (pkt.flow.proto == IPPROTO_UDP &&
		    hb_misrouted(ctx, pkt.iph, (void *)(long)ctx->data_end))
			return count_drop(EDGE_NO_SERVICE, EDGE_DROP_SPOOFED_HB);
		/* a connection to a backend's own address? (The later stages
		 * see VIP traffic only. verifier: there this call cost
		 * edge_ingress_scan ~280k instructions.) */
		if (stage == EDGE_STAGE_FAST && pkt.syn)
			direct_syn(&pkt.flow);
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	}

	/* A corrupted header must not be NATed: the checksum would be fixed up
	 * incrementally and stay wrong. */
	if ((void *)(pkt.iph + 1) > (void *)(long)ctx->data_end)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	if (!ipv4_csum_ok(pkt.iph))
		return count_drop(vip->id, EDGE_DROP_BAD_CSUM);

	/* Let the stack answer an expiring packet with ICMP time exceeded. */
	if (pkt.iph->ttl <= 1)
		return count_verdict(vip->id, EDGE_CNT_PASS, XDP_PASS);

	if (pkt.syn) {
		int csum = syn_csum(ctx, &pkt);

		if (!csum)
			return count_drop(vip->id, EDGE_DROP_BAD_CSUM);
		pkt.syn_counted = csum > 0;
	}

	sc = edge_svc_cfg.lookup(&vip->id);
	if (!sc)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	/* verifier: the slow stages read the clock itself (the cached one
	 * took the scan ~150k instructions more) */
	if (sc->flags)
		now = stage == EDGE_STAGE_FAST ? health_now() : bpf_ktime_get_ns();

	if (!looked)
		fi = flow_lookup(&pkt, stage != EDGE_STAGE_FAST);
	be = select_backend(vip, sc, &pkt, fi, now, &bid, &new_flow, &failover, &drop, stage, NULL);
	if (!be) {
		if (drop == EDGE_TO_NEXT_STAGE) {
			edge_tails.call(ctx, stage);
			drop = EDGE_DROP_NO_BACKEND; /* no next stage installed */
		}
		return count_drop(vip->id, drop);
	}

	count_traffic(vip->id, bid, pkt.l3_len, new_flow, failover);
	if (sc->flags & EDGE_SVC_F_DSR)
		return dsr_forward(ctx, &pkt, be, bid);
	/* wire.h: one flag test unless a wire signal is pending (before
	 * flow_mark_syn: it compares the SYN's sequence number with the last);
	 * a flow the later stages moved was seen to by wire_move */
	if (stage == EDGE_STAGE_FAST && pkt.ct)
		wire_forward(pkt.ct, bid, pkt.syn, pkt.end, pkt.seq,
			     pkt.l3_len - sizeof(struct iphdr) - pkt.tcp_hlen);
	if (pkt.syn && !new_flow)
		flow_mark_syn(&pkt, stage != EDGE_STAGE_FAST);
	if (pkt.syn_counted && (sc->flags & EDGE_SVC_F_PASSIVE))
		note_syn(be, now);
	if (dnat(&pkt, be, (void *)(long)ctx->data_end) < 0)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	return forward(ctx, &pkt, vip->id, bid);
}

/* after health_now, which its established-flow shortcut reads */
#include "include/ingress6.h"

int edge_ingress(struct xdp_md *ctx)
{
	return ingress(ctx, EDGE_STAGE_FAST);
}

int edge_ingress_slow(struct xdp_md *ctx)
{
	return ingress(ctx, EDGE_STAGE_SLOW);
}

int edge_ingress_scan(struct xdp_md *ctx)
{
	return ingress(ctx, EDGE_STAGE_SCAN);
}

/* The IPv6 tail programs. A deploy of a config without an IPv6 service
 * leaves their slots empty and compiles without them (EDGE_NO_INGRESS6,
 * compilechild.build): a third of the compile's time; a reload that adds
 * the first IPv6 service compiles them then (compilechild.load_ipv6). */
#ifndef EDGE_NO_INGRESS6
int edge_ingress6(struct xdp_md *ctx)
{
	return ingress6(ctx, EDGE_STAGE_SLOW);
}

int edge_ingress6_scan(struct xdp_md *ctx)
{
	return ingress6(ctx, EDGE_STAGE_SCAN);
}

/* An IPv6 DSR service's packet, after edge_ingress6 chose its backend, wrote
 * it into edge_ct6 (select.h) and handed it over (encap6.h, dsr6_hand_over);
 * encap6.h sends it. Without the hand-over (a tail program of another
 * compile, during a deploy) the packet is parsed again and its entry names
 * backend and service. */
int edge_ingress6_dsr(struct xdp_md *ctx)
{
	struct dsr6_hand hand;
	struct pkt pkt = {};
	struct pkt6 p6 = {};
	struct flow_info *fi;
	struct addr6 *to;
	__u32 bid;
	int verdict;

	if (dsr6_take(ctx, &hand)) {
		to = edge_backends6.lookup(&hand.bid);
		if (!to)
			return count_drop(hand.vip_id, EDGE_DROP_NO_BACKEND);
		return dsr_forward6(ctx, hand.l3_off, hand.l3_len, to, hand.bid, hand.vip_id);
	}
	verdict = parse6(ctx, &pkt, &p6);
	if (verdict != EDGE_CONTINUE)
		return verdict;
	fi = edge_ct6.lookup(&p6.key);
	if (!fi)
		return count_drop(EDGE_NO_SERVICE, EDGE_DROP_NO_BACKEND);
	bid = fi->backend_id;
	to = edge_backends6.lookup(&bid);
	if (!to)
		return count_drop(fi->vip_id, EDGE_DROP_NO_BACKEND);
	return dsr_forward6(ctx, p6.l3_off, pkt.l3_len, to, bid, fi->vip_id);
}

/* An IPv6 TCP packet (no SYN) of a flow with no entry, over the budget
 * (edge_ingress6 found it spent): parsed again, forwarded to its first
 * Maglev pick without an entry (state6.h, stateless6), or dropped as
 * untracked. A program of its own: inlined in edge_ingress6 it cost 4 % of
 * the verifier's budget there. A SYN comes here when edge_ingress6 found no
 * edge_ct6 entry but a half-open one (ingress6.h, syn_again6): the other
 * step edge_ingress6 has no room for. */
int edge_ingress6_stateless(struct xdp_md *ctx)
{
	struct pkt pkt = {};
	struct pkt6 p6 = {};
	struct vip_key6 vk = {};
	struct vip_info *vip;
	struct service_cfg *sc;
	struct backend_info *be;
	struct ipv6hdr *ip6;
	struct addr6 *to;
	__u32 bid, drop;
	int verdict = parse6(ctx, &pkt, &p6), new_flow, failover;
	__u64 now = 0;

	if (verdict != EDGE_CONTINUE)
		return verdict == EDGE_ICMP ? count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS) : verdict;
	/* verifier: the compiler knows parse6 bounded the offsets and would
	 * drop the masks dnat6 puts on them; hide what it knows */
	EDGE_OPAQUE(p6.l3_off);
	EDGE_OPAQUE(p6.l4_off);
	if (pkt.syn) /* a SYN sent again on a half-open flow (ingress6.h) */
		return syn_again6(ctx, &pkt, &p6);
	vk.addr = p6.key.dst;
	vk.port = p6.key.dport;
	vk.proto = p6.key.proto;
	vip = edge_vips6.lookup(&vk);
	if (!vip)
		return count_verdict(EDGE_NO_SERVICE, EDGE_CNT_PASS, XDP_PASS);
	ip6 = (void *)(long)ctx->data + (p6.l3_off & 0x1f);
	if ((void *)(ip6 + 1) > (void *)(long)ctx->data_end)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	if (ip6->hop_limit <= 1) /* the stack answers with time exceeded */
		return count_verdict(vip->id, EDGE_CNT_PASS, XDP_PASS);
	sc = edge_svc_cfg.lookup(&vip->id);
	if (!sc)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	if (sc->flags)
		now = bpf_ktime_get_ns();
	be = stateless6(vip, sc, &p6.key, now, &bid, &new_flow, &failover, &drop);
	if (!be)
		return count_drop(vip->id, drop);
	to = edge_backends6.lookup(&bid);
	if (!to)
		return count_drop(vip->id, EDGE_DROP_NO_BACKEND);
	count_traffic(vip->id, bid, pkt.l3_len, 0, 0);
	if (sc->flags & EDGE_SVC_F_DSR) /* as IPv4's: the pick, encapsulated (encap6.h) */
		return dsr_forward6(ctx, p6.l3_off, pkt.l3_len, to, bid, vip->id);
	if (dnat6(ctx, &p6, to, be->port) < 0)
		return count_drop(vip->id, EDGE_DROP_MALFORMED);
	return forward6(ctx, &pkt, &p6, bid, vip->id);
}
#endif /* EDGE_NO_INGRESS6 */
