"""edge-heartbeat: the agent beside an inference server. It sends the router UDP
heartbeats (abi.heartbeat) every --interval-ms while the server's own health check
passes, and none while it fails. Owns the send loop and the health check; knows
nothing of the router's maps or config files.

    edge-heartbeat --router 198.18.1.1 --source 198.18.1.2 --service-port 8000 \\
        --token 0x5eed0001 --interval-ms 1 --check-url http://198.18.1.2:8000/health

Two processes sharing one page: the sender wakes on absolute deadlines (no drift; late ticks
are skipped, never bunched) and never waits for the checker, which probes the server over a
keep-alive connection and, between probes, watches it, so a server that dies is noticed when
the kernel closes its sockets. A checker whose results stop coming stops the sending too.
Runs until SIGTERM or SIGINT (exit 0) or --duration-s; errors: one line, exit 1 or 2.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import mmap
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Callable, Optional, Sequence
from urllib.parse import urlsplit

from controlplane import abi

PROG = "edge-heartbeat"
DEFAULT_ROUTER_PORT = 7946  # config.Heartbeat.port's default; test_heartbeat compares them
DEFAULT_INTERVAL_MS = 100.0  # config.Heartbeat.interval_ms's default
MIN_CHECK_INTERVAL_MS = 5.0  # default checks: every heartbeat interval, but at most 200 a second
MIN_CHECK_TIMEOUT_MS = 20.0
DEFAULT_CHECK_PATH = "/v2/health/ready"  # Open Inference Protocol (Triton, KServe); vLLM/TGI: /health
MIN_INTERVAL_MS = 0.05
MAX_INTERVAL_MS = 3_600_000.0  # one hour, config.MAX_MS
MAX_NAP_S = 0.05  # longest single sleep, so a stop request is seen within this
MAX_RESPONSE_BYTES = 65536
TOKEN_MAX = 2**64 - 1
MIN_STALE_MS = 100.0  # grace on top of check interval + timeout before a silent checker stops sending
PR_SET_TIMERSLACK = 29  # from include/uapi/linux/prctl.h
PR_SET_PDEATHSIG = 1


class UsageError(ValueError):
    """A bad option value; the message names the option."""


class CheckerGone(RuntimeError):
    """The checker process exited while the sender was running."""


# ------------------------------------------------------------ pure part: parsing


def parse_ipv4(text: str, what: str) -> IPv4Address:
    try:
        return IPv4Address(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not an IPv4 address") from None


def parse_port(text: str, what: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{what}: {text!r} is not a port (1..65535)")
    return int(text)


def parse_router(text: str) -> tuple[IPv4Address, int]:
    """`ADDR[:PORT]` -> (address, port); the port defaults to DEFAULT_ROUTER_PORT."""
    if text.count(":") > 1:
        raise UsageError(f"--router: {text!r} is not an IPv4 address (with an optional :PORT)")
    addr, sep, port = text.partition(":")
    return (parse_ipv4(addr, "--router"),
            parse_port(port, "--router port") if sep else DEFAULT_ROUTER_PORT)


def parse_token(text: str) -> int:
    """A 64-bit token, decimal or 0x hex, as the config writes it."""
    try:
        value = int(text, 0)
    except ValueError:
        raise UsageError(f"--token: {text!r} is not an integer (e.g. 0x5eed0001)") from None
    if not 0 <= value <= TOKEN_MAX:
        raise UsageError(f"--token: {text} is out of range 0..2**64-1")
    return value


def parse_number(text: str, what: str, lo: float, hi: float, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:  # also false for nan
        raise UsageError(f"{what}: {text!r} is not a number of {unit} in {lo:g}..{hi:g}")
    return value


def parse_ms(text: str, what: str) -> float:
    return parse_number(text, what, MIN_INTERVAL_MS, MAX_INTERVAL_MS, "milliseconds")


@dataclass(frozen=True)
class Target:
    """Where the health check goes: an HTTP URL split up, or host and port for tcp."""

    host: str
    port: int
    path: str = "/"

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.hostport}{self.path}"


def parse_check_url(text: str) -> Target:
    """An http:// URL -> Target; the port defaults to 80, the path to /."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise UsageError(f"--check-url: {text!r}: {e}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--check-url: {text!r} is not an http://HOST[:PORT]/PATH URL")
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    return Target(parts.hostname, port if port is not None else 80, path)


