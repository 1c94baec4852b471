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

import numpy as np
import pytest
import yaml

from controlplane import abi, loader, maps, wire
from controlplane.edged import daemon as edged
from controlplane.edged import status
from controlplane.errors import ConfigError, EdgeError, MapError
from controlplane.config import parse_config
from controlplane.maps import ApplyReport, ProbeStatus, WireStats
from controlplane.signals import Sample

MS = 1_000_000


def config(backends=("b0", "b1", "b2"), policy="latency_inverse", **service_extra) -> object:
    return parse_config(doc(backends, policy, **service_extra))


def doc(backends=("b0", "b1", "b2"), policy="latency_inverse", **service_extra) -> dict:
    service = {
        "name": "web", "vip": "198.18.0.10", "port": 8000,
        "backends": [{"name": n, "address": f"198.18.{i + 1}.2", "port": 8000, "weight": 100}
                     for i, n in enumerate(backends)],
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

    def wire_stats(self, bids=None):
        bids = [bid for _, ids in self.ids_of.values() for bid in ids.values()] if bids is None else bids
        return {bid: self.wire.get(bid, WireStats()) for bid in bids}

    def wire_rows(self, bids):
        return np.array([wire.row(self.wire.get(bid, WireStats())) for bid in bids], np.int64).reshape(-1, wire.ROW_LEN)

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


# ---------------------------------------------------------------- steering and the operator


def handshakes(d: edged.Daemon, backend: str, n: int, bucket: int) -> None:
    """n more handshakes of backend in the data path's histogram, in bucket (2^bucket us)."""
    _, bids = d.state.maps.ids("web")
    w = d.state.maps.wire.get(bids[backend], WireStats())
    hs = list(w.handshake)
    hs[bucket] += n
    d.state.maps.wire[bids[backend]] = WireStats(handshake=tuple(hs), opened=w.opened + n)


def test_fresh_wire_signals_steer_between_probes_and_stale_ones_give_the_rtt_back():
    def test():
        t = 10**12
        d = probed({"b0": 0.0001, "b1": 0.0001, "b2": 0.0001}, t)
        st = d.state.services["web"]
        d.steering.step(st, t)
        even = d.state.maps.weights("web")
        assert len(set(even.values())) == 1 and d.state.wire_fresh == set()
        for name in ("b0", "b2"):
            handshakes(d, name, 10, 6)  # ~100 us
        handshakes(d, "b1", 10, 14)  # ~25 ms: its path got slow, no probe has seen it yet
        d.steering.step(st, t + 300 * MS)
        assert d.state.wire_fresh == {("web", "b0"), ("web", "b1"), ("web", "b2")}
        moved = d.state.maps.weights("web")
        assert moved["b1"] < moved["b0"] / 10 and moved["b0"] == moved["b2"]
        # no more traffic: once the window (2 s) holds none, the signals are stale and the probes' RTT counts
        d.steering.step(st, t + 2600 * MS)
        d.steering.step(st, t + 2900 * MS)
        assert d.state.wire_fresh == set()
        assert all(tr.wire_rtt_s is None for tr in st.trackers.values())
        assert len(set(d.state.maps.weights("web").values())) == 1
    on_loop(test)



def test_a_step_pushes_the_policys_weights_and_not_the_noise_within_the_hysteresis():
    def test():
        t = 10**12
        d = probed({"b0": 0.010, "b1": 0.020, "b2": 0.040}, t)
        st = d.state.services["web"]
        assert d.steering.step(st, t) is True
        first = d.state.maps.weights("web")
        assert first["b0"] > first["b1"] > first["b2"] and st.pushed == first
        probed({"b0": 0.0101, "b1": 0.0199, "b2": 0.0401}, t + 300 * MS, d=d)  # 1 % noise
        assert d.steering.step(st, t + 300 * MS) is False and d.state.maps.weights("web") == first
        pushes = kinds(d, "weights")
        assert len(pushes) == 1 and pushes[0]["weights"] == first
    on_loop(test)


def test_a_drain_forces_0_until_undrained_and_shows_in_the_status_record():
    def test():
        t = 10**12
        d = steered({"b0": 0.010, "b1": 0.010, "b2": 0.010}, t)
        d.operations.drain("web", "b1")
        assert d.state.maps.weights("web")["b1"] == 0
        _, bids = d.state.maps.ids("web")
        assert d.state.maps.read_status(bids["b1"]).drained and d.state.maps.read_status(bids["b1"]).state == "drained"
        assert d.status.backend_view("web", "b1", t)["state"] == "drained"
        d.operations.undrain("web", "b1")
        assert d.state.maps.weights("web")["b1"] == d.state.maps.weights("web")["b0"] > 0
        assert not d.state.maps.read_status(bids["b1"]).drained
        assert [e["kind"] for e in d.events.recent if e["kind"] in ("drain", "undrain")] == ["drain", "undrain"]
    on_loop(test)


def test_an_override_beats_the_policy_until_cleared():
    def test():
        t = 10**12
        d = steered({"b0": 0.010, "b1": 0.030}, t)
        d.operations.set_override("web", "b1", 77)
        _, bids = d.state.maps.ids("web")
        assert d.state.maps.weights("web")["b1"] == 77 and d.state.maps.read_status(bids["b1"]).override == 77
        probed({"b0": 0.030, "b1": 0.010}, t + 10**9, n=5, d=d)  # the policy now prefers b1
        d.steering.step(d.state.services["web"], t + 10**9)
        assert d.state.maps.weights("web")["b1"] == 77
        d.operations.set_override("web", "b1", None)
        assert d.state.maps.weights("web")["b1"] > d.state.maps.weights("web")["b0"]
        assert d.state.maps.read_status(bids["b1"]).override is None
        with pytest.raises(ValueError, match="^weight: 70000 is out of range"):
            d.operations.set_override("web", "b1", 70000)
        with pytest.raises(LookupError, match="no backend 'b9'"):
            d.operations.drain("web", "b9")
    on_loop(test)


def test_a_drain_the_maps_refuse_is_an_error_and_leaves_nothing_behind():
    def test():
        d = steered({"b0": 0.010, "b1": 0.010})
        before = d.state.maps.weights("web")
        d.state.maps.refusing = loader.Table(abi.MAP_VIPS, RefusingTable("Argument list too long"))
        with pytest.raises(MapError, match="^edge_vips: update"):
            d.operations.drain("web", "b1")
        assert not d.state.drained and not kinds(d, "drain")
        d.state.maps.refusing = None
        d.steering.step(d.state.services["web"], 10**12)  # the steer loop's next step does not drain b1
        assert d.state.maps.weights("web") == before
    on_loop(test)


def test_a_restarted_edged_keeps_the_drains_and_overrides_it_finds_in_the_maps():
    def test():
        t = 10**12
        d = steered({"b0": 0.010, "b1": 0.010, "b2": 0.010}, t)
        d.operations.drain("web", "b1")
        d.operations.set_override("web", "b2", 5)
        again = edged.Daemon(d.state.cfg, "edge-t0", edged.Events())
        again.steering.targets = lambda cfg: []
        again.state.maps = d.state.maps  # what a restart finds pinned
        again._adopt_operator_state()
        again.steering.set_services(d.state.cfg)
        assert again.state.drained == {("web", "b1")} and again.state.overrides == {("web", "b2"): 5}
        again.steering.step(again.state.services["web"], t)  # no probe data yet: nothing forced moves
        assert {n: w for n, w in d.state.maps.weights("web").items() if n != "b0"} == {"b1": 0, "b2": 5}
    on_loop(test)


def test_the_status_record_carries_what_edged_measured():
    def test():
        t = 10**12
        d = steered({"b0": 0.010, "b1": 0.020}, t)
        d.status.write_status(t)
        _, bids = d.state.maps.ids("web")
        p = d.state.maps.read_status(bids["b0"])
        assert p.updated_ns == t and p.config_weight == 100 and p.state == "up"
        assert p.rtt_smoothed_s == pytest.approx(0.010)
        assert not p.drained and p.override is None and p.leave_until_s is None
    on_loop(test)


# ---------------------------------------------------------------- reload


def test_reload_adds_a_backend_and_drains_a_removed_one_at_weight_0(monkeypatch):
    monkeypatch.setattr(edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services
                                                                       for b in s.backends})

    async def go():
        d = daemon(config(("b0", "b1", "b2")))
        d.steering.step(d.state.services["web"], time.monotonic_ns())
        new = doc(("b0", "b1", "b3"))
        new["services"][0]["backends"][2]["address"] = "198.18.9.2"  # on b2's endpoint, b3 would be b2 renamed
        summary = await d.reload(yaml.safe_dump(new))  # the API's config text
        d.steering.step(d.state.services["web"], time.monotonic_ns())
        return d, summary

    d, summary = asyncio.run(go())
    assert summary["added_backends"] == ["web/b3"] and summary["draining_backends"] == ["web/b2"]
    assert d.state.maps.weights("web")["b2"] == 0 and d.state.maps.weights("web")["b3"] > 0  # b2 keeps its connections
    _, bids = d.state.maps.ids("web")
    assert d.state.maps.read_status(bids["b2"]).leave_until_s is not None  # a restart keeps draining it
    assert d.status.backend_view("web", "b2", time.monotonic_ns())["state"] == "leaving"


