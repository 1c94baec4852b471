"""Byte order, names and the plain records of the maps package: the edge_be_probe
status record (ProbeStatus, packed and unpacked here only), a backend's wire signals
(WireStats, from edge_wire), the state status shows (shown_state) and counting helpers."""

from __future__ import annotations

import socket
import struct
import sys
import time
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Iterable, Mapping, Sequence

from controlplane import abi

PROTOS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
PROTO_NAMES = {v: k for k, v in PROTOS.items()}
# Array maps store each value in round_up(value_size, 8) bytes; edge_maglev's
# values hold abi.MAGLEV_PER_VALUE (2) u32 slots each (8 bytes, no padding), so
# through mmap the map is one plain array of u32 backend ids, 4 bytes a slot.
MAGLEV_STRIDE = 4


def be32(addr: IPv4Address) -> int:
    """An address as the integer whose memory image is network order."""
    return struct.unpack("=I", addr.packed)[0]


def be16(port: int) -> int:
    return socket.htons(port)


def from_be32(value: int) -> IPv4Address:
    return IPv4Address(struct.pack("=I", value))


def from_be16(value: int) -> int:
    return socket.ntohs(value)


def hash_mix(h: int) -> int:
    """bpf/include/flow.h's hash_mix (MurmurHash3's 32-bit finaliser)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def next_rnat_gen(gen: int) -> int:
    """node_info.rnat_gen after an edge_rnat change: above gen and CLOCK_MONOTONIC's ns, so it
    is a value no edged or edgectl on this boot gave it before, even after a rollback."""
    return max(gen + 1, time.monotonic_ns()) & 0xFFFFFFFFFFFFFFFF


def vip_filter_words(addrs: Iterable[int]) -> list[int]:
    """edge_vip_filter's words with the bit of each address set (be32 values, as stored)."""
    words = [0] * abi.VIP_FILTER_WORDS
    for a in addrs:
        bit = hash_mix(a) % abi.VIP_FILTER_BITS
        words[bit // 64] |= 1 << (bit % 64)
    return words


def _name_bytes(name: str) -> bytes:
    return name.encode()[: abi.NAME_LEN - 1]


@dataclass(frozen=True)
class ProbeStatus:
    """One backend's edge_be_probe record in plain units: what edged measured and decided,
    and the operator's marks a restarted edged keeps. pack_probe/unpack_probe convert."""

    updated_ns: int = 0  # CLOCK_MONOTONIC of the write; 0 = never
    config_weight: int = 0
    rtt_p50_s: float | None = None  # over the probe window; None = no sample
    rtt_p99_s: float | None = None
    rtt_smoothed_s: float | None = None
    waiting: float | None = None  # load signals as the engine reports them; None = unknown
    running: float | None = None
    kv_usage: float | None = None  # 0..1
    probes_ok: int = 0
    probes_failed: int = 0
    state: str = ""
    reason: str = ""
    drained: bool = False  # by the operator (API)
    override: int | None = None  # the operator's weight
    leave_until_s: int | None = None  # removed by a reload: CLOCK_MONOTONIC second its drain ends


PROBE_TEXT = {"state": 16, "reason": 64}  # char arrays of struct backend_probe, NUL included
_U32_MAX_VALUE = 0xFFFFFFFE  # the largest u32 that is not EDGE_UNKNOWN


def shown_state(flags: int, health: Mapping, probe_state: str) -> str:
    """A backend's state as status shows it, from its backend_info flags, the data path's
    health judgement (Reader._health) and the state edged last wrote to edge_be_probe: "down"
    while its probes keep it out of new flows (edged gave it weight 0: BE_F_DRAINING), under
    every weight policy; "draining" for another weight 0; else the data path's own state."""
    if flags & abi.BE_F_DRAINING and probe_state == "down":
        return "down"
    if flags & abi.BE_F_DRAINING and health["usable"]:
        return "draining"
    return health["state"]


def pack_probe(p: ProbeStatus) -> dict[str, int | bytes]:
    """p as the fields of struct backend_probe (C names, units and sentinels of abi.h)."""

    def us(seconds):
        return 0 if seconds is None else max(1, min(round(seconds * 1e6), _U32_MAX_VALUE))

    def count(value):
        return abi.UNKNOWN if value is None else max(0, min(round(value), _U32_MAX_VALUE))

    return {
        "updated_ns": p.updated_ns,
        "config_weight": p.config_weight,
        "rtt_p50_us": us(p.rtt_p50_s),
        "rtt_p99_us": us(p.rtt_p99_s),
        "rtt_smoothed_us": us(p.rtt_smoothed_s),
        "waiting": count(p.waiting),
        "running": count(p.running),
        "kv_permille": abi.UNKNOWN if p.kv_usage is None else max(0, min(1000, round(p.kv_usage * 1000))),
        "probes_ok": p.probes_ok & 0xFFFFFFFF,
        "probes_failed": p.probes_failed & 0xFFFFFFFF,
        "flags": (abi.PROBE_F_DRAINED if p.drained else 0)
        | (abi.PROBE_F_OVERRIDE if p.override is not None else 0)
        | (abi.PROBE_F_LEAVING if p.leave_until_s is not None else 0),
        "override_weight": p.override or 0,
        "leave_until_s": p.leave_until_s or 0,
        "state": p.state.encode()[: PROBE_TEXT["state"] - 1],
        "reason": p.reason.encode()[: PROBE_TEXT["reason"] - 1],
    }


def unpack_probe(v: Mapping[str, int | bytes]) -> ProbeStatus:
    """The fields of struct backend_probe (C names) as a ProbeStatus."""

    def seconds(us):
        return us / 1e6 if us else None

    def known(value):
        return None if value == abi.UNKNOWN else value

    flags = v["flags"]
    return ProbeStatus(
        updated_ns=v["updated_ns"],
        config_weight=v["config_weight"],
        rtt_p50_s=seconds(v["rtt_p50_us"]),
        rtt_p99_s=seconds(v["rtt_p99_us"]),
        rtt_smoothed_s=seconds(v["rtt_smoothed_us"]),
        waiting=known(v["waiting"]),
        running=known(v["running"]),
        kv_usage=None if v["kv_permille"] == abi.UNKNOWN else v["kv_permille"] / 1000,
        probes_ok=v["probes_ok"],
        probes_failed=v["probes_failed"],
        state=bytes(v["state"]).decode(errors="replace"),
        reason=bytes(v["reason"]).decode(errors="replace"),
        drained=bool(flags & abi.PROBE_F_DRAINED),
        override=v["override_weight"] if flags & abi.PROBE_F_OVERRIDE else None,
        leave_until_s=v["leave_until_s"] if flags & abi.PROBE_F_LEAVING else None,
    )


_NO_BUCKETS = (0,) * abi.WIRE_BUCKETS


@dataclass(frozen=True)
class WireStats:
    """One backend's edge_wire record: cumulative counts since the map was made (summed over
    CPUs by the reader). Histogram bucket i counts samples of [2^i, 2^(i+1)) microseconds
    (bucket 0 from 0, the last one open-ended); controlplane/wiresignals.py makes windows of them."""

    handshake: tuple[int, ...] = _NO_BUCKETS  # SYN forwarded -> SYN-ACK seen
    first_byte: tuple[int, ...] = _NO_BUCKETS  # first request payload -> first reply payload
    handshake_ns: int = 0  # sums of the samples
    first_byte_ns: int = 0
    opened: int = 0  # connections begun with a SYN
    closed: int = 0  # of those, FIN or RST seen (LRU evictions are not)

    @property
    def active(self) -> int:
        """Connections open now: opened - closed, never below 0."""
        return max(0, self.opened - self.closed)

    def __add__(self, other: "WireStats") -> "WireStats":
        return WireStats(
            handshake=tuple(a + b for a, b in zip(self.handshake, other.handshake)),
            first_byte=tuple(a + b for a, b in zip(self.first_byte, other.first_byte)),
            handshake_ns=self.handshake_ns + other.handshake_ns,
            first_byte_ns=self.first_byte_ns + other.first_byte_ns,
            opened=self.opened + other.opened,
            closed=self.closed + other.closed,
        )


def unpack_wire(v) -> WireStats:
    """One CPU's struct wire_stats (an object with the C field names) as a WireStats."""
    return WireStats(
        handshake=tuple(int(x) for x in v.handshake[: abi.WIRE_BUCKETS]),
        first_byte=tuple(int(x) for x in v.first_byte[: abi.WIRE_BUCKETS]),
        handshake_ns=int(v.handshake_ns),
        first_byte_ns=int(v.first_byte_ns),
        opened=int(v.opened),
        closed=int(v.closed),
    )


def wire_columns(leaf) -> list[int]:
    """Where each column of a wire row (controlplane.wiresignals.row) is among the u64 words of one
    CPU's struct wire_stats; leaf: its ctypes type (bcc's sLeaf)."""

    def word(name: str) -> int:
        return getattr(leaf, name).offset // 8

    return [
        *range(word("handshake"), word("handshake") + abi.WIRE_BUCKETS),
        *range(word("first_byte"), word("first_byte") + abi.WIRE_BUCKETS),
        word("handshake_ns"),
        word("first_byte_ns"),
        word("opened"),
        word("closed"),
    ]


def wire_from_row(r) -> WireStats:
    """A wire row (controlplane.wiresignals.row) as a WireStats."""
    values = [int(x) for x in r]
    b = abi.WIRE_BUCKETS
    return WireStats(
        handshake=tuple(values[:b]),
        first_byte=tuple(values[b : 2 * b]),
        handshake_ns=values[2 * b],
        first_byte_ns=values[2 * b + 1],
        opened=values[2 * b + 2],
        closed=values[2 * b + 3],
    )


def verdicts_shown(counts: dict[str, int]) -> dict[str, int]:
    """edge_verdicts by name as status and the metrics show them: return_nat is every
    reverse-NATed reply, tc's (its own slot, EDGE_CNT_RETURN_NAT) and edge_reply's, which
    counts each of its replies only once, under return_xdp."""
    names = abi.CNT_NAMES[abi.CNT_RETURN_NAT], abi.CNT_NAMES[abi.CNT_RETURN_XDP]
    if all(n in counts for n in names):
        counts = {**counts, names[0]: counts[names[0]] + counts[names[1]]}
    return counts


def slot_counts(values: Sequence[int], slot: int) -> dict[str, dict[str, int]]:
    """{"verdicts": {name: n}, "drops": {name: n}} of one slot of edge_svc_counts (a VIP id, or
    max_services: no service known), values: the map's counters summed over CPUs, by index;
    verdicts as shown (verdicts_shown)."""
    base = slot * abi.SVC_COUNTERS
    return {
        "verdicts": verdicts_shown({n: int(values[base + i]) for i, n in abi.CNT_NAMES.items()}),
        "drops": {n: int(values[base + abi.CNT_MAX + i]) for i, n in abi.DROP_NAMES.items()},
    }


def node_counts(values: Sequence[int]) -> dict[str, dict[str, int]]:
    """slot_counts summed over every slot: the node's counts (a service's stay in them until
    its id is given to another service, which starts from zero)."""
    per_index = [0] * abi.SVC_COUNTERS
    for key, n in enumerate(values):
        per_index[key % abi.SVC_COUNTERS] += int(n)
    return slot_counts(per_index, 0)


def values_from_dump(dump: list[dict]) -> list[int]:
    """`bpftool -j map dump` of edge_svc_counts (a per-CPU array of u64, key u32, both host byte
    order) as its counters summed over CPUs, by index: for readers that do not compile the data
    path (tests, tools)."""
    out: dict[int, int] = {}
    for entry in dump:
        key = int.from_bytes(bytes(int(b, 16) for b in entry["key"]), sys.byteorder)
        out[key] = sum(int.from_bytes(bytes(int(b, 16) for b in v["value"]), sys.byteorder) for v in entry["values"])
    return [out.get(i, 0) for i in range(max(out, default=-1) + 1)]


def counts_from_dump(dump: list[dict]) -> dict[str, dict[str, int]]:
    """The node's {"verdicts", "drops"} from a bpftool dump of edge_svc_counts (node_counts)."""
    return node_counts(values_from_dump(dump))


def count_entries(keys: Iterable, deadline_ns: int | None = None, every: int = 1024) -> tuple[int, bool]:
    """(entries, complete) of a walk over keys that stops at deadline_ns (CLOCK_MONOTONIC),
    looking at the clock every `every` entries."""
    n = 0
    for n, _ in enumerate(keys, 1):
        if deadline_ns is not None and n % every == 0 and time.monotonic_ns() > deadline_ns:
            return n, False
    return n, True
