"""How maps applies a config: the transaction (ids planned by desired.py,
writes ordered so that no packet sees a half-made state, every write journaled
and undone when a later one fails) and the writers of each map it touches but
the VIP entries (vips.py) and the IPv6 keys (family6.py). Part of the maps
package, the only code that knows map layouts; Maps mixes this in."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address
from typing import Callable, Mapping

import numpy as np

from controlplane import abi, desired, maglev, siphash
from controlplane.config import Backend, Config, Service
from controlplane.errors import MapError
from controlplane.maps.changed import changed_services, member_plan
from controlplane.maps.family6 import Family6
from controlplane.maps.journal import Journal
from controlplane.maps.quick import Quick
from controlplane.maps.records import (
    PROTO_NAMES,
    _name_bytes,
    addr_of,
    be16,
    be32,
    from_be16,
    next_rnat_gen,
    put_addr,
)
from controlplane.maps.vips import Vips


@dataclass
class ApplyReport:
    """What one apply() changed, for the CLI's progress lines."""

    added_services: list[str] = field(default_factory=list)
    removed_services: list[str] = field(default_factory=list)
    updated_services: list[str] = field(default_factory=list)
    added_backends: list[str] = field(default_factory=list)
    removed_backends: list[str] = field(default_factory=list)
    renamed_services: list[str] = field(default_factory=list)


