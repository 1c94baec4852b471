/* SPDX-License-Identifier: Apache-2.0 */
/* dsr_decap.c: the backend's side of direct server return, for kernels
 * without the ipip or ip6_tunnel module (tools/dsr-backend setup --decap
 * xdp): XDP on the backend's link that takes the outer header off an IPIP
 * packet (IPv4, protocol 4, a 20-byte outer header, an IPv4 packet inside)
 * or an IPv6-in-IPv6 one (next header 41 right after the 40-byte outer
 * header, an IPv6 packet inside) and passes the inner packet, the VIP its
 * destination, to the stack. Like the kernel's catch-all tunl0 and ip6tnl0 it
 * takes them from any sender; the backend's addresses and firewall decide
 * the rest. Everything else passes untouched. Standalone: no maps, nothing
 * pinned; not part of the router's data path. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>

/* How many outer bytes follow the Ethernet header of a tunnelled packet
 * this program takes apart; 0 for any other. */
static __always_inline int outer_len(struct ethhdr *eth, void *data_end)
{
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *outer = (void *)(eth + 1), *inner = (void *)(outer + 1);

		if ((void *)(inner + 1) > data_end || outer->version != 4 || outer->ihl != 5 ||
		    outer->protocol != IPPROTO_IPIP || (outer->frag_off & bpf_htons(0x3fff)) || inner->version != 4)
			return 0;
		return sizeof(*outer);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *outer = (void *)(eth + 1), *inner = (void *)(outer + 1);

		if ((void *)(inner + 1) > data_end || outer->version != 6 || outer->nexthdr != IPPROTO_IPV6 ||
		    inner->version != 6)
			return 0;
		return sizeof(*outer);
	}
	return 0;
}

int dsr_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data, copy;
	int len;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	len = outer_len(eth, data_end);
	if (!len)
		return XDP_PASS;
	__builtin_memcpy(&copy, eth, sizeof(copy));
	if (bpf_xdp_adjust_head(ctx, len))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(eth, &copy, sizeof(copy));
	return XDP_PASS;
}
