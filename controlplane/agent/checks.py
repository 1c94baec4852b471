"""The agent's health checks of its inference server: an HTTP GET over one kept-alive
connection (read with the prober's HTTP/1.1 reader), a TCP connect, or none. Each check()
returns a Result and never waits longer than its timeout."""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Optional

from controlplane.agent.options import PROG, Options, Target, UsageError, fmt_ms
from controlplane.probe.http import Response

MAX_RESPONSE_BYTES = 65536


@dataclass(frozen=True)
class Result:
    ok: bool
    detail: str  # "http 200", "http 503", "connection refused by 127.0.0.1:8000", ...


def _why(e: BaseException, target: Target, timeout_s: float) -> str:
    if isinstance(e, socket.timeout):
        return f"no answer from {target.hostport} within {fmt_ms(timeout_s * 1000)}"
    if isinstance(e, OSError) and e.errno:
        return f"{os.strerror(e.errno).lower()} ({target.hostport})"
    return f"{e} ({target.hostport})"


def resolve(target: Target) -> tuple:
    """The first socket address of target's host (resolved once, so no check waits on DNS)."""
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"--check-url: cannot resolve {target.host!r}: {e.strerror}") from None
    family, kind, proto, _, sockaddr = infos[0]
    return family, kind, proto, sockaddr


class Deadline:
    def __init__(self, timeout_s: float):
        self.at = time.monotonic() + timeout_s

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        return left


def _connect(addr: tuple, deadline: Deadline) -> socket.socket:
    family, kind, proto, sockaddr = addr
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(deadline.left())
        sock.connect(sockaddr)
        return sock
    except BaseException:
        sock.close()
        raise


def _abort(sock: socket.socket) -> None:
    # RST instead of FIN: frequent checks would otherwise pile up TIME_WAIT sockets here.
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Check:
    """A health check: check() -> Result, never raises; watched(): the socket that closes
    when the server dies, or None; peer_closed(): look at it once it is readable."""

    def check(self, timeout_s: float) -> Result:
        raise NotImplementedError

    def watched(self) -> Optional[socket.socket]:
        return None

    def peer_closed(self) -> bool:
        return False

    def close(self) -> None:
        pass


class TcpCheck(Check):
    """Ready when a TCP connect to the target succeeds; the last connection stays open
    until the next check so that the server's death shows as EOF on it."""

    def __init__(self, target: Target):
        self.target = target
        self.addr = resolve(target)
        self.sock: Optional[socket.socket] = None

    def check(self, timeout_s: float) -> Result:
        self.close()
        try:
            self.sock = _connect(self.addr, Deadline(timeout_s))
        except OSError as e:
            return Result(False, f"tcp connect: {_why(e, self.target, timeout_s)}")
        return Result(True, f"tcp connect to {self.target.hostport}")

    def watched(self) -> Optional[socket.socket]:
        return self.sock

    def peer_closed(self) -> bool:
        try:
            data = self.sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:  # the server talks first (a banner): nothing to watch on this connection
            self.close()
            return False
        self.close()
        return True

    def close(self) -> None:
        if self.sock is not None:
            _abort(self.sock)
            self.sock = None


class HttpCheck(Check):
    """Ready while GET target.path answers 2xx, over one keep-alive connection."""

    def __init__(self, target: Target):
        self.target = target
        self.addr = resolve(target)
        self.sock: Optional[socket.socket] = None
        self.connections = 0  # made so far (a test checks they are reused)
        self.reply = Response(MAX_RESPONSE_BYTES, keep_body=False)
        self.request = (
            f"GET {target.path} HTTP/1.1\r\nHost: {target.hostport}\r\nUser-Agent: {PROG}\r\nAccept: */*\r\n\r\n"
        ).encode()

    def check(self, timeout_s: float) -> Result:
        deadline = Deadline(timeout_s)
        try:
            return self._get(deadline)
        except (OSError, ValueError, EOFError) as e:  # EOFError: closed before the answer ended
            self.close()
            if isinstance(e, ValueError):
                return Result(False, f"http: bad answer from {self.target.hostport}: {e}")
            return Result(False, f"http: {_why(e, self.target, timeout_s)}")

    def _get(self, deadline: Deadline) -> Result:
        reused = self.sock is not None
        if self.sock is None:
            self.sock = _connect(self.addr, deadline)
            self.connections += 1
        try:
            status, keep = self._exchange(deadline)
        except (ConnectionError, EOFError):
            if not reused:
                raise
            # The server closed the idle connection just as we sent on it: once more, on a new one.
            self.close()
            self.sock = _connect(self.addr, deadline)
            self.connections += 1
            status, keep = self._exchange(deadline)
        if not keep:
            self.close()
        return Result(200 <= status < 300, f"http {status}")

    def _exchange(self, deadline: Deadline) -> tuple[int, bool]:
        """Send the request, read one response (the prober's reader); (status, connection reusable)."""
        sock = self.sock
        sock.settimeout(deadline.left())
        sock.sendall(self.request)
        reply = self.reply
        reply.start()
        while True:  # bounded: the deadline, and the reader's size limit
            sock.settimeout(deadline.left())
            # A server that writes head and body apart (with Nagle on) waits for our ACK of the
            # head; Linux delays that ACK by up to 40 ms unless asked not to, before every read.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            chunk = sock.recv(MAX_RESPONSE_BYTES)
            if not chunk:
                if reply.eof():
                    break
                raise EOFError("connection closed by the server")
            if reply.feed(chunk):
                break
        return reply.status, reply.keep

    def watched(self) -> Optional[socket.socket]:
        return self.sock

    def peer_closed(self) -> bool:
        # Between requests, any readable event (EOF, reset, stray bytes) ends this connection.
        self.close()
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class NoCheck(Check):
    def check(self, timeout_s: float) -> Result:
        return Result(True, "no check")


def make_check(opts: Options) -> Check:
    if opts.check == "http":
        return HttpCheck(opts.target)
    if opts.check == "tcp":
        return TcpCheck(opts.target)
    return NoCheck()
