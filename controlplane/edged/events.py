"""What edged did and saw, in order: one Events log that writes each event to
stderr (a text line, or one JSON object per line), keeps the recent ones for
the API, and hands them to every subscribed watcher without ever blocking on a
slow one. The log writes to its own copy of fd 2, taken when it is made: the
loader points fd 2 at a buffer while bcc compiles or attaches, in worker
threads, and an event of the loop meanwhile would land in that buffer."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import time
from collections import deque

PROG = "edged"
EVENTS_KEPT = 512


def _own_stderr() -> io.TextIOBase | None:
    """A line-buffered stream on a copy of stderr's fd; None when stderr has no fd (a test's
    stand-in), which is then written as it is."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return None
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="backslashreplace")


class Events:
    """What edged did and saw, in order: for the log, tests and API watchers.
    Each event is a dict with t (UNIX time), kind, and fields of its own."""

    def __init__(self, json_lines: bool = False, keep: int = EVENTS_KEPT):
        self.recent: deque[dict] = deque(maxlen=keep)
        self.queues: set[asyncio.Queue] = set()
        self.json_lines = json_lines
        self._out = _own_stderr()

    def emit(self, kind: str, text: str, **fields) -> dict:
        event = {"t": time.time(), "kind": kind, "text": text, **fields}
        self.recent.append(event)
        out = self._out or sys.stderr
        # one write per event: lines never interleave
        out.write(json.dumps(event, default=str) + "\n" if self.json_lines else f"{PROG}: {text}\n")
        out.flush()
        for q in list(self.queues):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:  # a watcher that does not read loses events, not edged
                pass
        return event

    def subscribe(self, size: int = 1024) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(size)
        self.queues.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self.queues.discard(q)
