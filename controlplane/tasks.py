"""Ending asyncio tasks within a bound: what edged's stop uses so that no source, member or
watcher task can hold a stop (and systemd's stop timeout) hostage; and `within`, the one
wait with a deadline the product uses, which never loses a cancel. Pure asyncio, no I/O."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Iterable, TypeVar

T = TypeVar("T")

RECANCEL_S = 0.05  # a task still running this long after a cancel is cancelled again


async def cancel_all(tasks: Iterable[asyncio.Task], within_s: float) -> list[asyncio.Task]:
    """Cancels tasks and waits at most within_s for them to end. A task that swallowed its
    cancellation (a gRPC call cancelled midway surfaces as an RpcError, which a retry loop
    takes for a fault and retries; asyncio.wait_for can lose a cancel that races its
    timeout) is cancelled again every RECANCEL_S. Returns the tasks still running after."""
    loop = asyncio.get_running_loop()
    pending = {t for t in tasks if not t.done()}
    deadline = loop.time() + within_s
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: no "never retrieved" warning at exit
    return list(pending)


async def within(aw: Awaitable[T], seconds: float) -> T:
    """aw's result, or TimeoutError after seconds; what asyncio.wait_for does, except that a
    cancel of the caller always ends it. Python 3.11's wait_for returns the inner result when
    the cancel and the inner's completion fall in the same loop step, so the cancel is lost
    (a fleet member cancelled as a report arrived kept leading and its stop never ended);
    asyncio.timeout counts cancels and keeps the caller's."""
    async with asyncio.timeout(seconds):
        return await aw
