"""What the agent puts on the wire: the heartbeats of one backend, packed as abi.heartbeat
(the layout bpf/include/abi.h declares) and MACed under the backend's own key.

Each heartbeat is stamped with the clock: epoch is the CLOCK_TAI second it is sent in (the
router refuses one more than abi.HB_WINDOW_S away from its own CLOCK_TAI) and seq the
microsecond within it. The router takes a heartbeat only with a newer epoch, or a higher seq
in the same one, so a recorded heartbeat replayed later is refused; two in one microsecond, or
a clock that steps back, take the last (epoch, seq) plus one instead. A run restarted in the
same second starts above every seq the run before could have sent (at most one per
microsecond)."""

from __future__ import annotations

import time

from controlplane import abi

SEQ_MAX = 0xFFFFFFFF


def clock_ns() -> int:
    """The clock heartbeats are stamped with: CLOCK_TAI, as the router's data path reads it."""
    return time.clock_gettime_ns(time.CLOCK_TAI)


def first_epoch_seq(wall_ns: int) -> tuple[int, int]:
    """(epoch, seq) of a heartbeat sent at clock time wall_ns: the second (at least 1) and the
    microsecond within it."""
    return max(1, wall_ns // 1_000_000_000), (wall_ns % 1_000_000_000) // 1000


def next_epoch_seq(epoch: int, seq: int, wall_ns: int) -> tuple[int, int]:
    """(epoch, seq) of the heartbeat after (epoch, seq), sent at wall_ns: its clock stamp when
    that is newer, else seq + 1 (a newer epoch where seq would wrap)."""
    now = first_epoch_seq(wall_ns)
    if now > (epoch, seq):
        return now
    if seq < SEQ_MAX:
        return epoch, seq + 1
    return epoch + 1, 0


class Beats:
    """The heartbeat packets of one agent: packet() is the next one to send; sent() after it
    went out moves on to the following one."""

    def __init__(self, service_port: int, token: int):
        self.service_port = service_port
        self.token = token
        self.epoch, self.seq = first_epoch_seq(clock_ns())

    def packet(self) -> bytes:
        return abi.heartbeat(self.service_port, self.seq, self.token, self.epoch)

    def sent(self) -> None:
        self.epoch, self.seq = next_epoch_seq(self.epoch, self.seq, clock_ns())
