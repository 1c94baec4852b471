"""edged's test stage without root (test_edged_loop.py, test_steer_wake.py, test_prober_relax.py):
FakeMaps, an in-memory stand-in for the interface edged uses of maps.Maps; a Daemon over it
(daemon, probed, steered), samples and wire handshakes fed in, a config and its document, and
on_loop for what must run on an event loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading

import numpy as np

from controlplane import loader, wiresignals
from controlplane.config import parse_config
from controlplane.edged import daemon as edged
from controlplane.errors import MapError
from controlplane.maps import ApplyReport, ProbeStatus, WireStats
from controlplane.samples import Sample

MS = 1_000_000


def config(backends=("b0", "b1", "b2"), policy="latency_inverse", **service_extra) -> object:
    return parse_config(doc(backends, policy, **service_extra))


def doc(backends=("b0", "b1", "b2"), policy="latency_inverse", **service_extra) -> dict:
    service = {
        "name": "web",
        "vip": "198.18.0.10",
        "port": 8000,
        "backends": [
            {"name": n, "address": f"198.18.{i + 1}.2", "port": 8000, "weight": 100} for i, n in enumerate(backends)
        ],
        "weights": {"policy": policy, "hysteresis_pct": 10, "rtt_offset_ms": 0},
        **service_extra,
    }
    return {"version": 1, "services": [service]}


class RefusingTable:
    """What a bcc table does when the kernel refuses an update: a bare Exception."""

    Key = ctypes.c_uint32

    def __init__(self, text: str) -> None:
        self.text = text

    def __setitem__(self, key, value) -> None:
        raise Exception(f"Could not update table: {self.text}")


class FakeMaps:
    """maps.Maps as edged sees it, in memory. refusing: while set, set_weights writes into
    this (bcc-like) table, through the loader's guard as maps.Maps does."""

    def __init__(self, cfg):
        self.ids_of: dict[str, tuple[int, dict[str, int]]] = {}
        self.table: dict[str, dict[str, int]] = {}  # the active Maglev table's weights
        self.probe: dict[int, ProbeStatus] = {}
        self.refusing: loader.Table | None = None
        self.writes = 0
        self.walk_gate: threading.Event | None = None  # when set, a walk waits for it (a slow walk)
        self.walk_deadlines: list = []
        self.wire: dict[int, WireStats] = {}  # the data path's wire signals (edge_wire), cumulative
        self.open_scale: dict[int, int] = {}  # least_loaded's extra scale per backend id (edge_inflight)
        # when set, an apply waits for it (a long apply: 2 s of CPU at 10,000 backends)
        self.apply_gate: threading.Event | None = None
        self.in_apply = threading.Event()  # set while an apply runs
        self.applies_done = 0
        self.written_under_apply: list[str] = []  # writes that came while an apply ran
        self.apply(cfg)

    def _written(self, what: str) -> None:
        if self.in_apply.is_set():
            self.written_under_apply.append(what)

    def apply(self, cfg, oifs=None) -> ApplyReport:
        self._written("apply")
        self.in_apply.set()
        try:
            if self.apply_gate is not None:
                self.apply_gate.wait(timeout=3)
            return self._apply(cfg)
        finally:
            self.in_apply.clear()
            self.applies_done += 1

    def _apply(self, cfg) -> ApplyReport:
        report = ApplyReport()
        used = {bid for _, bids in self.ids_of.values() for bid in bids.values()}
        for s in cfg.services:
            if s.name not in self.ids_of:
                self.ids_of[s.name] = (len(self.ids_of), {})
                report.added_services.append(s.name)
            else:  # as maps.Maps.apply reports it: every service that was there already
                report.updated_services.append(s.name)
            bids = self.ids_of[s.name][1]
            for b in s.backends:
                if b.name not in bids:
                    bids[b.name] = min(set(range(len(used) + 1)) - used)
                    used.add(bids[b.name])
                    self.probe[bids[b.name]] = ProbeStatus(config_weight=b.weight)
                    report.added_backends.append(f"{s.name}/{b.name}")
            # as maps.Maps.apply: the tables get the weights cfg gives (edged passes deploy.adopted(cfg))
            self.table[s.name] = {b.name: b.weight for b in s.backends}
            for gone in set(bids) - {b.name for b in s.backends}:
                del bids[gone]
                report.removed_backends.append(gone)
        for gone in set(self.ids_of) - {s.name for s in cfg.services}:
            del self.ids_of[gone], self.table[gone]
            report.removed_services.append(gone)
        return report

    def ids(self, service):
        if service not in self.ids_of:
            raise MapError(f"service {service!r} is not deployed")
        return self.ids_of[service]

    def weights(self, service):
        self.ids(service)
        return dict(self.table[service])

    def set_weights(self, s, weights):
        self._written(f"set_weights {s.name}")
        if self.refusing is not None:
            self.refusing[self.refusing.Key(0)] = 1
        self.writes += 1
        self.table[s.name] = {b.name: int(weights.get(b.name, b.weight)) for b in s.backends}

    def set_open_scale(self, bid: int, extra: int) -> None:
        self._written(f"set_open_scale {bid}")
        self.open_scale[bid] = extra

    def write_status(self, bid, status: ProbeStatus):
        self._written(f"write_status {bid}")
        self.probe[bid] = status

    def write_statuses(self, records):
        for bid, status in records:
            self.write_status(bid, status)

    def read_status(self, bid) -> ProbeStatus:
        return self.probe[bid]

    def backend_stats(self, bid):
        return {"packets": 0, "bytes": 0, "new_flows": 0, "return_packets": 0, "failovers": 0}

    def wire_stats(self, bids=None):
        bids = [bid for _, ids in self.ids_of.values() for bid in ids.values()] if bids is None else bids
        return {bid: self.wire.get(bid, WireStats()) for bid in bids}

    def wire_rows(self, bids):
        return np.array([wiresignals.row(self.wire.get(bid, WireStats())) for bid in bids], np.int64).reshape(
            -1, wiresignals.ROW_LEN
        )

    def leaving(self, s):
        return []

    def node(self):
        return {"return_ifindex": [1], "ingress_ifindex": 0}

    def close(self):
        pass

    # the walk `edgectl status` and metrics scrapes ask for
    def snapshot(self, count_conntrack=False, deadline_ns=None):
        self.walk_deadlines.append(deadline_ns)
        if self.walk_gate is not None:
            self.walk_gate.wait(timeout=10)
        services = []
        for name, (vid, bids) in self.ids_of.items():
            services.append(
                {
                    "name": name,
                    "id": vid,
                    "backends": [
                        {
                            "id": bid,
                            "name": b,
                            "weight": self.table[name][b],
                            "state": "up",
                            "probe": {},
                            "health": {"usable": True},
                            **self.backend_stats(bid),
                        }
                        for b, bid in bids.items()
                    ],
                }
            )
        return {"node": self.node(), "services": services, "verdicts": {}, "drops": {}, "conntrack_entries": None}


