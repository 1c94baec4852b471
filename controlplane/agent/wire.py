"""What the agent puts on the wire: the heartbeats of one backend, packed as abi.heartbeat
(the layout bpf/include/abi.h declares), numbered from 0 for each one sent."""

from __future__ import annotations

from controlplane import abi


class Beats:
    """The heartbeat packets of one agent: packet() is the next one to send; sent() after it
    went out moves on to the following one."""

    def __init__(self, service_port: int, token: int):
        self.service_port = service_port
        self.token = token
        self.seq = 0

    def packet(self) -> bytes:
        return abi.heartbeat(self.service_port, self.seq, self.token)

    def sent(self) -> None:
        self.seq += 1
