/* SPDX-License-Identifier: Apache-2.0 */
/* edge_tc.c: clsact ingress of the backend-facing interfaces. Consumes
 * heartbeats (heartbeat.h); notes SYNs to a backend's address as direct
 * connections (stateless.h); gives a backend's reply to a client the VIP back
 * as its source (NAT mode) when conntrack (or, for a SYN-ACK or RST, the
 * half-open table) pins that client's connection to this backend, or
 * without an entry when the Maglev table gives it to this backend and it is
 * no direct connection (stateless.h), noting SYN-ACKs and RSTs for passive
 * detection and the SYN-ACK a half-open connection's ACK must acknowledge,
 * and
 * redirects it towards the client (nat.h, reply_out) without the kernel's
 * forwarding path; everything else continues untouched. The L4 checksum
 * goes through the kernel's helpers, which also handle partial checksums.
 * IPv6 frames go to return6.h. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/stddef.h>
#include "include/maps.h"
#include "include/parse.h"
#include "include/stats.h"
#include "include/health.h"
#include "include/heartbeat.h"
#include "include/nat.h"
#include "include/stateless.h"
#include "include/icmp.h"
#include "include/return6.h"

#define ANSWER_NONE (-1)

/* Passive detection: the backend answered the SYN passive detection waits
 * for with a SYN-ACK (1) or refused it with a RST (0). */
static __always_inline void note_answer(const struct rnat_info *ri, int syn_ack)
{
	__u32 bid = ri->backend_id, vid = ri->vip_id;
	struct backend_info *be = edge_backends.lookup(&bid);
	struct service_cfg *sc = edge_svc_cfg.lookup(&vid);

	if (!be || !sc || !(sc->flags & EDGE_SVC_F_PASSIVE))
		return;
	note_syn_answer(be, sc, syn_ack, bpf_ktime_get_ns());
}

/* What a SYN-ACK or RST of a VIP connection says. A SYN-ACK acknowledging
 * the VIP SYN's sequence number (plus any data it carried) answers it: it is
 * NATed, retransmitted or not; one acknowledging anything else answers a SYN
 * that did not come through the VIP: when that SYN was seen (a direct
 * connection on a reused client port, stateless.h) TC_ACT_UNSPEC, and the
 * stale entry (ho: the half-open one) goes; else it is NATed like the
 * connection's, so it never leaves with the backend's address. Passive detection hears
 * only the first exact answer (ack = seq + 1) to a SYN it counted:
 * never a RST on an established or moved flow, nor one answering a stray
 * ACK (such a RST carries no ACK). *answer: 1, 0 or ANSWER_NONE. */
