"""Client-side traffic for the testbed: HTTP requests, flow counts, wait_until.

Every helper takes the namespace to send from (an Ns of topo.Net) and creates its sockets
inside it through Ns.enter(); the calling thread is back in its own namespace on return.
Every helper is bounded in count and time. Owns no topology and knows nothing of the router.
"""

from __future__ import annotations

import errno
import json
import selectors
import socket
import time
from collections import Counter
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import TYPE_CHECKING, Any, Callable, Iterable, Union

if TYPE_CHECKING:
    from controlplane.lab.topo import Ns

Addr = Union[str, IPv4Address, IPv6Address]


def family(addr: Addr) -> int:
    """AF_INET6 for an IPv6 address, else AF_INET."""
    return socket.AF_INET6 if ":" in str(addr) else socket.AF_INET


MAX_RESPONSE_BYTES = 65536


def wait_until(
    pred: Callable[[], Any],
    timeout_s: float,
    what: str = "condition",
    *,
    observe: Callable[[], Any] | None = None,
    interval_s: float = 0.01,
) -> Any:
    """Poll pred until it returns something truthy and return that; raise TimeoutError naming
    `what` and the last observed value (observe() if given, else pred's last result)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            last = observe() if observe is not None else value
            raise TimeoutError(f"{what}: still not true after {timeout_s}s; last observed {last!r}")
        time.sleep(interval_s)  # poll interval between checks, not a wait for the condition


@dataclass(frozen=True)
class Reply:
    """One HTTP answer of a testbed backend."""

    backend: str | None  # backend name from the body; None when the body is not a backend's JSON
    peer: str | None  # "ip:port" of the client as the backend saw it
    status: int
    server_addr: str  # "ip:port" the client socket is connected to (getpeername)


def _hostport(addr: tuple) -> str:
    return f"{addr[0]}:{addr[1]}"  # IPv6 too: "2001:2::2:40000" (the last colon is the port's)


def _request(addr: Addr, port: int) -> bytes:
    return f"GET / HTTP/1.1\r\nHost: {addr}:{port}\r\n\r\n".encode()


def _take_response(buf: bytearray) -> tuple[int, bytes] | None:
    """Remove one complete HTTP response from buf and return (status, body); None if incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_RESPONSE_BYTES:
            raise ValueError(f"no end of headers in {len(buf)} bytes")
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0]!r}")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length > MAX_RESPONSE_BYTES:
        raise ValueError(f"content-length {length} is too large")
    if len(buf) < end + 4 + length:
        return None
    body = bytes(buf[end + 4 : end + 4 + length])
    del buf[: end + 4 + length]
    return int(parts[1]), body


def _reply(status: int, body: bytes, server_addr: str) -> Reply:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Reply(None, None, status, server_addr)
    return Reply(doc.get("backend"), doc.get("peer"), status, server_addr)


