"""edged stops within its bound whatever its tasks do: a source whose retry loop takes the
cancellation of a gRPC call for a fault (an RpcError) and retries used to keep the discovery
supervisor's close(), and so edged's stop, waiting for ever (seen: > 15 s, then SIGKILL)."""

from __future__ import annotations

import asyncio

from controlplane.config import load_config_text
from controlplane.discovery import Failure
from controlplane.discovery.supervisor import Supervisor
from controlplane.tasks import cancel_all

CONFIG = """
version: 1
services:
  - name: web
    vip: 198.18.0.10
    port: 8000
    discovery:
      etcd: {endpoints: ["127.0.0.1:2379"], prefix: /edge/services/web/}
"""


class Swallowing:
    """A source like one whose gRPC call, cancelled midway, raises a fault it retries after."""

    kind, watched = "etcd", True

    def __init__(self):
        self.swallowed = 0

    async def run(self, report) -> None:
        for _ in range(100):  # ends by itself after ~10 s: the test is bounded on any code
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                self.swallowed += 1  # as `except grpc.RpcError` would on a cancelled call
                if self.swallowed > 1:  # a second cancel lands outside the call
                    raise
            await report(Failure("etcd: cancelled"))


async def _swallower(n: list) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            n.append(1)
            if len(n) >= 3:
                raise


def test_cancel_all_cancels_again_until_a_task_ends():
    async def main():
        n: list = []
        t = asyncio.create_task(_swallower(n))
        await asyncio.sleep(0)
        left = await cancel_all([t], within_s=2.0)
        return left, t, n

    left, t, n = asyncio.run(main())
    assert left == [] and t.cancelled() and len(n) == 3


def test_cancel_all_gives_up_at_its_bound():
    async def forever():
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    async def main():
        t = asyncio.create_task(forever())
        await asyncio.sleep(0)
        left = await cancel_all([t], within_s=0.2)
        assert left == [t]
        return left

    loop = asyncio.new_event_loop()
    try:
        assert len(loop.run_until_complete(main())) == 1
    finally:
        for task in asyncio.all_tasks(loop):  # the test's own immortal task: dropped with its loop
            task._log_destroy_pending = False
        loop.close()


def test_supervisor_close_ends_a_source_that_swallows_its_cancel(monkeypatch):
    cfg = load_config_text(CONFIG)
    source = Swallowing()
    monkeypatch.setattr("controlplane.discovery.supervisor.make_source", lambda s: source)

    async def main():
        events = []
        sup = Supervisor(apply=lambda: asyncio.sleep(0), emit=lambda *a, **k: events.append(a))
        sup.configure(cfg, {"web": None})
        sup.start()
        await asyncio.sleep(0.05)
        await asyncio.wait_for(sup.close(), 2.0)  # before: waited for the source to end by itself
        return source.swallowed

    assert asyncio.run(main()) >= 1
