"""edged's orchestration without root: Daemon.step, the operator's actions, reload, the
loops' survival of map failures and the long walks, driven through FakeMaps.

FakeMaps is an in-memory stand-in for the interface edged uses of maps.Maps (ids,
weights, set_weights, the status record, apply, snapshot). It tests what edged does
with the maps, not the kernel: the maps themselves are tested in netns-tests/.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from ipaddress import IPv4Address

import pytest

from controlplane import abi, edged, loader
from controlplane.errors import MapError
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
