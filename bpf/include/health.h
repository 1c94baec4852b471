/* SPDX-License-Identifier: Apache-2.0 */
/* health.h: is a backend usable right now? Decided per packet from what the
 * data path itself saw: heartbeats (stamped by the return-path program on
 * backend-facing interfaces), and passive outlier detection (SYNs forwarded
 * against SYN-ACKs and RSTs seen coming back). No user-space round trip. */
#ifndef EDGE_HEALTH_H
#define EDGE_HEALTH_H

#include "maps.h"
#include "stats.h"

#ifndef EDGE_MAX_EJECT_SHIFT
#define EDGE_MAX_EJECT_SHIFT 4 /* ejection time doubles at most 4 times (x16) */
#endif

static __always_inline struct backend_health *health_of(const struct backend_info *be)
{
	__u32 hid = be->health_id;

	return edge_health.lookup(&hid);
}

#define HEALTH_ALIVE 0 /* an established flow: no rise asked again, probation ignored */
#define HEALTH_NEW   1 /* a new flow: risen, not on probation */
#define HEALTH_TRIAL 2 /* a new flow's own Maglev pick: risen; on probation passive_ok decides */

/* Admin-up, not ejected, and (when the service uses heartbeats) heard from
 * within silence_mult timeouts, with rise heartbeats in a row unless
 * HEALTH_ALIVE. After an ejection a backend is on probation until evidence
 * (see passive_ok): HEALTH_NEW refuses it. Times are compared as
 * "stamp + span < now", never "now - stamp": another CPU may stamp a
 * heartbeat after this packet read now. */
static __always_inline int backend_health_ok(const struct backend_info *be,
					     const struct service_cfg *sc, __u64 now,
					     __u32 silence_mult, int need_rise)
{
	struct backend_health *h;

	if ((be->flags & (EDGE_BE_F_VALID | EDGE_BE_F_UP)) !=
	    (EDGE_BE_F_VALID | EDGE_BE_F_UP))
		return 0;
	if (!(sc->flags & (EDGE_SVC_F_HEARTBEAT | EDGE_SVC_F_PASSIVE)))
		return 1;
	h = health_of(be);
	if (!h || h->ejected_until_ns > now)
		return 0;
	if (need_rise == HEALTH_NEW && h->probation)
		return 0;
	if (sc->flags & EDGE_SVC_F_HEARTBEAT) {
		if (h->last_seen_ns + silence_mult * sc->hb_timeout_ns < now)
			return 0;
		if (need_rise && h->rise_count < sc->rise)
			return 0;
	}
	return 1;
}

/* For new flows: heartbeats fresh and risen, not ejected, not on
 * probation. Draining and standby are the caller's business. */
static __always_inline int backend_usable(const struct backend_info *be,
					  const struct service_cfg *sc, __u64 now)
{
	return backend_health_ok(be, sc, now, 1, HEALTH_NEW);
}

/* For an established flow: not silent for twice the timeout (rise is not
 * asked again), not ejected. One late heartbeat must not move live
 * connections; a dead backend loses them one timeout after new flows. */
static __always_inline int backend_alive(const struct backend_info *be,
					 const struct service_cfg *sc, __u64 now)
{
	return backend_health_ok(be, sc, now, 2, HEALTH_ALIVE);
}

#ifndef EDGE_EJECT_SAMPLE
#define EDGE_EJECT_SAMPLE 64 /* backends looked at for the ejection cap */
#endif

/* Ejects h unless that would take out more than max_ejected_pct of the
 * service's backends. Returns 1 when it ejected. Up to EDGE_EJECT_SAMPLE
 * backends every one is counted; a larger service is sampled evenly (every
 * (n / EDGE_EJECT_SAMPLE)-th, rounded up) and the share ejected estimated
 * from the sample. verifier: a loop over all of EDGE_MAX_PER_SERVICE (1,024)
 * would not fit the slow path's budget. */
static __always_inline int try_eject(__u32 vid, const struct service_cfg *sc,
				     struct backend_health *h, __u64 now)
{
	__u32 i, ejected = 0, seen = 0, n = sc->n_backends, step, shift;

