"""edged's parts driven alone, with no Daemon: a State over the in-memory model of the pinned
maps (memtables: maps.Maps itself over tables built from abi.h and maps.h), and the one part
under test built on it, as edged/daemon.py builds it. Unprivileged."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.config import parse_config
from controlplane.edged.operations import Operations
from controlplane.edged.state import State
from controlplane.edged.status import Status
from controlplane.edged.steer import Steering
from controlplane.samples import Sample
from controlplane.tests.memtables import MemMaps

MS = 1_000_000
T = 10**12


def config():
    return parse_config(
        {
            "version": 1,
            "node": {"maglev_m": 1009, "max_services": 4, "max_backends": 8},
            "services": [
                {
                    "name": "web",
                    "vip": "198.18.0.10",
                    "port": 8000,
                    "weights": {"policy": "latency_inverse", "hysteresis_pct": 10, "rtt_offset_ms": 0},
                    "health": {"probe": {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50}},
                    "backends": [
                        {"name": n, "address": f"198.18.{i + 1}.2", "port": 8000, "weight": 100}
                        for i, n in enumerate(("b0", "b1"))
                    ],
                }
            ],
        }
    )


@pytest.fixture
def state():
    """A State as start() leaves it (config applied to the maps), over memtables."""
    cfg = config()
    mem = MemMaps(cfg.node.maglev_m, cfg.node.max_services, cfg.node.max_backends)
    st = State.new(cfg, "edge-t0")
    st.maps = mem.maps()
    st.maps.apply(cfg)
    yield st
    mem.close()


def steering_on(state: State) -> Steering:
    steering = Steering(state)
    steering.targets = lambda cfg: []  # nothing is probed: the test hands it its samples
    steering.set_services(state.cfg)
    return steering


def probed(steering: Steering, rtts: dict[str, float]) -> None:
    """Three samples of each backend's RTT, 100 ms apart up to T."""
    for i in range(3):
        for name, rtt in rtts.items():
            steering.on_sample(("web", name), Sample(t_ns=T - (2 - i) * 100 * MS, ok=True, rtt_s=rtt))


def test_steering_alone_puts_the_policys_weights_into_the_maps(state):
    async def go():
        steering = steering_on(state)
        try:
            probed(steering, {"b0": 0.010, "b1": 0.040})
            return steering.step(state.services["web"], T)
        finally:
            await steering.prober.close()

    pushed = asyncio.run(go())
    table = state.maps.weights("web")
    assert pushed and table["b0"] > table["b1"] > 0  # the faster backend gets more of the table
    assert state.services["web"].pushed == table
    assert [e["kind"] for e in state.events.recent if e["kind"] == "weights"] == ["weights"]


def test_a_drain_through_operations_alone_reaches_the_maps_and_the_status_record(state):
    async def go():
        steering = steering_on(state)
        ops = Operations(state, steering, Status(state, steering.prober))
        try:
            probed(steering, {"b0": 0.010, "b1": 0.010})
            ops.drain("web", "b1")
            drained = state.maps.weights("web")
            ops.undrain("web", "b1")
            return drained, state.maps.weights("web")
        finally:
            await steering.prober.close()

    drained, undrained = asyncio.run(go())
    assert drained["b1"] == 0 and drained["b0"] > 0
    assert undrained["b1"] == undrained["b0"] > 0
    _, bids = state.maps.ids("web")
    record = state.maps.read_status(bids["b1"])
    assert not record.drained and record.state == "up"  # undrain rewrote edge_be_probe at once
    assert state.drained == set()


def test_the_watch_checks_the_backends_of_the_services_edged_has_now():
    """The backend addresses the watch checks (made anew only when a service changed) follow a
    service replaced by a reload or discovery."""
    import dataclasses
    import ipaddress

    from controlplane.tests import edgedstage

    async def go():
        d = edgedstage.daemon(edgedstage.config(("b0", "b1")))
        d.state.held = object()  # as after a deploy
        first = d._watched().backends
        assert d._watched().backends is first  # not made anew while nothing changed
        st = d.state.services["web"]
        moved = dataclasses.replace(st.service.backends[1], address=ipaddress.ip_address("198.18.3.2"))
        st.service = dataclasses.replace(st.service, backends=(st.service.backends[0], moved))
        return first, d._watched().backends

    first, now = asyncio.run(go())
    assert first == ("198.18.1.2", "198.18.2.2") and now == ("198.18.1.2", "198.18.3.2")
