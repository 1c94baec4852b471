/* SPDX-License-Identifier: Apache-2.0 */
/* select.h: which backend a packet goes to. An established flow keeps its
 * conntrack backend (unless that became unusable and the service reselects).
 * A new flow takes slot hash(5-tuple) % M of the VIP's active Maglev table
 * (with EDGE_SVC_F_TWO_CHOICES, that or a second backend, whichever has
 * fewer open connections: two_choices), tries EDGE_MAX_WALK more (rehashed)
 * slots past unusable backends, then picks among the service's usable
 * primaries by hash, then its standbys (a scan in chunks, each run of the
 * scan program one chunk).
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
#define EDGE_MAX_WALK 4 /* extra Maglev slots tried before the fallback scan */
#endif

/* The three programs of the ingress, each tail-calling the next through
 * edge_tails[its own stage]: the fast path; the slow path (first pick with
 * passive bookkeeping, the walk); the fallback scan. */
#define EDGE_STAGE_FAST 0
#define EDGE_STAGE_SLOW 1
#define EDGE_STAGE_SCAN 2

/* *drop of select_backend: the next stage decides (never counted). */
#define EDGE_TO_NEXT_STAGE 0xffffffff

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

#ifndef EDGE_SCAN_CHUNK
#define EDGE_SCAN_CHUNK 64 /* backends one run of the scan program looks at */
#endif

/* scan_backends: not done, the scan program runs again (tail call). */
#define EDGE_SCAN_MORE 0xfffffffe

/* Score of backend id for a flow of this hash: rendezvous (highest random
 * weight) hashing, so the pick among usable backends needs no count first
 * and moves only the flows of a backend that goes. */
static __always_inline __u32 scan_score(__u32 hash, __u32 id)
{
	return hash_mix(hash ^ hash_mix(id + EDGE_HASH_SEED));
}

/* Starts the scan of one packet (flow hash, service vip_id) from the
 * service's first backend. */
static __always_inline void scan_begin(__u32 hash, __u32 vip_id)
{
	__u32 zero = 0;
	struct scan_state *st = edge_scan_state.lookup(&zero);

	if (!st)
		return;
	st->hash = hash;
	st->vip_id = vip_id;
	st->pos = 0;
	st->primaries = 0;
	st->standbys = 0;
	st->best_p = EDGE_NO_BACKEND;
	st->best_s = EDGE_NO_BACKEND;
}

/* Takes backend id, usable for new flows, into the scan's running pick. */
static __always_inline void scan_take(struct scan_state *st, const struct backend_info *be,
				      __u32 id, __u32 hash)
{
	__u32 score = scan_score(hash, id);

	if (be->flags & EDGE_BE_F_STANDBY) {
		st->standbys++;
		if (st->best_s == EDGE_NO_BACKEND || score > st->score_s) {
			st->best_s = id;
			st->score_s = score;
		}
		return;
	}
	st->primaries++;
	if (st->best_p == EDGE_NO_BACKEND || score > st->score_p) {
		st->best_p = id;
		st->score_p = score;
	}
}

/* Id of a deterministic pick among the service's usable backends: the
 * primary of the highest scan_score, or if no primary is usable the standby
 * of the highest score, or EDGE_NO_BACKEND; EDGE_SCAN_MORE while backends
 * are left to look at. Scan stage only. Panic mode: with fewer than
 * panic_below primaries usable (and some usable, or no standby), pick_id
 * (the Maglev slot's backend) takes the flow if it is in service, health
 * ignored, so new flows spread over all in-service primaries by weight.
 *
 * One run looks at EDGE_SCAN_CHUNK backends and keeps what it found in the
 * per-CPU edge_scan_state; the program then tail-calls itself
 * (edge_tails[EDGE_TAIL_SCAN_MORE]) for the next chunk, with the packet as
 * it arrived. The kernel allows 33 tail calls per packet: fast to slow
 * path, slow path to the scan, then 31 more runs, 32 in all, so 1,024
 * backends (16 runs) fit, and 4,096 would with chunks of 128 (docs: the
 * path to 4,096; netns-tests/test_verifier_budget.py checks the count).
 *
 * verifier: before, this was two loops over all EDGE_MAX_PER_SERVICE (64)
 * backends in one program, count then pick, 554,686 instructions processed
 * of the 1,000,000 budget; 875,194 at 96, E2BIG at 128. A loop's cost is
 * its bound times its body, so the bound is now the chunk's. The counts and
 * the best picks live in a map value, which the verifier does not track,
 * so the body's paths converge per iteration. bpf_loop (kernel 5.17+) would
 * need the callback's address relocated (BPF_PSEUDO_FUNC) and its BTF
 * func_info, which bcc 0.26 does not emit ("R2 type=scalar expected=func").
 * The first Maglev pick written out before the walk in pick_new and the
 * scan's one call site are on purpose: when the ingress was one program
 * (842,952 instructions), folding either failed with E2BIG. Returning an id
 * (not a pointer) and leaving pick_new by one exit saved ~33k. */