@dataclass(frozen=True)
class Options:
    """Everything the agent runs with, checked and with defaults filled in."""

    router: IPv4Address
    router_port: int
    source: Optional[IPv4Address]
    service_port: int
    token: int
    interval_ms: float
    check: str  # none | tcp | http
    target: Optional[Target]  # None for check none
    check_interval_ms: float
    check_timeout_ms: float
    duration_s: Optional[float]
    rt_priority: int  # 0: normal scheduling
    quiet: bool


def secret_token(path: str, source: Optional[IPv4Address], router: IPv4Address, router_port: int,
                 service_port: int) -> int:
    """The token the router derives for this backend (a discovered one) from the service secret:
    keyed by this backend's address (--source, else the one the kernel sends to the router from)."""
    from controlplane.discovery.tokens import derive_token, read_secret
    from controlplane.errors import ConfigError

    try:
        secret = read_secret(path, "--token-secret-file")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if source is None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((str(router), router_port))  # no packet: only the route is looked up
            except OSError as e:
                raise UsageError(f"--router: no route to {router}: {e.strerror}") from None
            source = IPv4Address(s.getsockname()[0])
    return derive_token(secret, source, service_port)


def options(args: argparse.Namespace) -> Options:
    """Turn parsed arguments into Options, filling the defaults that depend on others."""
    router, router_port = parse_router(args.router)
    source = parse_ipv4(args.source, "--source") if args.source is not None else None
    service_port = parse_port(args.service_port, "--service-port")
    interval_ms = parse_ms(args.interval_ms, "--interval-ms")
    check_interval_ms = (parse_ms(args.check_interval_ms, "--check-interval-ms")
                         if args.check_interval_ms is not None else max(interval_ms, MIN_CHECK_INTERVAL_MS))
    check_timeout_ms = (parse_ms(args.check_timeout_ms, "--check-timeout-ms")
                        if args.check_timeout_ms is not None
                        else max(2 * check_interval_ms, MIN_CHECK_TIMEOUT_MS))
    duration_s = None
    if args.duration_s is not None:
        duration_s = parse_number(args.duration_s, "--duration-s", 0.0, MAX_INTERVAL_MS / 1000, "seconds")
    if not 0 <= args.rt_priority <= 99:
        raise UsageError(f"--rt-priority: {args.rt_priority} is not in 0..99")
    target = None
    if args.check != "none":
        if args.check_url is not None:
            target = parse_check_url(args.check_url)
        else:  # where the router sends traffic, unless told otherwise
            target = Target(str(source or "127.0.0.1"), service_port, DEFAULT_CHECK_PATH)
        if args.check == "tcp" and args.check_url is None:
            target = Target(target.host, service_port)
    elif args.check_url is not None:
        raise UsageError("--check-url: given with --check none")
    if (args.token is None) == (args.token_secret_file is None):
        raise UsageError("--token: give exactly one of --token, --token-secret-file")
    if args.token is not None:
        token = parse_token(args.token)
    else:
        token = secret_token(args.token_secret_file, source, router, router_port, service_port)
    return Options(router, router_port, source, service_port, token, interval_ms,
                   args.check, target, check_interval_ms, check_timeout_ms, duration_s,
                   args.rt_priority, args.quiet)


# ------------------------------------------------------------ pure part: scheduling


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


def sleep_until(deadline_ns: int, stop: StopFlag, clock: Callable[[], int] = time.monotonic_ns,
                nap: Callable[[float], None] = time.sleep) -> bool:
    """Sleep until deadline_ns on the monotonic clock in naps of at most MAX_NAP_S; False if
    stop was set first. (time.sleep is clock_nanosleep here: precise to the timer slack.)"""
    while not stop.is_set():
        left_ns = deadline_ns - clock()
        if left_ns <= 0:
            return True
        nap(min(left_ns / 1e9, MAX_NAP_S))
    return False


# ------------------------------------------------------------ health checks


@dataclass(frozen=True)
class Result:
    ok: bool
    detail: str  # "http 200", "http 503", "connection refused by 127.0.0.1:8000", ...


