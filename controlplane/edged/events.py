"""What edged did and saw, in order: one Events log that writes each event to
stderr (a text line, or one JSON object per line), keeps the recent ones for
the API, and hands them to every subscribed watcher without ever blocking on a
slow one. The log writes to its own copy of fd 2, taken when it is made: the
loader points fd 2 at a buffer while bcc compiles or attaches, in worker
threads, and an event of the loop meanwhile would land in that buffer.

Every line has a level (syslog's: error, warning, notice, info, debug), from the
event's kind (level_of). Under systemd, whose journal reads stderr (JOURNAL_STREAM
names that stream), a line starts with journald's priority prefix, `<3>` for an
error, and without 'edged: ' (the journal names the program itself), so
`journalctl -u edged -p err` finds rejected reloads and failures. Elsewhere a text
line reads 'edged: error: ...'; a JSON line carries "severity". Lines below the
log level (--log-level) are not written; the API's watchers still get every event."""

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

ERR, WARNING, NOTICE, INFO, DEBUG = 3, 4, 5, 6, 7  # syslog priorities, as journald reads them
LEVELS = {"error": ERR, "warning": WARNING, "notice": NOTICE, "info": INFO, "debug": DEBUG}
LEVEL_NAMES = {n: name for name, n in LEVELS.items()}
# routine events (weights pushed, progress, discovery results, fleet snapshots) are info:
# --log-level notice leaves them out of the log
KIND_LEVELS = {
    "error": ERR,
    "fatal": ERR,
    "reload-rejected": ERR,
    "fleet-lost": ERR,
    "reload": NOTICE,
    "deployed": NOTICE,
    "adopted": NOTICE,
    "stopped": NOTICE,
    "api": NOTICE,
    "removed": NOTICE,
    "drain-node": NOTICE,
    "fleet-leader": NOTICE,
    "fleet-recovered": NOTICE,
    "fleet-operator": NOTICE,
}


def level_of(kind: str, fields: dict) -> int:
    """The syslog level of an event: its kind's, a backend leaving 'up' a warning, the data
    path not serving an error."""
    if kind == "datapath":
        return ERR if fields.get("serving") is False else NOTICE
    if kind == "probe-budget":
        return WARNING if fields.get("short") else NOTICE
    if kind == "state":
        return NOTICE if fields.get("new") == "up" else WARNING
    return KIND_LEVELS.get(kind, INFO)


def under_journal(fd: int) -> bool:
    """Whether fd is the stream systemd's journal reads (JOURNAL_STREAM is its 'dev:inode')."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def log_line(event: dict, level: int, json_lines: bool, journal: bool) -> str:
    """One event as a log line (with its newline)."""
    if json_lines:
        body = json.dumps({**event, "severity": LEVEL_NAMES[level]}, default=str)
    else:
        body = event["text"] if journal else f"{PROG}: {LEVEL_NAMES[level]}: {event['text']}"
    return (f"<{level}>{body}" if journal else body) + "\n"


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

    def __init__(
        self, json_lines: bool = False, keep: int = EVENTS_KEPT, level: int = INFO, journal: bool | None = None
    ):
        self.recent: deque[dict] = deque(maxlen=keep)
        self.queues: set[asyncio.Queue] = set()
        self.json_lines = json_lines
        self.level = level  # lines less severe than this are not written
        self._out = _own_stderr()
        if journal is None:
            journal = self._out is not None and under_journal(self._out.fileno())
        self.journal = journal

    def emit(self, kind: str, text: str, **fields) -> dict:
        event = {"t": time.time(), "kind": kind, "text": text, **fields}
        self.recent.append(event)
        level = level_of(kind, fields)
        if level <= self.level:
            out = self._out or sys.stderr
            # one write per event: lines never interleave
            out.write(log_line(event, level, self.json_lines, self.journal))
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
