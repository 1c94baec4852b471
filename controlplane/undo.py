"""Undo: the steps that reverse what a change to the node did, run newest first. deploy and
the data-path watch push one step per attach, pin or netlink change (loader.py, netlink.py),
and maps.Journal one per map entry written, so a failure leaves things as they were. Knows
nothing of what the steps do."""

from __future__ import annotations

from typing import Callable


class Undo:
    """Steps that reverse what was done, run newest first by rollback()."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], None]]] = []

    def push(self, what: str, step: Callable[[], None]) -> None:
        self._steps.append((what, step))

    def rollback(self) -> list[str]:
        """Runs every step; returns the ones that failed, as messages."""
        failed = []
        while self._steps:
            what, step = self._steps.pop()
            try:
                step()
            except Exception as e:  # keep undoing the rest whatever one step raised
                failed.append(f"{what}: {e}")
        return failed

    def forget(self) -> None:
        self._steps.clear()