class Conn:
    """One long-lived keep-alive HTTP connection; request() may be called any number of times."""

    def __init__(self, sock: socket.socket, addr: Addr, port: int):
        self.sock = sock
        self.server_addr = _hostport(sock.getpeername())
        self.local_addr = _hostport(sock.getsockname())
        self._request = _request(addr, port)
        self._buf = bytearray()

    def request(self) -> Reply:
        """GET / on this connection (timeout: the socket's)."""
        self.sock.sendall(self._request)
        while True:
            got = _take_response(self._buf)
            if got is not None:
                return _reply(*got, self.server_addr)
            chunk = self.sock.recv(MAX_RESPONSE_BYTES)
            if not chunk:
                raise ConnectionError(f"{self.server_addr} closed the connection mid-response")
            self._buf += chunk

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Conn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(ns: Ns, addr: Addr, port: int, timeout_s: float = 2.0) -> Conn:
    """A new TCP connection from namespace ns to addr:port."""
    with ns.enter():
        sock = socket.socket(family(addr), socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect((str(addr), port))
        return Conn(sock, addr, port)
    except BaseException:
        sock.close()
        raise


def http_get(ns: Ns, addr: Addr, port: int, timeout_s: float = 2.0) -> Reply:
    """One GET / on a new connection from ns."""
    with connect(ns, addr, port, timeout_s) as conn:
        return conn.request()


def open_connections(ns: Ns, addr: Addr, port: int, n: int, timeout_s: float = 2.0) -> list[Conn]:
    """n long-lived connections from ns to addr:port (all closed again if one fails)."""
    conns: list[Conn] = []
    try:
        for _ in range(n):
            conns.append(connect(ns, addr, port, timeout_s))
    except BaseException:
        close_all(conns)
        raise
    return conns


def close_all(conns: Iterable[Conn]) -> None:
    for conn in conns:
        conn.close()


def udp_refused(ns: Ns, addr: Addr, port: int, timeout_s: float = 2.0) -> bool:
    """Send one datagram from a connected UDP socket in ns; True when the kernel reports the port
    unreachable (an ICMP error quoting this very socket's packet, client -> addr:port, came back)."""
    with ns.enter():
        sock = socket.socket(family(addr), socket.SOCK_DGRAM)
    with sock:
        sock.settimeout(timeout_s)
        sock.connect((str(addr), port))
        sock.send(b"anyone?")
        try:
            sock.recv(2048)
        except ConnectionRefusedError:
            return True
        except socket.timeout:
            return False
    return False


def udp_answers(ns: Ns, addr: Addr, port: int, n: int, timeout_s: float = 2.0) -> list[tuple[str, str]]:
    """n UDP sockets open at once in ns (n distinct source ports), one datagram each to addr:port;
    the answers as (payload, "ip:port" it came from), in socket order."""
    answers = []
    socks: list[socket.socket] = []
    try:
        with ns.enter():
            socks = [socket.socket(family(addr), socket.SOCK_DGRAM) for _ in range(n)]
        for sock in socks:
            sock.settimeout(timeout_s)
            sock.sendto(b"who", (str(addr), port))
        for sock in socks:
            data, src = sock.recvfrom(2048)
            answers.append((data.decode(), _hostport(src)))
    finally:
        for sock in socks:
            sock.close()
    return answers


def _error_key(err: int) -> str:
    names = {
        errno.ECONNREFUSED: "refused",
        errno.ECONNRESET: "reset",
        errno.ETIMEDOUT: "timeout",
        errno.EHOSTUNREACH: "unreachable",
        errno.ENETUNREACH: "unreachable",
    }
    return "error:" + names.get(err, errno.errorcode.get(err, str(err)).lower())


def _flow_step(
    sel: selectors.BaseSelector, sock: socket.socket, buf: bytearray, events: int, request: bytes
) -> str | None:
    """One ready event of one backends_seen flow: None while it goes on, else the key it ends
    under (a backend's name or "error:<reason>"). Connected: sends the request; readable:
    reads into buf until a whole response is there."""
    if events & selectors.EVENT_WRITE:
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            return _error_key(err)
        try:
            sock.send(request)  # a few dozen bytes into an empty send buffer
        except OSError as e:
            return _error_key(e.errno or 0)
        sel.modify(sock, selectors.EVENT_READ)
        return None
    try:
        chunk = sock.recv(MAX_RESPONSE_BYTES)
    except OSError as e:
        return _error_key(e.errno or 0)
    if not chunk:
        return "error:closed"
    buf += chunk
    try:
        got = _take_response(buf)
    except ValueError:
        return "error:bad-reply"
    if got is None:
        return None
    backend = _reply(*got, "").backend
    return backend if backend is not None else "error:bad-reply"


def backends_seen(
    ns: Ns,
    addr: Addr,
    port: int,
    n_flows: int,
    concurrency: int = 64,
    flow_timeout_s: float = 2.0,
    deadline_s: float | None = None,
) -> Counter:
    """Counter of backend names over n_flows new connections (one GET each) from ns to addr:port.

    Failed flows count under "error:<reason>" (refused, reset, timeout, unreachable, bad-reply,
    closed, deadline), so the counts always add up to n_flows. At most `concurrency` flows are in
    flight; the whole run ends after deadline_s (default: 10 s, or 5 ms per flow if longer).
    """
    deadline = time.monotonic() + (deadline_s if deadline_s is not None else max(10.0, n_flows * 0.005))
    request = _request(addr, port)
    target = (str(addr), port)
    seen: Counter = Counter()
    flows: dict[int, tuple[socket.socket, bytearray, float]] = {}  # fd -> (sock, buf, started)
    started = 0
    with ns.enter(), selectors.DefaultSelector() as sel:

        def finish(fd: int, key: str) -> None:
            sock = flows.pop(fd)[0]
            sel.unregister(fd)
            sock.close()
            seen[key] += 1

        try:
            while started < n_flows or flows:
                now = time.monotonic()
                if now >= deadline:
                    for fd in list(flows):
                        finish(fd, "error:deadline")
                    seen["error:deadline"] += n_flows - started
                    break
                while started < n_flows and len(flows) < concurrency:
                    started += 1
                    sock = socket.socket(family(addr), socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
                    err = sock.connect_ex(target)
                    if err not in (0, errno.EINPROGRESS):
                        sock.close()
                        seen[_error_key(err)] += 1
                        continue
                    flows[sock.fileno()] = (sock, bytearray(), now)
                    sel.register(sock, selectors.EVENT_WRITE)
                for key, events in sel.select(timeout=min(0.05, max(0.0, deadline - now))):
                    sock, buf, _ = flows[key.fd]
                    end = _flow_step(sel, sock, buf, events, request)
                    if end is not None:
                        finish(key.fd, end)
                now = time.monotonic()
                for fd, (_, _, t0) in list(flows.items()):
                    if now - t0 > flow_timeout_s:
                        finish(fd, "error:timeout")
        finally:
            for sock, _, _ in flows.values():
                sock.close()
    return seen