def _why(e: BaseException, target: Target, timeout_s: float) -> str:
    if isinstance(e, socket.timeout):
        return f"no answer from {target.hostport} within {_fmt_ms(timeout_s * 1000)}"
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
        self.request = (f"GET {target.path} HTTP/1.1\r\nHost: {target.hostport}\r\n"
                        f"User-Agent: {PROG}\r\nAccept: */*\r\n\r\n").encode()

    def check(self, timeout_s: float) -> Result:
        deadline = Deadline(timeout_s)
        try:
            return self._get(deadline)
        except (OSError, ValueError) as e:
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
        """Send the request, read one response; (status, connection reusable)."""
        sock = self.sock
        sock.settimeout(deadline.left())
        sock.sendall(self.request)
        buf = bytearray()
        got = [0]

        def more() -> None:
            sock.settimeout(deadline.left())
            # A server that writes head and body apart (with Nagle on) waits for our ACK of the
            # head; Linux delays that ACK by up to 40 ms unless asked not to, before every read.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            chunk = sock.recv(MAX_RESPONSE_BYTES)
            if not chunk:
                raise EOFError("connection closed by the server")
            buf.extend(chunk)
            got[0] += len(chunk)
            if got[0] > MAX_RESPONSE_BYTES:
                raise ValueError(f"answer longer than {MAX_RESPONSE_BYTES} bytes")

        def line() -> bytes:
            while buf.find(b"\r\n") < 0:
                more()
            end = buf.find(b"\r\n")
            text = bytes(buf[:end])
            del buf[:end + 2]
            return text

        while True:  # bounded: more() raises on the deadline and on oversize
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(buf[:end]).decode("latin-1").split("\r\n")
                del buf[:end + 4]
                status, headers = parse_head(head)
                if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
                    continue
                break
            more()
        keep = "close" not in headers.get("connection", "")
        if "chunked" in headers.get("transfer-encoding", ""):
            while True:  # bounded: more() raises on the deadline and on oversize
                size = int(line().split(b";")[0], 16)
                if size == 0:
                    while line():  # trailers, up to the empty line
                        pass
                    return status, keep
                while len(buf) < size + 2:
                    more()
                del buf[:size + 2]
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length > MAX_RESPONSE_BYTES:
                raise ValueError(f"content-length {length} is too large")
            while len(buf) < length:
                more()
        else:  # the body runs until the server closes
            try:
                while True:
                    more()
            except EOFError:
                pass
            keep = False
        return status, keep

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


def parse_head(lines: list[str]) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of an HTTP/1.x response head."""
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if "content-length" in headers and not headers["content-length"].isdigit():
        raise ValueError(f"bad content-length {headers['content-length'][:20]!r}")
    return int(parts[1]), headers


class NoCheck(Check):
    def check(self, timeout_s: float) -> Result:
        return Result(True, "no check")


# ------------------------------------------------------------ state shared by checker and sender


class Readiness:
    """The checker's verdict, in memory the sender can share (an anonymous mmap across fork):
    byte 0 is 0 before the first check, 1 ready, 2 not ready (one byte: never torn); bytes 4..7
    count finished checks. Written by the checker only."""

    _STATES = {0: None, 1: True, 2: False}

    def __init__(self, say: Callable[[str], None], mem: Optional[mmap.mmap] = None):
        self.mem = mem if mem is not None else bytearray(8)
        self.detail = ""
        self.say = say

    @property
    def ready(self) -> Optional[bool]:
        return self._STATES[self.mem[0]]

    @property
    def checks(self) -> int:
        return struct.unpack_from("<I", self.mem, 4)[0]

    def update(self, result: Result) -> None:
        """Take a check's result; say so when readiness changed."""
        changed = result.ok is not self.ready
        self.mem[0] = 1 if result.ok else 2
        struct.pack_into("<I", self.mem, 4, (self.checks + 1) & 0xFFFFFFFF)
        self.detail = result.detail
        if changed:
            self.say(f"ready: {result.detail}" if result.ok else f"not ready: {result.detail}")