def daemon(cfg=None) -> edged.Daemon:
    """A Daemon over FakeMaps, as start() leaves it (without deploying or serving); call it
    on a running loop (the prober's)."""
    cfg = cfg or config()
    d = edged.Daemon(cfg, "edge-t0", edged.Events())
    d.steering.targets = lambda cfg: []  # nothing is probed: the tests hand edged its samples
    d.state.maps = FakeMaps(cfg)
    d.steering.set_services(cfg)
    return d


def sample(d: edged.Daemon, backend: str, rtt_s: float, t_ns: int) -> None:
    d.steering.on_sample(("web", backend), Sample(t_ns=t_ns, ok=True, rtt_s=rtt_s))


def kinds(d: edged.Daemon, kind: str) -> list[dict]:
    return [e for e in d.events.recent if e["kind"] == kind]


PROBED = {"health": {"probe": {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50, "fall": 2, "rise": 1}}}


def probed(rtts: dict[str, float], t_ns: int, n: int = 3, d: edged.Daemon | None = None) -> edged.Daemon:
    """A Daemon of probed backends that has seen n samples of each RTT, 100 ms apart up to t_ns."""
    d = d or daemon(config(tuple(rtts), **PROBED))
    for i in range(n):
        for name, rtt in rtts.items():
            sample(d, name, rtt, t_ns - (n - 1 - i) * 100 * MS)
    return d


def steered(rtts: dict[str, float], t_ns: int = 10**12) -> edged.Daemon:
    """probed(), then one step: the policy's weights are in the table."""
    d = probed(rtts, t_ns)
    d.steering.step(d.state.services["web"], t_ns)
    return d


def on_loop(test):
    """Runs test() on an event loop (the prober's targets are set on one)."""

    async def go():
        return test()

    return asyncio.run(go())


def handshakes(d: edged.Daemon, backend: str, n: int, bucket: int) -> None:
    """n more handshakes of backend in the data path's histogram, in bucket (2^bucket us)."""
    _, bids = d.state.maps.ids("web")
    w = d.state.maps.wire.get(bids[backend], WireStats())
    hs = list(w.handshake)
    hs[bucket] += n
    d.state.maps.wire[bids[backend]] = WireStats(handshake=tuple(hs), opened=w.opened + n)
