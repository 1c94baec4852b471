/* SPDX-License-Identifier: Apache-2.0 */
/* abi.h: everything the data path and user space must agree on: map key and
 * value structs, flag bits, counter indices, drop reasons. Types and integer
 * #defines only: no maps, no functions, no bcc macros.
 *
 * Shared with controlplane/abi.py; controlplane/tests/test_abi.py compares
 * them. Struct layouts are not mirrored: Python uses bcc's generated types.
 * Changing a layout or a number here means bumping EDGE_ABI_VERSION, which is
 * part of the pin path, so a new build never reads an old layout. */
#ifndef EDGE_ABI_H
#define EDGE_ABI_H

#include <linux/types.h>

#define EDGE_ABI_VERSION	1

#define EDGE_NAME_LEN		32	/* service and backend names, NUL padded */
#define EDGE_MAX_RETURN_IFACES	16	/* backend-facing interfaces per router */
#define EDGE_NO_BACKEND		0xffffffff	/* empty Maglev slot */

/* Key of edge_vips: what a client addresses. */
struct vip_key {
	__be32	addr;		/* network byte order */
	__be16	port;		/* network byte order */
	__u8	proto;		/* IPPROTO_TCP or IPPROTO_UDP */
	__u8	pad;
};

/* Value of edge_vips. Replaced as a whole (hash update), which is what makes
 * the Maglev A/B flip atomic. */
struct vip_info {
	__u32	id;		/* index into per-VIP arrays: 0..max_services-1 */
	__u32	table;		/* active Maglev half, 0 or 1 */
	__u32	flags;		/* EDGE_VIP_F_* */
	__u32	pad;
};

/* vip_info.flags */
#define EDGE_VIP_F_KEEP_FLOWS	0x1	/* existing_flows: keep (else reselect) */

/* Value of edge_backends, indexed by backend id. */
struct backend_info {
	__be32	addr;		/* network byte order */
	__be16	port;		/* network byte order */
	__u16	flags;		/* EDGE_BE_F_* */
	__u32	vip_id;		/* the service this backend serves */
	__u32	pad;
};

/* backend_info.flags */
#define EDGE_BE_F_VALID		0x1	/* slot in use */
#define EDGE_BE_F_UP		0x2	/* administratively up */
#define EDGE_BE_F_STANDBY	0x4	/* used only when no primary is usable */
#define EDGE_BE_F_DRAINING	0x8	/* weight 0: keeps its flows, gets no new ones */

/* Key of edge_ct (client -> VIP) and edge_rnat (backend -> client). */
struct flow_key {
	__be32	src;
	__be32	dst;
	__be16	sport;
	__be16	dport;
	__u8	proto;
	__u8	pad[3];
};

/* Value of edge_ct: the backend a connection is pinned to. */
struct flow_info {
	__u32	backend_id;
	__u32	vip_id;
};

/* Value of edge_rnat: what the return path rewrites the source back to. */
struct rnat_info {
	__be32	vip_addr;	/* network byte order */
	__be16	vip_port;	/* network byte order */
	__u16	pad;
	__u32	backend_id;
	__u32	vip_id;
};

/* Value of edge_vip_stats and edge_be_stats (per CPU). */
struct traffic_stats {
	__u64	packets;	/* forwarded client -> backend */
	__u64	bytes;		/* L3 bytes of those packets */
	__u64	new_flows;	/* conntrack misses that picked this VIP/backend */
	__u64	return_packets;	/* reverse-NATed backend -> client */
};

/* Value of edge_svc_meta, indexed by VIP id. User space only: names and
 * settings that status shows without a config file. */
struct service_meta {
	char	name[EDGE_NAME_LEN];
	__u32	in_use;		/* 1 while the id is allocated */
	__u32	pad;
};

/* Value of edge_be_meta, indexed by backend id. User space only. */
struct backend_meta {
	char	name[EDGE_NAME_LEN];
	__u32	weight;		/* configured weight; 0 = draining */
	__u32	slots;		/* Maglev slots owned in the active table */
};

/* Value of edge_node (one entry). User space only: what undeploy must undo
 * and the sizes the pinned maps were made with. */
struct node_info {
	__u32	maglev_m;
	__u32	max_services;
	__u32	max_backends;
	__u32	ct_size;
	__u32	ingress_ifindex;
	__u32	xdp_flags;		/* XDP_FLAGS_* used to attach */
	__u32	ip_forward_was;		/* net.ipv4.ip_forward before deploy, +1; 0 = unknown */
	__u32	n_return;		/* entries used in return_ifindex */
	__u32	return_ifindex[EDGE_MAX_RETURN_IFACES];
	__u32	return_clsact_added;	/* bit i: deploy created clsact on return_ifindex[i] */
	__u32	pad;
};

/* Verdict counters: index into edge_verdicts. */
#define EDGE_CNT_PASS		0	/* not for a VIP: handed to the stack untouched */
#define EDGE_CNT_REDIRECT	1	/* NATed and redirected to the backend's interface */
#define EDGE_CNT_NAT_PASS	2	/* NATed, handed to the stack (neighbour unresolved, VLAN) */
#define EDGE_CNT_DROP		3	/* dropped; edge_drops says why */
#define EDGE_CNT_RETURN_NAT	4	/* return path: reverse NAT applied */
#define EDGE_CNT_MAX		5

/* Drop reasons: index into edge_drops. Never reuse a number; retire it. */
#define EDGE_DROP_MALFORMED	1	/* truncated or inconsistent headers */
#define EDGE_DROP_NO_BACKEND	2	/* the VIP has no usable backend */
#define EDGE_DROP_IP_OPTIONS	3	/* IPv4 options on VIP traffic (not handled) */
#define EDGE_DROP_FRAGMENT	4	/* IPv4 fragment for a VIP (not handled) */
#define EDGE_DROP_MAX		5

_Static_assert(sizeof(struct vip_key) == 8, "abi: vip_key");
_Static_assert(sizeof(struct vip_info) == 16, "abi: vip_info");
_Static_assert(sizeof(struct backend_info) == 16, "abi: backend_info");
_Static_assert(sizeof(struct flow_key) == 16, "abi: flow_key");
_Static_assert(sizeof(struct flow_info) == 8, "abi: flow_info");
_Static_assert(sizeof(struct rnat_info) == 16, "abi: rnat_info");
_Static_assert(sizeof(struct traffic_stats) == 32, "abi: traffic_stats");
_Static_assert(sizeof(struct service_meta) == 40, "abi: service_meta");
_Static_assert(sizeof(struct backend_meta) == 40, "abi: backend_meta");
_Static_assert(sizeof(struct node_info) == 104, "abi: node_info");

#endif /* EDGE_ABI_H */
