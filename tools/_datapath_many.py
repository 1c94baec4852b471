"""The `--backends N` part of tools/bench-datapath: the extra backends (x0, x1, ... at 198.19.x.y,
on-link behind the bench's backend veth), the client port whose established flow (a) lands on one
of the three main backends (the reply cases are compiled for those), the Maglev pick of a 5-tuple
computed as the data path does, and the C text of case (l): a new flow whose Maglev pick is the
one dead backend. Pure (controlplane.maglev, imported when used); no root, no bcc.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

EXTRA_BLOCK = IPv4Network("198.19.0.0/16")  # clear of the bench's 198.18.x link nets
PER_BLOCK = 250
HASH_SEED = 0x9E3779B9  # bpf/include/flow.h, EDGE_HASH_SEED
M32 = 0xFFFFFFFF
DEAD = "x0"  # the extra backend (l) finds dead
IPPROTO_TCP = 6


def extra_backends(n: int, port: int) -> list[tuple[str, IPv4Address, int]]:
    """The n backends beyond the bench's three: (name, address, port)."""
    return [(f"x{k}", EXTRA_BLOCK.network_address + 256 * (k // PER_BLOCK) + k % PER_BLOCK + 1, port) for k in range(n)]


def _mix(h: int) -> int:
    """flow.h's hash_mix (the MurmurHash3 finaliser)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def _word(addr: IPv4Address) -> int:
    return int.from_bytes(addr.packed, "little")  # a __be32 as a little-endian host reads it


def _half(port: int) -> int:
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def hash_flow(src: IPv4Address, dst: IPv4Address, sport: int, dport: int, proto: int = IPPROTO_TCP) -> int:
    """flow.h's hash_flow of a 5-tuple, on a little-endian machine (x86, arm64)."""
    h = _mix(HASH_SEED ^ _word(src))
    h = _mix(h ^ _word(dst))
    h = _mix(h ^ ((_half(sport) << 16) | _half(dport)))
    return _mix(h ^ proto)


def client_port(
    names: list[str], m: int, wanted: set[str], src: IPv4Address, dst: IPv4Address, dport: int, first: int = 40000
) -> int:
    """The first client port from `first` on whose flow's Maglev pick (equal weights) is in wanted."""
    from controlplane import maglev  # here: bench-datapath imports this module before it re-execs in .venv

    positions = maglev.build_table(names, [1] * len(names), m)
    for port in range(first, 65536):
        if names[positions[hash_flow(src, dst, port, dport) % m]] in wanted:
            return port
    raise ValueError(f"no client port from {first} on picks one of {sorted(wanted)}")


# Case (l): before each repetition the Maglev slot of the new 5-tuple is made to name the dead
# backend, and the slot the repetition before changed gets its backend back (a tail call to the
# slow path never returns to the wrapper, so the restore waits for the next repetition; the
# bench restores the last one). bench_dead[0]: (slot + 1) << 32 | its backend, 0: none;
# bench_dead[1]: the dead backend's id, written by the bench.
HELPERS = r"""
BPF_ARRAY(bench_dead, __u64, 2);

static __always_inline void bench_make_dead_pick(void *data)
{
	struct vip_key vk = { .addr = *(__be32 *)(data + 30), .port = *(__be16 *)(data + 36),
			      .proto = IPPROTO_TCP };
	struct flow_key fk = { .src = *(__be32 *)(data + 26), .dst = *(__be32 *)(data + 30),
			       .sport = *(__be16 *)(data + 34), .dport = *(__be16 *)(data + 36),
			       .proto = IPPROTO_TCP };
	__u32 zero = 0, one = 1, idx, *id;
	__u64 *saved = bench_dead.lookup(&zero), *dead = bench_dead.lookup(&one);
	struct vip_info *vip = edge_vips.lookup(&vk);

	if (!saved || !dead || !vip || vip->id >= EDGE_MAX_SERVICES)
		return;
	if (*saved) {
		id = maglev_slot((__u32)(*saved >> 32) - 1);
		if (id)
			*id = (__u32)*saved;
	}
	idx = ((vip->id << 1) | (vip->table & 1)) * EDGE_MAGLEV_M + hash_flow(&fk) % EDGE_MAGLEV_M;
	id = maglev_slot(idx);
	if (!id)
		return;
	*saved = ((__u64)(idx + 1) << 32) | *id;
	*id = (__u32)*dead;
}
"""