static __always_inline int classify_answer(struct flow_info *fi, struct flow_key *fk,
					   const struct backend_key *bk, struct half_open *ho,
					   __u8 flags, __be32 ack_seq, int *answer)
{
	__u32 past = bpf_ntohl(ack_seq) - bpf_ntohl(fi->syn_seq) - 1;
	int ours = (fi->flags & EDGE_CT_F_SYN) && (flags & TCP_FLAG_ACK_) && past <= 0xffff;
	int syn_ack = (flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == (TCP_FLAG_SYN_ | TCP_FLAG_ACK_);

	*answer = ANSWER_NONE;
	if (syn_ack && !ours) {
		if (!is_direct(fk, bk))
			return TC_ACT_OK;
		wire_end(fi, fi->backend_id); /* wire.h: counted closed */
		if (ho)
			edge_half_open.delete(fk);
		else
			edge_ct.delete(fk);
		return TC_ACT_UNSPEC;
	}
	if (ours && past == 0 && (fi->flags & EDGE_CT_F_SYN_PENDING) &&
	    (syn_ack || (flags & TCP_FLAG_RST_))) {
		ct_flags_clear(fi, EDGE_CT_F_SYN_PENDING); /* wire.h: atomic */
		*answer = syn_ack;
	}
	return TC_ACT_OK;
}

int edge_return(struct __sk_buff *skb)
{
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = (void *)(long)skb->data };
	struct backend_key rk = {};
	struct flow_key fk = {};
	struct half_open *ho = NULL;
	struct flow_info *fi;
	struct rnat_info *ri;
	struct ethhdr *eth;
	struct iphdr *iph;
	__u32 l3_off, l4_off, csum_off, csum_flags;
	int proto, vlans, verdict;
	__u8 tcp_flags = 0;
	__be32 ack_seq = 0, seq;
	int answer = ANSWER_NONE;

	proto = parse_eth(&nh, data_end, &eth, &vlans);
	if (proto != bpf_htons(ETH_P_IP)) {
		if (proto == bpf_htons(ETH_P_IPV6)) /* return6.h */
			return return6(skb, nh.pos - (void *)(long)skb->data);
		return TC_ACT_UNSPEC;
	}
	l3_off = nh.pos - (void *)(long)skb->data;
	proto = parse_ipv4(&nh, data_end, &iph, 0);
	if (proto == IPPROTO_ICMP && !(iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
		return icmp_return(skb, iph, l3_off, nh.pos - (void *)(long)skb->data);
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	if (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return TC_ACT_UNSPEC;
	/* Ports are the first four bytes of TCP and UDP alike. */
	if (nh.pos + 4 > data_end)
		return TC_ACT_UNSPEC;

	if (proto == IPPROTO_UDP) {
		verdict = consume_heartbeat(skb, iph, nh.pos - (void *)(long)skb->data,
					    ((__be16 *)nh.pos)[1]);
		if (verdict != TC_ACT_UNSPEC)
			return verdict;
	}

	l4_off = nh.pos - (void *)(long)skb->data;
	if (proto == IPPROTO_TCP) {
		/* the flags byte, read directly when it is in the linear data */
		if (nh.pos + 14 <= data_end)
			tcp_flags = ((__u8 *)nh.pos)[13];
		else
			bpf_skb_load_bytes(skb, l4_off + 13, &tcp_flags, 1);
		if ((tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == TCP_FLAG_SYN_) {
			/* a connection opened from this side: no reply */
			fk.src = iph->saddr;
			fk.dst = iph->daddr;
			fk.sport = ((__be16 *)nh.pos)[0];
			fk.dport = ((__be16 *)nh.pos)[1];
			fk.proto = IPPROTO_TCP;
			direct_syn(&fk);
			return TC_ACT_UNSPEC;
		}
	}
	rk.addr = iph->saddr;
	rk.port = ((__be16 *)nh.pos)[0];
	rk.proto = proto;
	ri = edge_rnat.lookup(&rk);
	if (!ri)
		return TC_ACT_UNSPEC;
	/* Only replies of a VIP connection of this backend (its entry, or with
	 * none its Maglev slot): the router's own probes and direct connections
	 * to the backend stay untouched. */
	fk.src = iph->daddr;
	fk.dst = ri->vip_addr;
	fk.sport = ((__be16 *)nh.pos)[1];
	fk.dport = ri->vip_port;
	fk.proto = proto;
	fi = edge_ct.lookup(&fk);
	if (!fi && (tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_RST_))) {
		/* tcp_flags: TCP only. The answer to a SYN of a half-open flow. */
		ho = edge_half_open.lookup(&fk);
		fi = ho ? &ho->ct : NULL;
	}
	if (!fi) {
		/* no entry: ours if the Maglev table says so (stateless.h) */
		if (!stateless_reply(skb, &fk, &rk, ri, tcp_flags))
			return TC_ACT_UNSPEC;
	} else if (fi->backend_id != ri->backend_id) {
		/* The connection is another backend's (moved, or given anew
		 * to another by a SYN sent again): this backend's late
		 * packets, a SYN-ACK above all, must not leave with its
		 * address, unless its SYN went to it directly. */
		if (proto != IPPROTO_TCP || is_direct(&fk, &rk))
			return TC_ACT_UNSPEC;
		count_reason(ri->vip_id, EDGE_DROP_OTHER_BACKEND);
		return TC_ACT_SHOT;
	} else if (proto == IPPROTO_TCP) {
		if (tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_RST_)) {
			bpf_skb_load_bytes(skb, l4_off + 8, &ack_seq, sizeof(ack_seq));
			/* a direct connection on a VIP flow's port: its entry
			 * went, edge_direct keeps its replies as they are */
			if (classify_answer(fi, &fk, &rk, ho, tcp_flags, ack_seq, &answer) != TC_ACT_OK)
				return TC_ACT_UNSPEC;
			if (ho && (tcp_flags & TCP_FLAG_SYN_) &&
			    bpf_skb_load_bytes(skb, l4_off + 4, &seq, sizeof(seq)) == 0) {
				ho->ack_seq = bpf_htonl(bpf_ntohl(seq) + 1);
				ho->flags |= EDGE_HO_F_ANSWERED;
			}
		}
	}

	csum_off = l4_csum_off(proto, l4_off, &csum_flags); /* csum.h */
	bpf_l4_csum_replace(skb, csum_off, rk.addr, ri->vip_addr,
			    BPF_F_PSEUDO_HDR | csum_flags | sizeof(rk.addr));
	if (rk.port != ri->vip_port) /* most services keep the port: one helper call less */
		bpf_l4_csum_replace(skb, csum_off, rk.port, ri->vip_port,
				    csum_flags | sizeof(rk.port));

	if (answer != ANSWER_NONE)
		note_answer(ri, answer);
	if (proto == IPPROTO_TCP && fi)					/* none on the stateless path */
		wire_reply(skb, fi, ri->backend_id, tcp_flags, l4_off); /* wire.h */
	count_return(ri->vip_id, ri->backend_id);
	count_index(ri->vip_id, EDGE_CNT_RETURN_NAT);
	return reply_out(skb, l3_off, l4_off, ri->vip_addr, ri->vip_port, ri->vip_id);
}
