"""edged's prober in a child process (probe.child): results reach the steering on edged's loop and
its Windows, calls cross both ways, the budget's shortfall is reported, a close or edged's stop
ends the child, a child whose parent is killed (SIGKILL) exits on its own, and a child that dies is
reported and started again. Real TCP servers on 127.0.0.1, real child processes, edged's parts
over FakeMaps (edgedstage), unprivileged."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

from controlplane.config import Probe
from controlplane.edged import steer
from controlplane.probe import Target
from controlplane.probe.child import ChildProber
from controlplane.tests import edgedstage
from controlplane.tests.loopturns import LoopTurns
from controlplane.tests.proberstage import LOOPBACK, Recorder, run, wait_for

PROBE = {"health": {"probe": {"kind": "tcp", "interval_ms": 50, "timeout_ms": 50, "fall": 2, "rise": 1}}}
TCP = Probe(kind="tcp", interval_ms=50, timeout_ms=50)
GONE_WITHIN_S = 5.0


async def _listening() -> asyncio.AbstractServer:
    """A TCP server on 127.0.0.1 that accepts and closes."""

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return await asyncio.start_server(accepted, LOOPBACK, 0)


def _daemon(port: int, backends=("b0", "b1")):
    """edged over FakeMaps whose backends are probed on 127.0.0.1:port."""
    cfg = edgedstage.config(backends, **PROBE)
    d = edgedstage.daemon(cfg)
    d.steering.targets = lambda cfg: [Target(t.key, LOOPBACK, port, t.probe) for t in steer.targets(cfg)]
    d.steering.set_services(cfg)
    return d


def _alive(pid: int) -> bool:
    """Whether process pid is there and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_results_reach_edgeds_loop_and_calls_cross_to_the_child():
    async def main() -> tuple:
        server = await _listening()
        d = _daemon(server.sockets[0].getsockname()[1])
        prober = d.steering.prober
        seen: list[int] = []
        on_sample = prober.on_sample

        def counted(key, sample) -> None:
            seen.append(threading.get_ident())
            on_sample(key, sample)

        prober.on_sample = counted
        try:
            pid = prober.pid
            await wait_for(lambda: len(seen) >= 4, 5, "samples on edged's loop")
            in_window = len(prober.window(("web", "b0")).samples)
            keys = sorted(prober.keys())
            prober.relax([("web", "b0")], time.monotonic_ns() + 10**10)
            await wait_for(lambda: prober.relaxed(("web", "b0")), 3, "b0 relaxed")
            b1_relaxed = prober.relaxed(("web", "b1"))
            prober.relax([("web", "b0")], 0)
            await wait_for(lambda: not prober.relaxed(("web", "b0")), 3, "b0 back at the full rate")
            d.steering.set_services(edgedstage.config(("b0",), **PROBE))  # b1 removed
            keys_after, gone = prober.keys(), prober.window(("web", "b1"))
            ok_b0 = d.state.observer.probes("web", "b0")[0]
        finally:
            await prober.close()
            server.close()
        return pid, set(seen), in_window, keys, b1_relaxed, keys_after, gone, ok_b0

    pid, threads, in_window, keys, b1_relaxed, keys_after, gone, ok_b0 = run(main())
    assert pid != os.getpid() and not _alive(pid)  # a process of its own, ended by close()
    assert threads == {threading.get_ident()}  # the steering heard every result on edged's loop
    assert in_window >= 1 and ok_b0 >= 1  # the windows (status reads them) and the steering got them
    assert keys == [("web", "b0"), ("web", "b1")] and not b1_relaxed
    assert keys_after == [("web", "b0")] and gone is None  # set_targets took effect before it returned


def test_edged_without_probed_backends_starts_no_child():
    d = edgedstage.on_loop(lambda: edgedstage.daemon())  # no backend probed
    assert d.steering.prober.pid is None


def test_edgeds_stop_ends_the_child():
    """What SIGTERM runs (Daemon.close, after the loops are cancelled): the child ends with it."""

    async def main() -> tuple:
        server = await _listening()
        d = _daemon(server.sockets[0].getsockname()[1])
        try:
            pid = d.steering.prober.pid
            await wait_for(lambda: d.steering.prober.window(("web", "b0")).samples, 3, "b0 probed")
            await d.close()
            return pid, _alive(pid), d.steering.prober.running
        finally:
            server.close()

    pid, alive, running = run(main())
    assert pid is not None and not alive and not running


