"""What the agent puts on the wire: the heartbeats of one backend, packed as abi.heartbeat
(the layout bpf/include/abi.h declares), numbered within this run's epoch.

The router takes a heartbeat only from a newer epoch, or with a higher seq within the epoch it
last took (so a recorded heartbeat replayed later is refused). The epoch is the second the run
started and the first seq the microsecond within it: a run restarted within the same second
starts above every seq the run before could have sent (at most one per microsecond)."""

from __future__ import annotations

import time

from controlplane import abi

SEQ_MAX = 0xFFFFFFFF


def first_epoch_seq(wall_ns: int) -> tuple[int, int]:
    """This run's epoch (seconds since 1970, at least 1) and first seq (microseconds into that
    second), for a run starting at wall-clock time wall_ns."""
    return max(1, wall_ns // 1_000_000_000), (wall_ns % 1_000_000_000) // 1000


def next_epoch_seq(epoch: int, seq: int, wall_ns: int) -> tuple[int, int]:
    """(epoch, seq) of the heartbeat after (epoch, seq): seq + 1, or a newer epoch where seq
    would wrap."""
    if seq < SEQ_MAX:
        return epoch, seq + 1
    return max(epoch + 1, wall_ns // 1_000_000_000), 0


class Beats:
    """The heartbeat packets of one agent: packet() is the next one to send; sent() after it
    went out moves on to the following one."""

    def __init__(self, service_port: int, token: int):
        self.service_port = service_port
        self.token = token
        self.epoch, self.seq = first_epoch_seq(time.time_ns())

    def packet(self) -> bytes:
        return abi.heartbeat(self.service_port, self.seq, self.token, self.epoch)

    def sent(self) -> None:
        self.epoch, self.seq = next_epoch_seq(self.epoch, self.seq, time.time_ns())
