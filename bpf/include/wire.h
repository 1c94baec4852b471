/* SPDX-License-Identifier: Apache-2.0 */
/* wire.h: latency and load seen in real traffic, per backend (edge_wire):
 * the handshake RTT (SYN forwarded -> its SYN-ACK seen on the return path),
 * the time from a connection's first request payload to the backend's first
 * reply payload (about a time to first token), and connections opened and
 * closed. The conntrack entry carries one timestamp (flow_info.wire_ns) and
 * EDGE_CT_F_* bits saying what it waits for, so an established flow with
 * nothing pending costs one flag test per packet each way. Entries are
 * shared by CPUs without locks: two packets of one connection racing on two
 * CPUs can lose a sample, never make a wrong one. The flags themselves
 * change only by atomic and/or of the bits a step means (ct_flags_*), never
 * by a store of a copy: the forward path (XDP) and the return path (tc) of
 * one connection run on different CPUs, and a stale copy stored back could
 * set EDGE_CT_F_OPEN again after the other side cleared it, so a close was
 * counted twice (an open count ended at -1 in bench-serving). Owns no
 * policy: user space (controlplane/wiresignals.py) turns the counts into
 * quantiles and freshness. */
#ifndef EDGE_WIRE_H
#define EDGE_WIRE_H

#include "maps.h"

#define WIRE_TCP_FIN 0x01
#define WIRE_TCP_SYN 0x02
#define WIRE_TCP_RST 0x04
#define WIRE_TCP_ACK 0x10

/* Histogram bucket of a duration: floor(log2(microseconds)), 0 below 2 us,
 * the last bucket for everything from 2^(EDGE_WIRE_BUCKETS - 1) us up. */
static __always_inline __u32 wire_bucket(__u64 ns)
{
	__u64 us = ns / 1000;
	__u32 i = 0;

	if (us >> 32)
		return EDGE_WIRE_BUCKETS - 1;
	if (us >> 16) {
		us >>= 16;
		i += 16;
	}
	if (us >> 8) {
		us >>= 8;
		i += 8;
	}
	if (us >> 4) {
		us >>= 4;
		i += 4;
	}
	if (us >> 2) {
		us >>= 2;
		i += 2;
	}
	if (us >> 1)
		i += 1;
	return i < EDGE_WIRE_BUCKETS ? i : EDGE_WIRE_BUCKETS - 1;
}

/* One sample since start_ns into backend bid's handshake (first_byte 0) or
 * first-byte histogram. */
static __always_inline void wire_sample(__u32 bid, int first_byte, __u64 start_ns)
{
	struct wire_stats *ws = edge_wire.lookup(&bid);
	__u64 took = bpf_ktime_get_ns() - start_ns;
	__u32 b = wire_bucket(took);

	if (!ws || b >= EDGE_WIRE_BUCKETS) /* verifier: b bounded for the index */
		return;
	if (first_byte) {
		ws->first_byte[b] += 1;
		ws->first_byte_ns += took;
	} else {
		ws->handshake[b] += 1;
		ws->handshake_ns += took;
	}
}

/* Counts a connection of backend bid as opened (closed 0) or closed, in
 * its per-CPU statistics and in its open count (edge_inflight), which the
 * ingress reads to choose between two candidates (select.h, two_choices).
 * An entry the LRU evicts while open is never counted closed: edged finds
 * such a count off against conntrack and says by how much (maps.h). */
static __always_inline void wire_count(__u32 bid, int closed)
{
	struct wire_stats *ws = edge_wire.lookup(&bid);
	__s64 *open = edge_inflight.lookup(&bid);

	if (open)
		__sync_fetch_and_add(open, closed ? -1 : 1);
	if (!ws)
		return;
	if (closed)
		ws->closed += 1;
	else
		ws->opened += 1;
}

/* Atomic changes of an entry's flags: only the bits named change. bcc
 * compiles for a BPF CPU without 32-bit atomics, so they work on the 64-bit
 * word of flags and syn_seq (8-byte aligned, abi.h), with syn_seq's half of
 * each mask neutral. */
_Static_assert(offsetof(struct flow_info, flags) % 8 == 0 &&
		       offsetof(struct flow_info, syn_seq) == offsetof(struct flow_info, flags) + 4,
	       "wire.h: flags and syn_seq share an aligned 64-bit word");
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CT_FLAGS_SHIFT 0
#else
#define CT_FLAGS_SHIFT 32
#endif
#define CT_FLAGS_WORD(fi) ((__u64 *)&(fi)->flags)

static __always_inline void ct_flags_clear(struct flow_info *fi, __u32 bits)
{
	__sync_fetch_and_and(CT_FLAGS_WORD(fi), ~((__u64)bits << CT_FLAGS_SHIFT));
}

static __always_inline void ct_flags_set(struct flow_info *fi, __u32 bits)
{
	__sync_fetch_and_or(CT_FLAGS_WORD(fi), (__u64)bits << CT_FLAGS_SHIFT);
}

/* Clears EDGE_CT_F_OPEN: 1 for the one call that found it set (the one
 * that counts the close), on whichever CPU. */
static __always_inline int ct_take_open(struct flow_info *fi)
{
	__u64 mask = (__u64)EDGE_CT_F_OPEN << CT_FLAGS_SHIFT;

	return (__sync_fetch_and_and(CT_FLAGS_WORD(fi), ~mask) & mask) != 0;
}