	if (n > EDGE_MAX_PER_SERVICE)
		n = EDGE_MAX_PER_SERVICE;
	step = (n + EDGE_EJECT_SAMPLE - 1) / EDGE_EJECT_SAMPLE;
	if (!step)
		step = 1;
	for (i = 0; i < EDGE_EJECT_SAMPLE; i++) {
		struct backend_info *other;
		struct backend_health *oh;
		__u32 bid, j = i * step;

		if (j >= n)
			break;
		bid = sc->backends[j & (EDGE_MAX_PER_SERVICE - 1)];
		seen++;
		other = edge_backends.lookup(&bid);
		if (!other)
			continue;
		oh = health_of(other);
		if (oh && oh != h && oh->ejected_until_ns > now)
			ejected++;
	}
	if (seen && seen < n)
		ejected = (__u64)ejected * n / seen;
	h->trial_ns = 0;
	if ((ejected + 1) * 100 > (__u64)sc->max_ejected_pct * n) {
		h->probation = 0; /* kept in service, as without a trial */
		return 0;
	}
	shift = h->ejections < EDGE_MAX_EJECT_SHIFT ? h->ejections : EDGE_MAX_EJECT_SHIFT;
	h->ejected_until_ns = now + (sc->ejection_ns << shift);
	h->ejections++;
	h->probation = 1;
	h->syn_outstanding = 0;
	h->rst_count = 0;
	count_index(vid, EDGE_CNT_EJECTION);
	return 1;
}

/* Failures in a row that eject: consecutive, or one on probation. */
static __always_inline __u32 eject_after(const struct backend_health *h,
					 const struct service_cfg *sc)
{
	return h->probation ? 1 : sc->consecutive;
}

/* Passive detection is due to act on h: eject_after SYNs unanswered for
 * longer than syn_timeout, or a trial flow unanswered that long. */
static __always_inline int passive_due(const struct backend_health *h,
				       const struct service_cfg *sc, __u64 now)
{
	__u64 trial = h->trial_ns;

	return (h->syn_outstanding >= eject_after(h, sc) &&
		h->first_syn_ns + sc->syn_timeout_ns < now) ||
	       (trial && trial + sc->syn_timeout_ns < now);
}

/* The fast path's passive check: 1 when passive_ok would let the flow
 * through without touching any state (nothing due, not on probation); 0
 * sends the packet to the slow path, where passive_ok decides. */
static __always_inline int passive_quiet(const struct backend_info *be,
					 const struct service_cfg *sc, __u64 now)
{
	struct backend_health *h;

	if (!(sc->flags & EDGE_SVC_F_PASSIVE))
		return 1;
	h = health_of(be);
	return !h || (!h->probation && !passive_due(h, sc, now));
}

/* Passive check before a new flow is given to this backend (its own Maglev
 * pick): eject_after SYNs unanswered for longer than syn_timeout eject it.
 * Readmission needs evidence: after an ejection the backend is on probation
 * until a SYN it was sent is answered with a SYN-ACK (or, with heartbeats,
 * a heartbeat arrives after the ejection; with probes, edged ends it when a
 * probe passes). Without probes exactly one new flow at a time is let
 * through as a trial meanwhile; a trial unanswered for syn_timeout (or
 * refused) ejects it again, for twice as long. With probes no client flow
 * is spent: the probation waits for a passing probe. Returns 1 if the
 * backend may take the flow. */
static __always_inline int passive_ok(const struct backend_info *be,
				      const struct service_cfg *sc, __u64 now)
{
	struct backend_health *h;

	if (!(sc->flags & EDGE_SVC_F_PASSIVE))
		return 1;
	h = health_of(be);
	if (!h)
		return 1;
	if (passive_due(h, sc, now))
		return !try_eject(be->vip_id, sc, h, now);
	if (!h->probation)
		return 1;
	if (h->trial_ns || (sc->flags & EDGE_SVC_F_PROBED))
		return 0; /* the trial is out, or the probes decide */
	return __sync_val_compare_and_swap(&h->trial_ns, 0, now) == 0;
}

/* A SYN is being forwarded to this backend. */
static __always_inline void note_syn(const struct backend_info *be, __u64 now)
{
	struct backend_health *h = health_of(be);

	if (!h)
		return;
	if (h->syn_outstanding == 0)
		h->first_syn_ns = now;
	h->syn_outstanding++;
}

/* The return path saw this backend answer a SYN the ingress counted (see
 * classify_answer in edge_tc.c): with SYN-ACK (healthy) or with RST
 * (refusing: a dead server behind a live host). */
static __always_inline void note_syn_answer(const struct backend_info *be,
					    const struct service_cfg *sc,
					    int syn_ack, __u64 now)
{
	struct backend_health *h = health_of(be);

	if (!h)
		return;
	if (syn_ack) {
		h->syn_outstanding = 0;
		h->rst_count = 0;
		h->probation = 0;
		h->trial_ns = 0;
		/* a long healthy stretch forgets past ejections */
		if (h->ejections && now > h->ejected_until_ns + (sc->ejection_ns << EDGE_MAX_EJECT_SHIFT))
			h->ejections = 0;
		return;
	}
	h->rst_count++;
	if ((sc->flags & EDGE_SVC_F_PASSIVE) && h->rst_count >= eject_after(h, sc))
		try_eject(be->vip_id, sc, h, now);
}

#endif /* EDGE_HEALTH_H */