class Writer(Quick, Family6, Vips):
    """The apply transaction and the writers it orders (mixed into Maps)."""

    def _zero_stats(self, name: str, index: int) -> None:
        t = self.t[name]
        t[t.Key(index)] = t.Leaf()  # for per-CPU maps bcc's Leaf is one value per CPU

    # ------------------------------------------------------------ apply

    def apply(self, cfg: Config, oifs: Mapping[IPv4Address, int] | None = None) -> ApplyReport:
        """Makes the maps describe cfg, as one transaction: the ids come from desired.plan()
        (nothing is written when they cannot fit), the writes follow the order of the module
        docstring, and if any write fails every one before it is undone (the maps are byte-
        identical to before) and MapError names the map. oifs: backend address -> the
        interface its heartbeats must arrive on. When cfg differs from the config this Maps
        applied last only in weights or standby flags (changed.py), only the services that
        changed are written: cost follows the change, not the node's size."""
        oifs = dict(oifs or {})
        quick = changed_services(self._last, cfg, oifs, self._dirty)
        members = (
            None
            if quick is not None
            else member_plan(self._last, self._last_plan, cfg, oifs, self._dirty, self.max_backends)
        )
        saved_t, saved_ids = self.t, self._ids
        journal = Journal(  # putting back is a change too
            saved_t, after_undo={abi.MAP_RNAT: self.rnat_changed, abi.MAP_RNAT6: self.rnat_changed}
        )
        self.t, self._journal = journal.tables, journal
        try:
            if quick is not None:
                p = self._last_plan
                self._write_changed(quick, p)
                report = ApplyReport(updated_services=[s.name for s in cfg.services])
            elif members is not None and self._write_members(cfg, *members):
                p = members[1]
                report = ApplyReport(
                    updated_services=[s.name for s in cfg.services],
                    added_backends=[f"{s}/{b}" for s, b in p.new_backends],
                    removed_backends=sorted(name for _, name in p.removed_backends),
                )
            else:
                p, report = self._plan_and_write(cfg, oifs)
        except Exception as e:  # bcc raises bare Exception
            failed = journal.rollback()
            self._ids, self._last, self._steered = saved_ids, None, {}
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
        self._last, self._last_plan, self._dirty, self._steered = (cfg, oifs), p, set(), {}
        return report

    def _plan_and_write(self, cfg: Config, oifs: Mapping[IPv4Address, int]) -> tuple[desired.Plan, ApplyReport]:
        """The full apply: every id planned from what the maps hold, every service written."""
        p = desired.plan(self._deployed(), cfg, self.max_services, self.max_backends)
        report = ApplyReport(
            added_services=list(p.new_services),
            removed_services=sorted(p.removed_services),
            updated_services=[s.name for s in cfg.services if s.name not in p.new_services],
            added_backends=[f"{s}/{b}" for s, b in p.new_backends],
            removed_backends=sorted(name for _, name in p.removed_backends),
            renamed_services=[f"{a}->{b}" for a, b in sorted(p.renamed_services.items())],
        )
        if p.recycled:  # an id this change frees is needed: free it first, in the safe order
            first = desired.kept_part(self._deployed(), cfg, p)
            self._write(first, desired.plan(self._deployed(), first, self.max_services, self.max_backends), oifs)
            p = desired.plan(self._deployed(), cfg, self.max_services, self.max_backends)
        self._write(cfg, p, oifs)
        return p, report

    def _write(self, cfg: Config, p: desired.Plan, oifs: Mapping[IPv4Address, int]) -> None:
        """Writes cfg with plan p's ids, in an order that never shows a packet a half state."""
        old_vips = self._vip_keys_in_maps()
        old_bes = self._deployed().backends
        # 0. new ids start clean; a backend that moved loses its cached next hop
        self._clean_new_ids(p)
        # 1. a removed service's VIP stops answering first: its address or backends may be
        #    someone else's below
        for vid in p.removed_services.values():
            if vid in old_vips:
                self._delete_vip(old_vips.pop(vid)[0])
        waits, old_owners = self._claims(cfg, p, old_bes)
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
        self._unname_claimed(cfg, p, old_vips, old_bes, old_owners, waits)
        # 4. reverse NAT changes owner, the waiting backends are written, then every service's
        #    list and table, and the flip
        self._write_reverse_nat(cfg, p)
        for s in cfg.services:
            for b in s.backends:
                if waits(s, b):
                    self._write_backend(
                        p.be_ids[(s.name, b.name)], p.svc_ids[s.name], b, p.health_ids[(b.address, b.port)]
                    )
        self._write_config_weights(cfg.services, p)
        want_keys = {bytes(self._vip_key(s)) for s in cfg.services}
        self._make_room(abi.MAP_VIPS, want_keys)
        self._make_room(abi.MAP_VIPS6, want_keys)  # keys of either family: their lengths differ
        for s in cfg.services:
            self._flip(s, p.svc_ids[s.name], p, old_vips)
        # 5. what the config no longer has, now that nothing names it
        self._drop_removed(cfg, p)

    def _clean_new_ids(self, p: desired.Plan) -> None:
        """Step 0 of _write: zeroed stats and open counts for new ids, no cached next hop for new or moved
        backends, unknown load for new backends, a down health entry for new endpoints."""
        for name in p.new_services:
            vid = p.svc_ids[name]
            self._zero_stats(abi.MAP_VIP_STATS, vid)
            for i in range(vid * abi.SVC_COUNTERS, (vid + 1) * abi.SVC_COUNTERS):  # a reused id's counts
                self._zero_stats(abi.MAP_SVC_COUNTS, i)
        for key in p.new_backends:
            bid = p.be_ids[key]
            self._zero_stats(abi.MAP_BE_STATS, bid)
            self._zero_stats(abi.MAP_NEXTHOP, bid)
            self._zero_stats(abi.MAP_HOP6, bid)  # IPv6 DSR's way out (encap6.h)
            self._zero_stats(abi.MAP_INFLIGHT, bid)  # an id used before: its count starts over
            third = len(self.t[abi.MAP_INFLIGHT]) // 3  # counts, fixes, least_loaded's scales (maps.h)
            self._zero_stats(abi.MAP_INFLIGHT, bid + third)  # and its fix
            self._zero_stats(abi.MAP_INFLIGHT, bid + 2 * third)  # and its scale, until edged writes one
            probe = self.t[abi.MAP_BE_PROBE]
            v = probe.Leaf()
            v.waiting = v.running = v.kv_permille = abi.UNKNOWN
            probe[probe.Key(bid)] = v
        for bid in p.moved_backends:
            self._zero_stats(abi.MAP_NEXTHOP, bid)
            self._zero_stats(abi.MAP_HOP6, bid)
        for hid in p.new_health:
            t = self.t[abi.MAP_HEALTH]
            t[t.Key(hid)] = t.Leaf()  # down until it proves itself

    def _claims(
        self, cfg: Config, p: desired.Plan, old_bes: Mapping
    ) -> tuple[Callable[[Service, Backend], bool], set[int]]:
        """(waits, old owners). An endpoint whose replies change owner (another backend id) is
        "claimed": the backends on either side of it wait (waits(s, b) is true) until the tables
        stop naming them (step 3 of _write); the old owners are the backend ids it leaves."""
        rnat = {bytes(k): v.backend_id for name in (abi.MAP_RNAT, abi.MAP_RNAT6) for k, v in self.t[name].items()}
        old_ep = {bid: ep for bid, ep in old_bes.values()}

        def ep_of(s, b):
            return bytes(self._rnat_key_of(b.address, b.port, s.protocol))

        claimed = {
            ep_of(s, b)
            for s in cfg.services
            for b in s.backends
            if ep_of(s, b) in rnat and rnat[ep_of(s, b)] != p.be_ids[(s.name, b.name)]
        }
        old_owners = {rnat[ep] for ep in claimed}

        def waits(s, b) -> bool:
            bid = p.be_ids[(s.name, b.name)]
            return ep_of(s, b) in claimed or (
                bid in old_ep and bytes(self._rnat_key_of(*old_ep[bid], s.protocol)) in claimed
            )

        return waits, old_owners

    def _unname_claimed(
        self,
        cfg: Config,
        p: desired.Plan,
        old_vips: dict,
        old_bes: Mapping,
        old_owners: set[int],
        waits: Callable[[Service, Backend], bool],
    ) -> None:
        """Step 3 of _write: each service naming a backend on a claimed endpoint flips, on the VIP
        it has now, to its list without the backends that wait."""
        for s in cfg.services:
            vid = p.svc_ids[s.name]
            names_old_owner = any(bid in old_owners for (v, _), (bid, _) in old_bes.items() if v == vid)
            if vid not in old_vips or not (names_old_owner or any(waits(s, b) for b in s.backends)):
                continue
            k = old_vips[vid][0]  # on the VIP it has now; a move comes with the last flip
            if bytes(k) not in {bytes(x) for x in self._vip_table(k).keys()}:  # moving, and gone to make room
                continue
            interim = replace(
                s,
                vip=addr_of(k.addr),
                port=from_be16(k.port),
                protocol=PROTO_NAMES[k.proto],
                backends=tuple(b for b in s.backends if not waits(s, b)),
            )
            self._flip(interim, vid, p, old_vips)

    def _write_config_weights(self, services: tuple[Service, ...] | list[Service], p: desired.Plan) -> None:
        """Each backend's configured weight into its probe record, where it changed."""
        probe = self.t[abi.MAP_BE_PROBE]
        for s in services:
            for b in s.backends:
                bid = p.be_ids[(s.name, b.name)]
                v = probe[probe.Key(bid)]
                if v.config_weight != b.weight:
                    v.config_weight = b.weight
                    probe[probe.Key(bid)] = v

    def _drop_removed(self, cfg: Config, p: desired.Plan) -> None:
        """Step 5 of _write: what the config no longer has, now that nothing names it."""
        for vid in p.removed_services.values():
            self._write_service_meta(vid, None)
            t = self.t[abi.MAP_SVC_CFG]
            t[t.Key(vid)] = t.Leaf()
        for bid in p.removed_backends.values():
            self._clear_backend(bid)
        dropped = self._drop_unwanted(abi.MAP_RNAT, self._rnat_keys(cfg))
        if self._drop_unwanted(abi.MAP_RNAT6, self._rnat_keys(cfg)) or dropped:
            self.rnat_changed()
        self._drop_unwanted(abi.MAP_HB, self._hb_wanted[abi.MAP_HB])
        self._drop_unwanted(abi.MAP_HB6, self._hb_wanted[abi.MAP_HB6])
        self._drop_unwanted(abi.MAP_HB_PORTS, self._hb_ports_wanted)
        self._drop_unwanted(abi.MAP_VIP_ADDRS, {bytes(self._vip_addr_key(s.vip)) for s in cfg.services})
        self._drop_unwanted(abi.MAP_VIP_ADDRS6, {bytes(self._vip_addr_key(s.vip)) for s in cfg.services})
        self._write_vip_filter({be32(s.vip) for s in cfg.services if s.vip.version == 4})

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
        old_vips[vid] = (k, self._vip_table(k)[k])

    def _make_room(self, name: str, wanted: set[bytes]) -> bool:
        """At capacity, a hash map's entries that are going away go before new ones come in
        (the kernel refuses a key into a full map). True when it had to make room."""
        t = self.t[name]
        present = {bytes(k): k for k in t.keys()}
        if len(present) + len(wanted - set(present)) <= self._capacity(name):
            return False
        for raw, k in present.items():
            if raw not in wanted:
                if name in (abi.MAP_VIPS, abi.MAP_VIPS6):
                    self._delete_vip(k)
                else:
                    del t[k]
        return True

    def _capacity(self, name: str) -> int:
        """max_entries of a hash map as pinned (bpf/include/maps.h sizes them by these two)."""
        by_services = (abi.MAP_VIPS, abi.MAP_VIP_ADDRS, abi.MAP_HB_PORTS, abi.MAP_VIPS6, abi.MAP_VIP_ADDRS6)
        return self.max_services if name in by_services else self.max_backends

    def _drop_unwanted(self, name: str, wanted: set[bytes]) -> bool:
        """Deletes the entries not wanted; True when there were any."""
        t = self.t[name]
        unwanted = [k for k in t.keys() if bytes(k) not in wanted]
        for k in unwanted:
            del t[k]
        return bool(unwanted)

    def rnat_changed(self) -> None:
        """edge_reply uses its per-CPU copy of an edge_rnat or edge_rnat6 entry while
        node_info.rnat_gen is the one it was copied under (bpf/edge_reply.c, rnat_cached;
        bpf/include/reply6.h, rnat6_cached), so after every change of either, before any other
        map is written, rnat_gen takes a value it never had. Not journaled: putting an entry back
        is a change too, so it never goes back."""
        t = self._untracked[abi.MAP_NODE]
        v = t[t.Key(0)]
        v.rnat_gen = next_rnat_gen(v.rnat_gen)
        t[t.Key(0)] = v

    # ------------------------------------------------------------ weights

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
        if health and health.probe:  # a probation waits for a passing probe (maps.readmit): no trial flow
            v.flags |= abi.SVC_F_PROBED
        if s.forwarding == "dsr":
            v.flags |= abi.SVC_F_DSR
        if s.new_flows == "two_choices":
            v.flags |= abi.SVC_F_TWO_CHOICES
        elif s.new_flows == "least_loaded":
            v.flags |= abi.SVC_F_LEAST_LOADED
        if health:  # fewer usable than panic_percent of the primaries: usable < ceil(pct * n / 100)
            v.panic_below = (health.panic_percent * sum(not b.standby for b in s.backends) + 99) // 100
        ordered = [bid for b, bid in zip(s.backends, ids) if not b.standby]
        ordered += [bid for b, bid in zip(s.backends, ids) if b.standby]
        if len(ordered) > abi.MAX_PER_SERVICE:
            raise MapError(f"{s.name}: more than {abi.MAX_PER_SERVICE} backends in one service")
        v.n_backends = len(ordered)
        for i, bid in enumerate(ordered):
            v.backends[i] = bid
        # the VIP key stays what the map has: only _write_vip names one, once the VIP entry is this
        # service's, and _forget_service_vip clears it before the entry goes or changes owner
        cur = t[t.Key(vid)]
        v.vip_addr, v.vip_port, v.vip_proto, v.vip_addr6 = cur.vip_addr, cur.vip_port, cur.vip_proto, cur.vip_addr6
        t[t.Key(vid)] = v

    def _write_heartbeats(self, cfg: Config, health_ids: dict, oifs: Mapping[IPv4Address, int]) -> None:
        """edge_hb (edge_hb6 for IPv6 backends) and edge_hb_ports for every service that uses
        heartbeats (added and changed entries; apply() drops the rest once nothing needs them)."""
        ports = self.t[abi.MAP_HB_PORTS]
        want: dict[str, dict[bytes, tuple]] = {abi.MAP_HB: {}, abi.MAP_HB6: {}}
        want_ports: dict[bytes, object] = {}
        for s in cfg.services:
            if not (s.health and s.health.heartbeat):
                continue
            h = s.health.heartbeat
            pk = ports.Key(be16(h.port))
            want_ports[bytes(pk)] = pk
            for b in s.backends:
                name, k = self._hb_key_of(b.address, b.port, h.port)
                v = want[name].get(bytes(k), (k, None))[1]
                timeout_ns = h.timeout_ms * 1_000_000
                if v is None:
                    v = self.t[name].Leaf()
                    v.timeout_ns = timeout_ns
                v.key[0], v.key[1] = siphash.key_words(abi.hb_key(b.token or 0))
                v.health_id = health_ids[(b.address, b.port)]
                v.ifindex = oifs.get(b.address, 0)
                v.timeout_ns = min(v.timeout_ns, timeout_ns)  # shared by services: the strictest
                want[name][bytes(k)] = (k, v)
        self._hb_wanted = {name: set(entries) for name, entries in want.items()}
        self._hb_ports_wanted = set(want_ports)
        for name, entries in want.items():
            self._make_room(name, set(entries))
            for k, v in entries.values():
                self._put_changed(self.t[name], k, v)
        self._make_room(abi.MAP_HB_PORTS, set(want_ports))
        for k in want_ports.values():
            self._put_changed(ports, k, ports.Leaf(1))

    @staticmethod
    def _put_changed(t, k, v) -> bool:
        """One write, only when the entry differs: an apply that changes nothing writes nothing.
        True when it wrote."""
        try:
            if bytes(t[k]) == bytes(v):
                return False
        except KeyError:
            pass
        t[k] = v
        return True

    def _rnat_keys(self, cfg: Config) -> set[bytes]:
        """The edge_rnat and edge_rnat6 keys of cfg's endpoints (of either family: their lengths differ)."""
        return {bytes(self._rnat_key_of(b.address, b.port, s.protocol)) for s in cfg.services for b in s.backends}

    def _write_reverse_nat(self, cfg: Config, p: desired.Plan, only_new: bool = False) -> None:
        """edge_rnat: each backend endpoint -> the VIP its replies come from (only_new: the
        endpoints that have no entry yet)."""
        changed = self._make_room(abi.MAP_RNAT, self._rnat_keys(cfg))
        changed = self._make_room(abi.MAP_RNAT6, self._rnat_keys(cfg)) or changed
        present = set()
        if only_new:
            present = {bytes(k) for name in (abi.MAP_RNAT, abi.MAP_RNAT6) for k in self.t[name].keys()}
        for s in cfg.services:
            vid = p.svc_ids[s.name]
            for b in s.backends:
                k = self._rnat_key_of(b.address, b.port, s.protocol)
                t = self._rnat_table(k)
                v = t.Leaf()
                put_addr(v, "vip_addr", s.vip)
                v.vip_port = be16(s.port)
                v.backend_id, v.vip_id = p.be_ids[(s.name, b.name)], vid
                if bytes(k) not in present:
                    # edge_reply copies entries of both (edge_reply.c, reply6.h)
                    changed = self._put_changed(t, k, v) or changed
        if changed:
            self.rnat_changed()

    def _write_backend(self, bid: int, vid: int, b, health_id: int) -> None:
        info, meta = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_BE_META]
        flags = abi.BE_F_VALID | abi.BE_F_UP
        if b.standby:
            flags |= abi.BE_F_STANDBY
        if b.weight == 0:
            flags |= abi.BE_F_DRAINING
        v = info.Leaf()
        if b.address.version == 6:  # its address in edge_backends6 (abi.h), before the entry is valid
            t6 = self.t[abi.MAP_BACKENDS6]
            a = t6.Leaf()
            self._put_addr6(a, b.address)
            t6[t6.Key(bid)] = a
        else:
            v.addr = be32(b.address)
        v.port, v.flags, v.vip_id = be16(b.port), flags, vid
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
        for name in (abi.MAP_BACKENDS, abi.MAP_BE_META, abi.MAP_BE_PROBE, abi.MAP_BACKENDS6):
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

    # ------------------------------------------------------------ reading

    def readmit(self, service: str, backend: str) -> bool:
        """Ends a backend's probation on evidence the data path cannot see (a passing probe),
        once its passive ejection is over: new flows may go to it again without a trial flow.
        Returns whether it was on probation. edge_health is the data path's: this rewrites the
        entry it read, so a field the data path stamped in between (a heartbeat's time, a SYN
        count) goes back by that one packet, which the next packet makes good."""
        _, bids = self.ids(service)
        if backend not in bids:
            return False
        info = self.t[abi.MAP_BACKENDS]
        b = info[info.Key(bids[backend])]
        health = self.t[abi.MAP_HEALTH]
        key = health.Key(b.health_id)
        h = health[key]
        if not h.probation or h.ejected_until_ns > time.monotonic_ns():  # CLOCK_MONOTONIC, as the C
            return False
        h.probation, h.trial_ns = 0, 0
        health[key] = h
        return True