class Gate:
    """The sender's side of Readiness: open while the last verdict is ready and checks keep
    finishing; closed once none finished for stale_ns (a checker that hangs). While closed
    for that reason, gone() is asked each tick and a checker that died raises CheckerGone."""

    def __init__(self, readiness: Readiness, stale_ns: Optional[int], say: Callable[[str], None],
                 now_ns: int, gone: Callable[[], Optional[str]] = lambda: None):
        self.readiness = readiness
        self.stale_ns = stale_ns  # None: never stale (no checker)
        self.say = say
        self.gone = gone  # why the checker is gone, or None while it lives
        self.seen = readiness.checks
        self.seen_at_ns = now_ns
        self.stale = False

    def open(self, now_ns: int) -> bool:
        checks = self.readiness.checks
        if checks != self.seen:
            self.seen, self.seen_at_ns = checks, now_ns
            if self.stale:
                self.stale = False
                self.say("checks resumed")
        elif self.stale_ns is not None and now_ns - self.seen_at_ns > self.stale_ns:
            if not self.stale:
                self.stale = True
                self.say(f"not ready: no check finished for {_fmt_ms(self.stale_ns / 1e6)}")
            why = self.gone()
            if why is not None:
                raise CheckerGone(why)
        return not self.stale and self.readiness.ready is True


class Checker(threading.Thread):
    """Runs check every interval (absolute deadlines) and, while ready, watches its connection
    in between: when it closes, one extra check runs at once (at most one per interval).
    The agent calls run() in its checker process; tests may start() it as a thread."""

    def __init__(self, check: Check, readiness: Readiness, interval_ms: float, timeout_ms: float,
                 stop: StopFlag):
        super().__init__(name="edge-heartbeat-check", daemon=True)
        self.check = check
        self.readiness = readiness
        self.interval_ns = int(interval_ms * 1e6)
        self.timeout_s = timeout_ms / 1000
        self.stop = stop
        self.checks = 0

    def run(self) -> None:
        ticker = Ticker(time.monotonic_ns(), self.interval_ns)
        scheduled = True
        try:
            while not self.stop.is_set():
                self.readiness.update(self.check.check(self.timeout_s))
                self.checks += 1
                if scheduled:
                    ticker.advance(time.monotonic_ns())
                early = self._wait(ticker.deadline_ns, watch=scheduled and bool(self.readiness.ready))
                scheduled = not early
        finally:
            self.check.close()

    def _wait(self, deadline_ns: int, watch: bool) -> bool:
        """Wait for deadline_ns; True when the watched connection closed first."""
        sock = self.check.watched() if watch else None
        while not self.stop.is_set():
            left_s = (deadline_ns - time.monotonic_ns()) / 1e9
            if left_s <= 0:
                return False
            if sock is None:
                time.sleep(min(left_s, MAX_NAP_S))
                continue
            readable, _, _ = select.select([sock], [], [], min(left_s, MAX_NAP_S))
            if readable:
                if self.check.peer_closed():
                    return True
                sock = None
        return False


# ------------------------------------------------------------ the sender


@dataclass
class SendStats:
    sent: int = 0
    missed_ticks: int = 0  # deadlines skipped because the sender woke too late for them
    max_late_ns: int = 0
    errors: int = 0


def send_loop(sock: socket.socket, dest: tuple[str, int], service_port: int, token: int,
              interval_ns: int, gate: Gate, stop: StopFlag,
              end_ns: Optional[int], say: Callable[[str], None]) -> SendStats:
    """Send one heartbeat per tick while the gate is open, until stop is set or end_ns."""
    stats = SendStats()
    ticker = Ticker(time.monotonic_ns(), interval_ns)
    seq = 0
    failing = False
    while True:  # bounded by stop (signals) and end_ns (--duration-s)
        deadline = ticker.deadline_ns if end_ns is None else min(ticker.deadline_ns, end_ns)
        if not sleep_until(deadline, stop):
            break
        now = time.monotonic_ns()
        if end_ns is not None and now >= end_ns:
            break
        if gate.open(now):
            try:
                sock.sendto(abi.heartbeat(service_port, seq, token), dest)
            except OSError as e:
                stats.errors += 1
                if not failing:
                    failing = True
                    say(f"send failing: {os.strerror(e.errno).lower() if e.errno else e}")
            else:
                seq += 1
                stats.sent += 1
                if failing:
                    failing = False
                    say("sending again")
        stats.max_late_ns = max(stats.max_late_ns, now - ticker.deadline_ns)
        stats.missed_ticks += ticker.advance(time.monotonic_ns())
    return stats