static __always_inline __u32
scan_backends(const struct service_cfg *sc, __u32 vip_id, __u32 hash, __u64 now, __u32 pick_id)
{
	struct backend_info *pick;
	__u32 k, pos, n = sc->n_backends, zero = 0;
	struct scan_state *st = edge_scan_state.lookup(&zero);

	if (!st)
		return EDGE_NO_BACKEND;
	if (st->hash != hash || st->vip_id != vip_id)
		scan_begin(hash, vip_id); /* not begun by the slow path: from the start */
	pos = st->pos;
	if (n > EDGE_MAX_PER_SERVICE)
		n = EDGE_MAX_PER_SERVICE;
	for (k = 0; k < EDGE_SCAN_CHUNK; k++) {
		struct backend_info *be;
		__u32 i = pos + k, id;

		if (i >= n)
			break;
		id = sc->backends[i & (EDGE_MAX_PER_SERVICE - 1)];
		be = edge_backends.lookup(&id);
		if (be && takes_new_flows(be, sc, now))
			scan_take(st, be, id, hash);
	}
	pos += EDGE_SCAN_CHUNK;
	if (pos < n) {
		st->pos = pos;
		return EDGE_SCAN_MORE;
	}
	st->vip_id = EDGE_NO_BACKEND; /* done: the next packet begins anew */
	if (st->primaries < sc->panic_below && (st->primaries || !st->standbys)) {
		pick = edge_backends.lookup(&pick_id);
		if (pick && in_service(pick))
			return pick_id;
	}
	if (st->primaries)
		return st->best_p;
	return st->best_s; /* EDGE_NO_BACKEND without a usable standby */
}

#define EDGE_TWO_CHOICES_SEED 0x5bd1e995 /* the second candidate's hash: none of the walk's */

/* Open connections of backend id (wire.h, wire_count) less what user space
 * found the count off by (maps.h, edge_inflight); below zero is none. */
static __always_inline __u64 open_count(__u32 id)
{
	__u32 fix_id = id + EDGE_MAX_BACKENDS;
	__s64 *n = edge_inflight.lookup(&id), *fix = edge_inflight.lookup(&fix_id), v;

	if (!n)
		return 0;
	v = *n - (fix ? *fix : 0);
	return v > 0 ? (__u64)v : 0;
}

/* least_loaded's cost of backend id: its open connections (as open_count)
 * times its scale, EDGE_OPEN_SCALE_ONE plus what edged wrote in
 * edge_inflight's third part (maps.h: EDGE_OPEN_SCALE_ONE x (the service's
 * largest slots / this engine's - 1)), so a 2-slot engine's 2 weigh as a
 * 4-slot one's 4; none written is EDGE_OPEN_SCALE_ONE, every backend
 * alike. A product, not a division; the extra is masked so that the
 * verifier knows its range, and a missing slot (never: the ids are in
 * range) has one way out, so that the candidates add few paths. */
static __always_inline __u64 open_cost(__u32 id)
{
	__u32 fix_id = id + EDGE_MAX_BACKENDS, scale_id = id + 2 * EDGE_MAX_BACKENDS;
	__s64 *n = edge_inflight.lookup(&id), *fix = edge_inflight.lookup(&fix_id),
	      *extra = edge_inflight.lookup(&scale_id), v;

	if (!n || !fix || !extra)
		return 0;
	v = *n - *fix;
	return v > 0 ? (__u64)v * (EDGE_OPEN_SCALE_ONE + ((__u64)*extra & EDGE_OPEN_SCALE_MASK)) : 0;
}

/* Power of two choices (EDGE_SVC_F_TWO_CHOICES): first, the usable Maglev
 * pick of a new flow of this hash, drawn by weight, against a second
 * primary drawn uniformly from the service's backends by an independent
 * hash; the one with fewer open connections takes the flow, a tie keeps
 * the Maglev pick. The data path keeps the counts exact between probes, so
 * a backend whose connections pile up (a hung or throttled engine, one the
 * last weights sent too much) loses new flows at once. The second is drawn
 * uniformly, not by weight: weights that chase the last scrape pile on one
 * backend, and two candidates drawn from them are then mostly the same one
 * (docs/steering.md has the runs). Only new flows choose: conntrack keeps an
 * established flow where it is. The second must take new flows without
 * health bookkeeping (passive_quiet), else the first stays. */
static __always_inline __u32 two_choices(__u32 hash, __u32 first, const struct service_cfg *sc,
					 __u64 now)
{
	__u32 n = sc->n_backends, second;
	struct backend_info *be;

	if (!n)
		return first;
	second = sc->backends[(hash_mix(hash ^ EDGE_TWO_CHOICES_SEED) % n) & (EDGE_MAX_PER_SERVICE - 1)];
	if (second == first)
		return first;
	be = edge_backends.lookup(&second);
	if (!be || (be->flags & EDGE_BE_F_STANDBY) || !takes_new_flows(be, sc, now) ||
	    !passive_quiet(be, sc, now))
		return first;
	return open_count(second) < open_count(first) ? second : first;
}

