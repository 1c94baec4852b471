/* SPDX-License-Identifier: Apache-2.0 */
/* dsr_decap.c: the backend's side of direct server return, for kernels
 * without the ipip module (tools/dsr-backend setup --decap xdp): XDP on the
 * backend's link that takes the outer IPv4 header off an IPIP packet
 * (protocol 4, a 20-byte outer header, an IPv4 packet inside) and passes
 * the inner packet, the VIP its destination, to the stack. Like the kernel's
 * catch-all tunl0 it takes IPIP from any sender; the backend's addresses and
 * firewall decide the rest. Everything else passes untouched. Standalone:
 * no maps, nothing pinned; not part of the router's data path. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>

int dsr_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data, copy;
	struct iphdr *outer = (void *)(eth + 1), *inner = (void *)(outer + 1);

	if ((void *)(inner + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	if (outer->version != 4 || outer->ihl != 5 || outer->protocol != IPPROTO_IPIP ||
	    (outer->frag_off & bpf_htons(0x3fff)) || inner->version != 4)
		return XDP_PASS;
	__builtin_memcpy(&copy, eth, sizeof(copy));
	if (bpf_xdp_adjust_head(ctx, sizeof(struct iphdr)))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(eth, &copy, sizeof(copy));
	return XDP_PASS;
}