def test_a_bad_reload_changes_nothing(monkeypatch):
    monkeypatch.setattr(edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services
                                                                       for b in s.backends})
    bad = doc(("b0", "b1"))
    bad["services"][0]["backends"][1]["weight"] = -1

    async def go():
        d = daemon(config(("b0", "b1", "b2")))
        d.steering.step(d.state.services["web"], time.monotonic_ns())
        before = (d.state.maps.weights("web"), dict(d.state.maps.ids_of), d.state.cfg)
        with pytest.raises(ConfigError, match=r"weight"):
            await d.reload(yaml.safe_dump(bad))
        return d, before

    d, before = asyncio.run(go())
    assert (d.state.maps.weights("web"), dict(d.state.maps.ids_of), d.state.cfg) == before
    assert kinds(d, "reload-rejected")


# ---------------------------------------------------------------- loops survive map failures


def test_a_bcc_table_failure_is_a_map_error_naming_the_map_and_key():
    table = loader.Table(abi.MAP_VIPS, RefusingTable("Argument list too long"))
    with pytest.raises(MapError, match=r"^edge_vips: update 7: Could not update table: Argument list too long$") as e:
        table[table.Key(7)] = 1
    assert e.value.map == abi.MAP_VIPS


def test_a_lookup_miss_stays_a_key_error_and_a_failed_walk_is_a_map_error():
    class Broken(RefusingTable):
        def __getitem__(self, key):
            raise KeyError(key)

        def keys(self):
            yield self.Key(1)
            raise Exception("Operation not permitted")

    table = loader.Table(abi.MAP_CT, Broken("-"))
    with pytest.raises(KeyError):
        table[table.Key(3)]
    with pytest.raises(MapError, match=r"^edge_ct: walk: Operation not permitted$"):
        list(table.keys())


