/* SPDX-License-Identifier: Apache-2.0 */
/* select.h: which backend a packet goes to. An established flow keeps its
 * conntrack backend (unless that became unusable and the service reselects).
 * A new flow takes slot hash(5-tuple) % M of the VIP's active Maglev table,
 * tries EDGE_MAX_WALK more (rehashed) slots past unusable backends, then
 * picks among the service's usable primaries by hash, then its standbys. */
#ifndef EDGE_SELECT_H
#define EDGE_SELECT_H

#include "flow.h"
#include "health.h"

#ifndef EDGE_MAX_WALK
#define EDGE_MAX_WALK	4	/* extra Maglev slots tried before the fallback scan */
#endif

/* Admin-up and not draining, whatever its health. */
static __always_inline int in_service(const struct backend_info *be)
{
	return (be->flags & (EDGE_BE_F_VALID | EDGE_BE_F_UP | EDGE_BE_F_DRAINING)) ==
	       (EDGE_BE_F_VALID | EDGE_BE_F_UP);
}

/* Usable and allowed new flows (not draining). */
static __always_inline int takes_new_flows(const struct backend_info *be,
					   const struct service_cfg *sc, __u64 now)
{
	return !(be->flags & EDGE_BE_F_DRAINING) && backend_usable(be, sc, now);
}

/* Id of a deterministic pick among the service's usable backends: the
 * (hash % count)-th primary, or if no primary is usable the
 * (hash % count)-th standby, or EDGE_NO_BACKEND. Slow path only. Panic
 * mode: with fewer than panic_below primaries usable (and some usable, or
 * no standby), pick_id (the Maglev slot's backend) takes the flow if it is
 * in service, health ignored, so new flows spread over all in-service
 * primaries by weight.
 *
 * verifier: the two loops (count, then pick) and the first Maglev pick
 * written out before the walk in pick_new are on purpose. edge_ingress as
 * it is: 842,952 instructions processed of the 1,000,000 budget (kernel
 * 6.18, LLVM 14 through bcc 0.26, default sizes; 744,954 before the health
 * hardening). Each of these folds was measured and fails to load with
 * E2BIG (over 1M): these two loops as one pass that records usable ids in
 * a stack array; the first pick folded into the walk loop as i == 0; a
 * second call site of this scan (an early return for an empty table).
 * Returning an id (not a pointer) and leaving pick_new by one exit saves
 * ~33k. tools/bench-datapath prints the count (verified_insns): read it
 * before and after changing this file. */
static __always_inline __u32
scan_backends(const struct service_cfg *sc, __u32 hash, __u64 now, __u32 pick_id)
{
	struct backend_info *pick;
	__u32 i, n = sc->n_backends, primaries = 0, standbys = 0, want;
	__u16 kind;

	for (i = 0; i < EDGE_MAX_PER_SERVICE; i++) {
		struct backend_info *be;
		__u32 id;

		if (i >= n)
			break;
		id = sc->backends[i];
		be = edge_backends.lookup(&id);
		if (!be || !takes_new_flows(be, sc, now))
			continue;
		if (be->flags & EDGE_BE_F_STANDBY)
			standbys++;
		else
			primaries++;
	}
	if (primaries < sc->panic_below && (primaries || !standbys)) {
		pick = edge_backends.lookup(&pick_id);
		if (pick && in_service(pick))
			return pick_id;
	}
	if (primaries) {
		kind = 0;
		want = hash % primaries;
	} else if (standbys) {
		kind = EDGE_BE_F_STANDBY;
		want = hash % standbys;
	} else {
		return EDGE_NO_BACKEND;
	}
	for (i = 0; i < EDGE_MAX_PER_SERVICE; i++) {
		struct backend_info *be;
		__u32 id;

		if (i >= n)
			break;
		id = sc->backends[i];
		be = edge_backends.lookup(&id);
		if (!be || (be->flags & EDGE_BE_F_STANDBY) != kind ||
		    !takes_new_flows(be, sc, now))
			continue;
		if (want-- == 0)
			return id;
	}
	return EDGE_NO_BACKEND;
}

/* Backend for a flow without a (usable) conntrack entry. Passive detection
 * is judged on the Maglev pick itself (it may eject it there); *failover is
 * set when that pick could not be used. */
