"""How maps reads the data path back: per-backend health as the data path
judges it (tied to health.h by a test), counters, the wire signals (edge_wire),
the edge_be_probe status records, and the snapshot `edgectl status` and the metrics show. Part of the
maps package, the only code that knows map layouts; Maps mixes this in."""

from __future__ import annotations

import copy
import ctypes
import time
from typing import Iterable, Sequence

import numpy as np

from controlplane import abi, wiresignals
from controlplane.maps.records import (
    PROBE_TEXT,
    PROTO_NAMES,
    PROTOS,
    ProbeStatus,
    WireStats,
    addr_of,
    be16,
    count_entries,
    from_be16,
    from_be32,
    is6,
    node_counts,
    pack_probe,
    put_addr,
    shown_state,
    slot_counts,
    unpack_probe,
    wire_columns,
    wire_from_row,
)
from controlplane.maps.rows import Rows

CT_FLAG_NAMES = {
    abi.CT_F_SYN: "syn",
    abi.CT_F_SYN_PENDING: "syn_pending",
    abi.CT_F_OPEN: "open",
    abi.CT_F_HS_WAIT: "hs_wait",
    abi.CT_F_REQ_WAIT: "req_wait",
    abi.CT_F_RESP_WAIT: "resp_wait",
}


def _endpoint(address, port: int) -> str:
    """ADDR:PORT of a conntrack key's address field (a __be32 or a struct addr6) and __be16 port;
    [ADDR]:PORT for IPv6."""
    a = addr_of(address)
    return f"{a}:{from_be16(port)}" if a.version == 4 else f"[{a}]:{from_be16(port)}"


COPY_MAX_BYTES = 16 << 20  # snapshot copies an array whole when it is at most this large
RANGE_READ = 4  # wire_rows reads the range of ids in one batched call when it is at most this many times their number

# The arrays a status walk reads per backend (snapshot): read whole, in batches, before it
_WALKED = (
    abi.MAP_BACKENDS,
    abi.MAP_BACKENDS6,
    abi.MAP_BE_META,
    abi.MAP_SVC_CFG,
    abi.MAP_HEALTH,
    abi.MAP_BE_PROBE,
    abi.MAP_BE_STATS,
    abi.MAP_WIRE,
    abi.MAP_INFLIGHT,
)


