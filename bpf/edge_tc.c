/* SPDX-License-Identifier: Apache-2.0 */
/* edge_tc.c: return path of NAT mode, on clsact ingress of the
 * backend-facing interfaces. A reply from a backend to a client gets the
 * VIP back as its source; everything else continues untouched. Uses the
 * kernel's checksum helpers, which also handle partial checksums. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/stddef.h>
#include "include/maps.h"
#include "include/parse.h"
#include "include/stats.h"

#define IP_CSUM_OFF	offsetof(struct iphdr, check)
#define IP_SADDR_OFF	offsetof(struct iphdr, saddr)

int edge_return(struct __sk_buff *skb)
{
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = (void *)(long)skb->data };
	struct flow_key rk = {};
	struct rnat_info *ri;
	struct ethhdr *eth;
	struct iphdr *iph;
	__u32 l3_off, l4_off, csum_off, port_off, csum_flags;
	__be32 old_addr;
	__be16 old_port;
	int proto, vlans;

	proto = parse_eth(&nh, data_end, &eth, &vlans);
	if (proto != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	l3_off = nh.pos - (void *)(long)skb->data;
	proto = parse_ipv4(&nh, data_end, &iph, 0);
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	if (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return TC_ACT_UNSPEC;
	/* Ports are the first four bytes of TCP and UDP alike. */
	if (nh.pos + 4 > data_end)
		return TC_ACT_UNSPEC;

	rk.src = iph->saddr;
	rk.dst = iph->daddr;
	rk.sport = ((__be16 *)nh.pos)[0];
	rk.dport = ((__be16 *)nh.pos)[1];
	rk.proto = proto;
	ri = edge_rnat.lookup(&rk);
	if (!ri)
		return TC_ACT_UNSPEC;

	l4_off = nh.pos - (void *)(long)skb->data;
	if (proto == IPPROTO_TCP) {
		csum_off = l4_off + offsetof(struct tcphdr, check);
		csum_flags = 0;
	} else {
		csum_off = l4_off + offsetof(struct udphdr, check);
		csum_flags = BPF_F_MARK_MANGLED_0;
	}
	port_off = l4_off;	/* source port */
	old_addr = rk.src;
	old_port = rk.sport;

	bpf_l4_csum_replace(skb, csum_off, old_addr, ri->vip_addr,
			    BPF_F_PSEUDO_HDR | csum_flags | sizeof(old_addr));
	bpf_l4_csum_replace(skb, csum_off, old_port, ri->vip_port,
			    csum_flags | sizeof(old_port));
	bpf_skb_store_bytes(skb, port_off, &ri->vip_port, sizeof(old_port), 0);
	bpf_l3_csum_replace(skb, l3_off + IP_CSUM_OFF, old_addr, ri->vip_addr,
			    sizeof(old_addr));
	bpf_skb_store_bytes(skb, l3_off + IP_SADDR_OFF, &ri->vip_addr,
			    sizeof(old_addr), 0);

	count_return(ri->vip_id, ri->backend_id);
	return count_verdict(EDGE_CNT_RETURN_NAT, TC_ACT_OK);
}
