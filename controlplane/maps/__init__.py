"""The maps package is the only code that knows map layouts. This module:
the Maps class (handles, the node record, Maglev tables through mmap, weights,
drains), mixing in writer.py (the apply transaction) and reader.py (health,
counters, status). In short: it writes services, backends and
Maglev tables into the pinned maps and reads them back for status. Field
names are the C names of bpf/include/abi.h through bcc's generated types.
Applying a config is a transaction: ids planned by desired.py, writes ordered
so that no packet sees a half-made state, every write journaled and undone if
a later one fails (docs/design-decisions.md)."""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import replace
from typing import Mapping

import numpy as np

from controlplane import abi, desired
from controlplane.config import Backend, Service
from controlplane.errors import MapError
from controlplane.maps.journal import Journal
from controlplane.maps.opencounts import OpenCounts
from controlplane.maps.reader import Reader
from controlplane.maps.records import (  # noqa: F401  (re-exported)
    _U32_MAX_VALUE,
    MAGLEV_STRIDE,
    PROBE_TEXT,
    PROTO_NAMES,
    PROTOS,
    ProbeStatus,
    WireStats,
    _name_bytes,
    addr_of,
    be16,
    be32,
    count_entries,
    counts_from_dump,
    from_be16,
    from_be32,
    next_rnat_gen,
    pack_probe,
    slot_counts,
    unpack_probe,
    values_from_dump,
)
from controlplane.maps.writer import ApplyReport, Writer  # noqa: F401  (re-exported)


def token_of_key(key) -> int | None:
    """The config token whose key (abi.hb_key) edge_hb holds as (k0, k1); None for no key."""
    raw = int(key[0]).to_bytes(8, "little") + int(key[1]).to_bytes(8, "little")
    return int.from_bytes(raw, "big") or None


