/* SPDX-License-Identifier: Apache-2.0 */
/* parse.h: bounded, verifier-safe header parsing shared by the XDP and tc
 * programs. Each parse_* helper checks its header against data_end and
 * returns -1 when the header is cut off or inconsistent. parse_eth and
 * parse_ipv4 advance the cursor past their header and return the next
 * protocol (EtherType, IP protocol); parse_tcp and parse_udp, the last
 * headers parsed, leave the cursor where it is and return 0. Policy (what to
 * do with such a packet) lives elsewhere. */
#ifndef EDGE_PARSE_H
#define EDGE_PARSE_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#ifndef VLAN_MAX_DEPTH
#define VLAN_MAX_DEPTH 1 /* 802.1Q tags parsed; deeper stacks are passed */
#endif

#define IP_MF	  0x2000
#define IP_OFFSET 0x1fff

struct hdr_cursor {
	void *pos;
};

struct vlan_hdr {
	__be16 tci;
	__be16 encap_proto;
};

static __always_inline int proto_is_vlan(__u16 h_proto)
{
	return h_proto == bpf_htons(ETH_P_8021Q) ||
	       h_proto == bpf_htons(ETH_P_8021AD);
}

/* Returns the EtherType (network order) after at most VLAN_MAX_DEPTH tags;
 * *vlans tells how many were skipped. A deeper stack returns the tag type. */
static __always_inline int parse_eth(struct hdr_cursor *nh, void *data_end,
				     struct ethhdr **eth, int *vlans)
{
	struct ethhdr *e = nh->pos;
	struct vlan_hdr *vh;
	__u16 h_proto;
	int i;

	if ((void *)(e + 1) > data_end)
		return -1;
	nh->pos = e + 1;
	*eth = e;
	h_proto = e->h_proto;
	*vlans = 0;

#pragma unroll
	for (i = 0; i < VLAN_MAX_DEPTH; i++) {
		if (!proto_is_vlan(h_proto))
			break;
		vh = nh->pos;
		if ((void *)(vh + 1) > data_end)
			return -1;
		h_proto = vh->encap_proto;
		nh->pos = vh + 1;
		(*vlans)++;
	}
	return h_proto;
}

/* IPv4 header, checked the way ip_rcv() checks it: version, IHL >= 5, total
 * length between the header length and the end of the packet, which is
 * data_end for XDP (whole_frame) but not for a tc skb, whose payload may sit
 * in fragments beyond data_end. Options are skipped. */
static __always_inline int parse_ipv4(struct hdr_cursor *nh, void *data_end,
				      struct iphdr **iphdr, int whole_frame)
{
	struct iphdr *iph = nh->pos;
	__u32 hdrsize, tot_len;

	if ((void *)(iph + 1) > data_end)
		return -1;
	if (iph->version != 4 || iph->ihl < 5)
		return -1;
	hdrsize = iph->ihl * 4;
	tot_len = bpf_ntohs(iph->tot_len);
	if (tot_len < hdrsize)
		return -1;
	if (whole_frame && (void *)iph + tot_len > data_end)
		return -1;
	nh->pos = (void *)iph + hdrsize;
	*iphdr = iph;
	return iph->protocol;
}

/* TCP header whose data offset fits in l4_len bytes (the IP payload); 0 if so.
 * The cursor stays at the TCP header. */
static __always_inline int parse_tcp(struct hdr_cursor *nh, void *data_end,
				     __u32 l4_len, struct tcphdr **tcphdr)
{
	struct tcphdr *th = nh->pos;
	__u32 hdrsize;

	if ((void *)(th + 1) > data_end || l4_len < sizeof(*th))
		return -1;
	hdrsize = th->doff * 4;
	if (hdrsize < sizeof(*th) || hdrsize > l4_len)
		return -1;
	*tcphdr = th;
	return 0;
}

/* UDP header whose length field covers at least itself and at most l4_len;
 * 0 if so. The cursor stays at the UDP header. */
static __always_inline int parse_udp(struct hdr_cursor *nh, void *data_end,
				     __u32 l4_len, struct udphdr **udphdr)
{
	struct udphdr *uh = nh->pos;
	__u32 len;

	if ((void *)(uh + 1) > data_end || l4_len < sizeof(*uh))
		return -1;
	len = bpf_ntohs(uh->len);
	if (len < sizeof(*uh) || len > l4_len)
		return -1;
	*udphdr = uh;
	return 0;
}

#endif /* EDGE_PARSE_H */
