/* SPDX-License-Identifier: Apache-2.0 */
/* stateless.h: the return path of a TCP connection this router has no
 * conntrack entry for (it came through another router before ECMP moved it
 * here, or its entry was evicted): reverse NAT when the Maglev slot of its
 * (client, VIP) tuple names the sending backend, as the ingress forwards
 * such a flow's packets over the budget (select.h). Direct connections to a
 * backend's own address, which no table can tell from VIP ones, are known by
 * their SYN (direct_syn, where the ingress or the return path sees it; the
 * router's own by their SYN-ACK to a local address) and kept in edge_direct.
 * Nothing here makes a conntrack entry: replies, which a backend or anything
 * spoofing one can send at will, must not fill it. Kernel side only; the
 * forward half lives in select_backend. */
#ifndef EDGE_STATELESS_H
#define EDGE_STATELESS_H

#include "maps.h"
#include "flow.h"
#include "stats.h"

#define TCP_FLAG_FIN_ 0x01
#define TCP_FLAG_SYN_ 0x02
#define TCP_FLAG_RST_ 0x04
#define TCP_FLAG_ACK_ 0x10

/* The key of edge_direct for client fk (as the ingress sees it: client ->
 * VIP) and backend endpoint bk. */
static __always_inline struct direct_key direct_key_of(const struct flow_key *fk,
						       const struct backend_key *bk)
{
	struct direct_key dk = {
		.backend = bk->addr,
		.client = fk->src,
		.backend_port = bk->port,
		.client_port = fk->sport,
	};

	return dk;
}

/* The connection of client fk to backend endpoint bk is a direct one. */
static __always_inline void note_direct(const struct flow_key *fk, const struct backend_key *bk)
{
	struct direct_key dk = direct_key_of(fk, bk);
	__u32 one = 1;

	edge_direct.update(&dk, &one);
}

/* 1 when the connection of client fk to backend endpoint bk is known direct. */
static __always_inline int is_direct(const struct flow_key *fk, const struct backend_key *bk)
{
	struct direct_key dk = direct_key_of(fk, bk);

	return edge_direct.lookup(&dk) != NULL;
}

/* A TCP SYN (syn: as it travels, client -> destination) that is not for a
 * VIP: when it opens a connection to a backend endpoint, that connection is
 * direct and its replies keep the backend's address. */
static __always_inline void direct_syn(const struct flow_key *syn)
{
	struct backend_key bk = {
		.addr = syn->dst,
		.port = syn->dport,
		.proto = IPPROTO_TCP,
	};

	if (syn->proto == IPPROTO_TCP && edge_rnat.lookup(&bk))
		note_direct(syn, &bk);
}

/* 1 when the router itself is the destination of this reply (bpf_fib_lookup
 * says local: it forwards nothing there): the router's own connection to
 * the backend, e.g. edged's probes, whose SYN no program of ours sees. */
static __always_inline int to_router(struct __sk_buff *skb, __be32 saddr, __be32 daddr)
{
	struct bpf_fib_lookup fib = {};

	fib.family = 2; /* AF_INET */
	fib.l4_protocol = IPPROTO_TCP;
	fib.ipv4_src = saddr;
	fib.ipv4_dst = daddr;
	fib.ifindex = skb->ingress_ifindex;
	return bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_NOT_FWDED;
}

/* 1 when the reply from backend endpoint bk (ri: its edge_rnat entry) with
 * TCP flags tcp_flags to the client of fk (the connection as the ingress sees
 * it: client -> VIP) and no conntrack entry is to be reverse-NATed; 0 leaves
 * it alone. A connection known direct (direct_syn) is left alone; so is a
 * SYN-ACK to the router itself, whose connection is remembered as direct.
 * Otherwise the reply is ours when the VIP's active Maglev table gives the
 * tuple's slot to this backend (the first pick only: a flow the old router
 * walked past an unusable pick is not recognised): a SYN-ACK too, so the
 * retransmitted SYN-ACK of a VIP connection whose entry was evicted never
 * leaves with the backend's address. No entry is made: the connection's next
 * packet through the ingress makes one, within its budget. */
static __always_inline int stateless_reply(struct __sk_buff *skb, struct flow_key *fk,
					   const struct backend_key *bk, const struct rnat_info *ri,
					   __u8 tcp_flags)
{
	struct vip_key vk = {
		.addr = ri->vip_addr,
		.port = ri->vip_port,
		.proto = IPPROTO_TCP,
	};
	struct vip_info *vip;
	__u32 idx, *id;

	if (fk->proto != IPPROTO_TCP || is_direct(fk, bk))
		return 0;
	if ((tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == (TCP_FLAG_SYN_ | TCP_FLAG_ACK_) &&
	    to_router(skb, bk->addr, fk->src)) {
		note_direct(fk, bk);
		return 0;
	}
	vip = edge_vips.lookup(&vk);
	if (!vip || vip->id != ri->vip_id || vip->id >= EDGE_MAX_SERVICES)
		return 0;
	idx = maglev_index(maglev_base(vip), hash_flow(fk));
	id = maglev_slot(idx);
	if (!id || *id != ri->backend_id)
		return 0;
	count_index(ri->vip_id, EDGE_CNT_RETURN_STATELESS);
	return 1;
}

#endif /* EDGE_STATELESS_H */