class Reader:
    """Readers of health, counters, status records and the snapshot (mixed into Maps)."""

    # ------------------------------------------------------------ the two families (abi.h: IPv6)

    def _vip_key(self, s):
        """Service s's key in edge_vips, or in edge_vips6 for an IPv6 VIP."""
        k = self.t[abi.MAP_VIPS if s.vip.version == 4 else abi.MAP_VIPS6].Key()
        put_addr(k, "addr", s.vip)
        k.port, k.proto = be16(s.port), PROTOS[s.protocol]
        return k

    def _vip_table(self, key):
        """edge_vips or edge_vips6, whichever key is of."""
        return self.t[abi.MAP_VIPS6 if is6(key) else abi.MAP_VIPS]

    def _backend_addr(self, bid: int, b):
        """The address of backend bid, whose edge_backends entry is b: an IPv6 backend's is in
        edge_backends6 (its entry's addr is 0, which no IPv4 backend has)."""
        if b.addr:
            return from_be32(b.addr)
        t = self.t[abi.MAP_BACKENDS6]
        return addr_of(t[t.Key(bid)])

    def write_status(self, bid: int, status: ProbeStatus) -> None:
        """Backend bid's whole edge_be_probe record, from status."""
        t = self.t[abi.MAP_BE_PROBE]
        v = t.Leaf()
        for name, value in pack_probe(status).items():
            setattr(v, name, value)
        t[t.Key(bid)] = v

    def write_statuses(self, records: Sequence[tuple[int, ProbeStatus]]) -> None:
        """Whole edge_be_probe records, (backend id, record) each, in one batched write where the
        table has them (a write each released and took back the interpreter on edged's loop)."""
        t = self.t[abi.MAP_BE_PROBE]
        batched = getattr(t, "update_rows", None)
        if batched is None or len(records) < 2:
            for bid, status in records:
                self.write_status(bid, status)
            return
        values = (t.Leaf * len(records))()
        for v, (_, status) in zip(values, records):
            for name, value in pack_probe(status).items():
                setattr(v, name, value)
        batched([bid for bid, _ in records], values)

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
        elif (hb_on or passive_on) and h.probation:  # after an ejection, until evidence
            state = "probation"
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
            "probation": bool(h.probation),
        }

    def _sum_percpu(self, name: str, index: int) -> dict[str, int]:
        t = self.t[name]
        per_cpu = t.getvalue(t.Key(index))
        fields = [f for f, _ in t.sLeaf._fields_ if not f.startswith("pad")]
        return {f: sum(getattr(v, f) for v in per_cpu) for f in fields}

    def backend_stats(self, bid: int) -> dict[str, int]:
        """Traffic counters of one backend, summed over CPUs."""
        return self._sum_percpu(abi.MAP_BE_STATS, bid)

    def wire_stats(self, bids: Iterable[int] | None = None) -> dict[int, WireStats]:
        """Backend id -> its wire signals, summed over CPUs (cumulative); bids: these ids
        (default: every valid backend)."""
        if bids is None:
            info = self.t[abi.MAP_BACKENDS]
            bids = [i for i in range(self.max_backends) if info[info.Key(i)].flags & abi.BE_F_VALID]
        bids = list(bids)
        return {bid: wire_from_row(r) for bid, r in zip(bids, self.wire_rows(bids))}

    def wire_rows(self, bids: Sequence[int]) -> np.ndarray:
        """The wire signals of backends bids, summed over CPUs (cumulative), as rows of int64
        (controlplane.wiresignals.row), one a backend in the order of bids."""
        t = self.t[abi.MAP_WIRE]
        words = ctypes.sizeof(t.sLeaf) // 8  # all u64: abi.h asserts the size, a test the fields
        if not bids:
            return np.zeros((0, wiresignals.ROW_LEN), np.int64)
        lo, hi = min(bids), max(bids) + 1
        ranged = getattr(t, "rows", None)
        if ranged is not None and len(bids) > 1 and hi - lo <= RANGE_READ * len(bids):
            # a service's ids are mostly together: their range in one batched read (steering reads
            # the wire signals of each service it steps; a lookup each released and took back the
            # interpreter, waiting on a status walk's thread every time: tools/bench-probe --scale)
            span = np.frombuffer(ranged(start=lo, count=hi - lo), np.uint64).reshape(hi - lo, -1)
            raw = span[np.asarray(bids, np.int64) - lo]
        else:
            raw = np.empty((len(bids), ctypes.sizeof(t.Leaf) // 8), np.uint64)  # every CPU's record
            at, stride = raw.ctypes.data, raw.strides[0]
            key, lookup = t.Key, t.lookup_into
            for i, bid in enumerate(bids):
                lookup(key(bid), at + i * stride)
        summed = raw.reshape(len(bids), -1, words).sum(axis=1, dtype=np.uint64)
        return summed[:, wire_columns(t.sLeaf)].astype(np.int64)

    def wire_view(self, bid: int) -> dict:
        """Backend bid's wire signals since the map was made, as status and the metrics show
        them: cumulative buckets and sums (seconds), p50s over all of it, active flows."""
        w = self.wire_stats([bid])[bid]
        return {
            "handshake_buckets": list(w.handshake),
            "first_byte_buckets": list(w.first_byte),
            "handshake_sum_s": w.handshake_ns / 1e9,
            "first_byte_sum_s": w.first_byte_ns / 1e9,
            "handshakes": sum(w.handshake),
            "first_bytes": sum(w.first_byte),
            "handshake_p50_s": wiresignals.quantile(w.handshake, 0.5),
            "first_byte_p50_s": wiresignals.quantile(w.first_byte, 0.5),
            "opened": w.opened,
            "closed": w.closed,
            "active": w.active,
            "open": self.open_count(bid),
        }

    def open_count(self, bid: int) -> int:
        """Backend bid's open TCP connections as the data path counts them for new_flows
        two_choices and least_loaded: its count (one for all CPUs; below 0 after a restart of the
        count) less the fix edged found (maps/opencounts.py)."""
        t = self.t[abi.MAP_INFLIGHT]
        return int(t[t.Key(bid)].value) - int(t[t.Key(bid + len(t) // 3)].value)  # counts, fixes, scales

    def usable(self, service: str) -> dict[str, bool]:
        """Backend name -> whether the data path gives it new flows now (up, not draining)."""
        _, bids = self.ids(service)
        info, cfgs = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_SVC_CFG]
        now = time.monotonic_ns()
        out = {}
        for name, bid in bids.items():
            b = info[info.Key(bid)]
            out[name] = (
                bool(b.flags & abi.BE_F_VALID)
                and not b.flags & abi.BE_F_DRAINING
                and self._health(b, cfgs[cfgs.Key(b.vip_id)], now)["usable"]
            )
        return out

    def counter_values(self) -> list[int]:
        """edge_svc_counts summed over CPUs, by index (records.slot_counts reads a slot of it)."""
        t = self.t[abi.MAP_SVC_COUNTS]
        return [sum(int(v) for v in t.getvalue(t.Key(i))) for i in range(len(t))]

    def counters(self, values: Sequence[int] | None = None) -> dict[str, dict[str, int]]:
        """The node's {"verdicts": {name: n}, "drops": {name: n}}: every service's and those of
        packets no service is known for, summed over CPUs; verdicts as shown
        (records.verdicts_shown: return_nat includes return_xdp)."""
        return node_counts(self.counter_values() if values is None else values)

    def conntrack(
        self, limit: int, vip_id: int | None = None, backend_id: int | None = None, deadline_ns: int | None = None
    ) -> tuple[list[dict], bool]:
        """Up to limit entries of edge_ct, then edge_ct6 (IPv6 connections), of service vip_id and
        backend backend_id when given, as {client, vip, protocol, vip_id, backend_id, flags}
        (IPv6 endpoints as [ADDR]:PORT); complete: whether the walk saw both whole tables (it stops
        at limit matches, or at deadline_ns, CLOCK_MONOTONIC)."""
        out: list[dict] = []
        for name in (abi.MAP_CT, abi.MAP_CT6):
            if not self._walk_ct(self.t[name], out, limit, vip_id, backend_id, deadline_ns):
                return out, False
        return out, True

    @staticmethod
    def _walk_ct(t, out: list[dict], limit: int, vip_id, backend_id, deadline_ns) -> bool:
        """Appends t's matching entries to out; False when it stopped at limit or the deadline."""
        for n, k in enumerate(t, 1):
            if deadline_ns is not None and n % 1024 == 0 and time.monotonic_ns() > deadline_ns:
                return False
            try:
                v = t[k]
            except KeyError:  # gone (LRU or closed) between the key and its value
                continue
            if (vip_id is not None and v.vip_id != vip_id) or (backend_id is not None and v.backend_id != backend_id):
                continue
            if len(out) == limit:
                return False
            out.append(
                {
                    "client": _endpoint(k.src, k.sport),
                    "vip": _endpoint(k.dst, k.dport),
                    "protocol": PROTO_NAMES.get(k.proto, str(k.proto)),
                    "vip_id": v.vip_id,
                    "backend_id": v.backend_id,
                    "flags": [name for bit, name in CT_FLAG_NAMES.items() if v.flags & bit],
                }
            )
        return True

    def snapshot(self, count_conntrack: bool = False, deadline_ns: int | None = None) -> dict:
        """_snapshot over the per-backend arrays read whole first, in batches (maps/rows.py): the
        same walk, one system call per few thousand entries instead of about nine a backend."""
        walk, t = copy.copy(self), self.t  # type: ignore[attr-defined]
        # a per-CPU array on a many-CPU node is read a lookup at a time rather than copied whole
        whole = [n for n in _WALKED if n in t and ctypes.sizeof(t[n].Leaf) * len(t[n]) <= COPY_MAX_BYTES]
        walk.t = {**t, **{n: Rows(t[n]) for n in whole}}
        return walk._snapshot(count_conntrack, deadline_ns)

    def _snapshot(self, count_conntrack: bool = False, deadline_ns: int | None = None) -> dict:
        """Everything status shows, as plain data. Counting conntrack entries
        walks the whole table (seconds when it is full), so it is asked for; past
        deadline_ns (CLOCK_MONOTONIC) the count stops: conntrack_entries is None and
        conntrack_partial the entries counted before. half_open_entries (with a complete count):
        the half-open tables' entries (edge_half_open, edge_half_open6: SYNs whose handshake has not
        completed), not in conntrack_entries: a SYN flood fills them, not conntrack. The walk of the backends stops there too
        (O(max_backends): a second or more at the largest sizes); stopped_early says what each
        walk cut short, one line each."""
        started = time.monotonic_ns()
        stopped: list[str] = []
        node = self.node()
        vips = self._vip_keys_in_maps()
        svc_names = self._services_in_maps()
        info, meta = self.t[abi.MAP_BACKENDS], self.t[abi.MAP_BE_META]
        cfgs = self.t[abi.MAP_SVC_CFG]
        now = time.monotonic_ns()  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
        backends_by_vip: dict[int, list] = {}
        for bid in range(self.max_backends):
            if deadline_ns is not None and bid % 256 == 255 and time.monotonic_ns() > deadline_ns:
                stopped.append(
                    f"backends: read {bid} of {self.max_backends} backend ids in "
                    f"{(time.monotonic_ns() - started) / 1e9:.1f} s; the others are not shown"
                )
                break
            b = info[info.Key(bid)]
            if not b.flags & abi.BE_F_VALID:
                continue
            m = meta[meta.Key(bid)]
            health = self._health(b, cfgs[cfgs.Key(b.vip_id)], now)
            probe = self.read_probe(bid)
            backends_by_vip.setdefault(b.vip_id, []).append(
                {
                    "id": bid,
                    "name": m.name.decode(),
                    "address": str(self._backend_addr(bid, b)),
                    "port": from_be16(b.port),
                    "weight": m.weight,
                    "standby": bool(b.flags & abi.BE_F_STANDBY),
                    "state": shown_state(b.flags, health, probe["state"]),
                    "health": health,
                    "slots": m.slots,
                    "probe": probe,
                    "wire": self.wire_view(bid),
                    **self._sum_percpu(abi.MAP_BE_STATS, bid),
                }
            )
        counts = self.counter_values()
        services = []
        for name, vid in sorted(svc_names.items(), key=lambda kv: kv[1]):
            key, v = vips.get(vid, (None, None))
            services.append(
                {
                    "name": name,
                    "id": vid,
                    "vip": str(addr_of(key.addr)) if key else None,
                    "port": from_be16(key.port) if key else None,
                    "protocol": PROTO_NAMES.get(key.proto, "?") if key else None,
                    "table": v.table if v else None,
                    "existing_flows": "keep" if v and v.flags & abi.VIP_F_KEEP_FLOWS else "reselect",
                    **self._sum_percpu(abi.MAP_VIP_STATS, vid),
                    **slot_counts(counts, vid),  # its verdicts and drops
                    "backends": backends_by_vip.get(vid, []),
                }
            )
        out = {
            "node": node,
            "services": services,
            **self.counters(counts),
            # packets dropped or passed before a service was known (malformed, fragments,
            # not for a VIP, heartbeats): edge_svc_counts' slot after the last VIP id
            "no_service": slot_counts(counts, len(counts) // abi.SVC_COUNTERS - 1),
            "conntrack_entries": None,
            "half_open_entries": None,
            "stopped_early": stopped,
        }
        if count_conntrack:
            counting = time.monotonic_ns()
            n, complete = count_entries(self.t[abi.MAP_CT].keys(), deadline_ns)
            if complete:  # IPv6 connections (edge_ct6) count too
                n6, complete = count_entries(self.t[abi.MAP_CT6].keys(), deadline_ns)
                n += n6
            out["conntrack_entries"] = n if complete else None
            if complete:  # connections between the SYN and the client's ACK, both families: a table apart
                h4, whole = count_entries(self.t[abi.MAP_HALF_OPEN].keys(), deadline_ns)
                h6, whole = count_entries(self.t[abi.MAP_HALF_OPEN6].keys(), deadline_ns) if whole else (0, False)
                out["half_open_entries"] = h4 + h6 if whole else None
            if not complete:
                out["conntrack_partial"] = n
                stopped.append(
                    f"conntrack: >= {n} entries (counted for {(time.monotonic_ns() - counting) / 1e9:.1f} s)"
                )
        return out
