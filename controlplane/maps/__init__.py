"""The only module that knows map layouts: it writes services, backends and
Maglev tables into the pinned maps and reads them back for status. Field
names are the C names of bpf/include/abi.h through bcc's generated types.
Applying a config is a transaction: ids planned by desired.py, writes ordered
so that no packet sees a half-made state, every write journaled and undone if
a later one fails (README, design notes)."""

from __future__ import annotations

import mmap
import socket
import struct
import sys
import time
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address
from typing import Iterable, Mapping

import numpy as np

from controlplane import abi, desired, maglev
from controlplane.journal import Journal
from controlplane.config import Backend, Config, Service
from controlplane.errors import MapError

PROTOS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
PROTO_NAMES = {v: k for k, v in PROTOS.items()}
# Array maps store each value in round_up(value_size, 8) bytes; edge_maglev's
# u32 values are therefore 8 bytes apart in the mmap'd region (x86/arm64 are
# little-endian, so the id is the low half of each 64-bit word).
MAGLEV_STRIDE = 8


def be32(addr: IPv4Address) -> int:
    """An address as the integer whose memory image is network order."""
    return struct.unpack("=I", addr.packed)[0]


def be16(port: int) -> int:
    return socket.htons(port)


def from_be32(value: int) -> IPv4Address:
    return IPv4Address(struct.pack("=I", value))


def from_be16(value: int) -> int:
    return socket.ntohs(value)


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
        "flags": (abi.PROBE_F_DRAINED if p.drained else 0) | (abi.PROBE_F_OVERRIDE if p.override is not None else 0)
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
        updated_ns=v["updated_ns"], config_weight=v["config_weight"],
        rtt_p50_s=seconds(v["rtt_p50_us"]), rtt_p99_s=seconds(v["rtt_p99_us"]),
        rtt_smoothed_s=seconds(v["rtt_smoothed_us"]),
        waiting=known(v["waiting"]), running=known(v["running"]),
        kv_usage=None if v["kv_permille"] == abi.UNKNOWN else v["kv_permille"] / 1000,
        probes_ok=v["probes_ok"], probes_failed=v["probes_failed"],
        state=bytes(v["state"]).decode(errors="replace"), reason=bytes(v["reason"]).decode(errors="replace"),
        drained=bool(flags & abi.PROBE_F_DRAINED),
        override=v["override_weight"] if flags & abi.PROBE_F_OVERRIDE else None,
        leave_until_s=v["leave_until_s"] if flags & abi.PROBE_F_LEAVING else None,
    )


def counts_from_dump(map_name: str, dump: list[dict]) -> dict[str, int]:
    """`bpftool -j map dump` of edge_verdicts or edge_drops (per-CPU arrays of u64, key
    u32, both host byte order) as {name: count summed over CPUs}: for readers that do
    not compile the data path (tests, tools)."""
    names = {abi.MAP_VERDICTS: abi.CNT_NAMES, abi.MAP_DROPS: abi.DROP_NAMES}[map_name]
    counts = {}
    for entry in dump:
        key = int.from_bytes(bytes(int(b, 16) for b in entry["key"]), sys.byteorder)
        if key in names:
            counts[names[key]] = sum(int.from_bytes(bytes(int(b, 16) for b in v["value"]), sys.byteorder)
                                     for v in entry["values"])
    return counts


def count_entries(keys: Iterable, deadline_ns: int | None = None, every: int = 1024) -> tuple[int, bool]:
    """(entries, complete) of a walk over keys that stops at deadline_ns (CLOCK_MONOTONIC),
    looking at the clock every `every` entries."""
    n = 0
    for n, _ in enumerate(keys, 1):
        if deadline_ns is not None and n % every == 0 and time.monotonic_ns() > deadline_ns:
            return n, False
    return n, True


@dataclass
class ApplyReport:
    """What one apply() changed, for the CLI's progress lines."""

    added_services: list[str] = field(default_factory=list)
    removed_services: list[str] = field(default_factory=list)
    updated_services: list[str] = field(default_factory=list)
    added_backends: list[str] = field(default_factory=list)
    removed_backends: list[str] = field(default_factory=list)
    renamed_services: list[str] = field(default_factory=list)