class Maps(Writer, Reader, OpenCounts):
    """Typed access to one instance's maps (the handles loader returns)."""

    def __init__(
        self,
        tables: Mapping[str, object],
        maglev_fd: int,
        maglev_m: int,
        max_services: int,
        max_backends: int | None = None,
    ):
        """max_backends: the pinned maps' (node record); default: as the tables were compiled."""
        self.t = tables  # apply() swaps in journaled views while it runs
        self._untracked = tables  # writes not to be undone (rnat_changed)
        self.m = maglev_m
        self.max_services = max_services
        self.max_backends = max_backends or len(tables[abi.MAP_BACKENDS])
        self._maglev_fd = maglev_fd
        self._mm: mmap.mmap | None = None
        self._ids: dict[str, tuple[int, dict[str, int]]] | None = None  # set by apply(), else read once
        self._journal: Journal | None = None  # while apply() runs
        # what apply() wrote last (config, heartbeat interfaces; plan), and the services whose
        # tables set_weights wrote since: the weights-only apply starts from these (changed.py)
        self._last: tuple | None = None
        self._last_plan: desired.Plan | None = None
        self._dirty: set[str] = set()
        self._steered: dict[str, dict[str, int] | None] = {}  # service -> the weights set_weights built it with

    @classmethod
    def sized_by_node(cls, tables: Mapping[str, object], maglev_fd: int, maglev_m: int, max_services: int) -> "Maps":
        """Maps over tables sized by their node record when it has one (an instance deployed
        with other sizes), else by maglev_m and max_services."""
        t = tables[abi.MAP_NODE]
        v = t[t.Key(0)]
        return cls(tables, maglev_fd, v.maglev_m or maglev_m, v.max_services or max_services, v.max_backends or None)

    # ------------------------------------------------------------ maglev mmap

    def _maglev_words(self) -> np.ndarray:
        if self._mm is None:
            size = self.max_services * 2 * self.m * MAGLEV_STRIDE
            size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
            try:
                self._mm = mmap.mmap(self._maglev_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as e:
                raise MapError(f"{abi.MAP_MAGLEV}: mmap failed: {e.strerror}") from e
        return np.frombuffer(self._mm, dtype=np.uint32)

    def write_table(self, vip_id: int, half: int, backend_ids: np.ndarray) -> None:
        """Writes one Maglev half; the caller flips to it afterwards."""
        words = self._maglev_words()
        base = (vip_id * 2 + half) * self.m
        if self._journal is not None:
            old = words[base : base + self.m].copy()
            self._journal.push(f"{abi.MAP_MAGLEV}: restore", lambda: words.__setitem__(slice(base, base + self.m), old))
        words[base : base + self.m] = backend_ids.astype(np.uint32)

    def read_table(self, vip_id: int, half: int) -> np.ndarray:
        words = self._maglev_words()
        base = (vip_id * 2 + half) * self.m
        return words[base : base + self.m].copy()

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
            "answer_ping": not v.flags & abi.NODE_F_NO_ECHO,
        }

    def write_node(
        self,
        *,
        maglev_m: int,
        max_services: int,
        max_backends: int,
        ct_size: int,
        ingress_ifindex: int,
        xdp_flags: int,
        ip_forward_was: int | None,
        return_ifindex: list[int],
        return_clsact_added: list[bool],
        answer_ping: bool = True,
    ) -> None:
        if len(return_ifindex) > abi.MAX_RETURN_IFACES:
            raise MapError(f"{abi.MAP_NODE}: more than {abi.MAX_RETURN_IFACES} backend-facing interfaces")
        t = self.t[abi.MAP_NODE]
        v = t.Leaf()
        # a new reverse-NAT generation (writer.rnat_changed), not the old one: a value read before
        # another writer's change and written back after it would make stale copies current
        v.rnat_gen = next_rnat_gen(t[t.Key(0)].rnat_gen)
        v.maglev_m, v.max_services, v.max_backends, v.ct_size = maglev_m, max_services, max_backends, ct_size
        v.ingress_ifindex, v.xdp_flags = ingress_ifindex, xdp_flags
        v.ip_forward_was = 0 if ip_forward_was is None else ip_forward_was + 1
        v.n_return = len(return_ifindex)
        for i, idx in enumerate(return_ifindex):
            v.return_ifindex[i] = idx
        v.return_clsact_added = sum(1 << i for i, added in enumerate(return_clsact_added) if added)
        v.flags = 0 if answer_ping else abi.NODE_F_NO_ECHO
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
        return {v.id: (k, v) for name in (abi.MAP_VIPS, abi.MAP_VIPS6) for k, v in self.t[name].items()}

    def _deployed(self) -> desired.Deployed:
        """The ids in the maps, as desired.plan() takes them."""
        vips = {
            vid: (addr_of(k.addr), from_be16(k.port), PROTO_NAMES.get(k.proto, "?"))
            for vid, (k, _) in self._vip_keys_in_maps().items()
        }
        services = {name: (vid, vips.get(vid)) for name, vid in self._services_in_maps().items()}
        backends, health = {}, {}
        for i, b, name in self._valid_backends():
            ep = (self._backend_addr(i, b), from_be16(b.port))
            backends[(b.vip_id, name)] = (i, ep)
            health[ep] = b.health_id
        return desired.Deployed(services, backends, health)

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
        """Backend name -> the weight its slots in the active table were built with: known
        without a read when this Maps built that table (the last apply, or set_weights since)."""
        known = self._built_weights(service)
        if known is not None:
            return known
        _, bids = self.ids(service)
        meta = self.t[abi.MAP_BE_META]
        return {name: meta[meta.Key(bid)].weight for name, bid in bids.items()}

    def _built_weights(self, service: str) -> dict[str, int] | None:
        if service in self._steered:  # None: set_weights did not finish, the maps say
            built = self._steered[service]
            return None if built is None else dict(built)
        for s in self._last[0].services if self._last else ():
            if s.name == service:
                return {b.name: b.weight for b in s.backends}
        return None

    def table_digest(self, s: Service) -> str:
        """A digest of service s's active Maglev table, slot by slot, by backend name (ids are
        per node): two nodes with the same digest send a new flow to the same backend."""
        vid, bids = self.ids(s.name)
        key = self._vip_key(s)
        vips = self._vip_table(key)
        try:
            half = vips[key].table
        except KeyError:
            raise MapError(f"service {s.name!r} has no VIP entry {s.vip}:{s.port}/{s.protocol}") from None
        names = {bid: name for name, bid in bids.items()}
        table = self.read_table(vid, half)
        h = hashlib.sha256()
        for name, bid in sorted((names.get(int(b), "-"), int(b)) for b in np.unique(table)):
            h.update(f"{name}:".encode())
            h.update(np.flatnonzero(table == bid).astype(np.uint32).tobytes())
        return h.hexdigest()[:16]

    def set_weights(self, s: Service, weights: Mapping[str, int]) -> dict[str, int]:
        """Rebuilds service s's Maglev table with these weights (backend name ->
        0..65535; absent names keep their configured weight) into the inactive
        half and flips to it. Established flows keep their backends: conntrack
        names backends, not slots. Returns the slots each backend got."""
        vid, bids = self.ids(s.name)
        self._dirty.add(s.name)  # the next apply rewrites it, whatever its config
        self._steered[s.name] = None  # until it is done
        backends = tuple(replace(b, weight=int(weights.get(b.name, b.weight))) for b in s.backends)
        s = replace(s, backends=backends)
        ids = [bids[b.name] for b in backends]
        key = self._vip_key(s)
        vips = self._vip_table(key)
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
        self._steered[s.name] = {b.name: b.weight for b in backends}
        return {b.name: n for b, n in zip(backends, slots)}

    @staticmethod
    def _set_draining(info, bid: int, draining: bool) -> None:
        v = info[info.Key(bid)]
        flags = (v.flags | abi.BE_F_DRAINING) if draining else (v.flags & ~abi.BE_F_DRAINING)
        if flags != v.flags:
            v.flags = flags
            info[info.Key(bid)] = v

    def deployed_backends(self, s: Service) -> list[tuple[Backend, int]]:
        """Every backend of service s in the maps as a Backend (name, endpoint, the weight of
        the active table, standby, heartbeat token), with its edge_be_probe flags (PROBE_F_*):
        what a restarted edged can take for the last known good set of a source that is down.
        [] when s is not deployed."""
        try:
            _, bids = self.ids(s.name)
        except MapError:
            return []
        info, meta = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_BE_META]
        out = []
        for name, bid in sorted(bids.items()):
            b = info[info.Key(bid)]
            backend = Backend(
                name=name,
                address=self._backend_addr(bid, b),
                port=from_be16(b.port),
                weight=int(meta[meta.Key(bid)].weight),
                standby=bool(b.flags & abi.BE_F_STANDBY),
                token=self._hb_token(s, bid, b),
            )
            out.append((backend, int(self.read_probe(bid)["flags"])))
        return out

    def _hb_token(self, s: Service, bid: int, b) -> int | None:
        """The heartbeat token edge_hb holds for backend_info b of service s; None without one."""
        if not (s.health and s.health.heartbeat):
            return None
        name, k = self._hb_key_of(self._backend_addr(bid, b), from_be16(b.port), s.health.heartbeat.port)
        try:
            return token_of_key(self.t[name][k].key)
        except KeyError:
            return None

    def leaving(self, s: Service) -> list[tuple[Backend, int]]:
        """Backends of service s that a reload removed and that are still draining out
        (edge_be_probe says so), with the CLOCK_MONOTONIC second their drain ends: what a
        restarted edged must keep in the tables although its config no longer has them."""
        try:
            _, bids = self.ids(s.name)
        except MapError:
            return []
        info = self.t[abi.MAP_BACKENDS]
        hb_port = s.health.heartbeat.port if s.health and s.health.heartbeat else None
        out = []
        for name, bid in sorted(bids.items()):
            p = self.read_probe(bid)
            if not p["flags"] & abi.PROBE_F_LEAVING:
                continue
            b = info[info.Key(bid)]
            token = None
            if hb_port is not None:
                name, k = self._hb_key_of(self._backend_addr(bid, b), from_be16(b.port), hb_port)
                try:
                    token = token_of_key(self.t[name][k].key)
                except KeyError:
                    token = None
            backend = Backend(
                name=name, address=self._backend_addr(bid, b), port=from_be16(b.port), weight=0, token=token
            )
            out.append((backend, p["leave_until_s"]))
        return out

    # ------------------------------------------------------------ probe state
