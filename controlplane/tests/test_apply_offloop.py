"""Applies off edged's loop: a reload's (or discovery's) apply writes the maps on a worker
thread, so the API, probes and the watch go on meanwhile; nothing on the loop writes the maps
under it (steps, operator actions and the status record wait for it). Driven through FakeMaps,
whose apply_gate holds an apply in flight as long as a test needs (a full apply at 10,000
backends takes about 2 s of CPU; tools/bench-apply measures the API's latency during one).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import yaml

from controlplane.config import Node
from controlplane.edged import daemon as edged
from controlplane.tests.apistage import serving, wait_until
from controlplane.tests.edgedstage import config, daemon, doc


@pytest.fixture
def routes(monkeypatch):
    monkeypatch.setattr(
        edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )


async def in_flight(maps) -> None:
    """Until maps' apply runs (on its thread; an apply on the loop is never seen running)."""
    deadline = time.monotonic() + 5
    while not maps.in_apply.is_set():
        assert time.monotonic() < deadline, "no apply seen in flight"
        await asyncio.sleep(0.01)


def test_the_api_answers_while_an_apply_is_in_flight_and_a_pin_waits_for_it(lt, sockdir, routes):
    """Status over the API socket is answered while a reload's apply is held in flight (on the
    loop, the call waited for the apply); a weight pin waits for the apply and is in the table
    after it; nothing wrote the maps under the apply."""
    d = lt.call(daemon, config(("b0", "b1", "b2")))
    maps = d.state.maps
    running = asyncio.run_coroutine_threadsafe(d.run(), lt.loop)  # steer and status loops
    gate = maps.apply_gate = threading.Event()
    try:
        with serving(lt, Node(api_socket=os.path.join(sockdir, "edged.sock")), daemon=d) as served:
            done_before = maps.applies_done
            new = doc(("b0", "b1", "b3"))
            new["services"][0]["backends"][2]["address"] = "198.18.9.2"  # on b2's endpoint, b3 would be b2 renamed
            reload = asyncio.run_coroutine_threadsafe(d.reload(yaml.safe_dump(new)), lt.loop)
            wait_until(maps.in_apply.is_set, what="the reload's apply to start")
            with served.client() as c:
                snap = c.status()
                answered_in_flight = maps.applies_done == done_before
                pinned: list = []
                pin = threading.Thread(target=lambda: pinned.append(c.set_weight("web", "b0", 7)))
                pin.start()
                gate.set()  # the apply ends
                summary = reload.result(10)
                pin.join(10)
        assert answered_in_flight, "status waited for the apply"
        assert [b["name"] for b in snap["services"][0]["backends"]] == ["b0", "b1", "b2"]  # as before the apply
        assert summary["added_backends"] == ["web/b3"] and summary["draining_backends"] == ["web/b2"]
        assert pinned == ["node"] and maps.weights("web")["b0"] == 7
        assert maps.written_under_apply == []
    finally:
        gate.set()
        lt.call(d.stop)
        running.result(10)
        lt.run(d.close())


def test_steps_and_operator_actions_wait_for_an_apply_in_flight(routes):
    """While an apply runs on its thread, a step raises at once, an operator action waits,
    and the action reaches the table once the apply is done."""

    async def go():
        d = daemon(config(("b0", "b1")))
        maps = d.state.maps
        gate = maps.apply_gate = threading.Event()
        reload = asyncio.create_task(d.reload(yaml.safe_dump(doc(("b0", "b1", "b2")))))
        await in_flight(maps)
        assert d.state.applying
        with pytest.raises(edged.EdgeError, match=r"^web: an apply is writing the maps"):
            d.steering.step(d.state.services["web"], 0)
        drain = asyncio.create_task(d.operate("drain", "web", "b1"))
        await asyncio.sleep(0.05)
        waited = not drain.done()
        gate.set()
        await reload
        await drain
        return d, waited

    d, waited = asyncio.run(go())
    assert waited and not d.state.applying
    assert d.state.maps.weights("web")["b1"] == 0 and d.state.maps.written_under_apply == []


def test_a_cancelled_reload_holds_the_lock_until_its_apply_ends(routes):
    """An API client that gives up cancels its reload; the apply's thread cannot stop, so the
    reload keeps the apply lock (no second apply starts) until it is done."""

    async def go():
        d = daemon(config(("b0", "b1")))
        maps = d.state.maps
        gate = maps.apply_gate = threading.Event()
        reload = asyncio.create_task(d.reload(yaml.safe_dump(doc(("b0", "b1", "b2")))))
        await in_flight(maps)
        reload.cancel()
        await asyncio.sleep(0.05)
        held = (not reload.done(), d.state.apply_lock.locked(), d.state.applying)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await reload
        return d, held

    d, held = asyncio.run(go())
    assert held == (True, True, True)
    assert not d.state.apply_lock.locked() and not d.state.applying
