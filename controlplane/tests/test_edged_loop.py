"""edged's orchestration without root: Daemon.step, the operator's actions, reload, the
loops' survival of map failures and the long walks, driven through FakeMaps.

FakeMaps (edgedstage.py) is an in-memory stand-in for the interface edged uses of maps.Maps
(ids, weights, set_weights, the status record, apply, snapshot). It tests what edged does
with the maps, not the kernel: the maps themselves are tested in netns-tests/.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
import time

import pytest
import yaml

from controlplane import abi, loader, maps
from controlplane.edged import daemon as edged, status
from controlplane.errors import ConfigError, EdgeError, MapError
from controlplane.tests.edgedstage import (
    MS,
    RefusingTable,
    config,
    daemon,
    doc,
    handshakes,
    kinds,
    on_loop,
    probed,
    steered,
)

# ---------------------------------------------------------------- steering and the operator


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
    monkeypatch.setattr(
        edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )

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
    monkeypatch.setattr(
        edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )
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
    monkeypatch.setattr(
        edged.deploy,
        "describe",
        lambda maps, instance, pin_path, count=False, deadline_ns=None: maps.snapshot(count, deadline_ns),
    )

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
    monkeypatch.setattr(
        edged.deploy,
        "describe",
        lambda maps, instance, pin_path, count=False, deadline_ns=None: maps.snapshot(count, deadline_ns),
    )
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