def test_a_failed_map_write_does_not_kill_the_steer_task():
    """set_weights fails as a bcc table write does; the steer loop reports it once, counts
    every failure per map, keeps deciding, and pushes once the map takes writes again;
    edged stays healthy for the watchdog."""

    async def go():
        d = daemon()
        d.state.maps.refusing = loader.Table(abi.MAP_VIPS, RefusingTable("Argument list too long"))
        task = asyncio.create_task(d.run())
        d.state.overrides[("web", "b0")] = 5  # a push is due at once

        async def until(cond):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not cond() and d.healthy():
                await asyncio.sleep(0.01)

        await until(lambda: d.state.observer.read().map_errors.get(abi.MAP_VIPS, 0) >= 2)
        failed = d.state.observer.read().map_errors.get(abi.MAP_VIPS, 0)
        d.state.maps.refusing = None
        await until(lambda: d.state.maps.writes > 0)
        healthy, writes = d.healthy(), d.state.maps.writes
        dead = [f"{t.get_name()}: {t.exception()!r}" for t in d.state.tasks if t.done() and not t.cancelled()]
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
        gate = d.state.maps.walk_gate = threading.Event()
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
    assert d.state.maps.walk_deadlines[-1] is not None  # the walk was given a deadline


def test_a_walk_that_outlives_its_grace_is_an_error_and_the_loop_goes_on(monkeypatch):
    monkeypatch.setattr(edged.deploy, "describe", lambda maps, instance, pin_path, count=False, deadline_ns=None:
                        maps.snapshot(count, deadline_ns))
    monkeypatch.setattr(status, "WALK_DEADLINE_S", 0.01)
    monkeypatch.setattr(status, "WALK_GRACE_S", 0.01)

    async def go():
        d = daemon()
        gate = d.state.maps.walk_gate = threading.Event()  # a walk that ignores its deadline
        try:
            with pytest.raises(EdgeError, match=r"^status: walking the maps took over"):
                await d.snapshot(count_conntrack=True)
            d.steering.step(d.state.services["web"], time.monotonic_ns())  # the loop is free to steer
            assert d.state.maps.writes == 1
        finally:
            gate.set()
        await d.close()  # waits for the walk before closing the maps

    asyncio.run(go())


def test_counting_entries_stops_at_the_deadline():
    assert maps.count_entries(iter(range(5000)), None) == (5000, True)
    assert maps.count_entries(iter(range(5000)), time.monotonic_ns() + 10**12) == (5000, True)
    n, complete = maps.count_entries(itertools.count(), time.monotonic_ns() - 1)  # endless: a huge table
    assert not complete and n > 0
