"""The drill's capture: a child process with one AF_PACKET socket on each backend's veth, which
records, with kernel timestamps, each flow's first packet, the backends' heartbeats and RSTs, and
what the kernel dropped. Started before the traffic, stopped and read after it.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import selectors
import signal
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controlplane.drill.frames import ETH_HLEN
from controlplane.drill.plan import DrillError

if TYPE_CHECKING:
    from controlplane.lab.topo import Net

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # sll_pkttype (linux/if_packet.h)
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
CAPTURE_RCVBUF = 64 << 20
TCP_SYN, TCP_RST, TCP_ACK = 0x02, 0x04, 0x10
PROTO = {"tcp": 6, "udp": 17}


@dataclass
class Seen:
    """What the capture saw on one backend's veth, times in time.monotonic_ns()."""

    first: dict[int, int] = field(default_factory=dict)  # client source port -> arrival of its first packet
    refused: dict[int, int] = field(default_factory=dict)  # client source port -> the backend's RST to it
    heartbeats: list[int] = field(default_factory=list)  # departures of the backend's heartbeats
    dropped: int = 0  # frames the kernel dropped for the capture socket
    frames: int = 0
    down: bool = False  # the interface went down (link mode)


@dataclass
class Captured:
    backends: list[Seen]
    clock_error_ns: int  # uncertainty of the realtime -> monotonic conversion of kernel timestamps


def _realtime_offset() -> tuple[int, int]:
    """(CLOCK_REALTIME - CLOCK_MONOTONIC in ns, uncertainty in ns), best of a few reads."""
    best = None
    for _ in range(20):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[1]:
            best = (r - (m0 + m1) // 2, m1 - m0)
    return best


@dataclass(frozen=True)
class _Match:
    """Which frames matter: flows from client to port/proto (arriving), heartbeats and RSTs (leaving)."""

    client_ip: bytes
    proto: int
    port: int
    hb_port: int | None
    offset_ns: int  # CLOCK_REALTIME - CLOCK_MONOTONIC


def _capture_main(
    conn,
    where: list[tuple[str, str]],
    client: str,
    proto: int,
    port: int,
    hb_port: int | None,
    max_frames: int,
    deadline_s: float,
) -> None:
    """Child process: capture on each (netns path, ifname) until told to stop or deadline_s passes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    from controlplane.lab.topo import _setns

    socks = []
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        for path, ifname in where:
            fd = os.open(path, os.O_RDONLY)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            _setns(home)
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, CAPTURE_RCVBUF)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.bind((ifname, ETH_P_ALL))
            sock.setblocking(False)
            socks.append(sock)
    finally:
        os.close(home)
    for sock in socks:  # before bind() a socket sees every interface of its namespace: forget that
        while True:
            try:
                sock.recv(1)
            except BlockingIOError:
                break
    offset, err = _realtime_offset()
    match = _Match(socket.inet_aton(client), proto, port, hb_port, offset)
    seen = [Seen() for _ in socks]
    sel = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        sel.register(sock, selectors.EVENT_READ, i)
    sel.register(conn, selectors.EVENT_READ, None)
    conn.send("ready")
    deadline = time.monotonic() + deadline_s
    stop = False
    while not stop and sum(b.frames for b in seen) < max_frames:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(min(left, 0.05)):
            if key.data is None:
                conn.recv()
                stop = True  # read once more below, then report
                continue
            _read(socks[key.data], seen[key.data], match)
            if seen[key.data].down:
                sel.unregister(socks[key.data])
    for sock, b in zip(socks, seen):
        if not b.down:
            _read(sock, b, match)
        _packets, b.dropped = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        sock.close()
    offset2, err2 = _realtime_offset()
    conn.send(Captured(seen, max(err, err2) + abs(offset2 - offset)))
    conn.close()


def _read(sock: socket.socket, seen: Seen, m: _Match) -> None:
    """Read what is queued on one backend's capture socket into seen."""
    while True:
        try:
            data, anc, _flags, addr = sock.recvmsg(128, socket.CMSG_SPACE(16))
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno == errno.ENETDOWN:  # link mode took the interface down: nothing more comes
                seen.down = True
                return
            raise
        seen.frames += 1
        if len(data) < ETH_HLEN + 20 + 8 or data[12:14] != b"\x08\x00":
            continue
        stamp = None
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", value[:16])
                stamp = sec * 1_000_000_000 + nsec - m.offset_ns
        if stamp is None:
            stamp = time.monotonic_ns()
        ip = ETH_HLEN
        l4 = ip + (data[ip] & 0x0F) * 4
        if len(data) < l4 + 14:
            continue
        sport, dport = struct.unpack_from("!HH", data, l4)
        proto = data[ip + 9]
        if addr[2] == PACKET_OUTGOING:
            if m.hb_port is not None and proto == 17 and dport == m.hb_port:
                seen.heartbeats.append(stamp)
            elif proto == 6 == m.proto and sport == m.port and data[l4 + 13] & TCP_RST:
                seen.refused.setdefault(dport, stamp)
            continue
        if proto != m.proto or dport != m.port or data[ip + 12 : ip + 16] != m.client_ip:
            continue
        if proto == 6 and data[l4 + 13] & (TCP_SYN | TCP_ACK) != TCP_SYN:
            continue  # the client's RSTs and ACKs of a flow already seen
        seen.first.setdefault(sport, stamp)


class Capture:
    """The capture child process: started before the traffic, stopped and read after it."""

    def __init__(self, net: "Net", proto: int, port: int, hb_port: int | None, max_frames: int, deadline_s: float):
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        where = [(str(ns.path), net.backend_peer_iface(i)) for i, ns in enumerate(net.backends)]
        self._proc = ctx.Process(
            target=_capture_main,
            name="edge-drill-capture",
            daemon=True,
            args=(child, where, str(net.topo.client_addr.ip), proto, port, hb_port, max_frames, deadline_s),
        )
        self._proc.start()
        child.close()
        self._deadline_s = deadline_s

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        if not self._conn.poll(timeout_s):
            raise DrillError(f"capture process (pid {self._proc.pid}) not ready within {timeout_s}s")
        self._conn.recv()

    def finish(self, timeout_s: float = 30.0) -> Captured:
        """Tell the child to stop and return what it captured."""
        try:
            self._conn.send("stop")
            if not self._conn.poll(timeout_s):
                raise DrillError(f"capture process (pid {self._proc.pid}) sent nothing within {timeout_s}s")
            return self._conn.recv()
        except (EOFError, OSError) as e:
            raise DrillError(
                f"capture process (pid {self._proc.pid}) ended early (exit code {self._proc.exitcode}): {e}"
            ) from e

    def close(self) -> None:
        """End the child (by its pid, through multiprocessing) if it still runs."""
        self._conn.close()
        self._proc.join(timeout=2.0)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=2.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
