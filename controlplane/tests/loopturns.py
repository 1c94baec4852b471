"""LoopTurns: other work on a test's asyncio loop, counting its turns, so that a test can tell
whether the code under test gave the loop back between two steps (the turn count moved)."""

from __future__ import annotations

import asyncio


class LoopTurns:
    """Use inside a running loop: `with LoopTurns() as other:` ... `other.n` is the turns so far."""

    def __init__(self) -> None:
        self.n = 0
        self._task: asyncio.Future | None = None

    async def _spin(self) -> None:
        while True:
            self.n += 1
            await asyncio.sleep(0)

    def __enter__(self) -> LoopTurns:
        self._task = asyncio.ensure_future(self._spin())
        return self

    def __exit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
