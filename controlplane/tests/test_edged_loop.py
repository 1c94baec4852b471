"""edged's orchestration without root: Daemon.step, the operator's actions, reload, the
loops' survival of map failures and the long walks, driven through FakeMaps.

FakeMaps is an in-memory stand-in for the interface edged uses of maps.Maps (ids,
weights, set_weights, the status record, apply, snapshot). It tests what edged does
with the maps, not the kernel: the maps themselves are tested in netns-tests/.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import itertools
import threading
import time
from ipaddress import IPv4Address

import pytest

from controlplane import abi, edged, loader, maps
from controlplane.errors import EdgeError, MapError
from controlplane.config import parse_config
from controlplane.maps import ApplyReport, ProbeStatus
from controlplane.signals import Sample

MS = 1_000_000


def config(backends=("b0", "b1", "b2"), policy="latency_inverse", **service_extra) -> object:
    service = {
        "name": "web", "vip": "198.18.0.10", "port": 8000,
        "backends": [{"name": n, "address": f"198.18.{i + 1}.2", "port": 8000, "weight": 100}
                     for i, n in enumerate(backends)],
        "weights": {"policy": policy, "hysteresis_pct": 10, "rtt_offset_ms": 0},
        **service_extra,
    }
    return parse_config({"version": 1, "services": [service]})


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
        self.apply(cfg)

    def apply(self, cfg, oifs=None) -> ApplyReport:
        report = ApplyReport()
        used = {bid for _, bids in self.ids_of.values() for bid in bids.values()}
        for s in cfg.services:
            if s.name not in self.ids_of:
                self.ids_of[s.name] = (len(self.ids_of), {})
                report.added_services.append(s.name)
            bids = self.ids_of[s.name][1]
            for b in s.backends:
                if b.name not in bids:
                    bids[b.name] = min(set(range(len(used) + 1)) - used)
                    used.add(bids[b.name])
                    self.probe[bids[b.name]] = ProbeStatus(config_weight=b.weight)
                    report.added_backends.append(f"{s.name}/{b.name}")
            self.table[s.name] = {b.name: self.table.get(s.name, {}).get(b.name, b.weight) for b in s.backends}
            for gone in set(bids) - {b.name for b in s.backends}:
                del bids[gone]
        return report

    def ids(self, service):
        return self.ids_of[service]

    def weights(self, service):
        return dict(self.table[service])

    def set_weights(self, s, weights):
        if self.refusing is not None:
            self.refusing[self.refusing.Key(0)] = 1
        self.writes += 1
        self.table[s.name] = {b.name: int(weights.get(b.name, b.weight)) for b in s.backends}

    def write_status(self, bid, status: ProbeStatus):
        self.probe[bid] = status

    def read_status(self, bid) -> ProbeStatus:
        return self.probe[bid]

    def backend_stats(self, bid):
        return {"packets": 0, "bytes": 0, "new_flows": 0, "return_packets": 0, "failovers": 0}

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
            services.append({"name": name, "id": vid, "backends": [
                {"id": bid, "name": b, "weight": self.table[name][b], "probe": {}, "health": {"usable": True},
                 **self.backend_stats(bid)} for b, bid in bids.items()]})
        return {"node": self.node(), "services": services, "verdicts": {}, "drops": {},
                "conntrack_entries": None if deadline_ns is not None or not count_conntrack else 0}


def daemon(cfg=None) -> edged.Daemon:
    """A Daemon over FakeMaps, as start() leaves it (without deploying or serving); call it
    on a running loop (the prober's)."""
    cfg = cfg or config()
    d = edged.Daemon(cfg, "hp4t0", edged.Events())
    d.maps = FakeMaps(cfg)
    d._set_services(cfg)
    return d


def sample(d: edged.Daemon, backend: str, rtt_s: float, t_ns: int) -> None:
    d._on_sample(("web", backend), Sample(t_ns=t_ns, ok=True, rtt_s=rtt_s))


def kinds(d: edged.Daemon, kind: str) -> list[dict]:
    return [e for e in d.events.recent if e["kind"] == kind]


# ---------------------------------------------------------------- loops survive map failures


def test_a_bcc_table_failure_is_a_map_error_naming_the_map_and_key():
    table = loader.Table(abi.MAP_VIPS, RefusingTable("Argument list too long"))
    with pytest.raises(MapError, match=r"^edge_vips: update 7: Could not update table: Argument list too long$") as e:
        table[table.Key(7)] = 1
    assert e.value.map == abi.MAP_VIPS


def test_a_failed_map_write_does_not_kill_the_steer_task():
    """set_weights fails as a bcc table write does; the steer loop reports it once, counts
    every failure per map, keeps deciding, and pushes once the map takes writes again;
    edged stays healthy for the watchdog."""

    async def go():
        d = daemon()
        d.maps.refusing = loader.Table(abi.MAP_VIPS, RefusingTable("Argument list too long"))
        task = asyncio.create_task(d.run())
        d.overrides[("web", "b0")] = 5  # a push is due at once

        async def until(cond):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not cond() and d.healthy():
                await asyncio.sleep(0.01)

        await until(lambda: d.observer.read().map_errors.get(abi.MAP_VIPS, 0) >= 2)
        failed = d.observer.read().map_errors.get(abi.MAP_VIPS, 0)
        d.maps.refusing = None
        await until(lambda: d.maps.writes > 0)
        healthy, writes = d.healthy(), d.maps.writes
        dead = [f"{t.get_name()}: {t.exception()!r}" for t in d._tasks if t.done() and not t.cancelled()]
        d.stop()
        await task
        await d.close()
        return d, healthy, dead, failed, writes

    d, healthy, dead, failed, writes = asyncio.run(go())
    assert healthy and not dead, dead
    assert failed >= 2 and writes > 0
    errors = [e for e in kinds(d, "error") if e.get("map") == abi.MAP_VIPS]
    assert len(errors) == 1 and errors[0]["service"] == "web", errors  # reported once, not per retry


# ---------------------------------------------------------------- long walks


def test_the_loop_keeps_deciding_while_a_status_walk_is_slow(monkeypatch):
    """A status walk (GetStatus with a conntrack count, a metrics scrape) that takes long
    runs off the loop: the loop keeps ticking and steering until the walk is done."""
    monkeypatch.setattr(edged.deploy, "describe", lambda maps, instance, pin_path, count=False, deadline_ns=None:
                        maps.snapshot(count, deadline_ns))

    async def go():
        d = daemon()
        gate = d.maps.walk_gate = threading.Event()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                if ticks >= 20:
                    gate.set()  # the walk ends only once the loop has run during it
                await asyncio.sleep(0.005)

        t = asyncio.create_task(ticker())
        try:
            snap = d.snapshot(count_conntrack=True)
            snap = await snap if inspect.isawaitable(snap) else snap
        finally:
            gate.set()
            t.cancel()
        return d, snap, ticks

    d, snap, ticks = asyncio.run(go())
    assert ticks >= 20  # the loop ran while the walk was in progress
    assert [b["name"] for b in snap["services"][0]["backends"]] == ["b0", "b1", "b2"]
    assert snap["services"][0]["backends"][0]["edged"]["config_weight"] == 100  # edged's view on top
    assert d.maps.walk_deadlines[-1] is not None  # the walk was given a deadline


def test_a_walk_that_outlives_its_grace_is_an_error_and_the_loop_goes_on(monkeypatch):
    monkeypatch.setattr(edged.deploy, "describe", lambda maps, instance, pin_path, count=False, deadline_ns=None:
                        maps.snapshot(count, deadline_ns))
    monkeypatch.setattr(edged, "WALK_DEADLINE_S", 0.01)
    monkeypatch.setattr(edged, "WALK_GRACE_S", 0.01)

    async def go():
        d = daemon()
        gate = d.maps.walk_gate = threading.Event()  # a walk that ignores its deadline
        try:
            with pytest.raises(EdgeError, match=r"^status: walking the maps took over"):
                await d.snapshot(count_conntrack=True)
            d.step(d.services["web"], time.monotonic_ns())  # the loop is free to steer
            assert d.maps.writes == 1
        finally:
            gate.set()
        await d.close()  # waits for the walk before closing the maps

    asyncio.run(go())


def test_counting_entries_stops_at_the_deadline():
    assert maps.count_entries(iter(range(5000)), None) == (5000, True)
    assert maps.count_entries(iter(range(5000)), time.monotonic_ns() + 10**12) == (5000, True)
    n, complete = maps.count_entries(itertools.count(), time.monotonic_ns() - 1)  # endless: a huge table
    assert not complete and n > 0
