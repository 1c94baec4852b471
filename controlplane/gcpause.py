"""The cyclic collector held off while a status call's objects are alive (gcpause.paused()).

A full status at 10,000 backends makes about a million objects (the walk's rows, the snapshot's
dicts and lists, the message's arguments) that live for the seconds of the call. With the
collector on, the young collections in those seconds walk them, promote them to the old
generation, and so bring on full collections that walk them again: 55-604 ms each with the
interpreter held, what made edged's API calls wait (tools/bench-probe --scale --gc-log;
docs/design-decisions.md). With the collector off for the call's span they are allocated and
freed by their reference counts alone and never promoted. Garbage cycles made meanwhile (by
anything in the process) wait for the span's end: a young collection is run then, when the last
of the paused spans ends.

Bounded: paused spans nest and overlap (a count, from any thread); a span that starts when the
collector has been off for PAUSE_MAX_S already is not counted, so calls that keep overlapping
cannot hold it off for longer than PAUSE_MAX_S and the longest of them. A collector that was off
already (gc.disable by someone else) is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Iterator

# a span that starts this long after the collector went off runs with it on when the others end
PAUSE_MAX_S = 30.0

_lock = threading.Lock()
_held = 0  # paused spans counted and not ended
_off_since = 0.0  # time.monotonic() when this module turned the collector off


def _enter() -> bool:
    """Counts a span in (turning the collector off at the first); False: not counted."""
    global _held, _off_since
    with _lock:
        if _held == 0:
            if not gc.isenabled():  # off by someone else: theirs to turn on
                return False
            gc.disable()
            _off_since = time.monotonic()
        elif time.monotonic() - _off_since > PAUSE_MAX_S:
            return False
        _held += 1
        return True


def _leave() -> None:
    """Counts a span out; the last turns the collector on and collects the young generation."""
    global _held
    with _lock:
        _held -= 1
        if _held:
            return
        gc.enable()
    gc.collect(0)  # the cycles made while it was off (a young collection: the span's objects are freed)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the with block's span (on again when the last such span ends, an
    exception's included). What the block makes should be freed before it ends: whatever of it is
    still alive then is walked by the young collection that follows."""
    counted = _enter()
    try:
        yield
    finally:
        if counted:
            _leave()


def held() -> int:
    """Paused spans in progress (tests, and a view of the collector's state)."""
    return _held
