/* SPDX-License-Identifier: Apache-2.0 */
/* select.h: which backend a packet goes to. An established flow keeps its
 * conntrack backend (unless that became unusable and the service reselects).
 * A new flow takes slot hash(5-tuple) % M of the VIP's active Maglev table,
 * tries EDGE_MAX_WALK more (rehashed) slots past unusable backends, then
 * picks among the service's usable primaries by hash, then its standbys.
 *
 * Three programs share this code, told apart by the constant stage: the
 * fast path (edge_ingress) takes established flows and new flows whose
 * first Maglev pick is usable without touching health state. Everything
 * else (ejection and probation bookkeeping, the walk, moving an established
 * flow) is the slow path, edge_ingress_slow, and what that does not find,
 * the fallback scan (standbys, panic mode), edge_ingress_scan. Each is
 * tail-called by the one before with the packet as it arrived: it parses
 * again and decides from the start, skipping what an earlier stage tried
 * (no side effect runs twice: the budget is the fast path's, passive_ok
 * the slow path's). So the fast path pays nothing for the rest, and each
 * program has the verifier's budget to itself. */
#ifndef EDGE_SELECT_H
#define EDGE_SELECT_H

#include "flow.h"
#include "health.h"
#include "stats.h"

#ifndef EDGE_MAX_WALK
#define EDGE_MAX_WALK	4	/* extra Maglev slots tried before the fallback scan */
#endif

/* The three programs of the ingress, each tail-calling the next through
 * edge_tails[its own stage]: the fast path; the slow path (first pick with
 * passive bookkeeping, the walk); the fallback scan. */
#define EDGE_STAGE_FAST		0
#define EDGE_STAGE_SLOW		1
#define EDGE_STAGE_SCAN		2

/* *drop of select_backend: the next stage decides (never counted). */
#define EDGE_TO_NEXT_STAGE	0xffffffff

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
 * written out before the walk in pick_new are on purpose. Before the slow
 * path had a program of its own, edge_ingress took 842,952 instructions
 * processed of the 1,000,000 budget (kernel 6.18, LLVM 14 through bcc
 * 0.26, default sizes), and each of these folds failed to load with E2BIG:
 * these two loops as one pass that records usable ids in a stack array;
 * the first pick folded into the walk loop as i == 0; a second call site of
 * this scan. Returning an id (not a pointer) and leaving pick_new by one
 * exit saved ~33k. netns-tests/test_verifier_budget.py prints every
 * program's count and fails above 60% of the budget. */
static __always_inline __u32
scan_backends(const struct service_cfg *sc, __u32 hash, __u64 now, __u32 pick_id)
{
	struct backend_info *pick;
	__u32 i, n = sc->n_backends, primaries, standbys, want, zero = 0;
	/* verifier: counted in a map value, which the verifier does not
	 * track, so the loop's paths converge per iteration instead of
	 * multiplying by every (primaries, standbys) pair (~95k less). */
	struct scan_counts *cnt = edge_scan_counts.lookup(&zero);
	__u16 kind;

	if (!cnt)
		return EDGE_NO_BACKEND;
	cnt->primaries = 0;
	cnt->standbys = 0;
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
			cnt->standbys++;
		else
			cnt->primaries++;
	}
	primaries = cnt->primaries;
	standbys = cnt->standbys;
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
 * set when that pick could not be used. Each stage does its part and
 * returns NULL for the next: the fast path takes only a first pick usable
 * without touching health state; the slow path judges the first pick with
 * passive bookkeeping, then walks; the scan stage scans. */
