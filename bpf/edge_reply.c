/* SPDX-License-Identifier: Apache-2.0 */
/* edge_reply.c: XDP on the backend-facing interfaces, the fast path of
 * replies. It handles only the common case, an IPv4 TCP or UDP reply of a
 * VIP connection that conntrack pins to this backend, with nothing for the
 * return path to note: it gives the reply the VIP back as its source,
 * updates both checksums incrementally and redirects it to the client-facing
 * interface the router's ingress program runs on. Everything else goes on
 * (XDP_PASS) to the tc program (edge_tc.c), which handles it exactly as
 * without this one: heartbeats, SYN/RST/FIN (passive detection, wire counts),
 * pending wire samples, replies without a conntrack entry, VLAN tags, IPv4
 * options, fragments, an unresolved neighbour, an MTU exceeded, another
 * egress interface, and L4 checksums in partial form (see partial_csum).
 * The reverse-NAT entry of the sending backend comes from a per-CPU copy
 * (rnat_cached) while edge_rnat is unchanged, so a reply takes one hash
 * lookup, conntrack's. */
#include <uapi/linux/bpf.h>
#include <linux/stddef.h>
#include "include/maps.h"
#include "include/parse.h"
#include "include/stats.h"
#include "include/nat.h"

#define REPLY_TCP_SLOW 0x07 /* FIN | SYN | RST: the return path notes them */

/* 1 when a UDP datagram may be a heartbeat: its payload starts with the
 * heartbeat magic. tc's consume_heartbeat takes as heartbeats only
 * datagrams to a heartbeat port whose payload starts so, and looks the port
 * up itself; a reply that merely starts with those four bytes only takes
 * tc's slower path. Testing the magic instead of the port spares every UDP
 * reply a hash lookup (edge_hb_ports). */
static __always_inline int maybe_heartbeat(const struct udphdr *uh, void *data_end)
{
	const __be32 *magic = (const void *)(uh + 1);

	return (void *)(magic + 1) <= data_end && *magic == bpf_htonl(EDGE_HB_MAGIC);
}

/* 1 when the L4 checksum field holds the folded pseudo-header sum, as a
 * packet sent with a partial checksum (CHECKSUM_PARTIAL: a local stack on
 * a veth, GRO'd packets in generic mode) does: the rest is summed later by
 * whoever completes it, so the field needs another update than a full
 * checksum, which only tc's helpers can tell apart. A full checksum that
 * happens to have this value (1 in 65,536) goes to tc too, which is only
 * slower. */
static __always_inline int partial_csum(const struct iphdr *iph, __u16 check, __u16 l4_len)
{
	__u32 sum = (iph->saddr & 0xffff) + (iph->saddr >> 16) +
		    (iph->daddr & 0xffff) + (iph->daddr >> 16) +
		    bpf_htons(iph->protocol) + bpf_htons(l4_len);

	return csum_fold(sum) == check;
}

/* struct backend_key as one word, the tag of its edge_rnat_cache slot */
union rnat_tag {
	struct backend_key key;
	__u64 word;
};

/* The checksum change of the TTL dropping by one: ~old + new of the 16-bit
 * word it shares with the protocol (TTL in the high byte), whatever the
 * word: 0xfeff in network order. */
#define TTL_DEC_DELTA bpf_htons(0xfeff)

/* The edge_rnat entry of the backend endpoint rk, from this CPU's copy when
 * it was made under gen, the current node_info.rnat_gen (read before this
 * call: an entry looked up while user space changes edge_rnat is copied
 * under the older generation, so the next packet looks it up again), else
 * looked up and copied into the endpoint's slot with the checksum changes
 * of its reverse NAT (folded: applied to a checksum, a folded change gives
 * what the unfolded sum does). NULL: no entry. Two endpoints sharing a slot
 * on one CPU take turns, each turn a lookup, as without the copy. */
static __always_inline const struct rnat_slot *rnat_cached(const struct backend_key *rk, __u64 gen)
{
	union rnat_tag tag = { .key = *rk };
	__u32 idx = hash_mix((__u32)tag.word ^ (__u32)(tag.word >> 32)) & (EDGE_RNAT_CACHE_SLOTS - 1);
	struct rnat_slot *slot = edge_rnat_cache.lookup(&idx);
	struct rnat_info *ri;
	__u32 addr;

	if (!slot)
		return NULL;
	if (slot->key == tag.word && slot->gen == gen)
		return slot;
	ri = edge_rnat.lookup((struct backend_key *)rk);
	if (!ri)
		return NULL;
	slot->key = tag.word;
	slot->gen = gen;
	slot->info = *ri;
	addr = csum_delta32(rk->addr, ri->vip_addr);
	slot->csum_ip = csum_fold(addr + TTL_DEC_DELTA);
	slot->csum_l4 = csum_fold(addr + csum_delta16(rk->port, ri->vip_port));
	return slot;
}

