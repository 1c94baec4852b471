"""The C text tools/bench-datapath adds to the data path's source: the wrappers that restore a
template frame before each repetition, and the reference and floor programs the data path is
compared with. Text only (filled in with % by bench-datapath's bench_source); standard library
only; what is measured and checked lives in bench-datapath.
"""

from __future__ import annotations

import sys

HELPERS = r"""
/* ---- tools/bench-datapath: benchmark wrappers, not part of the data path ----
 * BPF_PROG_TEST_RUN reuses the buffer between repetitions, so every wrapper first
 * writes its template headers back. The template is written as constants, and a
 * compiler barrier keeps clang from folding them into the parse that follows. */
#define BENCH_FRAME_LEN	%(frame_len)d
#define BENCH_SEQ_OFF	%(seq_off)d
#define bench_barrier()	asm volatile("" ::: "memory")

%(restores)s

/* (b), (f): a new 5-tuple every repetition: source port and the low half of the
 * source address come from a counter kept in the payload. Both are 0 in the
 * template; the IPv4 id gets the complement of the address half, so the IPv4
 * checksum stays right (the data path drops a VIP packet whose IPv4 checksum is
 * wrong; it checks the TCP checksum only of SYNs without payload). */
static __always_inline void bench_next_flow(void *data)
{
	__u32 seq = *(__u32 *)(data + BENCH_SEQ_OFF);

	*(__u32 *)(data + BENCH_SEQ_OFF) = seq + 1;
	*(__u16 *)(data + %(saddr_low_off)d) = (__u16)(seq >> 16);
	*(__u16 *)(data + %(ip_id_off)d) = (__u16)~(seq >> 16);
	*(__u16 *)(data + %(sport_off)d) = (__u16)seq;
}

/* What any forwarder does at least: parse eth/IPv4/TCP (sets iph, th). */
#define BENCH_PARSE(drop, pass)						\
	void *data = (void *)(long)ctx->data;				\
	void *data_end = (void *)(long)ctx->data_end;			\
	struct ethhdr *eth = data;					\
	struct iphdr *iph;						\
	struct tcphdr *th;						\
	if ((void *)(eth + 1) > data_end)				\
		return drop;						\
	if (eth->h_proto != bpf_htons(ETH_P_IP))			\
		return pass;						\
	iph = (void *)(eth + 1);					\
	if ((void *)(iph + 1) > data_end)				\
		return drop;						\
	if (iph->ihl != 5 || iph->protocol != IPPROTO_TCP)		\
		return pass;						\
	th = (void *)(iph + 1);						\
	if ((void *)(th + 1) > data_end)				\
		return drop

/* (k) a heartbeat's MAC (heartbeat.h, hb_mac_ok): SipHash-2-4 of 16 bytes of the
 * frame under a key read from memory, compared with 8 more; the frame is dropped
 * either way, so (k) minus the wrapper is the MAC's cost and a bounds check. */
static __always_inline int bench_mac_body(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct hb_target t = { .key = { 0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL } };
	struct heartbeat *hb = data + 14;	/* any 24 bytes of the frame */

	bench_barrier();
	if ((void *)(hb + 1) > data_end)
		return XDP_ABORTED;
	return hb_mac_ok(hb, &t) ? XDP_TX : XDP_DROP;
}

/* (d) the reference: parse and redirect. */
static __always_inline int bench_reference_body(struct xdp_md *ctx)
{
	BENCH_PARSE(XDP_DROP, XDP_PASS);
	if (th->doff < 5)
		return XDP_DROP;
	return bpf_redirect(%(backend_ifindex)d, 0);
}

/* (e), (f) the floors: the reference plus what a conntrack-based forwarder does
 * at least: look up the VIP and the flow (2 hash lookups), and for a new flow
 * insert it into the table a SYN goes into: the half-open table (edge_half_open,
 * the same map, so the same type and size), not edge_ct, which a flow reaches only
 * once the client acknowledges the backend's SYN-ACK. */
static __always_inline int bench_floor_body(struct xdp_md *ctx, const int insert)
{
	struct vip_key vk = {};
	struct flow_key fk = {};
	struct half_open ho = {};

	BENCH_PARSE(XDP_DROP, XDP_PASS);
	vk.addr = iph->daddr;
	vk.port = th->dest;
	vk.proto = IPPROTO_TCP;
	if (!edge_vips.lookup(&vk))
		return XDP_PASS;
	fk.src = iph->saddr;
	fk.dst = iph->daddr;
	fk.sport = th->source;
	fk.dport = th->dest;
	fk.proto = IPPROTO_TCP;
	if (!edge_ct.lookup(&fk) && insert)
		edge_half_open.update(&fk, &ho);
	return bpf_redirect(%(backend_ifindex)d, 0);
}

/* (j), (h) the reply's floors, XDP and tc: what any return path does at least, with
 * the same two lookups (reverse NAT by backend endpoint, conntrack by client 5-tuple),
 * which bench_reply_found makes (1: both hit). */
static __always_inline int bench_reply_found(const struct iphdr *iph, const struct tcphdr *th)
{
	struct backend_key rk = {};
	struct flow_key fk = {};
	struct rnat_info *ri;

	rk.addr = iph->saddr;
	rk.port = th->source;
	rk.proto = IPPROTO_TCP;
	ri = edge_rnat.lookup(&rk);
	if (!ri)
		return 0;
	fk.src = iph->daddr;
	fk.dst = ri->vip_addr;
	fk.sport = th->dest;
	fk.dport = ri->vip_port;
	fk.proto = IPPROTO_TCP;
	return edge_ct.lookup(&fk) != NULL;
}

static __always_inline int bench_reply_floor_body(struct __sk_buff *ctx)
{
	BENCH_PARSE(TC_ACT_SHOT, TC_ACT_OK);
	if (!bench_reply_found(iph, th))
		return TC_ACT_OK;
	return bpf_redirect(%(client_ifindex)d, 0);
}

static __always_inline int bench_reply_xdp_floor_body(struct xdp_md *ctx)
{
	BENCH_PARSE(XDP_DROP, XDP_PASS);
	if (!bench_reply_found(iph, th))
		return XDP_PASS;
	return bpf_redirect(%(client_ifindex)d, 0);
}
"""

# One program per case: restores its template (for (b), (f) also the next 5-tuple), then
# runs its body. The restore-only wrappers' cost is subtracted from the others.
WRAPPER = r"""
int %(func)s(%(ctx_type)s *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (data + BENCH_FRAME_LEN > data_end)
		return %(abort)s;
	bench_write_%(template)s(data);%(next_flow)s
	bench_barrier();
	return %(body)s;
}
"""
CTX_TYPE = {"xdp": ("struct xdp_md", "XDP_ABORTED"), "tc": ("struct __sk_buff", "TC_ACT_SHOT")}  # by program type


def template_writer(name: str, template: bytes, hdr_len: int) -> str:
    """C function writing template[:hdr_len] back with 8-, 4- and 2-byte constant stores."""
    lines = [f"static __always_inline void bench_write_{name}(void *data)", "{"]
    off = 0
    for size, ctype in ((8, "__u64"), (4, "__u32"), (2, "__u16")):
        while hdr_len - off >= size:
            value = int.from_bytes(template[off : off + size], sys.byteorder)
            lines.append(f"\t*({ctype} *)(data + {off}) = {value:#x}ULL;")
            off += size
    lines.append("}")
    return "\n".join(lines)
