"""Ending asyncio tasks within a bound: what edged's stop uses so that no source, member or
watcher task can hold a stop (and systemd's stop timeout) hostage. Pure asyncio, no I/O."""

from __future__ import annotations

import asyncio
from typing import Iterable

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