/* Source address and port become the VIP's and the TTL drops by one; IPv4
 * and L4 checksums follow, each with the change its copy of the edge_rnat
 * entry carries (rnat_cached; a zero UDP checksum means "none" and stays
 * so). */
static __always_inline void snat_xdp(struct iphdr *iph, __be16 *sport, __u16 *check, int udp,
				     const struct rnat_slot *rs)
{
	__u16 c = *check;

	if (!udp || c) {
		c = csum_apply(c, rs->csum_l4);
		*check = (udp && !c) ? 0xffff : c;
	}
	iph->ttl--;
	iph->check = csum_apply(iph->check, rs->csum_ip);
	iph->saddr = rs->info.vip_addr;
	*sport = rs->info.vip_port;
}

int edge_reply(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);
	struct bpf_fib_lookup fib; /* filled by reply_hop_at on a cache miss */
	struct reply_hop *hop = NULL;
	struct backend_key rk = {};
	struct flow_key fk = {};
	const struct rnat_slot *rs;
	const struct rnat_info *ri;
	struct node_info *node;
	struct flow_info *fi;
	__u32 zero = 0, len = data_end - data;
	__u16 *check;
	__be16 *ports;
	int udp;

	if ((void *)(iph + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	if (iph->ihl != 5 || iph->ttl <= 1 || (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
	    bpf_ntohs(iph->tot_len) > len - sizeof(*eth))
		return XDP_PASS;
	ports = (void *)(iph + 1);
	if (iph->protocol == IPPROTO_TCP) {
		struct tcphdr *th = (void *)ports;

		if ((void *)(th + 1) > data_end || (((__u8 *)th)[13] & REPLY_TCP_SLOW))
			return XDP_PASS;
		check = &th->check;
		udp = 0;
	} else if (iph->protocol == IPPROTO_UDP) {
		struct udphdr *uh = (void *)ports;

		if ((void *)(uh + 1) > data_end || maybe_heartbeat(uh, data_end))
			return XDP_PASS;
		check = &uh->check;
		udp = 1;
	} else {
		return XDP_PASS;
	}
	if (partial_csum(iph, *check, bpf_ntohs(iph->tot_len) - sizeof(*iph)))
		return XDP_PASS;

	node = edge_node.lookup(&zero); /* rnat_gen; ingress_ifindex below */
	if (!node)
		return XDP_PASS;
	rk.addr = iph->saddr;
	rk.port = ports[0];
	rk.proto = iph->protocol;
	rs = rnat_cached(&rk, *(volatile __u64 *)&node->rnat_gen);
	if (!rs)
		return XDP_PASS;
	ri = &rs->info;
	fk.src = iph->daddr;
	fk.dst = ri->vip_addr;
	fk.sport = ports[1];
	fk.dport = ri->vip_port;
	fk.proto = iph->protocol;
	fi = edge_ct.lookup(&fk);
	if (!fi || fi->backend_id != ri->backend_id || (fi->flags & EDGE_CT_F_WIRE_WAIT))
		return XDP_PASS;

	/* Only to the interface edge_ingress runs on: a driver that takes XDP
	 * frames (on veth: whose peer runs NAPI, as the forward direction
	 * needs of the backends' side). Other egress interfaces go through tc. */
	if (reply_hop_at(ctx, ctx->ingress_ifindex, len, 0, iph, ri->vip_addr, &fib,
			 &hop) != BPF_FIB_LKUP_RET_SUCCESS ||
	    !hop ||
	    hop->ifindex != node->ingress_ifindex || len > hop->mtu + sizeof(*eth))
		return XDP_PASS;

	snat_xdp(iph, ports, check, udp, rs);
	set_macs(eth, hop->dmac, hop->smac);
	count_return(ri->vip_id, ri->backend_id);
	/* one verdict counter per reply: readers count it under return_nat too */
	return count_verdict(ri->vip_id, EDGE_CNT_RETURN_XDP, bpf_redirect(hop->ifindex, 0));
}