class Maps:
    """Typed access to one instance's maps (the handles loader returns)."""

    def __init__(self, tables: Mapping[str, object], maglev_fd: int, maglev_m: int, max_services: int,
                 max_backends: int | None = None):
        """max_backends: the pinned maps' (node record); default: as the tables were compiled."""
        self.t = tables
        self.m = maglev_m
        self.max_services = max_services
        self.max_backends = max_backends or len(tables[abi.MAP_BACKENDS])
        self._maglev_fd = maglev_fd
        self._mm: mmap.mmap | None = None
        self._ids: dict[str, tuple[int, dict[str, int]]] | None = None  # set by apply(), else read once
        self._journal: Journal | None = None  # while apply() runs

    @classmethod
    def sized_by_node(cls, tables: Mapping[str, object], maglev_fd: int, maglev_m: int, max_services: int) -> "Maps":
        """Maps over tables sized by their node record when it has one (an instance deployed
        with other sizes), else by maglev_m and max_services."""
        t = tables[abi.MAP_NODE]
        v = t[t.Key(0)]
        return cls(tables, maglev_fd, v.maglev_m or maglev_m, v.max_services or max_services,
                   v.max_backends or None)

    # ------------------------------------------------------------ maglev mmap

    def _maglev_words(self) -> np.ndarray:
        if self._mm is None:
            size = self.max_services * 2 * self.m * MAGLEV_STRIDE
            size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
            try:
                self._mm = mmap.mmap(self._maglev_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as e:
                raise MapError(f"{abi.MAP_MAGLEV}: mmap failed: {e.strerror}") from e
        return np.frombuffer(self._mm, dtype=np.uint64)

    def write_table(self, vip_id: int, half: int, backend_ids: np.ndarray) -> None:
        """Writes one Maglev half; the caller flips to it afterwards."""
        words = self._maglev_words()
        base = (vip_id * 2 + half) * self.m
        if self._journal is not None:
            old = words[base : base + self.m].copy()
            self._journal.push(f"{abi.MAP_MAGLEV}: restore", lambda: words.__setitem__(
                slice(base, base + self.m), old))
        words[base : base + self.m] = backend_ids.astype(np.uint64)

    def read_table(self, vip_id: int, half: int) -> np.ndarray:
        words = self._maglev_words()
        base = (vip_id * 2 + half) * self.m
        return (words[base : base + self.m] & 0xFFFFFFFF).astype(np.uint32)

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    # ------------------------------------------------------------ node record

    def node(self) -> dict:
        t = self.t[abi.MAP_NODE]
        v = t[t.Key(0)]
        return {
            "maglev_m": v.maglev_m,
            "max_services": v.max_services,
            "max_backends": v.max_backends,
            "ct_size": v.ct_size,
            "ingress_ifindex": v.ingress_ifindex,
            "xdp_flags": v.xdp_flags,
            "ip_forward_was": v.ip_forward_was - 1 if v.ip_forward_was else None,
            "return_ifindex": [v.return_ifindex[i] for i in range(v.n_return)],
            "return_clsact_added": [bool(v.return_clsact_added >> i & 1) for i in range(v.n_return)],
        }

    def write_node(self, *, maglev_m: int, max_services: int, max_backends: int, ct_size: int,
                   ingress_ifindex: int, xdp_flags: int, ip_forward_was: int | None,
                   return_ifindex: list[int], return_clsact_added: list[bool]) -> None:
        if len(return_ifindex) > abi.MAX_RETURN_IFACES:
            raise MapError(f"{abi.MAP_NODE}: more than {abi.MAX_RETURN_IFACES} backend-facing interfaces")
        t = self.t[abi.MAP_NODE]
        v = t.Leaf()
        v.maglev_m, v.max_services, v.max_backends, v.ct_size = maglev_m, max_services, max_backends, ct_size
        v.ingress_ifindex, v.xdp_flags = ingress_ifindex, xdp_flags
        v.ip_forward_was = 0 if ip_forward_was is None else ip_forward_was + 1
        v.n_return = len(return_ifindex)
        for i, idx in enumerate(return_ifindex):
            v.return_ifindex[i] = idx
        v.return_clsact_added = sum(1 << i for i, added in enumerate(return_clsact_added) if added)
        t[t.Key(0)] = v

    # ------------------------------------------------------------ ids

    def _services_in_maps(self) -> dict[str, int]:
        t = self.t[abi.MAP_SVC_META]
        out = {}
        for i in range(self.max_services):
            v = t[t.Key(i)]
            if v.in_use:
                out[v.name.decode()] = i
        return out

    def _valid_backends(self):
        """(backend id, backend_info, its name) of every valid backend."""
        info, meta = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_BE_META]
        for i in range(self.max_backends):
            b = info[info.Key(i)]
            if b.flags & abi.BE_F_VALID:
                yield i, b, meta[meta.Key(i)].name.decode()

    def _backends_in_maps(self) -> dict[tuple[int, str], int]:
        return {(b.vip_id, name): i for i, b, name in self._valid_backends()}

    def _vip_keys_in_maps(self) -> dict[int, tuple]:
        """vip id -> (key ctypes object, vip_info)."""
        t = self.t[abi.MAP_VIPS]
        return {v.id: (k, v) for k, v in t.items()}

    def _deployed(self) -> desired.Deployed:
        """The ids in the maps, as desired.plan() takes them."""
        vips = {vid: (from_be32(k.addr), from_be16(k.port), PROTO_NAMES.get(k.proto, "?"))
                for vid, (k, _) in self._vip_keys_in_maps().items()}
        services = {name: (vid, vips.get(vid)) for name, vid in self._services_in_maps().items()}
        backends, health = {}, {}
        for i, b, name in self._valid_backends():
            ep = (from_be32(b.addr), from_be16(b.port))
            backends[(b.vip_id, name)] = (i, ep)
            health[ep] = b.health_id
        return desired.Deployed(services, backends, health)

    def _zero_stats(self, name: str, index: int) -> None:
        t = self.t[name]
        t[t.Key(index)] = t.Leaf()  # for per-CPU maps bcc's Leaf is one value per CPU

    # ------------------------------------------------------------ apply

    def apply(self, cfg: Config, oifs: Mapping[IPv4Address, int] | None = None) -> ApplyReport:
        """Makes the maps describe cfg, as one transaction: the ids come from desired.plan()
        (nothing is written when they cannot fit), the writes follow the order of the module
        docstring, and if any write fails every one before it is undone (the maps are byte-
        identical to before) and MapError names the map. oifs: backend address -> the
        interface its heartbeats must arrive on."""
        oifs = oifs or {}
        saved_t, saved_ids = self.t, self._ids
        journal = Journal(saved_t)
        self.t, self._journal = journal.tables, journal
        try:
            p = desired.plan(self._deployed(), cfg, self.max_services, self.max_backends)
            report = ApplyReport(
                added_services=list(p.new_services), removed_services=sorted(p.removed_services),
                updated_services=[s.name for s in cfg.services if s.name not in p.new_services],
                added_backends=[f"{s}/{b}" for s, b in p.new_backends],
                removed_backends=sorted(name for _, name in p.removed_backends),
                renamed_services=[f"{a}->{b}" for a, b in sorted(p.renamed_services.items())])
            if p.recycled:  # an id this change frees is needed: free it first, in the safe order
                first = desired.kept_part(self._deployed(), cfg, p)
                self._write(first, desired.plan(self._deployed(), first, self.max_services, self.max_backends),
                            oifs)
                p = desired.plan(self._deployed(), cfg, self.max_services, self.max_backends)
            self._write(cfg, p, oifs)
        except Exception as e:  # bcc raises bare Exception
            failed = journal.rollback()
            self._ids = saved_ids
            what = str(e).splitlines()[0] if str(e) else type(e).__name__
            if not isinstance(e, MapError):
                what = f"{journal.table}: {what}; the maps were restored"
            if failed:
                what += f" (and undo failed: {failed[0]})"
            raise MapError(what) from e
        finally:
            self.t, self._journal = saved_t, None
            journal.forget()  # its views of the mmap must not outlive it (close() refuses)
        self._ids = p.ids(cfg)
        return report

    def _write(self, cfg: Config, p: desired.Plan, oifs: Mapping[IPv4Address, int]) -> None:
        """Writes cfg with plan p's ids, in an order that never shows a packet a half state."""
        old_vips = self._vip_keys_in_maps()
        old_bes = self._deployed().backends
        # 0. new ids start clean; a backend that moved loses its cached next hop
        for name in p.new_services:
            self._zero_stats(abi.MAP_VIP_STATS, p.svc_ids[name])
        for key in p.new_backends:
            bid = p.be_ids[key]
            self._zero_stats(abi.MAP_BE_STATS, bid)
            self._zero_stats(abi.MAP_NEXTHOP, bid)
            probe = self.t[abi.MAP_BE_PROBE]
            v = probe.Leaf()
            v.waiting = v.running = v.kv_permille = abi.UNKNOWN
            probe[probe.Key(bid)] = v
        for bid in p.moved_backends:
            self._zero_stats(abi.MAP_NEXTHOP, bid)
        for hid in p.new_health:
            t = self.t[abi.MAP_HEALTH]
            t[t.Key(hid)] = t.Leaf()  # down until it proves itself

        # 1. a removed service's VIP stops answering first: its address or backends may be
        #    someone else's below
        vips = self.t[abi.MAP_VIPS]
        for name, vid in p.removed_services.items():
            if vid in old_vips:
                del vips[old_vips.pop(vid)[0]]

        # An endpoint whose replies change owner (another backend id) is "claimed": the
        # backends on either side of it wait until the tables stop naming them (3.)
        rnat_t = self.t[abi.MAP_RNAT]
        rnat = {(k.addr, k.port, k.proto): v.backend_id for k, v in rnat_t.items()}
        old_ep = {bid: (be32(ep[0]), be16(ep[1])) for bid, ep in old_bes.values()}

        def ep_of(s, b):
            return (be32(b.address), be16(b.port), PROTOS[s.protocol])

        claimed = {ep_of(s, b) for s in cfg.services for b in s.backends
                   if ep_of(s, b) in rnat and rnat[ep_of(s, b)] != p.be_ids[(s.name, b.name)]}
        old_owners = {rnat[ep] for ep in claimed}

        def waits(s, b) -> bool:
            bid = p.be_ids[(s.name, b.name)]
            return ep_of(s, b) in claimed or (bid in old_ep and (*old_ep[bid], PROTOS[s.protocol]) in claimed)

        # 2. addresses, names, backends, heartbeats and new endpoints' reverse NAT, before
        #    any table names them
        self._write_vip_addrs(cfg)
        self._write_reverse_nat(cfg, p, only_new=True)
        for s in cfg.services:
            vid = p.svc_ids[s.name]
            self._write_service_meta(vid, s.name)
            for b in s.backends:
                if not waits(s, b):
                    self._write_backend(p.be_ids[(s.name, b.name)], vid, b, p.health_ids[(b.address, b.port)])
        self._write_heartbeats(cfg, p.health_ids, oifs)

        # 3. services naming a backend on a claimed endpoint stop naming it
        for s in cfg.services:
            vid = p.svc_ids[s.name]
            names_old_owner = any(bid in old_owners for (v, _), (bid, _) in old_bes.items() if v == vid)
            if vid not in old_vips or not (names_old_owner or any(waits(s, b) for b in s.backends)):
                continue
            k = old_vips[vid][0]  # on the VIP it has now; a move comes with the last flip
            if bytes(k) not in {bytes(x) for x in vips.keys()}:  # moving, and gone to make room
                continue
            interim = replace(s, vip=from_be32(k.addr), port=from_be16(k.port), protocol=PROTO_NAMES[k.proto],
                              backends=tuple(b for b in s.backends if not waits(s, b)))
            self._flip(interim, vid, p, old_vips)

        # 4. reverse NAT changes owner, the waiting backends are written, then every service's
        #    list and table, and the flip
        self._write_reverse_nat(cfg, p)
        for s in cfg.services:
            for b in s.backends:
                if waits(s, b):
                    self._write_backend(p.be_ids[(s.name, b.name)], p.svc_ids[s.name], b,
                                        p.health_ids[(b.address, b.port)])
        for s in cfg.services:
            probe = self.t[abi.MAP_BE_PROBE]
            for b in s.backends:
                bid = p.be_ids[(s.name, b.name)]
                v = probe[probe.Key(bid)]
                if v.config_weight != b.weight:
                    v.config_weight = b.weight
                    probe[probe.Key(bid)] = v
        want_keys = {bytes(self._vip_key(s)) for s in cfg.services}
        self._make_room(abi.MAP_VIPS, want_keys)
        for s in cfg.services:
            self._flip(s, p.svc_ids[s.name], p, old_vips)

        # 5. what the config no longer has, now that nothing names it
        for name, vid in p.removed_services.items():
            self._write_service_meta(vid, None)
            t = self.t[abi.MAP_SVC_CFG]
            t[t.Key(vid)] = t.Leaf()
        for bid in p.removed_backends.values():
            self._clear_backend(bid)
        self._drop_unwanted(abi.MAP_RNAT, self._rnat_keys(cfg))
        self._drop_unwanted(abi.MAP_HB, self._hb_wanted)
        self._drop_unwanted(abi.MAP_HB_PORTS, self._hb_ports_wanted)
        self._drop_unwanted(abi.MAP_VIP_ADDRS, {bytes(self.t[abi.MAP_VIP_ADDRS].Key(be32(s.vip)))
                                                for s in cfg.services})

    def _flip(self, s: Service, vid: int, p: desired.Plan, old_vips: dict) -> None:
        """Service s's backend list and Maglev table (inactive half), then one VIP update."""
        ids = [p.be_ids[(s.name, b.name)] for b in s.backends]
        self._write_service_cfg(vid, s, ids)
        old = old_vips.get(vid)
        half = 1 - old[1].table if old else 0
        slots = self._write_service_table(vid, half, s, ids)
        for bid, n in zip(ids, slots):
            self._set_slots(bid, n)
        self._write_vip(s, vid, half, old)
        k = self._vip_key(s)
        old_vips[vid] = (k, self.t[abi.MAP_VIPS][k])

    def _make_room(self, name: str, wanted: set[bytes]) -> None:
        """At capacity, a hash map's entries that are going away go before new ones come in
        (the kernel refuses a key into a full map)."""
        t = self.t[name]
        present = {bytes(k): k for k in t.keys()}
        if len(present) + len(wanted - set(present)) > self._capacity(name):
            for raw, k in present.items():
                if raw not in wanted:
                    del t[k]

    def _capacity(self, name: str) -> int:
        """max_entries of a hash map as pinned (bpf/include/maps.h sizes them by these two)."""
        by_services = (abi.MAP_VIPS, abi.MAP_VIP_ADDRS, abi.MAP_HB_PORTS)
        return self.max_services if name in by_services else self.max_backends

    def _drop_unwanted(self, name: str, wanted: set[bytes]) -> None:
        t = self.t[name]
        for k in list(t.keys()):
            if bytes(k) not in wanted:
                del t[k]

    # ------------------------------------------------------------ weights

    def ids(self, service: str) -> tuple[int, dict[str, int]]:
        """(VIP id, backend name -> backend id) of a deployed service."""
        if self._ids is None:
            names = {vid: name for name, vid in self._services_in_maps().items()}
            self._ids = {name: (vid, {}) for vid, name in names.items()}
            for (vid, bname), bid in self._backends_in_maps().items():
                if vid in names:
                    self._ids[names[vid]][1][bname] = bid
        if service not in self._ids:
            raise MapError(f"service {service!r} is not deployed")
        return self._ids[service]

    def weights(self, service: str) -> dict[str, int]:
        """Backend name -> the weight its slots in the active table were built with."""
        _, bids = self.ids(service)
        meta = self.t[abi.MAP_BE_META]
        return {name: meta[meta.Key(bid)].weight for name, bid in bids.items()}

    def set_weights(self, s: Service, weights: Mapping[str, int]) -> dict[str, int]:
        """Rebuilds service s's Maglev table with these weights (backend name ->
        0..65535; absent names keep their configured weight) into the inactive
        half and flips to it. Established flows keep their backends: conntrack
        names backends, not slots. Returns the slots each backend got."""
        vid, bids = self.ids(s.name)
        backends = tuple(replace(b, weight=int(weights.get(b.name, b.weight))) for b in s.backends)
        s = replace(s, backends=backends)
        ids = [bids[b.name] for b in backends]
        vips = self.t[abi.MAP_VIPS]
        key = vips.Key()
        key.addr, key.port, key.proto = be32(s.vip), be16(s.port), PROTOS[s.protocol]
        try:
            old = vips[key]
        except KeyError:
            raise MapError(f"service {s.name!r} has no VIP entry {s.vip}:{s.port}/{s.protocol}") from None
        info = self.t[abi.MAP_BACKENDS]
        # a backend going to 0 stops getting new flows before the flip ...
        for b, bid in zip(backends, ids):
            if b.weight == 0:
                self._set_draining(info, bid, True)
        half = 1 - old.table
        slots = self._write_service_table(vid, half, s, ids)
        self._write_vip(s, vid, half, (key, old))
        # ... and one coming back from 0 is in the fallback scan again after it
        for b, bid in zip(backends, ids):
            if b.weight != 0:
                self._set_draining(info, bid, False)
        meta = self.t[abi.MAP_BE_META]
        for b, bid, n in zip(backends, ids, slots):
            m = meta[meta.Key(bid)]
            m.weight, m.slots = b.weight, n
            meta[meta.Key(bid)] = m
        return {b.name: n for b, n in zip(backends, slots)}

    @staticmethod
    def _set_draining(info, bid: int, draining: bool) -> None:
        v = info[info.Key(bid)]
        flags = (v.flags | abi.BE_F_DRAINING) if draining else (v.flags & ~abi.BE_F_DRAINING)
        if flags != v.flags:
            v.flags = flags
            info[info.Key(bid)] = v

    def leaving(self, s: Service) -> list[tuple[Backend, int]]:
        """Backends of service s that a reload removed and that are still draining out
        (edge_be_probe says so), with the CLOCK_MONOTONIC second their drain ends: what a
        restarted edged must keep in the tables although its config no longer has them."""
        try:
            _, bids = self.ids(s.name)
        except MapError:
            return []
        info, hb = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_HB]
        hb_port = be16(s.health.heartbeat.port) if s.health and s.health.heartbeat else None
        out = []
        for name, bid in sorted(bids.items()):
            p = self.read_probe(bid)
            if not p["flags"] & abi.PROBE_F_LEAVING:
                continue
            b = info[info.Key(bid)]
            token = None
            if hb_port is not None:
                k = hb.Key()
                k.addr, k.port, k.hb_port = b.addr, b.port, hb_port
                try:
                    token = hb[k].token
                except KeyError:
                    token = None
            backend = Backend(name=name, address=from_be32(b.addr), port=from_be16(b.port), weight=0,
                              token=token)
            out.append((backend, p["leave_until_s"]))
        return out

    # ------------------------------------------------------------ probe state

    def write_probe(self, bid: int, **values) -> None:
        """Sets fields of backend bid's edge_be_probe entry (C names of struct
        backend_probe); strings are cut to fit, None load signals are UNKNOWN."""
        t = self.t[abi.MAP_BE_PROBE]
        v = t[t.Key(bid)]
        for name, value in values.items():
            if name in PROBE_TEXT:
                value = value.encode()[: PROBE_TEXT[name] - 1]
            elif value is None:
                value = abi.UNKNOWN
            setattr(v, name, value)
        t[t.Key(bid)] = v

    def write_status(self, bid: int, status: ProbeStatus) -> None:
        """Backend bid's whole edge_be_probe record, from status."""
        t = self.t[abi.MAP_BE_PROBE]
        v = t.Leaf()
        for name, value in pack_probe(status).items():
            setattr(v, name, value)
        t[t.Key(bid)] = v

    def _probe_fields(self, bid: int) -> dict:
        t = self.t[abi.MAP_BE_PROBE]
        v = t[t.Key(bid)]
        return {name: getattr(v, name) for name, _ in t.Leaf._fields_ if not name.startswith("pad")}

    def read_status(self, bid: int) -> ProbeStatus:
        """Backend bid's edge_be_probe record in plain units."""
        return unpack_probe(self._probe_fields(bid))

    def read_probe(self, bid: int) -> dict:
        """Backend bid's edge_be_probe record as `status --json` shows it: C names, text
        decoded, unknown load signals None."""
        out = self._probe_fields(bid)
        for name in PROBE_TEXT:
            out[name] = out[name].decode(errors="replace")
        for name in ("waiting", "running", "kv_permille"):
            if out[name] == abi.UNKNOWN:
                out[name] = None
        return out

    def _write_service_meta(self, vid: int, name: str | None) -> None:
        t = self.t[abi.MAP_SVC_META]
        v = t.Leaf()
        if name is not None:
            v.name = _name_bytes(name)
            v.in_use = 1
        t[t.Key(vid)] = v

    def _write_service_cfg(self, vid: int, s: Service, ids: list[int]) -> None:
        t = self.t[abi.MAP_SVC_CFG]
        v = t.Leaf()
        health = s.health
        if health and health.heartbeat:
            v.flags |= abi.SVC_F_HEARTBEAT
            v.hb_timeout_ns = health.heartbeat.timeout_ms * 1_000_000
            v.rise = health.heartbeat.rise
        if health and health.passive:
            p = health.passive
            v.flags |= abi.SVC_F_PASSIVE
            v.syn_timeout_ns = p.syn_timeout_ms * 1_000_000
            v.ejection_ns = p.ejection_ms * 1_000_000
            v.consecutive = p.consecutive
            v.max_ejected_pct = p.max_ejected_percent
        if health:  # fewer usable than panic_percent of the primaries: usable < ceil(pct * n / 100)
            v.panic_below = (health.panic_percent * sum(not b.standby for b in s.backends) + 99) // 100
        ordered = [bid for b, bid in zip(s.backends, ids) if not b.standby]
        ordered += [bid for b, bid in zip(s.backends, ids) if b.standby]
        if len(ordered) > abi.MAX_PER_SERVICE:
            raise MapError(f"{s.name}: more than {abi.MAX_PER_SERVICE} backends in one service")
        v.n_backends = len(ordered)
        for i, bid in enumerate(ordered):
            v.backends[i] = bid
        t[t.Key(vid)] = v

    def _write_heartbeats(self, cfg: Config, health_ids: dict, oifs: Mapping[IPv4Address, int]) -> None:
        """edge_hb and edge_hb_ports for every service that uses heartbeats (added and
        changed entries; apply() drops the rest once nothing needs them)."""
        hb, ports = self.t[abi.MAP_HB], self.t[abi.MAP_HB_PORTS]
        want: dict[bytes, object] = {}
        want_ports: dict[bytes, object] = {}
        for s in cfg.services:
            if not (s.health and s.health.heartbeat):
                continue
            h = s.health.heartbeat
            pk = ports.Key(be16(h.port))
            want_ports[bytes(pk)] = pk
            for b in s.backends:
                k = hb.Key()
                k.addr, k.port, k.hb_port = be32(b.address), be16(b.port), be16(h.port)
                v = want.get(bytes(k), (k, None))[1]
                timeout_ns = h.timeout_ms * 1_000_000
                if v is None:
                    v = hb.Leaf()
                    v.timeout_ns = timeout_ns
                v.token = b.token or 0
                v.health_id = health_ids[(b.address, b.port)]
                v.ifindex = oifs.get(b.address, 0)
                v.timeout_ns = min(v.timeout_ns, timeout_ns)  # shared by services: the strictest
                want[bytes(k)] = (k, v)
        self._hb_wanted, self._hb_ports_wanted = set(want), set(want_ports)
        self._make_room(abi.MAP_HB, set(want))
        for k, v in want.values():
            self._put_changed(hb, k, v)
        self._make_room(abi.MAP_HB_PORTS, set(want_ports))
        for k in want_ports.values():
            self._put_changed(ports, k, ports.Leaf(1))

    @staticmethod
    def _put_changed(t, k, v) -> None:
        """One write, only when the entry differs: an apply that changes nothing writes nothing."""
        try:
            if bytes(t[k]) == bytes(v):
                return
        except KeyError:
            pass
        t[k] = v

    def _rnat_keys(self, cfg: Config) -> set[bytes]:
        t = self.t[abi.MAP_RNAT]
        out = set()
        for s in cfg.services:
            for b in s.backends:
                k = t.Key()
                k.addr, k.port, k.proto = be32(b.address), be16(b.port), PROTOS[s.protocol]
                out.add(bytes(k))
        return out

    def _write_reverse_nat(self, cfg: Config, p: desired.Plan, only_new: bool = False) -> None:
        """edge_rnat: each backend endpoint -> the VIP its replies come from (only_new: the
        endpoints that have no entry yet)."""
        t = self.t[abi.MAP_RNAT]
        self._make_room(abi.MAP_RNAT, self._rnat_keys(cfg))
        present = {bytes(k) for k in t.keys()} if only_new else set()
        for s in cfg.services:
            vid = p.svc_ids[s.name]
            for b in s.backends:
                k = t.Key()
                k.addr, k.port, k.proto = be32(b.address), be16(b.port), PROTOS[s.protocol]
                v = t.Leaf()
                v.vip_addr, v.vip_port = be32(s.vip), be16(s.port)
                v.backend_id, v.vip_id = p.be_ids[(s.name, b.name)], vid
                if bytes(k) not in present:
                    self._put_changed(t, k, v)

    def _write_backend(self, bid: int, vid: int, b, health_id: int) -> None:
        info, meta = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_BE_META]
        flags = abi.BE_F_VALID | abi.BE_F_UP
        if b.standby:
            flags |= abi.BE_F_STANDBY
        if b.weight == 0:
            flags |= abi.BE_F_DRAINING
        v = info.Leaf()
        v.addr, v.port, v.flags, v.vip_id = be32(b.address), be16(b.port), flags, vid
        v.health_id = health_id
        info[info.Key(bid)] = v
        old = meta[meta.Key(bid)]
        m = meta.Leaf()
        m.name, m.weight, m.slots = _name_bytes(b.name), b.weight, old.slots
        meta[meta.Key(bid)] = m

    def _set_slots(self, bid: int, slots: int) -> None:
        meta = self.t[abi.MAP_BE_META]
        m = meta[meta.Key(bid)]
        m.slots = slots
        meta[meta.Key(bid)] = m

    def _clear_backend(self, bid: int) -> None:
        for name in (abi.MAP_BACKENDS, abi.MAP_BE_META, abi.MAP_BE_PROBE):
            t = self.t[name]
            t[t.Key(bid)] = t.Leaf()

    def _write_service_table(self, vid: int, half: int, s: Service, ids: list[int]) -> list[int]:
        """Builds and writes the VIP's table of primaries (standbys are found
        by the data path's fallback scan); returns slots per backend."""
        primaries = [b for b in s.backends if not b.standby]
        names = [b.name for b in primaries]
        weights = [b.weight for b in primaries]
        positions = maglev.build_table(names, weights, self.m)
        by_name = {b.name: bid for b, bid in zip(s.backends, ids)}
        lut = np.array([by_name[n] for n in names] + [abi.NO_BACKEND], dtype=np.uint32)
        table = lut[positions]  # position -1 picks the NO_BACKEND entry
        self.write_table(vid, half, table)
        counts = np.bincount(positions[positions >= 0], minlength=len(names))
        per_name = dict(zip(names, counts.tolist()))
        return [per_name.get(b.name, 0) for b in s.backends]

    def _vip_key(self, s: Service):
        k = self.t[abi.MAP_VIPS].Key()
        k.addr, k.port, k.proto = be32(s.vip), be16(s.port), PROTOS[s.protocol]
        return k

    def _write_vip(self, s: Service, vid: int, half: int, old) -> None:
        t = self.t[abi.MAP_VIPS]
        k = self._vip_key(s)
        v = t.Leaf()
        v.id, v.table = vid, half
        v.flags = abi.VIP_F_KEEP_FLOWS if s.existing_flows == "keep" else 0
        t[k] = v  # one hash update: the flip
        if old and bytes(old[0]) != bytes(k):  # the service moved to a new VIP
            try:
                if t[old[0]].id == vid:  # not taken over by another service meanwhile
                    del t[old[0]]
            except KeyError:  # made room for the new one already
                pass

    def _write_vip_addrs(self, cfg: Config) -> None:
        """How many VIPs each address carries (added and changed; apply() drops the rest last)."""
        t = self.t[abi.MAP_VIP_ADDRS]
        want: dict[int, int] = {}
        for s in cfg.services:
            want[be32(s.vip)] = want.get(be32(s.vip), 0) + 1
        present = {k.value for k in t.keys()}
        if len(present | set(want)) > self._capacity(abi.MAP_VIP_ADDRS):  # full: VIPs moving off an address go first
            vips = self.t[abi.MAP_VIPS]
            for k in list(vips.keys()):
                if k.addr not in want:
                    del vips[k]
        self._make_room(abi.MAP_VIP_ADDRS, {bytes(t.Key(a)) for a in want})
        for addr, n in want.items():
            self._put_changed(t, t.Key(addr), t.Leaf(n))

    # ------------------------------------------------------------ reading

    def _health(self, b, sc, now: int) -> dict:
        """What the data path thinks of a backend right now, and why. The state re-states
        health.h's backend_usable() to name the reason: "up" exactly when it would take new
        flows (tests/test_health_rule.py runs the C rule against this one)."""
        h = self.t[abi.MAP_HEALTH][self.t[abi.MAP_HEALTH].Key(b.health_id)]
        hb_on, passive_on = bool(sc.flags & abi.SVC_F_HEARTBEAT), bool(sc.flags & abi.SVC_F_PASSIVE)
        age_s = (now - h.last_seen_ns) / 1e9 if h.last_seen_ns else None
        # an ejection left from before passive detection was turned off counts no more
        ejected = (hb_on or passive_on) and h.ejected_until_ns > now
        state = "up"
        if b.flags & (abi.BE_F_VALID | abi.BE_F_UP) != abi.BE_F_VALID | abi.BE_F_UP:
            state = "admin-down"
        elif ejected:
            state = "ejected"
        elif hb_on and h.last_seen_ns + sc.hb_timeout_ns < now:  # as the C compares: no "now - stamp"
            state = "down"
        elif hb_on and h.rise_count < sc.rise:
            state = "rising"
        return {
            "state": state,
            "usable": state == "up",
            "heartbeat": hb_on,
            "heartbeat_age_s": age_s if hb_on else None,
            "rise_count": h.rise_count,
            "heartbeat_seq": h.hb_seq,
            "passive": passive_on,
            "ejected_for_s": (h.ejected_until_ns - now) / 1e9 if ejected else 0.0,
            "ejections": h.ejections,
            "syn_outstanding": h.syn_outstanding,
        }

    def _sum_percpu(self, name: str, index: int) -> dict[str, int]:
        t = self.t[name]
        per_cpu = t.getvalue(t.Key(index))
        fields = [f for f, _ in t.sLeaf._fields_ if not f.startswith("pad")]
        return {f: sum(getattr(v, f) for v in per_cpu) for f in fields}

    def backend_stats(self, bid: int) -> dict[str, int]:
        """Traffic counters of one backend, summed over CPUs."""
        return self._sum_percpu(abi.MAP_BE_STATS, bid)

    def usable(self, service: str) -> dict[str, bool]:
        """Backend name -> whether the data path gives it new flows now (up, not draining)."""
        _, bids = self.ids(service)
        info, cfgs = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_SVC_CFG]
        now = time.monotonic_ns()
        out = {}
        for name, bid in bids.items():
            b = info[info.Key(bid)]
            out[name] = (bool(b.flags & abi.BE_F_VALID) and not b.flags & abi.BE_F_DRAINING
                         and self._health(b, cfgs[cfgs.Key(b.vip_id)], now)["usable"])
        return out

    def _sum_counter(self, name: str, index: int) -> int:
        t = self.t[name]
        return sum(int(v) for v in t.getvalue(t.Key(index)))

    def counters(self) -> dict[str, dict[str, int]]:
        """{"verdicts": {name: n}, "drops": {name: n}}, summed over CPUs."""
        return {"verdicts": {n: self._sum_counter(abi.MAP_VERDICTS, i) for i, n in abi.CNT_NAMES.items()},
                "drops": {n: self._sum_counter(abi.MAP_DROPS, i) for i, n in abi.DROP_NAMES.items()}}

    def snapshot(self, count_conntrack: bool = False, deadline_ns: int | None = None) -> dict:
        """Everything status shows, as plain data. Counting conntrack entries
        walks the whole table (seconds when it is full), so it is asked for; past
        deadline_ns (CLOCK_MONOTONIC) the count stops: conntrack_entries is None and
        conntrack_partial the entries counted before."""
        node = self.node()
        vips = self._vip_keys_in_maps()
        svc_names = self._services_in_maps()
        info, meta = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_BE_META]
        cfgs = self.t[abi.MAP_SVC_CFG]
        now = time.monotonic_ns()  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
        backends_by_vip: dict[int, list] = {}
        for bid in range(self.max_backends):
            b = info[info.Key(bid)]
            if not b.flags & abi.BE_F_VALID:
                continue
            m = meta[meta.Key(bid)]
            health = self._health(b, cfgs[cfgs.Key(b.vip_id)], now)
            backends_by_vip.setdefault(b.vip_id, []).append({
                "id": bid,
                "name": m.name.decode(),
                "address": str(from_be32(b.addr)),
                "port": from_be16(b.port),
                "weight": m.weight,
                "standby": bool(b.flags & abi.BE_F_STANDBY),
                "state": "draining" if b.flags & abi.BE_F_DRAINING and health["usable"] else health["state"],
                "health": health,
                "slots": m.slots,
                "probe": self.read_probe(bid),
                **self._sum_percpu(abi.MAP_BE_STATS, bid),
            })
        services = []
        for name, vid in sorted(svc_names.items(), key=lambda kv: kv[1]):
            key, v = vips.get(vid, (None, None))
            services.append({
                "name": name,
                "id": vid,
                "vip": str(from_be32(key.addr)) if key else None,
                "port": from_be16(key.port) if key else None,
                "protocol": PROTO_NAMES.get(key.proto, "?") if key else None,
                "table": v.table if v else None,
                "existing_flows": "keep" if v and v.flags & abi.VIP_F_KEEP_FLOWS else "reselect",
                **self._sum_percpu(abi.MAP_VIP_STATS, vid),
                "backends": backends_by_vip.get(vid, []),
            })
        out = {
            "node": node,
            "services": services,
            **self.counters(),
            "conntrack_entries": None,
        }
        if count_conntrack:
            n, complete = count_entries(self.t[abi.MAP_CT].keys(), deadline_ns)
            out["conntrack_entries"] = n if complete else None
            if not complete:
                out["conntrack_partial"] = n
        return out