def _tighten_timer_slack() -> None:
    # Linux lets a sleeping thread wake up to 50 us late by default (timer slack); ask for 1 ns.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _fmt_ms(ms: float) -> str:
    return f"{ms:g} ms"


def make_check(opts: Options) -> Check:
    if opts.check == "http":
        return HttpCheck(opts.target)
    if opts.check == "tcp":
        return TcpCheck(opts.target)
    return NoCheck()


def start_checker(check: Check, readiness: Readiness, opts: Options, inherited: list[socket.socket]) -> int:
    """Fork the checker process; return its pid. It ends on SIGTERM or SIGINT, and when this
    process dies (PR_SET_PDEATHSIG)."""
    parent = os.getpid()
    stops = {signal.SIGTERM, signal.SIGINT}
    sys.stdout.flush()
    # Held back across fork until the child has its own handlers, so none is lost in between.
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        return pid
    code = 0
    try:  # the child: never returns into the caller's frames
        stop = StopFlag()
        for sig in stops:
            signal.signal(sig, lambda *_: stop.set())
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == parent:  # else the parent died before prctl took effect
            for sock in inherited:
                sock.close()
            Checker(check, readiness, opts.check_interval_ms, opts.check_timeout_ms, stop).run()
    except BaseException as e:  # the child's last word; the parent's gate notices the silence
        print(f"{PROG}: checker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        sys.stdout.flush()
        os._exit(code)


class CheckerProcess:
    """The forked checker, by pid: gone() reaps it if it exited, stop() ends it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.status: Optional[int] = None  # os.waitpid status once reaped

    def gone(self) -> Optional[str]:
        """Why the checker is no longer running, or None while it is."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid != self.pid:
                return None
            self.status = status
        if os.WIFSIGNALED(self.status):
            return f"checker process {self.pid} was killed by signal {os.WTERMSIG(self.status)}"
        return f"checker process {self.pid} exited with {os.waitstatus_to_exitcode(self.status)}"

    def stop(self, timeout_s: float) -> None:
        """SIGTERM, wait at most timeout_s, then SIGKILL; reap it. Idempotent."""
        if self.gone() is not None:
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # bounded by timeout_s
            if self.gone() is not None:
                return
            time.sleep(0.005)
        os.kill(self.pid, signal.SIGKILL)
        self.status = os.waitpid(self.pid, 0)[1]


def run(opts: Options, stop: StopFlag, say: Callable[[str], None]) -> SendStats:
    """Open the socket, start the checker, send until stop or the duration ends."""
    check = make_check(opts)
    checker = None
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        # Unconnected and non-blocking: ICMP errors from the router are not reported back,
        # and a full send buffer costs one heartbeat, never the schedule.
        sock.setblocking(False)
        try:
            sock.bind((str(opts.source) if opts.source else "0.0.0.0", 0))
        except OSError as e:
            raise UsageError(f"--source {opts.source}: {os.strerror(e.errno).lower()}") from None
        readiness = Readiness(say, mmap.mmap(-1, 8))
        if opts.check == "http":
            what = f"while GET {opts.target.url} answers 2xx"
        elif opts.check == "tcp":
            what = f"while {opts.target.hostport} accepts tcp connections"
        else:
            what = "always (no check)"
        checking = (f", checked every {_fmt_ms(opts.check_interval_ms)}, "
                    f"timeout {_fmt_ms(opts.check_timeout_ms)}") if opts.check != "none" else ""
        say(f"sending to {opts.router}:{opts.router_port} from {opts.source or 'any address'} every "
            f"{_fmt_ms(opts.interval_ms)} for service port {opts.service_port}, {what}{checking}")
        stale_ns = None
        if opts.check == "none":
            readiness.update(check.check(0.0))
        else:
            checker = CheckerProcess(start_checker(check, readiness, opts, [sock]))
            check.close()  # the child's now
            stale_ms = opts.check_interval_ms + opts.check_timeout_ms + max(opts.check_timeout_ms, MIN_STALE_MS)
            stale_ns = int(stale_ms * 1e6)
        _tighten_timer_slack()
        if opts.rt_priority:  # the sender only: the checker is its own process, on its own time
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(opts.rt_priority))
            except OSError as e:
                raise UsageError(f"--rt-priority {opts.rt_priority}: {os.strerror(e.errno).lower()} "
                                 f"(needs CAP_SYS_NICE)") from None
        now = time.monotonic_ns()
        end_ns = now + int(opts.duration_s * 1e9) if opts.duration_s is not None else None
        gate = Gate(readiness, stale_ns, say, now, checker.gone if checker is not None else lambda: None)
        return send_loop(sock, (str(opts.router), opts.router_port), opts.service_port, opts.token,
                         int(opts.interval_ms * 1e6), gate, stop, end_ns, say)
    finally:
        sock.close()
        check.close()
        if checker is not None:
            checker.stop(timeout_s=opts.check_timeout_ms / 1000 + 2 * MAX_NAP_S + 1.0)