static __always_inline struct backend_info *
pick_new(const struct vip_info *vip, const struct service_cfg *sc,
	 const struct pkt *pkt, __u64 now, __u32 *bid, int *failover,
	 const int stage)
{
	__u32 hash = hash_flow(&pkt->flow), i, base, idx, *id, pick_id, found;
	struct backend_info *be;

	*failover = 0;
	if (vip->id >= EDGE_MAX_SERVICES)
		return NULL;
	base = maglev_base(vip);
	idx = maglev_index(base, hash);
	id = edge_maglev.lookup(&idx);
	/* An empty table (every primary drains) goes straight to the scan.
	 * verifier: the scan has one call site and the first pick stays out
	 * of the walk loop; see scan_backends for the counts. */
	pick_id = EDGE_NO_BACKEND;
	found = EDGE_NO_BACKEND;
	if (id && *id != EDGE_NO_BACKEND) {
		pick_id = *id;
		be = edge_backends.lookup(&pick_id);
		if (stage != EDGE_STAGE_SCAN && be && !(be->flags & EDGE_BE_F_DRAINING) &&
		    backend_health_ok(be, sc, now, 1, HEALTH_TRIAL) &&
		    (stage == EDGE_STAGE_SLOW ? passive_ok(be, sc, now) : passive_quiet(be, sc, now))) {
			found = pick_id;
			goto out;
		}
	}
	if (stage == EDGE_STAGE_FAST)
		return NULL;
	if (stage == EDGE_STAGE_SLOW && id && *id != EDGE_NO_BACKEND) {
		*failover = 1;
		/* Further picks come from independent hashes, not neighbouring
		 * slots, so a dead backend's flows spread by the others' weights.
		 * Not in panic mode (panic_below set): there the scan decides on
		 * the first pick, so a usable backend's share stays its own. */
		for (i = 0; i < EDGE_MAX_WALK && !sc->panic_below; i++) {
			idx = maglev_index(base, hash_mix(hash + i + 1));
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
	if (stage == EDGE_STAGE_SLOW)
		return NULL;
	*failover = pick_id != EDGE_NO_BACKEND;
	found = scan_backends(sc, hash, now, pick_id);
	if (found == EDGE_NO_BACKEND)
		return NULL;
out:
	/* verifier: one exit, so what follows is checked once, not per pick */
	*bid = found;
	return edge_backends.lookup(&found);
}

/* Resolves the backend of this packet, whose conntrack entry is fi (NULL:
 * none), or NULL with the drop reason in
 * *drop: the VIP has none usable, or the packet is TCP but no SYN, conntrack
 * does not know it, the budget for such entries is spent and its first
 * Maglev pick is not usable without the slow path (a usable one takes it
 * statelessly: no entry, *new_flow 0, counted EDGE_CNT_STATELESS), or, on
 * the fast path, EDGE_TO_SLOW_PATH. *new_flow: conntrack was missed or replaced;
 * *failover: see pick_new. The slow path takes no budget: the fast path
 * took it before handing the packet over. */
static __always_inline struct backend_info *
select_backend(const struct vip_info *vip, const struct service_cfg *sc,
	       struct pkt *pkt, struct flow_info *fi, __u64 now, __u32 *bid,
	       int *new_flow, int *failover, __u32 *drop, const int stage)
{
	struct backend_info *be;
	int stateless;

	*failover = 0;
	pkt->ct = fi;
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
	stateless = stage == EDGE_STAGE_FAST && !fi && pkt->flow.proto == IPPROTO_TCP &&
		    !pkt->syn && !ct_budget_take();
	/* verifier: on the fast path a flow that moves is the slow path's */
	be = stage || !fi ? pick_new(vip, sc, pkt, now, bid, failover, stage) : NULL;
	if (!be) {
		if (stateless)
			*drop = EDGE_DROP_UNTRACKED;
		else if (stage != EDGE_STAGE_SCAN)
			*drop = EDGE_TO_NEXT_STAGE;
		return NULL;
	}
	if (stateless) {
		/* Over the budget, a usable Maglev pick still takes the packet,
		 * without an entry: a flow another router had (ECMP) finds the
		 * backend the identical table gives it (stateless.h). */
		*new_flow = 0;
		count_index(EDGE_CNT_STATELESS);
		return be;
	}
	if (fi) {
		/* An established flow moved: rewritten in place, so moving
		 * flows never evicts another entry. */
		*failover = 1;
		fi->flags = syn_flags(pkt) | wire_move(fi, *bid, pkt->syn);
		fi->backend_id = *bid;
		fi->syn_seq = pkt->seq;
		return be;
	}
	flow_insert(pkt, vip, *bid, sc->flags & EDGE_SVC_F_DSR);
	return be;
}

#endif /* EDGE_SELECT_H */
