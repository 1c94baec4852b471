"""What a node config pins in kernel memory: every pinned map's kind, key and value size and
entry count as a function of the node section, and the bytes the kernel charges for it. Pure
(no bcc, no kernel): `edgectl validate` prints it and deploy refuses a config that does not fit
before compiling anything. netns-tests/test_map_sizing.py holds the table to what the kernel
reports for a deployed instance (sizes, entries, and bytes within a few percent).

The kernel's accounting (6.x map_mem_usage), measured on this project's maps:
  array          header + entries * round8(value)     (BPF_F_MMAPABLE: a page, then the values page-rounded)
  percpu_array   header + entries * (8 + cpus * round8(value))
  hash           header + (entries + cpus) * elem + pow2(entries) * 16   (preallocated; per-CPU spares)
  lru_hash       header + entries * elem + pow2(entries) * 16
  with elem = 48 + round8(key) + round8(value) and a header of a few hundred bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from controlplane import abi
from controlplane.config import Node, ct6_size, half_open_size

_ARRAY_HEADER = 312
_HASH_HEADER = 912
_LRU_HEADER = 896
_HTAB_ELEM = 48  # struct htab_elem before its key
_BUCKET = 16
_PAGE = 4096


@dataclass(frozen=True)
class Shape:
    """One pinned map: its kind, key and value size, and entries for a node section."""

    kind: str  # as bpftool names it: array, percpu_array, hash, lru_hash, prog_array
    key: int
    value: int
    entries: Callable[[Node], int]
    mmapable: bool = False


def _services(n: Node) -> int:
    return n.max_services


def _backends(n: Node) -> int:
    return n.max_backends


def _one(n: Node) -> int:
    return 1


def _const(k: int) -> Callable[[Node], int]:
    return lambda n: k


# Key and value sizes are those of bpf/include/abi.h's structs (the netns test compares them).
SHAPES: dict[str, Shape] = {
    abi.MAP_VIPS: Shape("hash", 8, 16, _services),
    abi.MAP_VIP_ADDRS: Shape("hash", 4, 4, _services),
    abi.MAP_VIP_FILTER: Shape("array", 4, 128, _one),
    abi.MAP_BACKENDS: Shape("array", 4, 16, _backends),
    abi.MAP_SVC_CFG: Shape("array", 4, 4168, _services),
    abi.MAP_HEALTH: Shape("array", 4, 64, _backends),
    abi.MAP_HB: Shape("hash", 8, 32, _backends),
    abi.MAP_HB_PORTS: Shape("hash", 2, 4, _services),
    abi.MAP_MAGLEV: Shape(
        "array",
        4,
        4 * abi.MAGLEV_PER_VALUE,
        lambda n: n.max_services * 2 * n.maglev_m // abi.MAGLEV_PER_VALUE,
        mmapable=True,
    ),
    abi.MAP_CT: Shape("lru_hash", 16, 24, lambda n: n.ct_size),
    abi.MAP_HALF_OPEN: Shape("lru_hash", 16, 32, lambda n: half_open_size(n.ct_size)),
    abi.MAP_CT_BUDGET: Shape("percpu_array", 4, 16, _one),
    abi.MAP_RNAT: Shape("hash", 8, 16, _backends),
    abi.MAP_DIRECT: Shape("lru_hash", 12, 4, _const(abi.DIRECT_SLOTS)),
    abi.MAP_NEXTHOP: Shape("percpu_array", 4, 32, _backends),
    abi.MAP_TAILS: Shape("prog_array", 4, 4, _const(abi.TAIL_MAX)),
    abi.MAP_REPLY_HOP: Shape("percpu_array", 4, 40, _const(abi.REPLY_HOP_SLOTS)),
    abi.MAP_VIP_STATS: Shape("percpu_array", 4, 48, _services),
    abi.MAP_BE_STATS: Shape("percpu_array", 4, 48, _backends),
    abi.MAP_WIRE: Shape("percpu_array", 4, 416, _backends),
    abi.MAP_INFLIGHT: Shape("array", 4, 8, lambda n: 3 * n.max_backends),  # counts, their fixes, scales
    abi.MAP_SVC_COUNTS: Shape("percpu_array", 4, 8, lambda n: (n.max_services + 1) * abi.SVC_COUNTERS),
    abi.MAP_SVC_META: Shape("array", 4, 40, _services),
    abi.MAP_BE_META: Shape("array", 4, 40, _backends),
    abi.MAP_BE_PROBE: Shape("array", 4, 136, _backends),
    abi.MAP_NODE: Shape("array", 4, 112, _one),
    # IPv6 (abi.h: vip_key6, flow_key6, backend_key6, rnat_info6, hb_key6, nexthop6): pinned whether or not a VIP is IPv6
    abi.MAP_VIPS6: Shape("hash", 20, 16, _services),
    abi.MAP_VIP_ADDRS6: Shape("hash", 16, 4, _services),
    abi.MAP_BACKENDS6: Shape("array", 4, 16, _backends),
    abi.MAP_CT6: Shape("lru_hash", 40, 24, lambda n: ct6_size(n.ct_size)),
    abi.MAP_HALF_OPEN6: Shape("lru_hash", 40, 32, lambda n: half_open_size(n.ct_size)),
    abi.MAP_DIRECT6: Shape("lru_hash", 36, 4, _const(abi.DIRECT6_SLOTS)),
    abi.MAP_RNAT6: Shape("hash", 20, 28, _backends),
    abi.MAP_REPLY_HOP6: Shape("percpu_array", 4, 64, _const(abi.REPLY_HOP_SLOTS)),
    abi.MAP_HB6: Shape("hash", 20, 32, _backends),
    abi.MAP_HOP6: Shape("percpu_array", 4, 48, _backends),
}


def ct_entry_bytes(name: str) -> int:
    """Bytes the kernel charges per conntrack entry of edge_ct or edge_ct6 (its element and its
    share of the buckets, at a power-of-two entry count): 104 for IPv4, 128 for IPv6."""
    shape = SHAPES[name]
    return _HTAB_ELEM + _round8(shape.key) + _round8(shape.value) + _BUCKET


def _round8(x: int) -> int:
    return (x + 7) & ~7


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def map_bytes(shape: Shape, node: Node, cpus: int) -> int:
    """Bytes the kernel charges for one map of this shape."""
    n = shape.entries(node)
    if shape.kind in ("array", "prog_array"):
        body = n * _round8(shape.value)
        if shape.mmapable:  # the values start on a page of their own, and end on a page boundary
            return _PAGE + -(-body // _PAGE) * _PAGE
        return _ARRAY_HEADER + body
    if shape.kind == "percpu_array":
        return _ARRAY_HEADER + n * (8 + cpus * _round8(shape.value))
    elem = _HTAB_ELEM + _round8(shape.key) + _round8(shape.value)
    if shape.kind == "hash":
        return _HASH_HEADER + (n + cpus) * elem + _pow2(n) * _BUCKET
    return _LRU_HEADER + n * elem + _pow2(n) * _BUCKET


def node_bytes(node: Node, cpus: int | None = None) -> dict[str, int]:
    """Bytes per pinned map for a node section, largest first; cpus: this machine's by default."""
    cpus = cpus or os.cpu_count() or 1
    sizes = {name: map_bytes(shape, node, cpus) for name, shape in SHAPES.items()}
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def describe(sizes: dict[str, int], top: int = 3) -> str:
    """'61.2 MiB (edge_ct 26.0 MiB, edge_maglev 16.0 MiB, ...)' for one line of output."""
    parts = ", ".join(f"{name} {mib(b)}" for name, b in list(sizes.items())[:top])
    return f"{mib(sum(sizes.values()))} ({parts}, ...)"


def mib(b: int) -> str:
    return f"{b / (1 << 20):.1f} MiB"


def misfit(node: Node, available: int | None, cpus: int | None = None) -> str | None:
    """The one-line refusal when the node section's maps would not fit in available bytes
    (MemAvailable), else None (also when available is unknown)."""
    sizes = node_bytes(node, cpus)
    need = sum(sizes.values())
    if available is None or need <= available:
        return None
    return (
        f"node: the maps would pin {describe(sizes)} but this machine has {mib(available)} available; "
        f"lower node.ct_size, node.maglev_m or node.max_services"
    )
