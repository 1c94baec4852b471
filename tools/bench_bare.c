/* SPDX-License-Identifier: Apache-2.0 */
/* tools/bench_bare.c: the floor programs tools/bench-e2e compares the router
 * with, and its packet sink. Not part of the data path; loaded through
 * controlplane/loader.py (compile_standalone). Each redirect program does the
 * least a redirecting router must: bounds-check Ethernet + IPv4 + UDP (or
 * IPv6 + UDP, tested after IPv4), write both MACs and redirect to one interface. No NAT, no lookups. The target
 * interface and MACs come as -D flags:
 *   BARE_IFINDEX        ifindex to redirect to
 *   BARE_DST_MAC_HI/LO  destination MAC: first 2 bytes, last 4 (host order)
 *   BARE_SRC_MAC_HI/LO  source MAC, likewise
 * bare_sink_xdp counts IPv4 and IPv6 UDP frames (also inside IPIP or
 * IPv6-in-IPv6, as the router sends a DSR backend) in bare_sink (per CPU) and
 * drops them;
 * everything else (ARP) passes. bare_gen_xdp is the generator, run through
 * BPF_PROG_TEST_RUN with live frames: it writes the frame in bare_tmpl over
 * each frame (live mode recycles pages without writing them again, so a
 * frame would come back as the router left it), gives it the next of
 * BARE_GEN_FLOWS UDP ports from BARE_GEN_FIRST_PORT (the source port when
 * BARE_GEN_PORT_OFF is 34, the destination port when 36; IPv6's source port
 * is at 54) and redirects it to
 * BARE_IFINDEX, so frames enter the router's veth as XDP frames, as from a
 * NIC's DMA. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/udp.h>

#ifndef BARE_IFINDEX
#define BARE_IFINDEX 0
#endif
#ifndef BARE_DST_MAC_HI
#define BARE_DST_MAC_HI 0
#define BARE_DST_MAC_LO 0
#define BARE_SRC_MAC_HI 0
#define BARE_SRC_MAC_LO 0
#endif

#ifndef BARE_GEN_PORT_OFF
#define BARE_GEN_PORT_OFF   34
#define BARE_GEN_FIRST_PORT 10000
#define BARE_GEN_FLOWS	    1024
#endif

BPF_PERCPU_ARRAY(bare_sink, u64, 1); /* frames the sink dropped, per CPU */
BPF_PERCPU_ARRAY(bare_gen, u32, 1);  /* the generator's next flow, per CPU */

#define BARE_FRAME_SIZE 64
struct bare_frame {
	__u8 bytes[BARE_FRAME_SIZE];
};
BPF_ARRAY(bare_tmpl, struct bare_frame, 1); /* the frame the generator sends */

/* 1 when data..data_end holds Ethernet + IPv4 (no options) + UDP. */
static __always_inline int is_udp4(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)ip + sizeof(*ip) + sizeof(struct udphdr) > data_end)
		return 0;
	return eth->h_proto == bpf_htons(ETH_P_IP) && ip->ihl == 5 &&
	       ip->protocol == IPPROTO_UDP;
}

static __always_inline int is_udp4_in_ipip(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	struct iphdr *outer = data + sizeof(*eth), *inner = (void *)(outer + 1);

	if ((void *)(inner + 1) + sizeof(struct udphdr) > data_end)
		return 0;
	return eth->h_proto == bpf_htons(ETH_P_IP) && outer->ihl == 5 &&
	       outer->protocol == IPPROTO_IPIP && inner->ihl == 5 && inner->protocol == IPPROTO_UDP;
}

/* 1 when data..data_end holds Ethernet + IPv6 + UDP, as the outer header
 * (the first test) or behind an outer IPv6 header (next header 41). */
static __always_inline int is_udp6(void *data, void *data_end, int in_ip6)
{
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = data + sizeof(*eth) + (in_ip6 ? sizeof(*ip6) : 0), *outer = data + sizeof(*eth);

	if ((void *)(ip6 + 1) + sizeof(struct udphdr) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return 0;
	return ip6->nexthdr == IPPROTO_UDP && (!in_ip6 || outer->nexthdr == IPPROTO_IPV6);
}

static __always_inline void write_macs(struct ethhdr *eth)
{
	__u16 *d = (__u16 *)eth->h_dest, *s = (__u16 *)eth->h_source;

	d[0] = bpf_htons(BARE_DST_MAC_HI);
	d[1] = bpf_htons((BARE_DST_MAC_LO >> 16) & 0xffff);
	d[2] = bpf_htons(BARE_DST_MAC_LO & 0xffff);
	s[0] = bpf_htons(BARE_SRC_MAC_HI);
	s[1] = bpf_htons((BARE_SRC_MAC_LO >> 16) & 0xffff);
	s[2] = bpf_htons(BARE_SRC_MAC_LO & 0xffff);
}

int bare_redirect_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (!is_udp4(data, data_end) && !is_udp6(data, data_end, 0))
		return XDP_PASS;
	write_macs(data);
	return bpf_redirect(BARE_IFINDEX, 0);
}

int bare_redirect_tc(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (!is_udp4(data, data_end))
		return TC_ACT_OK;
	write_macs(data);
	return bpf_redirect(BARE_IFINDEX, 0);
}

int bare_sink_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	int zero = 0;
	u64 *n;

	/* also UDP in IPIP or IPv6-in-IPv6: what the router sends a DSR backend (router-dsr, router-dsr6) */
	if (!is_udp4(data, data_end) && !is_udp4_in_ipip(data, data_end) && !is_udp6(data, data_end, 0) &&
	    !is_udp6(data, data_end, 1))
		return XDP_PASS;
	n = bare_sink.lookup(&zero);
	if (n)
		*n += 1;
	return XDP_DROP;
}

int bare_gen_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__be16 *port = data + BARE_GEN_PORT_OFF;
	struct bare_frame *tmpl;
	int zero = 0;
	u32 *next;

	if (data + BARE_FRAME_SIZE > data_end)
		return XDP_ABORTED;
	next = bare_gen.lookup(&zero);
	tmpl = bare_tmpl.lookup(&zero);
	if (!next || !tmpl)
		return XDP_ABORTED;
	__builtin_memcpy(data, tmpl->bytes, BARE_FRAME_SIZE);
	*port = bpf_htons(BARE_GEN_FIRST_PORT + *next % BARE_GEN_FLOWS);
	*next += 1;
	return bpf_redirect(BARE_IFINDEX, 0);
}
