"""The agent's clocks: absolute deadlines that never drift (Ticker), a stop flag a signal
handler may set (StopFlag), and sleeping until a deadline while watching that flag."""

from __future__ import annotations

import time
from typing import Callable

MAX_NAP_S = 0.05  # longest single sleep, so a stop request is seen within this


class Ticker:
    """Absolute deadlines start_ns + k * interval_ns. A late tick is taken once and the
    deadlines already past are skipped (counted), so the sender neither drifts nor bunches."""

    def __init__(self, start_ns: int, interval_ns: int):
        if interval_ns <= 0:
            raise ValueError(f"interval_ns: {interval_ns} is not positive")
        self.start_ns = start_ns
        self.interval_ns = interval_ns
        self.k = 0

    @property
    def deadline_ns(self) -> int:
        return self.start_ns + self.k * self.interval_ns

    def advance(self, now_ns: int) -> int:
        """Move to the next deadline after now_ns (at least one step); return how many were skipped."""
        due = (now_ns - self.start_ns) // self.interval_ns + 1
        step = max(1, due - self.k)
        self.k += step
        return step - 1


class StopFlag:
    """Set once to stop a loop. Unlike threading.Event it takes no lock, so a signal handler
    may set it whatever the interrupted code was doing."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def sleep_until(
    deadline_ns: int,
    stop: StopFlag,
    clock: Callable[[], int] = time.monotonic_ns,
    nap: Callable[[float], None] = time.sleep,
) -> bool:
    """Sleep until deadline_ns on the monotonic clock in naps of at most MAX_NAP_S; False if
    stop was set first. (time.sleep is clock_nanosleep here: precise to the timer slack.)"""
    while not stop.is_set():
        left_ns = deadline_ns - clock()
        if left_ns <= 0:
            return True
        nap(min(left_ns / 1e9, MAX_NAP_S))
    return False
