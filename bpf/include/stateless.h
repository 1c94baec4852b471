/* SPDX-License-Identifier: Apache-2.0 */
/* stateless.h: the return path of a TCP connection this router has no
 * conntrack entry for (it came through another router before ECMP moved it
 * here, or its entry was evicted): reverse NAT when the Maglev slot of its
 * (client, VIP) tuple names the sending backend, as the ingress forwards
 * such a flow's packets over the budget (select.h). Direct connections to a
 * backend's own address, which no table can tell from VIP ones, are known by
 * their SYN-ACK (without an entry, or not answering the entry's SYN: a port a
 * VIP flow used before) and kept in edge_direct. Kernel side
 * only; the forward half lives in select_backend. */
#ifndef EDGE_STATELESS_H
#define EDGE_STATELESS_H

#include "maps.h"
#include "flow.h"
#include "stats.h"

#define TCP_FLAG_FIN_	0x01
#define TCP_FLAG_SYN_	0x02
#define TCP_FLAG_RST_	0x04
#define TCP_FLAG_ACK_	0x10

/* The edge_direct key of the connection of client fk (as the ingress sees
 * it) to backend endpoint bk. */
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

/* The connection of client fk (as the ingress sees it) to backend endpoint
 * bk answered a SYN that did not come through the VIP: a direct one. */
static __always_inline void note_direct(const struct flow_key *fk, const struct backend_key *bk)
{
	struct direct_key dk = direct_key_of(fk, bk);
	__u32 one = 1;

	edge_direct.update(&dk, &one);
}

/* 1 when the reply from backend endpoint bk (ri: its edge_rnat entry) with
 * TCP flags tcp_flags to the client of fk (the connection as the ingress sees
 * it: client -> VIP) and no conntrack entry is to be reverse-NATed; 0 leaves
 * it alone. A SYN-ACK without an entry answers a SYN that did not come
 * through the VIP: that connection is remembered as direct and its replies
 * are left alone from then on. Otherwise the reply is ours when the VIP's
 * active Maglev table gives the tuple's slot to this backend (the first
 * pick only: a flow the old router walked past an unusable pick is not
 * recognised). Such a reply that is no RST or FIN puts the entry back, so
 * the connection's next packets find it; a backend sends those only on
 * connections it has, so spoofed packets cannot fill conntrack this way. */
static __always_inline int stateless_reply(struct flow_key *fk, const struct backend_key *bk,
					   const struct rnat_info *ri, __u8 tcp_flags)
{
	struct direct_key dk = direct_key_of(fk, bk);
	struct vip_key vk = {
		.addr = ri->vip_addr,
		.port = ri->vip_port,
		.proto = IPPROTO_TCP,
	};
	struct flow_info fi = {
		.backend_id = ri->backend_id,
		.vip_id = ri->vip_id,
	};
	struct vip_info *vip;
	__u32 idx, *id;

	if (fk->proto != IPPROTO_TCP)
		return 0;
	if ((tcp_flags & (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) == (TCP_FLAG_SYN_ | TCP_FLAG_ACK_)) {
		note_direct(fk, bk);
		return 0;
	}
	if (edge_direct.lookup(&dk))
		return 0;
	vip = edge_vips.lookup(&vk);
	if (!vip || vip->id != ri->vip_id || vip->id >= EDGE_MAX_SERVICES)
		return 0;
	idx = maglev_index(maglev_base(vip), hash_flow(fk));
	id = edge_maglev.lookup(&idx);
	if (!id || *id != ri->backend_id)
		return 0;
	if (!(tcp_flags & (TCP_FLAG_RST_ | TCP_FLAG_FIN_)))
		edge_ct.insert(fk, &fi);	/* BPF_NOEXIST: a SYN's entry made meanwhile stays */
	count_index(EDGE_CNT_RETURN_STATELESS);
	return 1;
}

#endif /* EDGE_STATELESS_H */
