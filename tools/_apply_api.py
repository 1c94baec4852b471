"""tools/bench-apply --api: the latency of edged's API while edged applies a full config at
the benchmark's size, with the apply on edged's loop (as before changes.apply_off_loop) and
off it, alternating in one run. A real Daemon over the benchmark's pinned maps (no probes,
no data path attached) serves its real gRPC API on a unix socket in a temporary directory;
a client thread calls it back to back (a grpc health check, or `edgectl status`'s GetStatus, summaries only)
from before the apply until after it. Each full apply is a fresh Maps (as after a restart):
every id planned from the maps, every Maglev table built again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import threading
import time


def _calls(client, which: str, stop: threading.Event, out: list) -> None:
    from controlplane.errors import EdgeError

    view = None
    if which == "status":
        from controlplane.statuspage import View

        view = View(summary=True)  # what `edgectl status` asks for at this size
    while not stop.is_set():
        t0, ok = time.monotonic(), True
        try:
            client.health() if view is None else client.status(view=view)
        except EdgeError:  # a walk past its deadline: counted as failed, with its latency
            ok = False
        out.append((t0, time.monotonic(), ok))


def _during(calls: list, start: float, end: float) -> tuple[list[float], int]:
    """(latencies in ms, failures) of the calls that overlapped [start, end]."""
    hit = [(b - a, ok) for a, b, ok in calls if b >= start and a <= end]
    return [d * 1e3 for d, _ in hit], sum(not ok for _, ok in hit)


def run(loaded, base, pairs: int) -> None:
    from controlplane import deploy
    from controlplane.api import server
    from controlplane.api.client import Client
    from controlplane.config import Node
    from controlplane.edged import daemon as edged
    from controlplane.edged.changes import apply_off_loop

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="edged-loop", daemon=True)
    thread.start()

    def on_loop(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(300)

    sockdir = tempfile.mkdtemp(prefix="bench-apply-")
    sock = os.path.join(sockdir, "edged.sock")

    async def make():
        d = edged.Daemon(base, "bench0")
        d.steering.targets = lambda cfg: []  # nothing probed: the API and the apply alone
        d.state.maps = deploy.open_maps(loaded)
        d.steering.set_services(base)
        return d, await server.start(d, Node(api_socket=sock))

    async def full_apply(d, off: bool) -> float:
        old, d.state.maps = d.state.maps, deploy.open_maps(loaded)  # fresh: a full apply
        old.close()
        t0 = time.monotonic()
        async with d.state.apply_lock:
            if off:
                await apply_off_loop(d.state, base, {})
            else:  # as edged applied before: on its loop
                d.state.maps.apply(deploy.adopted(d.state.maps, base), {})
        return time.monotonic() - t0

    d, handle = on_loop(make())
    results: dict[tuple[str, str], list[float]] = {}
    failed: dict[tuple[str, str], int] = {}
    applies: dict[str, list[float]] = {"on the loop": [], "off the loop": []}
    try:
        with Client(sock, timeout_s=60) as client:
            for _ in range(pairs):
                for which in ("health", "status"):
                    for off in (False, True):
                        mode = "off the loop" if off else "on the loop"
                        calls: list = []
                        stop = threading.Event()
                        caller = threading.Thread(target=_calls, args=(client, which, stop, calls))
                        caller.start()
                        time.sleep(0.3)
                        start = time.monotonic()
                        took = on_loop(full_apply(d, off))
                        end = start + took
                        time.sleep(0.1)
                        stop.set()
                        caller.join(120)
                        applies[mode].append(took)
                        ms, bad = _during(calls, start, end)
                        results.setdefault((which, mode), []).extend(ms)
                        failed[(which, mode)] = failed.get((which, mode), 0) + bad
    finally:
        on_loop(handle.stop(0.5))
        d.state.maps.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        shutil.rmtree(sockdir, ignore_errors=True)
    for mode, took in applies.items():
        print(f"  full apply {mode:12s}: {statistics.median(took) * 1e3:7.0f} ms wall (median of {len(took)})")
    for (which, mode), ms in sorted(results.items()):
        if ms:
            print(
                f"  API {which:6s} during a full apply, apply {mode:12s}: "
                f"{len(ms):4d} calls, p50 {statistics.median(ms):7.1f} ms, max {max(ms):7.1f} ms, "
                f"{failed[(which, mode)]} failed"
            )
