/* SPDX-License-Identifier: Apache-2.0 */
/* stats.h: the one place verdicts, drops and traffic are counted. Every exit
 * of the data path goes through count_verdict() or count_drop(), with the
 * service it belongs to (EDGE_NO_SERVICE when none is known). */
#ifndef EDGE_STATS_H
#define EDGE_STATS_H

#include "maps.h"

/* Counter i (EDGE_CNT_*, or EDGE_CNT_MAX + EDGE_DROP_*) of service vid: a
 * VIP id, or EDGE_NO_SERVICE when the packet is no known service's (before
 * the VIP lookup, heartbeats). One lookup, as a node-wide counter cost:
 * readers sum the slots for the node's counts. */
static __always_inline void count_index(__u32 vid, __u32 i)
{
	__u32 key;
	__u64 *cnt;

	if (vid > EDGE_NO_SERVICE)
		vid = EDGE_NO_SERVICE;
	key = vid * EDGE_SVC_COUNTERS + i;
	cnt = edge_svc_counts.lookup(&key);
	if (cnt)
		*cnt += 1;
}

/* Counts a packet of service vid under EDGE_CNT_* and returns the action. */
static __always_inline int count_verdict(__u32 vid, __u32 cnt, int action)
{
	count_index(vid, cnt);
	return action;
}

/* Counts a drop of service vid under its EDGE_DROP_* reason (and as a drop
 * verdict). */
static __always_inline void count_reason(__u32 vid, __u32 reason)
{
	if (reason < EDGE_DROP_MAX) /* else no reason's number: a drop only */
		count_index(vid, EDGE_CNT_MAX + reason);
	count_index(vid, EDGE_CNT_DROP);
}

/* XDP: counts a drop of service vid with its reason; returns XDP_DROP. */
static __always_inline int count_drop(__u32 vid, __u32 reason)
{
	count_reason(vid, reason);
	return XDP_DROP;
}

static __always_inline void add_traffic(struct traffic_stats *st, __u32 bytes,
					int new_flow, int failover)
{
	if (!st)
		return;
	st->packets += 1;
	st->bytes += bytes;
	st->new_flows += new_flow;
	st->failovers += failover;
}

/* Forward-direction traffic of one packet, per VIP and per backend. */
static __always_inline void count_traffic(__u32 vip_id, __u32 backend_id,
					  __u32 bytes, int new_flow, int failover)
{
	add_traffic(edge_vip_stats.lookup(&vip_id), bytes, new_flow, failover);
	add_traffic(edge_be_stats.lookup(&backend_id), bytes, new_flow, failover);
}

/* Return-direction packet of one backend and its VIP. */
static __always_inline void count_return(__u32 vip_id, __u32 backend_id)
{
	struct traffic_stats *st = edge_vip_stats.lookup(&vip_id);

	if (st)
		st->return_packets += 1;
	st = edge_be_stats.lookup(&backend_id);
	if (st)
		st->return_packets += 1;
}

#endif /* EDGE_STATS_H */
