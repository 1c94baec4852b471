"""Ctrl-C at a safe point: a change to the node and the undo step pushed for it happen
together (deploy.py), so an interrupted deploy rolls back all it did. Signals only; no I/O."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Holds back a Ctrl-C (SIGINT) until the block is done, so a change to the node and the
    undo step pushed for it happen together: an interrupted deploy then rolls back all it did.
    Only on the main thread, which alone runs Python's signal handlers (edged deploys on a
    worker thread, and its loop handles the signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if got:
            signal.raise_signal(signal.SIGINT)  # the handler there before (KeyboardInterrupt) runs now
