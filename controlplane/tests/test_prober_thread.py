"""The prober on a thread of its own (probe.threaded; edged's before probe.child), as edged's: a
probe round held on the prober's side leaves edged's loop free, results still reach the steering
on edged's loop, calls cross both ways, and a stop ends the prober's thread. Real TCP servers on 127.0.0.1, edged's parts over
FakeMaps (edgedstage), unprivileged."""

from __future__ import annotations

import asyncio
import threading
import time

from controlplane.edged import steer
from controlplane.probe import Target, checks
from controlplane.probe.threaded import THREAD_NAME, ThreadedProber
from controlplane.tests import edgedstage
from controlplane.tests.proberstage import LOOPBACK, run, wait_for

HOLD_S = 3.0  # a held probe round waits at most this long for edged's loop to release it
PROBE = {"health": {"probe": {"kind": "tcp", "interval_ms": 50, "timeout_ms": 50, "fall": 2, "rise": 1}}}


async def _listening() -> asyncio.AbstractServer:
    """A TCP server on 127.0.0.1 that accepts and closes."""

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return await asyncio.start_server(accepted, LOOPBACK, 0)


def _daemon(port: int, backends=("b0", "b1")):
    """edged over FakeMaps whose backends are probed on 127.0.0.1:port."""
    cfg = edgedstage.config(backends, **PROBE)
    d = edgedstage.daemon(cfg)
    st = d.steering
    st.prober = d.status.prober = ThreadedProber(on_sample=st.on_sample, on_load=st.on_load, on_budget=st.on_budget)
    d.steering.targets = lambda cfg: [Target(t.key, LOOPBACK, port, t.probe) for t in steer.targets(cfg)]
    d.steering.set_services(cfg)
    return d


def _prober_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def test_edgeds_loop_runs_while_a_probe_round_is_held(monkeypatch):
    """A probe round that does not return (here: held until edged's loop releases it) leaves
    edged's loop running: edged's loop releases it, and the probes' results come in after."""
    entered, released = threading.Event(), threading.Event()
    outcome: list[bool] = []
    tick = checks._TcpCheck.tick

    def held_tick(self, due_ns: int) -> None:
        if not entered.is_set():
            entered.set()
            outcome.append(released.wait(HOLD_S))  # True: released from edged's loop in time
        tick(self, due_ns)

    monkeypatch.setattr(checks._TcpCheck, "tick", held_tick)

    async def main() -> tuple:
        server = await _listening()
        d = _daemon(server.sockets[0].getsockname()[1])
        seen: list[int] = []
        on_sample = d.steering.prober.on_sample

        def counted(key, sample) -> None:
            seen.append(threading.get_ident())
            on_sample(key, sample)

        d.steering.prober.on_sample = counted
        try:
            deadline = time.monotonic() + HOLD_S
            while not entered.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)  # edged's loop turns: a poll, not a wait for the condition
            released.set()
            await wait_for(lambda: len(seen) >= 4, 5, "samples on edged's loop")
            window = d.steering.prober.window(("web", "b0"))
            return outcome, set(seen), len(window.samples) if window else 0
        finally:
            await d.steering.prober.close()
            server.close()

    outcome, threads, in_window = run(main())
    assert outcome == [True]  # edged's loop released the held round: it was not held with it
    assert threads == {threading.get_ident()}  # the steering heard every result on edged's loop
    assert in_window >= 1  # and the windows (status reads them there) got them


def test_calls_cross_to_the_prober_and_a_close_ends_its_thread():
    async def main() -> tuple:
        server = await _listening()
        before = len(_prober_threads())
        d = _daemon(server.sockets[0].getsockname()[1])
        prober = d.steering.prober
        try:
            running = len(_prober_threads()) - before
            keys = sorted(prober.keys())
            prober.relax([("web", "b0")], time.monotonic_ns() + 10**10)
            await wait_for(lambda: prober.relaxed(("web", "b0")), 3, "b0 relaxed")
            b1_relaxed = prober.relaxed(("web", "b1"))
            prober.relax([("web", "b0")], 0)
            await wait_for(lambda: not prober.relaxed(("web", "b0")), 3, "b0 back at the full rate")
            d.steering.set_services(edgedstage.config(("b0",), **PROBE))  # b1 removed
            keys_after = prober.keys()
            gone = prober.window(("web", "b1"))
        finally:
            await prober.close()
            server.close()
        return running, keys, b1_relaxed, keys_after, gone, len(_prober_threads()) - before

    running, keys, b1_relaxed, keys_after, gone, left = run(main())
    assert running == 1
    assert keys == [("web", "b0"), ("web", "b1")]
    assert not b1_relaxed
    assert keys_after == [("web", "b0")] and gone is None  # set_targets took effect before it returned
    assert left == 0  # close() joined the prober's thread


def test_edged_without_probed_backends_starts_no_prober_thread():
    before = len(_prober_threads())

    def go() -> int:
        edgedstage.daemon()  # no backend probed
        return len(_prober_threads()) - before

    assert edgedstage.on_loop(go) == 0


def test_edgeds_stop_ends_the_probers_thread():
    """What SIGTERM runs (Daemon.close, after the loops are cancelled): the prober's thread
    ends with it, its sockets closed; nothing of the prober outlives edged's stop."""

    async def main() -> tuple:
        server = await _listening()
        before = len(_prober_threads())
        d = _daemon(server.sockets[0].getsockname()[1])
        try:
            running = len(_prober_threads()) - before
            await wait_for(lambda: d.steering.prober.window(("web", "b0")).samples, 3, "b0 probed")
            await d.close()
            return running, len(_prober_threads()) - before, d.steering.prober.running
        finally:
            server.close()

    running, left, still = run(main())
    assert running == 1 and left == 0 and not still


def test_grpc_probes_run_on_the_probers_loop_beside_a_grpc_server_on_the_callers():
    """grpc.aio on two loops of one process: edged's API server on edged's loop, the grpc
    health probes' channels on the prober's."""
    from controlplane.config import Probe
    from controlplane.probe.threaded import ThreadedProber
    from controlplane.tests.proberstage import Recorder
    from controlplane.tests.test_prober import GrpcServer

    async def main() -> tuple:
        server = await GrpcServer().start()
        rec = Recorder()
        p = ThreadedProber(on_sample=rec.sample)
        probe = Probe(kind="grpc", grpc_service="chat", interval_ms=250, timeout_ms=250)
        try:
            p.set_targets([Target("chat", LOOPBACK, server.port, probe)])
            await wait_for(lambda: len(rec.of("chat")) >= 3, 5, "3 samples", observe=lambda: rec.errors("chat"))
            return rec.of("chat")[-2:]
        finally:
            await p.close()
            await server.close()

    samples = run(main())
    assert all(s.ok for s in samples), samples
