/* SPDX-License-Identifier: Apache-2.0 */
/* select.h: which backend a packet goes to: its conntrack entry when it has
 * one, else slot hash(5-tuple) % M of the VIP's active Maglev table. */
#ifndef EDGE_SELECT_H
#define EDGE_SELECT_H

#include "flow.h"

static __always_inline int backend_usable(const struct backend_info *be)
{
	return (be->flags & (EDGE_BE_F_VALID | EDGE_BE_F_UP)) ==
	       (EDGE_BE_F_VALID | EDGE_BE_F_UP);
}

/* Backend id from the active Maglev half, or EDGE_NO_BACKEND. */
static __always_inline __u32 maglev_pick(const struct vip_info *vip,
					 const struct pkt *pkt)
{
	__u32 idx, *bid;

	if (vip->id >= EDGE_MAX_SERVICES)
		return EDGE_NO_BACKEND;
	idx = ((vip->id << 1) | (vip->table & 1)) * EDGE_MAGLEV_M +
	      hash_flow(&pkt->flow) % EDGE_MAGLEV_M;
	bid = edge_maglev.lookup(&idx);
	return bid ? *bid : EDGE_NO_BACKEND;
}

/* Resolves the backend of this packet. Returns it (and its id in *bid) or
 * NULL when the VIP has none; *new_flow tells whether conntrack was missed. */
static __always_inline struct backend_info *
select_backend(const struct vip_info *vip, struct pkt *pkt, __u32 *bid,
	       int *new_flow)
{
	struct flow_info *fi = edge_ct.lookup(&pkt->flow);
	struct backend_info *be;

	if (fi) {
		*bid = fi->backend_id;
		be = edge_backends.lookup(bid);
		if (be && (be->flags & EDGE_BE_F_VALID)) {
			*new_flow = 0;
			return be;
		}
	}
	*new_flow = 1;
	*bid = maglev_pick(vip, pkt);
	be = edge_backends.lookup(bid);
	if (!be || !backend_usable(be))
		return NULL;
	flow_insert(pkt, vip, *bid, be);
	return be;
}

#endif /* EDGE_SELECT_H */
