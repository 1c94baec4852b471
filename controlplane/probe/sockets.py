"""The prober's socket layer: non-blocking TCP sockets that reset on close, a reusable
disconnect (connect(AF_UNSPEC)), errno words for samples, the kernel's tcpi_rtt from TCP_INFO,
and the grid relaxed rounds are looked at on. Used by probe.checks."""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time
from typing import Callable, Optional

_LINGER_RST = struct.pack("ii", 1, 0)
_SO_TIMESTAMPNS = 35  # asm-generic/socket.h SO_TIMESTAMPNS_OLD (== SCM_TIMESTAMPNS); not in Python's socket
_TS_ANCILLARY = socket.CMSG_SPACE(16)  # one struct timespec (two 64-bit fields)
_TCP_INFO_LEN = 72  # struct tcp_info up to tcpi_rttvar
_TCPI_RTT = 68  # offset of tcpi_rtt (microseconds) in struct tcp_info
_TCP_SYN_SENT = 2
_TCP_CLOSE = 7
_TCP_CONNECTED = (1, 8)  # ESTABLISHED, CLOSE_WAIT (the server accepted, then closed: connected all the same)
_EPOLLIN, _EPOLLOUT, _ONESHOT = select.EPOLLIN, select.EPOLLOUT, select.EPOLLONESHOT
# Relaxed rounds start and time out on this grid: a few loop wake-ups a tick instead of one
# per probe and deadline when probes are sparse (measured by tools/bench-probe).
SLOW_GRID_NS = 10_000_000
_monotonic_ns = time.monotonic_ns


# ---------------------------------------------------------------- sockets


def _errno_word(code: int) -> str:
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return "reset"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
        return "unreachable"
    if code == errno.ETIMEDOUT:
        return "timeout"
    return os.strerror(code).lower()


def _new_socket(addr: tuple) -> socket.socket:
    """A non-blocking TCP socket for addr (host, port), of the host's family."""
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    # RST on close: thousands of probes a second would otherwise leave as many TIME_WAITs.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    return sock


def _disconnecter() -> Optional[Callable[[int], int]]:
    """connect(fd, AF_UNSPEC): resets a TCP connection and leaves the socket reusable
    (connect(2)); None where libc cannot be reached."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        connect = libc.connect  # no argtypes: an int and a buffer convert as they are, faster
        connect.restype = ctypes.c_int
        unspec = ctypes.create_string_buffer(16)  # struct sockaddr, sa_family 0 (AF_UNSPEC)
    except (ImportError, OSError, AttributeError):
        return None
    return lambda fd: connect(fd, unspec, 16)


_disconnect = _disconnecter()


def look_at(now_ns: int) -> int:
    """The grid step (SLOW_GRID_NS) after now_ns, when a tcp round started at now_ns is
    looked at."""
    return (now_ns // SLOW_GRID_NS + 1) * SLOW_GRID_NS


def _rtt_if_connected(info: bytes) -> Optional[int]:
    """tcpi_rtt (microseconds) from a probe socket's TCP_INFO if its connection was made:
    ESTABLISHED; CLOSE_WAIT (the server accepted, then closed); or CLOSE with an RTT, which
    only a SYN-ACK gives (the server accepted, then reset; a refused or unreachable connect
    has none, and a reset by the prober clears it). None while connecting or when it failed."""
    state = info[0]
    if state in _TCP_CONNECTED:
        return struct.unpack_from("I", info, _TCPI_RTT)[0]
    if state == _TCP_CLOSE:
        rtt = struct.unpack_from("I", info, _TCPI_RTT)[0]
        return rtt if rtt else None
    return None
