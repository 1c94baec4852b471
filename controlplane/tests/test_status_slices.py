"""Status at scale without holding edged's loop: a status call's proto conversion runs off the
loop (a weight pin is answered while one is held), and the status views and the once-a-second
edge_be_probe record are built a slice of services at a time, with the loop given back between
slices (other work on the loop runs in between). Through FakeMaps (edgedstage); tools/bench-probe
--scale measures the API's latency while edged probes thousands of backends.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time

import yaml

from controlplane.api import server
from controlplane.config import Node, parse_config
from controlplane.edged import status as edged_status, steer
from controlplane.probe import Target
from controlplane.samples import Sample
from controlplane.tests.apistage import serving, wait_until
from controlplane.tests.edgedstage import PROBED, daemon
from controlplane.tests.loopturns import LoopTurns


def services(n: int, per: int):
    """n services of per backends each."""
    return parse_config(
        {
            "version": 1,
            "services": [
                {
                    "name": f"s{i}",
                    "vip": f"198.18.0.{10 + i}",
                    "port": 8000,
                    "backends": [
                        {"name": f"b{j}", "address": f"198.18.{i + 1}.{j + 2}", "port": 8000} for j in range(per)
                    ],
                }
                for i in range(n)
            ],
        }
    )


def test_a_weight_pin_is_answered_while_a_status_is_converted(lt, sockdir, monkeypatch):
    """A status call whose conversion to the API's message is held: a weight pin through the
    API is answered meanwhile (with the conversion on the loop, the pin waited for it)."""
    d = lt.call(daemon, services(2, 3))
    converting, gate = threading.Event(), threading.Event()
    convert = server.convert.status_to_proto

    def held(snap, edged):
        converting.set()
        gate.wait(timeout=10)
        return convert(snap, edged)

    monkeypatch.setattr(server.convert, "status_to_proto", held)
    try:
        with serving(lt, Node(api_socket=os.path.join(sockdir, "edged.sock")), daemon=d) as served:
            with served.client() as c1, served.client() as c2:
                snaps: list = []
                call = threading.Thread(target=lambda: snaps.append(c1.status()))
                call.start()
                wait_until(converting.is_set, what="the status call to convert")
                pinned: list = []
                pin = threading.Thread(target=lambda: pinned.append(c2.set_weight("s0", "b0", 7)))
                pin.start()
                wait_until(lambda: pinned, what="the pin's answer while the status is held")
                assert d.state.maps.weights("s0")["b0"] == 7
                gate.set()
                call.join(10)
                pin.join(10)
        assert [s["name"] for s in snaps[0]["services"]] == ["s0", "s1"]
    finally:
        gate.set()


def test_status_views_and_the_record_are_built_a_slice_at_a_time(monkeypatch):
    """With SLICE at one service: between two services' views (a status) and two services'
    records (the status loop's write), other work on the loop runs; every backend is in both."""
    monkeypatch.setattr(edged_status, "SLICE", 1)

    async def go():
        d = daemon(services(3, 2))
        other = LoopTurns()
        seen: list[tuple[str, int]] = []
        view, record = d.status.backend_view, d.status.record

        def counted(name, backend, now_ns, full=True):
            seen.append((name, other.n))
            return view(name, backend, now_ns, full)

        def counted_record(name, backend, weight):
            seen.append((name, other.n))
            return record(name, backend, weight)

        d.status.backend_view, d.status.record = counted, counted_record

        with other:
            await asyncio.sleep(0)
            snap = await d.snapshot()
            in_status = list(seen)
            seen.clear()
            await d.status.write_status_sliced()
            in_record = list(seen)
        return snap, in_status, in_record, d

    snap, in_status, in_record, d = asyncio.run(go())
    for views in (in_status, in_record):
        assert len(views) == 6  # every backend of the three services
        turns_per_service = {name: {t for n, t in views if n == name} for name in ("s0", "s1", "s2")}
        assert all(len(t) == 1 for t in turns_per_service.values()), turns_per_service  # a service at once
        assert len({next(iter(t)) for t in turns_per_service.values()}) == 3, turns_per_service  # the loop between
    assert all("edged" in b for s in snap["services"] for b in s["backends"])
    assert len(d.state.maps.probe) == 6 and all(p.updated_ns for p in d.state.maps.probe.values())


def test_an_operator_action_writes_the_records_of_its_service_alone():
    """A weight pin (and a drain) writes the edge_be_probe records of its own service, at once;
    the others wait for the status loop's next round (they used to be rewritten with it: 5,000
    records for one pin at 5,000 backends)."""

    async def go():
        d = daemon(services(3, 2))
        maps, written = d.state.maps, []
        write = maps.write_status

        def counted(bid, status):
            written.append(bid)
            write(bid, status)

        maps.write_status = counted
        await d.operate("weight", "s1", "b0", 7)
        pinned = list(written)
        written.clear()
        await d.operate("drain", "s2", "b1")
        return pinned, list(written), maps

    pinned, drained, maps = asyncio.run(go())
    assert sorted(pinned) == sorted(maps.ids("s1")[1].values())
    assert maps.probe[maps.ids("s1")[1]["b0"]].override == 7
    assert sorted(drained) == sorted(maps.ids("s2")[1].values())
    assert maps.probe[maps.ids("s2")[1]["b1"]].drained


def probed_doc(s2_weight: int = 100) -> dict:
    """Three services of two probed backends; s2's at weight s2_weight"""
    return {
        "version": 1,
        "services": [
            {
                "name": f"s{i}",
                "vip": f"198.18.0.{10 + i}",
                "port": 8000,
                **PROBED,
                "backends": [
                    {"name": f"b{j}", "address": f"198.18.{i + 1}.{j + 2}", "port": 8000}
                    | ({"weight": s2_weight} if i == 2 else {})
                    for j in range(2)
                ],
            }
            for i in range(3)
        ],
    }


def test_the_status_loop_rewrites_only_the_records_that_changed(monkeypatch):
    """The once-a-second edge_be_probe record: a backend whose record would be written as it is
    in the map already is left alone (at 10,000 backends the rewrite of every record held edged's
    loop and the interpreter every second); one probe result rewrites its backend's record alone;
    a reload rewrites the records of the services it changed (an apply may have reset them); every
    record is rewritten again within REFRESH_S, so updated_ns is never older than that."""

    async def go():
        d = daemon(parse_config(probed_doc()))
        maps, written = d.state.maps, []
        write = maps.write_status

        def counted(bid, status):
            written.append(bid)
            write(bid, status)

        maps.write_status = counted
        rounds = []
        t = time.monotonic_ns()  # the reload writes at the time it runs
        for step in range(3):
            if step == 2:  # one probe result of s0/b1
                d.steering.on_sample(("s0", "b1"), Sample(t_ns=t, ok=True, rtt_s=0.01))
            d.status.write_status(t + step * 1_000_000_000)
            rounds.append(sorted(written))
            written.clear()
        new = probed_doc(s2_weight=101)
        await d.reload(yaml.safe_dump(new))  # which writes the records itself
        d.status.write_status(t + 3 * 1_000_000_000)
        rounds.append(sorted(written))
        written.clear()
        d.status.write_status(t + 3 * 1_000_000_000 + int(edged_status.REFRESH_S * 1e9))
        rounds.append(sorted(written))
        return rounds, maps

    monkeypatch.setattr(
        edged_status.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )
    rounds, maps = asyncio.run(go())
    every = sorted(bid for name in ("s0", "s1", "s2") for bid in maps.ids(name)[1].values())
    assert rounds[0] == every
    assert rounds[1] == []  # nothing changed
    assert rounds[2] == [maps.ids("s0")[1]["b1"]]  # its probe count and RTT
    assert rounds[3] == sorted(maps.ids("s2")[1].values())  # the service the reload changed, once
    assert rounds[4] == every  # refreshed
    assert maps.probe[maps.ids("s2")[1]["b0"]].config_weight == 101


def test_what_the_status_loop_keeps_of_the_records_written_is_untracked_by_the_collector(monkeypatch):
    """What was written last is kept per backend as a tuple of atoms: the collector untracks it at
    its first collection (a ProbeStatus kept per backend was walked by every young collection)."""

    async def go():
        d = daemon(parse_config(probed_doc()))
        d.status.write_status(time.monotonic_ns())
        return d

    monkeypatch.setattr(
        edged_status.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )
    d = asyncio.run(go())
    kept = list(d.status._written.values())
    gc.collect()
    assert kept and not any(gc.is_tracked(k) for k in kept)


def test_the_record_says_what_the_backend_view_says(monkeypatch):
    """Status.record (built for every backend every second) and backend_view (status) agree on
    every field the record holds, with probe results, loads, an operator's drain and pin and a
    backend a reload left draining; a result that comes after a record was built is in the next."""
    from controlplane.samples import Load

    closed = socket.socket()  # bound, not listening: the prober's own probes are refused (no RTT)
    closed.bind(("127.0.0.1", 0))

    def result(d, key, sample: Sample) -> None:
        """A probe result as the prober delivers it: into the window, then to the steering."""
        d.steering.prober.window(key).add(sample)
        d.steering.on_sample(key, sample)

    async def go():
        cfg = parse_config(probed_doc())
        d = daemon(cfg)
        port = closed.getsockname()[1]
        d.steering.targets = lambda cfg: [Target(t.key, "127.0.0.1", port, t.probe) for t in steer.targets(cfg)]
        d.steering.set_services(cfg)  # the windows
        t = time.monotonic_ns()
        for j, rtt in enumerate((0.010, 0.020)):
            for k in range(5):
                ok = k != 3
                sample = Sample(t_ns=t + k, ok=ok, rtt_s=rtt if ok else None, error=None if ok else "timeout")
                result(d, ("s0", f"b{j}"), sample)
        d.steering.on_load(("s0", "b0"), Load(t_ns=t, ok=True, waiting=3.0, running=7.0, kv_usage=0.25))
        d.steering.step(d.state.services["s0"], t)
        await d.operate("drain", "s1", "b0")
        await d.operate("weight", "s1", "b1", 7)
        new = probed_doc()
        new["services"][2]["backends"] = new["services"][2]["backends"][:1]  # s2/b1 drains out
        await d.reload(yaml.safe_dump(new))
        await d.steering.prober.close()
        return d, time.monotonic_ns()

    routes = lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}  # noqa: E731
    monkeypatch.setattr(edged_status.deploy, "backend_routes", routes)
    try:
        d, now = asyncio.run(go())
    finally:
        closed.close()
    assert ("s2", "b1") in d.state.leaving
    fields = ("rtt_p50_s", "rtt_p99_s", "rtt_smoothed_s", "waiting", "running", "kv_usage", "probes_ok")
    fields += ("probes_failed", "state", "reason", "drained", "override")

    def agree() -> None:
        for name, st in d.state.services.items():
            for b in st.service.backends:
                view = d.status.backend_view(name, b.name, now, full=False)
                rec = d.status.record(name, b.name, b.weight)
                assert {f: getattr(rec, f) for f in fields} == {f: view.get(f) for f in fields}, (name, b.name)
                assert rec.leave_until_s == edged_status._leave_until_s(d.state.leaving.get((name, b.name)))

    agree()
    assert d.status.record("s0", "b0", 100).rtt_p99_s == 0.010
    assert d.status.record("s0", "b0", 100).waiting == 3 and d.status.record("s1", "b0", 100).drained
    for k in range(5):  # new results after a record was built: the next one has them
        result(d, ("s0", "b0"), Sample(t_ns=now + k, ok=True, rtt_s=0.5))
    assert d.status.record("s0", "b0", 100).rtt_p99_s == 0.5
    agree()
