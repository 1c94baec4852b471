"""What edged did and saw, in order: one Events log that writes each event to
stderr (a text line, or one JSON object per line), keeps the recent ones for
the API, and hands them to every subscribed watcher without ever blocking on a
slow one."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque

PROG = "edged"
EVENTS_KEPT = 512


def _log(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _log_json(event: dict) -> None:
    sys.stderr.write(json.dumps(event, default=str) + "\n")  # one write: lines never interleave
    sys.stderr.flush()


class Events:
    """What edged did and saw, in order: for the log, tests and API watchers.
    Each event is a dict with t (UNIX time), kind, and fields of its own."""

    def __init__(self, json_lines: bool = False, keep: int = EVENTS_KEPT):
        self.recent: deque[dict] = deque(maxlen=keep)
        self.queues: set[asyncio.Queue] = set()
        self.json_lines = json_lines

    def emit(self, kind: str, text: str, **fields) -> dict:
        event = {"t": time.time(), "kind": kind, "text": text, **fields}
        self.recent.append(event)
        if self.json_lines:
            _log_json(event)
        else:
            _log(text)
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
