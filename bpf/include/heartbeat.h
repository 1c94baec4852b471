/* SPDX-License-Identifier: Apache-2.0 */
/* heartbeat.h: backends' heartbeats. The return-path program on the
 * backend-facing interfaces validates each one (registered address and
 * service port, heartbeat port, arrival interface, version, a MAC under the
 * backend's own key, an epoch within EDGE_HB_WINDOW_S of the router's clock,
 * newer than the last taken), stamps the backend's health and consumes it.
 * The ingress program drops any heartbeat that arrives on an interface
 * other than its backend's, so a client cannot keep a dead backend alive.
 * Every rejection is counted. IPv6 backends' heartbeats: heartbeat6.h. */
#ifndef EDGE_HEARTBEAT_H
#define EDGE_HEARTBEAT_H

#include <uapi/linux/pkt_cls.h>
#include "maps.h"
#include "stats.h"
#include "siphash.h"

#define EDGE_HB_RISE_CAP 1000000 /* rise_count stops counting here */

static __always_inline __u64 be64_to_host(__u64 x)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return __builtin_bswap64(x);
#else
	return x;
#endif
}

/* bcc's helpers.h may lack bpf_ktime_get_tai_ns (kernel 6.1); this is the
 * kernel's signature (uapi/linux/bpf.h). */
static __u64 (*ktime_get_tai_ns)(void) = (void *)BPF_FUNC_ktime_get_tai_ns;

/* 1 when hb carries the MAC of its first EDGE_HB_MAC_LEN bytes under t's key. */
static __always_inline int hb_mac_ok(const struct heartbeat *hb, const struct hb_target *t)
{
	const __u64 *m = (const __u64 *)hb;

	return siphash24_16(t->key[0], t->key[1], sip_le64(m[0]), sip_le64(m[1])) ==
	       be64_to_host(hb->mac);
}

/* 1 when epoch (seconds of the sender's CLOCK_TAI) is within EDGE_HB_WINDOW_S
 * of the router's: a heartbeat from far ahead would otherwise make every
 * later one of the real agent a replay. */
static __always_inline int hb_epoch_ok(__u32 epoch)
{
	__u64 now_s = ktime_get_tai_ns() / 1000000000ULL;

	return (__u64)epoch + EDGE_HB_WINDOW_S >= now_s && (__u64)epoch <= now_s + EDGE_HB_WINDOW_S;
}

static __always_inline int is_hb_port(__be16 port)
{
	return edge_hb_ports.lookup(&port) != NULL;
}

/* Where this heartbeat is registered, or NULL; checks magic and version. */
static __always_inline struct hb_target *
hb_lookup(const struct heartbeat *hb, __be32 saddr, __be16 dport)
{
	struct hb_key key = {};

	if (hb->magic != bpf_htonl(EDGE_HB_MAGIC) ||
	    hb->version != bpf_htons(EDGE_HB_VERSION))
		return NULL;
	key.addr = saddr;
	key.port = hb->port;
	key.hb_port = dport;
	return edge_hb.lookup(&key);
}

/* XDP ingress: 1 when this UDP packet is a heartbeat (magic and version)
 * that may not enter here: unregistered, or registered to another
 * interface. Valid ones go on to the stack, where the return-path program
 * consumes them; other traffic to the port is not ours and passes. */
static __always_inline int hb_misrouted(struct xdp_md *ctx, struct iphdr *iph,
					void *data_end)
{
	struct udphdr *uh = (void *)(iph + 1);
	struct heartbeat *hb = (void *)(uh + 1);
	struct hb_target *t;

	if ((void *)(uh + 1) > data_end || !is_hb_port(uh->dest))
		return 0;
	if ((void *)(hb + 1) > data_end ||
	    hb->magic != bpf_htonl(EDGE_HB_MAGIC) ||
	    hb->version != bpf_htons(EDGE_HB_VERSION))
		return 0;
	t = hb_lookup(hb, iph->saddr, uh->dest);
	return !t || t->ifindex != ctx->ingress_ifindex;
}

/* tc: heartbeat hb, found registered as t (NULL: not registered), that
 * arrived on ifindex: stamps its backend's health when it holds (interface,
 * MAC, epoch within the window, newer than the last taken), else counts why
 * not. TC_ACT_SHOT either way: a heartbeat is consumed here. Both families'
 * (consume_heartbeat, heartbeat6.h). */
static __always_inline int hb_take(const struct heartbeat *hb, struct hb_target *t, __u32 ifindex)
{
	struct backend_health *h;
	__u32 epoch, seq;
	__u64 now;

	if (!t || t->ifindex != ifindex || !hb_mac_ok(hb, t))
		goto spoofed;
	h = edge_health.lookup(&t->health_id);
	if (!h)
		goto spoofed;
	epoch = bpf_ntohl(hb->epoch);
	seq = bpf_ntohl(hb->seq);
	if (!hb_epoch_ok(epoch)) {
		count_reason(EDGE_NO_SERVICE, EDGE_DROP_STALE_HB);
		return TC_ACT_SHOT;
	}
	/* A copy of an earlier heartbeat must not keep a dead backend alive. */
	if (!epoch || epoch < h->hb_epoch || (epoch == h->hb_epoch && seq <= h->hb_seq)) {
		count_reason(EDGE_NO_SERVICE, EDGE_DROP_REPLAYED_HB);
		return TC_ACT_SHOT;
	}
	now = bpf_ktime_get_ns();
	if (h->last_seen_ns + t->timeout_ns < now) /* not now - last: see health.h */
		h->rise_count = 1;
	else if (h->rise_count < EDGE_HB_RISE_CAP)
		h->rise_count++;
	h->last_seen_ns = now;
	/* evidence after an ejection: the agent's check passes again */
	if (h->probation && h->ejected_until_ns < now) {
		h->probation = 0;
		h->trial_ns = 0;
	}
	h->hb_epoch = epoch;
	h->hb_seq = seq;
	count_index(EDGE_NO_SERVICE, EDGE_CNT_HEARTBEAT);
	return TC_ACT_SHOT;
spoofed:
	count_reason(EDGE_NO_SERVICE, EDGE_DROP_SPOOFED_HB);
	return TC_ACT_SHOT;
}

/* tc, backend-facing ingress. Returns TC_ACT_SHOT for a heartbeat (stamped
 * or rejected) and TC_ACT_UNSPEC for anything else. */
static __always_inline int consume_heartbeat(struct __sk_buff *skb,
					     struct iphdr *iph, __u32 l4_off,
					     __be16 dport)
{
	struct heartbeat hb;

	if (!is_hb_port(dport))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, l4_off + sizeof(struct udphdr), &hb, sizeof(hb)) < 0 ||
	    hb.magic != bpf_htonl(EDGE_HB_MAGIC))
		return TC_ACT_UNSPEC; /* not a heartbeat after all */
	return hb_take(&hb, hb_lookup(&hb, iph->saddr, dport), skb->ingress_ifindex);
}

#endif /* EDGE_HEARTBEAT_H */