# ------------------------------------------------------------ command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, as every error of this program
        print(f"{PROG}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Send the edge router UDP heartbeats for one backend while "
                "its inference server's health check passes, and none while it fails. Exits 0 on "
                "SIGTERM or SIGINT.")
    p.add_argument("--router", required=True, metavar="ADDR[:PORT]",
                   help=f"the router's address on this backend's link, and the service's "
                        f"health.heartbeat.port (default {DEFAULT_ROUTER_PORT})")
    p.add_argument("--source", metavar="ADDR",
                   help="send from this address: the backend's address in the router's config "
                        "(heartbeats from any other address are rejected); default: the kernel's choice")
    p.add_argument("--service-port", required=True, metavar="PORT",
                   help="the backend's service port in the router's config, written into each heartbeat")
    p.add_argument("--token", metavar="TOKEN",
                   help="the backend's token in the router's config, decimal or 0x hex")
    p.add_argument("--token-secret-file", metavar="FILE",
                   help="instead of --token, for a discovered backend: the service's secret "
                        "(discovery.token_secret_file); the token is HMAC-SHA256(secret, 'ADDR:PORT') "
                        "cut to 64 bits, ADDR being --source or the address heartbeats leave from")
    p.add_argument("--interval-ms", default=f"{DEFAULT_INTERVAL_MS:g}", metavar="MS",
                   help="heartbeat interval, the service's health.heartbeat.interval_ms; fractions "
                        "allowed (default: %(default)s)")
    p.add_argument("--check", choices=("none", "tcp", "http"), default="http",
                   help="how to tell the server is ready: an http GET answering 2xx, a tcp connect, "
                        "or none: always send (default: %(default)s)")
    p.add_argument("--check-url", metavar="URL",
                   help=f"http: the health endpoint (vLLM and TGI: /health); tcp: its host and port "
                        f"are connected to. Default: http://SOURCE:SERVICE_PORT{DEFAULT_CHECK_PATH} "
                        f"(SOURCE 127.0.0.1 without --source)")
    p.add_argument("--check-interval-ms", metavar="MS",
                   help=f"how often to check; default: the heartbeat interval, at least "
                        f"{MIN_CHECK_INTERVAL_MS:g} ms")
    p.add_argument("--check-timeout-ms", metavar="MS",
                   help=f"a check not answered within this fails; default: twice the check interval, "
                        f"at least {MIN_CHECK_TIMEOUT_MS:g} ms")
    p.add_argument("--duration-s", metavar="S",
                   help="stop after this many seconds (tests); default: run until signalled")
    p.add_argument("--rt-priority", type=int, default=0, metavar="N",
                   help="run the sender and the checker as SCHED_FIFO threads of this priority "
                        "(1..99, needs CAP_SYS_NICE) for low jitter on a busy host; 0: normal scheduling "
                        "(default)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    stop = StopFlag()
    try:
        opts = options(args)
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            stats = run(opts, stop, say)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except CheckerGone as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {os.strerror(e.errno).lower() if e.errno else e}", file=sys.stderr)
        return 1
    say(f"stopped: {stats.sent} heartbeats sent, {stats.missed_ticks} ticks missed, "
        f"{stats.errors} send errors, woke at most {stats.max_late_ns / 1e6:.3f} ms late")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