def test_a_shortfall_is_reported_from_the_child():
    """10 targets every 50 ms ask for 200 probes/s; a budget of 100 stretches every interval 2x."""

    async def main() -> tuple:
        server = await _listening()
        port = server.sockets[0].getsockname()[1]
        budgets: list = []
        p = ChildProber(on_budget=budgets.append, budget_per_s=100)
        try:
            p.set_targets([Target(("s", i), LOOPBACK, port, TCP) for i in range(10)])
            short_on_return = p.short
            await wait_for(lambda: budgets, 3, "the shortfall reported")
            return short_on_return, budgets[0], p.stretch
        finally:
            await p.close()
            server.close()

    short_on_return, b, stretch = run(main())
    assert short_on_return and b.short and b.demand_per_s == 200 and stretch >= 2.0


def test_a_child_that_dies_is_reported_and_started_again():
    async def main() -> tuple:
        server = await _listening()
        port = server.sockets[0].getsockname()[1]
        rec, restarts = Recorder(), []
        p = ChildProber(on_sample=rec.sample, on_restart=restarts.append)
        try:
            p.set_targets([Target("a", LOOPBACK, port, TCP)])
            first = p.pid
            await wait_for(lambda: rec.of("a"), 3, "a probed")
            os.kill(first, signal.SIGKILL)
            await wait_for(lambda: restarts, 3, "the death reported")
            await wait_for(lambda: p.running and p.pid != first, 5, "another child")
            before = len(rec.of("a"))
            await wait_for(lambda: len(rec.of("a")) > before + 2, 5, "a probed again")
            return first, p.pid, restarts, p.restarts, len(p.window("a").samples)
        finally:
            await p.close()
            server.close()

    first, second, restarts, count, in_window = run(main())
    assert second != first and not _alive(first) and not _alive(second)
    assert count == 1 and len(restarts) == 1 and f"child process {first} ended (killed by signal 9" in restarts[0]
    assert in_window >= 3  # the window went on


CHILD_OF_KILLED = textwrap.dedent(
    """
    import asyncio, sys
    from controlplane.config import Probe
    from controlplane.probe import Target
    from controlplane.probe.child import ChildProber

    async def main():
        p = ChildProber()
        p.set_targets([Target("a", "127.0.0.1", int(sys.argv[1]), Probe(kind="tcp", interval_ms=50, timeout_ms=50))])
        print(p.pid, flush=True)
        await asyncio.sleep(30)

    asyncio.run(main())
    """
)


def test_a_child_whose_parent_is_killed_exits():
    """edged killed with SIGKILL (no close, no stop): its prober's child sees its socket end and exits."""

    async def main() -> tuple:
        server = await _listening()
        port = server.sockets[0].getsockname()[1]
        parent = subprocess.Popen([sys.executable, "-c", CHILD_OF_KILLED, str(port)], stdout=subprocess.PIPE, text=True)
        try:
            line = await asyncio.to_thread(parent.stdout.readline)
            child = int(line)
            alive_before = _alive(child)
            parent.kill()
            await asyncio.to_thread(parent.wait, GONE_WITHIN_S)
            await wait_for(lambda: not _alive(child), GONE_WITHIN_S, "the orphaned child to exit")
            return alive_before, child
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
            server.close()

    alive_before, child = run(main())
    assert alive_before and not _alive(child)


def test_results_that_piled_up_are_handled_a_slice_at_a_time(monkeypatch):
    """Frames read at once (what the child sent while edged's loop was busy) reach on_sample in
    the order sent, with the loop given back between slices of them (they were handled in one
    callback: up to 338 ms at 10,000 backends). The caller's side of a real socketpair; the test
    writes the child's frames itself, so that they are there before the loop reads any."""
    from controlplane.probe import child as child_mod
    from controlplane.samples import Sample

    monkeypatch.setattr(child_mod, "DELIVER_SLICE_NS", 0)  # a slice per chunk of results

    async def go():
        loop = asyncio.get_running_loop()
        seen = []
        other = LoopTurns()
        prober = ChildProber(on_sample=lambda key, sample: seen.append((key, sample.t_ns, other.n)))
        mine, theirs = socket.socketpair()
        prober._home, prober._sock = loop, mine
        mine.setblocking(False)
        frames = b"".join(
            child_mod._frame(
                ("batch", [("s", f"k{f}", Sample(t_ns=f * 1000 + i, ok=True), False) for i in range(200)], None)
            )
            for f in range(3)
        )
        theirs.sendall(frames)

        loop.add_reader(mine.fileno(), prober._readable)
        try:
            with other:
                for _ in range(1000):  # bounded
                    if len(seen) == 600:
                        break
                    await asyncio.sleep(0.001)
        finally:
            loop.remove_reader(mine.fileno())
            mine.close()
            theirs.close()
        return seen

    seen = asyncio.run(go())
    assert [(k, t) for k, t, _ in seen] == [(f"k{f}", f * 1000 + i) for f in range(3) for i in range(200)]
    turns = [turn for _, _, turn in seen]
    assert len(set(turns)) >= 600 // 64, sorted(set(turns))  # the loop ran between the slices