/* Least loaded of a bounded set (EDGE_SVC_F_LEAST_LOADED): the usable
 * Maglev pick of a new flow and up to EDGE_LEAST_CANDIDATES - 1 more of the
 * service's backends, consecutive in its list from a position this flow's
 * hash draws (so every backend of a service of at most that many); the one
 * with the fewest open connections per slot (open_cost: the count times the
 * scale edged writes from each engine's learned slots) takes the flow, a
 * tie keeps the Maglev pick. The scan looks only at counts and flags (in
 * service, a primary); the winner alone is judged as two_choices' second
 * (health, passive bookkeeping), and keeps the Maglev pick if it fails.
 * verifier: in the fast path the loop took edge_ingress from 47k to 287k
 * instructions, so it runs in the slow path only (pick_new); edge_ingress6
 * 372k -> 545k; with each candidate's health judged in it, 641k (over the
 * 60 % test_verifier_budget allows). The bound keeps a new flow's cost
 * fixed (docs/benchmarks.md has it); only new flows choose. */
static __always_inline __u32 least_loaded(__u32 hash, __u32 first, const struct service_cfg *sc,
					  __u64 now)
{
	__u32 n = sc->n_backends, best = first, start, k;
	__u64 best_n = open_cost(first);
	struct backend_info *be;

	if (n > EDGE_MAX_PER_SERVICE)
		n = EDGE_MAX_PER_SERVICE;
	if (!n || !best_n)
		return first;
	start = hash_mix(hash ^ EDGE_TWO_CHOICES_SEED) % n;
	for (k = 0; k < EDGE_LEAST_CANDIDATES; k++) {
		__u32 i = start + k, id;
		__u64 c;

		if (k >= n)
			break;
		if (i >= n)
			i -= n;
		id = sc->backends[i & (EDGE_MAX_PER_SERVICE - 1)];
		c = open_cost(id);
		if (c >= best_n)
			continue;
		be = edge_backends.lookup(&id);
		if (!be || !in_service(be) || (be->flags & EDGE_BE_F_STANDBY))
			continue;
		best = id;
		best_n = c;
	}
	if (best == first)
		return first;
	be = edge_backends.lookup(&best);
	if (!be || !takes_new_flows(be, sc, now) || !passive_quiet(be, sc, now))
		return first;
	return best;
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
	*bid = EDGE_NO_BACKEND;
	if (vip->id >= EDGE_MAX_SERVICES)
		return NULL;
	base = maglev_base(vip);
	idx = maglev_index(base, hash);
	id = maglev_slot(idx);
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
			/* least_loaded's loop stays out of the fast path (stage is a
			 * constant): its flows take the slow path's tail call, so
			 * edge_ingress verifies in 47k instructions, not 287k, and
			 * every deploy loads faster. */
			if (stage == EDGE_STAGE_FAST && (sc->flags & EDGE_SVC_F_LEAST_LOADED))
				return NULL;
			if (sc->flags & EDGE_SVC_F_TWO_CHOICES)
				found = two_choices(hash, pick_id, sc, now);
			else if (stage != EDGE_STAGE_FAST && (sc->flags & EDGE_SVC_F_LEAST_LOADED))
				found = least_loaded(hash, pick_id, sc, now);
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
			id = maglev_slot(idx);
			if (!id)
				break;
			be = edge_backends.lookup(id);
			if (be && takes_new_flows(be, sc, now)) {
				found = *id;
				goto out;
			}
		}
	}
	if (stage == EDGE_STAGE_SLOW) {
		scan_begin(hash, vip->id);
		return NULL;
	}
	*failover = pick_id != EDGE_NO_BACKEND;
	found = scan_backends(sc, vip->id, hash, now, pick_id);
	if (found == EDGE_SCAN_MORE)
		*bid = EDGE_SCAN_MORE;
	if (found == EDGE_NO_BACKEND || found == EDGE_SCAN_MORE)
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
 * took it before handing the packet over. flow6: see flow_insert (IPv6's
 * ingress runs the slow and scan stages only). */
static __always_inline struct backend_info *
select_backend(const struct vip_info *vip, const struct service_cfg *sc,
	       struct pkt *pkt, struct flow_info *fi, __u64 now, __u32 *bid,
	       int *new_flow, int *failover, __u32 *drop, const int stage,
	       const struct flow_key6 *flow6)
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
					       takes_new_flows(be, sc, now)
				     : ((vip->flags & EDGE_VIP_F_KEEP_FLOWS) ||
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
		else if (stage != EDGE_STAGE_SCAN || *bid == EDGE_SCAN_MORE)
			*drop = EDGE_TO_NEXT_STAGE; /* the scan's next run: itself */
		return NULL;
	}
	if (stateless) {
		/* Over the budget, a usable Maglev pick still takes the packet,
		 * without an entry: a flow another router had (ECMP) finds the
		 * backend the identical table gives it (stateless.h). */
		*new_flow = 0;
		count_index(vip->id, EDGE_CNT_STATELESS);
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
	flow_insert(pkt, vip, *bid, sc->flags & EDGE_SVC_F_DSR, flow6, now);
	return be;
}

#endif /* EDGE_SELECT_H */