/* Sets EDGE_CT_F_OPEN: 1 for the one call that found it clear. */
static __always_inline int ct_give_open(struct flow_info *fi)
{
	__u64 mask = (__u64)EDGE_CT_F_OPEN << CT_FLAGS_SHIFT;

	return (__sync_fetch_and_or(CT_FLAGS_WORD(fi), mask) & mask) == 0;
}

/* flow_info.flags and wire_ns of a new conntrack entry (not yet in a map,
 * so no other CPU sees it): a SYN opens a connection of bid and starts
 * timing its handshake, from now when have_now (a constant: the caller read
 * bpf_ktime_get_ns for this SYN, not the fast path's cached health_now),
 * else from a clock read here. */
static __always_inline __u32 wire_open(int syn, __u32 bid, __u64 *wire_ns, __u64 now, const int have_now)
{
	if (!syn)
		return 0;
	wire_count(bid, 0);
	*wire_ns = have_now ? now : bpf_ktime_get_ns();
	return EDGE_CT_F_OPEN | EDGE_CT_F_HS_WAIT;
}

/* An established flow moves from its backend to bid (reselect): an open
 * connection counts as closed there (if this CPU is the one that clears
 * its mark) and opened here, and a SYN opens one and starts timing its
 * handshake. Returns the flag bits the moved entry keeps; what was being
 * timed is dropped. */
static __always_inline __u32 wire_move(struct flow_info *fi, __u32 bid, int syn)
{
	__u32 open = ct_take_open(fi) ? EDGE_CT_F_OPEN : 0;

	if (open)
		wire_count(fi->backend_id, 1);
	if (open || syn)
		wire_count(bid, 0);
	if (!syn)
		return open;
	fi->wire_ns = bpf_ktime_get_ns();
	return EDGE_CT_F_OPEN | EDGE_CT_F_HS_WAIT;
}

/* A FIN or RST: an open connection of bid counts as closed, once, however
 * the two directions' FINs race; nothing more is timed. */
static __always_inline void wire_end(struct flow_info *fi, __u32 bid)
{
	if (ct_take_open(fi))
		wire_count(bid, 1);
	ct_flags_clear(fi, EDGE_CT_F_WIRE_WAIT);
}

/* Forward direction (XDP), a client packet of the flow whose entry fi the
 * ingress looked up (not one it just made: wire_open did that). syn: a SYN
 * on an existing entry, with sequence number seq: a retransmission (the
 * handshake is still timed from the first SYN: what the client waits,
 * also when a backend's full SYN queue drops SYNs) or a new connection on
 * a reused tuple; end: FIN or RST; payload: TCP payload bytes. */
static __always_inline void wire_forward(struct flow_info *fi, __u32 bid, int syn, int end,
					 __be32 seq, __u32 payload)
{
	__u32 flags = fi->flags;

	if (!(flags & EDGE_CT_F_WIRE_WAIT) && !syn && !end)
		return;
	if (syn) {
		if ((flags & EDGE_CT_F_HS_WAIT) && seq == fi->syn_seq)
			return;
		if (ct_give_open(fi))
			wire_count(bid, 0);
		fi->wire_ns = bpf_ktime_get_ns();
		ct_flags_clear(fi, EDGE_CT_F_REQ_WAIT | EDGE_CT_F_RESP_WAIT);
		ct_flags_set(fi, EDGE_CT_F_HS_WAIT);
		return;
	}
	if (end) {
		wire_end(fi, bid);
		return;
	}
	if ((flags & EDGE_CT_F_REQ_WAIT) && payload) {
		fi->wire_ns = bpf_ktime_get_ns();
		ct_flags_clear(fi, EDGE_CT_F_REQ_WAIT);
		ct_flags_set(fi, EDGE_CT_F_RESP_WAIT);
	}
}

/* TCP payload bytes of a reply whose TCP header starts at l4_off. */
static __always_inline __u32 wire_reply_payload(struct __sk_buff *skb, __u32 l4_off)
{
	__u8 doff = 0;

	if (bpf_skb_load_bytes(skb, l4_off + 12, &doff, 1) < 0)
		return 0;
	doff = (doff >> 4) * 4;
	return skb->len > l4_off + doff ? skb->len - l4_off - doff : 0;
}

/* Return direction (tc), a backend's reply on flow fi of backend bid, with
 * these TCP flags. A SYN-ACK here answers the SYN the entry names (the
 * return path let no other through). */
static __always_inline void wire_reply(struct __sk_buff *skb, struct flow_info *fi, __u32 bid,
				       __u8 tcp_flags, __u32 l4_off)
{
	__u32 flags = fi->flags;

	if (!(flags & EDGE_CT_F_WIRE_WAIT) && !(tcp_flags & (WIRE_TCP_FIN | WIRE_TCP_RST)))
		return;
	if ((flags & EDGE_CT_F_HS_WAIT) &&
	    (tcp_flags & (WIRE_TCP_SYN | WIRE_TCP_ACK)) == (WIRE_TCP_SYN | WIRE_TCP_ACK)) {
		wire_sample(bid, 0, fi->wire_ns);
		ct_flags_clear(fi, EDGE_CT_F_HS_WAIT);
		ct_flags_set(fi, EDGE_CT_F_REQ_WAIT);
	} else if ((flags & EDGE_CT_F_RESP_WAIT) && wire_reply_payload(skb, l4_off)) {
		wire_sample(bid, 1, fi->wire_ns);
		ct_flags_clear(fi, EDGE_CT_F_RESP_WAIT);
	}
	if (tcp_flags & (WIRE_TCP_FIN | WIRE_TCP_RST))
		wire_end(fi, bid);
}

#endif /* EDGE_WIRE_H */