static __always_inline struct backend_info *
pick_new(const struct vip_info *vip, const struct service_cfg *sc,
	 const struct pkt *pkt, __u64 now, __u32 *bid, int *failover)
{
	__u32 hash = hash_flow(&pkt->flow), slot, i, base, idx, *id, pick_id, found;
	struct backend_info *be;

	*failover = 0;
	if (vip->id >= EDGE_MAX_SERVICES)
		return NULL;
	base = ((vip->id << 1) | (vip->table & 1)) * EDGE_MAGLEV_M;
	slot = hash % EDGE_MAGLEV_M;
	idx = base + slot;
	id = edge_maglev.lookup(&idx);
	/* An empty table (every primary drains) goes straight to the scan.
	 * verifier: the scan has one call site and the first pick stays out
	 * of the walk loop; see scan_backends for the counts. */
	pick_id = EDGE_NO_BACKEND;
	found = EDGE_NO_BACKEND;
	if (id && *id != EDGE_NO_BACKEND) {
		pick_id = *id;
		be = edge_backends.lookup(&pick_id);
		if (be && !(be->flags & EDGE_BE_F_DRAINING) &&
		    backend_health_ok(be, sc, now, 1, HEALTH_TRIAL) && passive_ok(be, sc, now)) {
			found = pick_id;
			goto out;
		}
		*failover = 1;
		/* Further picks come from independent hashes, not neighbouring
		 * slots, so a dead backend's flows spread by the others' weights.
		 * Not in panic mode (panic_below set): there the scan decides on
		 * the first pick, so a usable backend's share stays its own. */
		for (i = 0; i < EDGE_MAX_WALK && !sc->panic_below; i++) {
			slot = hash_mix(hash + i + 1) % EDGE_MAGLEV_M;
			idx = base + slot;
			id = edge_maglev.lookup(&idx);
			if (!id)
				break;
			be = edge_backends.lookup(id);
			if (be && takes_new_flows(be, sc, now)) {
				found = *id;
				goto out;
			}
		}
	}
	found = scan_backends(sc, hash, now, pick_id);
	if (found == EDGE_NO_BACKEND)
		return NULL;
out:
	/* verifier: one exit, so what follows is checked once, not per pick */
	*bid = found;
	return edge_backends.lookup(&found);
}

/* Resolves the backend of this packet, or NULL with the drop reason in
 * *drop: the VIP has none usable, or the packet is TCP but no SYN, conntrack
 * does not know it and the budget for such entries is spent (forwarded, its
 * answer could not be reverse-NATed). *new_flow: conntrack was missed or
 * replaced; *failover: see pick_new. */
static __always_inline struct backend_info *
select_backend(const struct vip_info *vip, const struct service_cfg *sc,
	       struct pkt *pkt, __u64 now, __u32 *bid, int *new_flow,
	       int *failover, __u32 *drop)
{
	struct flow_info *fi = edge_ct.lookup(&pkt->flow);
	struct backend_info *be;

	*failover = 0;
	if (fi) {
		*bid = fi->backend_id;
		be = edge_backends.lookup(bid);
		if (be && (be->flags & EDGE_BE_F_VALID)) {
			*new_flow = 0;
			/* "keep" keeps connections, not tuples: a SYN reusing
			 * one is a new connection, held to the new-flow rules
			 * (a standby is re-picked: maybe a primary is back). */
			if (pkt->syn ? !(be->flags & EDGE_BE_F_STANDBY) &&
				       takes_new_flows(be, sc, now) :
			    ((vip->flags & EDGE_VIP_F_KEEP_FLOWS) ||
			     backend_alive(be, sc, now)))
				return be;
		}
	}
	*new_flow = 1;
	*drop = EDGE_DROP_NO_BACKEND;
	if (!fi && pkt->flow.proto == IPPROTO_TCP && !pkt->syn && !ct_budget_take()) {
		*drop = EDGE_DROP_UNTRACKED;
		return NULL;
	}
	be = pick_new(vip, sc, pkt, now, bid, failover);
	if (!be)
		return NULL;
	if (fi) {
		/* An established flow moved: rewritten in place, so moving
		 * flows never evicts another entry. */
		*failover = 1;
		fi->backend_id = *bid;
		fi->flags = syn_flags(pkt);
		fi->syn_seq = pkt->seq;
		return be;
	}
	flow_insert(pkt, vip, *bid);
	return be;
}

#endif /* EDGE_SELECT_H */
