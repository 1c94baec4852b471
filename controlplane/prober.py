"""The probe engine: TCP connect, HTTP GET and gRPC health probes of every backend, and
scrapes of their Prometheus metrics, on the caller's asyncio loop. Owns the schedules, the
sockets and channels, each target's Window and its last Load; decides nothing about weights
(weights.py) and touches no map. A failed probe is a Sample (ok False, error in a few words:
"timeout", "refused", "reset", "closed", "unreachable", "HTTP 503", "NOT_SERVING",
"grpc NOT_FOUND", ...), a failed scrape a Load(ok=False), never an exception.

    prober = Prober(on_sample=f, on_load=g)   # f(key, Sample), g(key, Load): plain calls on the loop
    prober.set_targets([Target(("chat", "h100-a"), "10.0.0.7", 8000, probe, metrics), ...])
    prober.window(key), prober.last_load(key), prober.keys()
    await prober.close()

set_targets() must be called on the loop the prober is to live on; it adds new targets, stops
removed ones and restarts changed ones (a changed target on the same address and port keeps
its Window, resized, and its last Load). window() is None for a target without probe.

Built for thousands of probes a second in one Python thread (tools/bench-probe measures it):
- One timer wheel: times are rounded up to tick_s (2 ms) and each occupied tick is one loop
  timer, so a tick starts and times out all its probes together (no task, future or timer
  handle per probe). A target's first probe is at a random point of its interval; a late
  loop skips starts, never bunches them; a target's probes never overlap.
- One private epoll set holds every probe socket and is itself one reader of the loop, so a
  wake-up serves every ready socket (the same under uvloop, which measured no faster).
- RTTs come from the kernel where it has them, so the loop's own delays never show in them:
  TCP connect RTT is tcpi_rtt of the new connection (SYN to SYN-ACK); HTTP RTT is the receive
  timestamp of the answer's last segment (SO_TIMESTAMPNS) minus the time just before send().
  A probe whose RTT exceeds timeout_ms fails as "timeout", even if the loop read it later;
  an answer that came in time but was not read yet is read at the deadline, not lost.
- TCP probes reuse one socket per target: connect, read TCP_INFO, then connect(AF_UNSPEC),
  which resets the connection (RST: no TIME_WAIT on the prober) and frees the socket for the
  next connect; where libc cannot be reached, a new socket with SO_LINGER 0 per probe.
- HTTP/1.1 keeps one connection per target (another for metrics), reconnects after an error,
  and retries once on a new connection when a kept-alive one turns out closed; the request is
  sent once connected, so the RTT never includes the connect.
- gRPC (grpc.health.v1.Health/Check) runs on grpc.aio: one channel per target, one task per
  probe; its RTT is the call's time as the loop sees it.
- Metrics are scraped every metrics.interval_ms with that as the timeout; the page's engine
  signals become a Load (parse_metrics, load_from).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import math
import os
import random
import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Optional

from controlplane import config
from controlplane.probe.http import Response
from controlplane.signals import Load, Sample, Window

TICK_S = 0.002  # timer wheel resolution: probe times are rounded up to this
PROBE_RESPONSE_MAX = 65536  # a health answer longer than this is a failure ("too large")
METRICS_RESPONSE_MAX = 8 << 20  # likewise a metrics page
RECV_SIZE = 262144
USER_AGENT = "edge-prober"

_LINGER_RST = struct.pack("ii", 1, 0)
_SO_TIMESTAMPNS = 35  # asm-generic/socket.h SO_TIMESTAMPNS_OLD (== SCM_TIMESTAMPNS); not in Python's socket
_TS_ANCILLARY = socket.CMSG_SPACE(16)  # one struct timespec (two 64-bit fields)
_TCP_INFO_LEN = 72  # struct tcp_info up to tcpi_rttvar
_TCPI_RTT = 68  # offset of tcpi_rtt (microseconds) in struct tcp_info
_TCP_SYN_SENT = 2
_TCP_CONNECTED = (1, 8)  # ESTABLISHED, CLOSE_WAIT (the server accepted, then closed: connected all the same)
_EPOLLIN, _EPOLLOUT, _ONESHOT = select.EPOLLIN, select.EPOLLOUT, select.EPOLLONESHOT
_monotonic_ns = time.monotonic_ns


@dataclass(frozen=True)
class Target:
    """One backend to probe. key names it in callbacks, window() and last_load(); address is
    IPv4 text (an IPv4Address is converted). probe None: no probes; metrics None: no scrapes."""

    key: Hashable
    address: str
    port: int
    probe: Optional[config.Probe] = None
    metrics: Optional[config.MetricsScrape] = None

    def __post_init__(self) -> None:
        address = ipaddress.IPv4Address(str(self.address))  # never a name: no DNS on the loop
        object.__setattr__(self, "address", str(address))
        if not 1 <= int(self.port) <= 65535:
            raise ValueError(f"port {self.port} is out of range 1..65535")


# ---------------------------------------------------------------- metrics text

# signal -> metric names, most preferred first; counters without their _total suffix
SIGNALS: dict[str, tuple[str, ...]] = {
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "progress": ("vllm:generation_tokens", "vllm:request_success", "sglang:generation_tokens",
                 "sglang:num_requests", "tgi_request_success"),
}
# kv_usage is a fraction per engine: several label sets (data-parallel engines) take the
# fullest, since a sum could pass 1. Every other signal is summed over its label sets.
_MAX_NAMES = frozenset(SIGNALS["kv_usage"])
_ENGINES = tuple(
    (("\n" + prefix).encode(), tuple((n, ("\n" + n).encode()) for n in dict.fromkeys(
        n for names in SIGNALS.values() for n in names if n.startswith(prefix))))
    for prefix in ("vllm:", "sglang:", "tgi_"))


class MetricsError(ValueError):
    """The page holds none of the engine metrics of SIGNALS."""


def parse_metrics(body: bytes) -> dict[str, float]:
    """Each known metric of a Prometheus text page, summed over its label sets (kv_usage
    names: the maximum); keys are the names of SIGNALS (no _total).

    Only lines that start with a known name are read: a search for each engine's prefix,
    then for each of its names, whose lines are then read while they follow one another (the
    exposition format keeps a family's lines together). A value that is not a finite number
    (NaN, garbage) is skipped. Raises MetricsError when no known metric has a value.
    """
    text = b"\n" + body
    found: dict[str, float] = {}
    for prefix, needles in _ENGINES:
        if prefix not in text:
            continue
        for name, needle in needles:
            at = text.find(needle)
            taken = False
            while at >= 0:
                start = at + len(needle)
                end = text.find(b"\n", start)
                if end < 0:
                    end = len(text)
                value = _sample_value(text, start, end)
                if value is not None:
                    taken = True
                    if name not in found:
                        found[name] = value
                    elif name in _MAX_NAMES:
                        found[name] = max(found[name], value)
                    else:
                        found[name] += value
                if text.startswith(needle, end):
                    at = end  # the family's next line
                else:  # the family ends here; a group of look-alikes only (name_by_x) does not count
                    at = -1 if taken else text.find(needle, end)
    if not found:
        raise MetricsError("no engine metrics")
    return found


def _sample_value(text: bytes, start: int, end: int) -> Optional[float]:
    """The value of the line text[:end] whose metric name (so far) ends at start; None when
    the name goes on (another metric) or the value is not a finite number."""
    if text.startswith(b"_total", start):
        start += 6
    if start >= end:
        return None
    c = text[start]
    if c == 0x7B:  # '{': label values may hold '}' and spaces, but nothing after the block can
        close = text.rfind(b"}", start, end)
        if close < 0:
            return None
        start = close + 1
    elif c != 0x20 and c != 0x09:
        return None
    parts = text[start:end].split()  # value [timestamp]
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def load_from(found: dict[str, float], t_ns: int) -> Load:
    """A Load from parse_metrics' result: each signal from the first of its names found."""
    values = []
    for names in _SIGNAL_NAMES:
        for name in names:
            if name in found:
                values.append(found[name])
                break
        else:
            values.append(None)
    waiting, running, kv_usage, progress = values
    return Load(t_ns, True, waiting, running, kv_usage, progress)


_SIGNAL_NAMES = tuple(SIGNALS[s] for s in ("waiting", "running", "kv_usage", "progress"))


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


def _new_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    # RST on close: thousands of probes a second would otherwise leave as many TIME_WAITs.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    return sock


def _disconnecter() -> Optional[Callable[[int], int]]:
    """connect(fd, AF_UNSPEC): resets a TCP connection and leaves the socket reusable
    (connect(2)); None where libc cannot be reached."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        connect = libc.connect
        connect.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
        connect.restype = ctypes.c_int
        unspec = ctypes.create_string_buffer(16)  # struct sockaddr, sa_family 0 (AF_UNSPEC)
    except (ImportError, OSError, AttributeError):
        return None
    return lambda fd: connect(fd, unspec, 16)


_disconnect = _disconnecter()


# ---------------------------------------------------------------- one schedule of one target


class _Check:
    """A probe or scrape schedule: starts every interval, fails at the timeout, never two at
    once. Subclasses implement begin() and may implement on_event(), last_look(), abort()."""

    def __init__(self, prober: "Prober", backend: "_Backend", interval_ms: int, timeout_ms: int):
        self.prober = prober
        self.backend = backend
        self.addr = (backend.target.address, backend.target.port)
        self.interval_ns = interval_ms * 1_000_000
        self.timeout_ns = timeout_ms * 1_000_000
        self.busy = False
        self.stopped = False
        self.round = 0
        self.started_ns = 0
        self.next_ns = _monotonic_ns() + int(random.random() * self.interval_ns)
        prober._at(self.next_ns, self)

    def tick(self, due_ns: int) -> None:
        """The wheel's call at due_ns for this check's deadline or next start (an entry for
        each; a call with nothing due does nothing)."""
        if self.stopped:
            return
        if self.busy:
            if self.started_ns + self.timeout_ns > due_ns:
                return  # a start due before the deadline waits for the deadline's own call
            self._deadline()
        if self.next_ns <= due_ns:
            self._start()

    def _start(self) -> None:
        now = _monotonic_ns()
        self.round += 1
        self.busy = True
        self.started_ns = now
        next_ns = self.next_ns + self.interval_ns
        if next_ns <= now:  # the loop was held up: skip the missed starts, never bunch them
            next_ns += ((now - next_ns) // self.interval_ns + 1) * self.interval_ns
        self.next_ns = next_ns
        self.prober._at(now + self.timeout_ns, self)
        self.prober._at(next_ns, self)
        try:
            self.begin()
        except OSError as e:  # no socket to be had (EMFILE, ENOBUFS): a failed probe too
            self.abort()
            self.fail(_errno_word(e.errno) if e.errno else str(e))
        except Exception as e:  # a bug here must not stop the other probes of this tick
            self._fault(e)

    def _deadline(self) -> None:
        try:
            self.last_look()  # an answer the loop has not read yet still counts
        except Exception as e:
            self._fault(e)
        if self.busy:
            self.abort()
            self.fail("timeout")

    def _fault(self, e: Exception) -> None:
        self.prober._report(f"prober: {type(self).__name__} of {self.backend.target.key!r} failed", e)
        try:
            self.abort()
        except Exception:
            pass  # reported above; the round fails all the same
        if self.busy:
            self.fail(f"prober error: {type(e).__name__}")

    def finish(self, rtt_ns: int) -> None:
        """The probe succeeded with this RTT (a timeout if it is longer than the timeout)."""
        if rtt_ns > self.timeout_ns:
            self.fail("timeout")
            return
        self.busy = False
        self.backend.sample(Sample(self.started_ns, True, rtt_ns / 1e9))

    def fail(self, error: str) -> None:
        self.busy = False
        self.backend.sample(Sample(self.started_ns, False, None, error))

    def begin(self) -> None:
        raise NotImplementedError

    def on_event(self, events: int) -> None:
        pass

    def last_look(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True
        self.busy = False
        self.abort()
        self.close()

    def close(self) -> None:
        pass


class _TcpCheck(_Check):
    """Connect, note tcpi_rtt, reset the connection; one socket reused when it can be."""

    def __init__(self, *args) -> None:
        self.sock: Optional[socket.socket] = None
        self.fd = -1
        self.armed_once = False
        self.t0 = 0
        super().__init__(*args)

    def begin(self) -> None:
        sock = self.sock
        if sock is None:
            sock = self.sock = _new_socket()
            self.fd = sock.fileno()
            self.armed_once = False
            self.prober._watch(self.fd, self.on_event)
        self.t0 = _monotonic_ns()
        err = sock.connect_ex(self.addr)
        if err != errno.EINPROGRESS:
            self._connected(err)
            return
        if self.armed_once:
            self.prober._ep.modify(self.fd, _EPOLLOUT | _ONESHOT)
        else:
            self.prober._ep.register(self.fd, _EPOLLOUT | _ONESHOT)
            self.armed_once = True

    def on_event(self, events: int) -> None:
        if self.busy:
            self._connected(0)

    def last_look(self) -> None:
        if self.sock is not None:
            self._connected(0, waiting=True)

    def _connected(self, err: int, waiting: bool = False) -> None:
        info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if info[0] in _TCP_CONNECTED:
            rtt_ns = struct.unpack_from("I", info, _TCPI_RTT)[0] * 1000 or _monotonic_ns() - self.t0
            self._release()
            self.finish(rtt_ns)
            return
        if info[0] == _TCP_SYN_SENT and not err:
            if not waiting:  # woken without a result: wait on
                self.prober._ep.modify(self.fd, _EPOLLOUT | _ONESHOT)
            return
        err = err or self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self._release()
        self.fail(_errno_word(err) if err else "closed")

    def _release(self) -> None:
        """Make the socket ready for the next connect, or drop it."""
        if _disconnect is None or _disconnect(self.fd) != 0:
            self.close()

    def abort(self) -> None:
        if self.sock is not None:
            self._release()

    def close(self) -> None:
        if self.sock is not None:
            self.prober._drop(self.fd, self.sock)
            self.sock = None
            self.fd = -1


class _HttpCheck(_Check):
    """GET path over a kept-alive connection: a health probe (2xx is ok) or, with scrape,
    a metrics scrape that ends in a Load."""

    def __init__(self, prober: "Prober", backend: "_Backend", interval_ms: int, timeout_ms: int,
                 path: str, scrape: bool):
        target = backend.target
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {target.address}:{target.port}\r\n"
                        f"User-Agent: {USER_AGENT}\r\nAccept: text/plain, */*\r\n\r\n").encode()
        self.scrape = scrape
        self.sock: Optional[socket.socket] = None
        self.fd = -1
        self.connecting = False
        self.stamps = False  # SO_TIMESTAMPNS is on: read with recvmsg for the receive time
        self.reused = False  # this round's request went on a connection an earlier round used
        self.reply = Response(METRICS_RESPONSE_MAX if scrape else PROBE_RESPONSE_MAX, keep_body=scrape)
        self.sent_ns = 0
        self.sent_real_ns = 0
        self.rx_real_ns = 0
        self.connections = 0  # made so far (tests check that they are reused)
        super().__init__(prober, backend, interval_ms, timeout_ms)

    # -- connection

    def begin(self) -> None:
        if self.sock is None:
            self._connect()
        else:
            self.reused = True
            self._send()

    def _connect(self) -> None:
        self.reused = False
        sock = self.sock = _new_socket()
        self.fd = sock.fileno()
        self.connections += 1
        if not self.scrape:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.stamps = True
            except OSError:
                self.stamps = False
        self.prober._watch(self.fd, self.on_event)
        err = sock.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            self._lost(_errno_word(err))
            return
        self.connecting = True
        self.prober._ep.register(self.fd, _EPOLLOUT)

    def on_event(self, events: int) -> None:
        if self.connecting:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err or not events & _EPOLLOUT:
                self._lost(_errno_word(err) if err else "closed")
                return
            self.connecting = False
            self.prober._ep.modify(self.fd, _EPOLLIN)
            if self.busy:
                self._send()
            return
        self._read()

    def _send(self) -> None:
        self.reply.start()
        self.rx_real_ns = 0
        self.sent_real_ns = time.time_ns()  # the kernel stamps receptions on CLOCK_REALTIME
        self.sent_ns = _monotonic_ns()
        try:
            sent = self.sock.send(self.request)
        except OSError as e:
            self._broken(_errno_word(e.errno) if e.errno else "closed")
            return
        if sent != len(self.request):  # a few hundred bytes on an idle connection: never short
            self._lost("send blocked")

    def _read(self) -> None:
        view = self.prober._rview  # one buffer for all reads: recv(n) would malloc n bytes each time
        try:
            if self.stamps:
                size, ancillary, _, _ = self.sock.recvmsg_into((view,), _TS_ANCILLARY)
                if ancillary and len(ancillary[-1][2]) >= 16:
                    sec, nsec = struct.unpack_from("qq", ancillary[-1][2])
                    self.rx_real_ns = sec * 1_000_000_000 + nsec
            else:
                size = self.sock.recv_into(view)
            data = view[:size].tobytes()
        except BlockingIOError:
            return
        except OSError as e:
            self._broken(_errno_word(e.errno) if e.errno else "closed")
            return
        if not data:
            self._eof()
            return
        if not self.busy:  # bytes nobody asked for, or the late answer of a timed-out round
            self.close()
            return
        try:
            done = self.reply.feed(data)
        except ValueError as e:
            self._lost(str(e))
            return
        if done:
            self._answer()
        else:
            self._quickack()

    def last_look(self) -> None:
        if self.sock is not None and not self.connecting:
            self._read()

    # -- answers

    def _quickack(self) -> None:
        # A server that writes head and body apart with Nagle on waits for our ACK of the
        # head; Linux would delay that ACK by up to 40 ms. Ask for it now (rare path).
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass

    def _answer(self) -> None:
        now = _monotonic_ns()
        status, body = self.reply.status, self.reply.body
        if not self.reply.keep:
            self.close()
        if self.scrape:
            self._scraped(status, body)
            return
        rtt_ns = now - self.sent_ns
        if self.rx_real_ns:
            kernel_ns = self.rx_real_ns - self.sent_real_ns
            if 0 < kernel_ns <= rtt_ns:  # else the wall clock was stepped between: keep ours
                rtt_ns = kernel_ns
        if 200 <= status < 300:
            self.finish(rtt_ns)
        else:
            self.fail(f"HTTP {status}")

    def _scraped(self, status: int, body: bytes) -> None:
        self.busy = False
        if not 200 <= status < 300:
            load = Load(t_ns=self.started_ns, ok=False, error=f"HTTP {status}")
        else:
            try:
                load = load_from(parse_metrics(body), self.started_ns)
            except MetricsError as e:
                load = Load(t_ns=self.started_ns, ok=False, error=str(e))
        self.backend.load(load)

    # -- failures

    def _eof(self) -> None:
        if self.busy and self.reply.eof():
            self._answer()
        else:
            self._broken("closed")

    def _broken(self, error: str) -> None:
        """The connection died under a request: once more on a new one if the server may
        just have closed an idle kept-alive connection, else the round fails."""
        if self.busy and self.reused and not self.reply.begun:
            self.close()
            self._connect()
            return
        self._lost(error)

    def _lost(self, error: str) -> None:
        self.close()
        if self.busy:
            self.fail(error)

    def fail(self, error: str) -> None:
        if self.scrape:
            self.busy = False
            self.backend.load(Load(t_ns=self.started_ns, ok=False, error=error))
        else:
            super().fail(error)

    def abort(self) -> None:
        self.close()  # a late answer must not be read as the next round's

    def close(self) -> None:
        if self.sock is not None:
            self.prober._drop(self.fd, self.sock)
            self.sock = None
            self.fd = -1
            self.connecting = False
            self.reply.start()


class _GrpcCheck(_Check):
    """grpc.health.v1.Health/Check over one channel per target; ok iff SERVING."""

    def __init__(self, prober: "Prober", backend: "_Backend", probe: config.Probe):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.grpc, self.health_pb2 = grpc, health_pb2
        target = backend.target
        self.channel = grpc.aio.insecure_channel(f"{target.address}:{target.port}", options=[
            # Retry a dead backend's connection at about the probe rate, not after minutes.
            ("grpc.initial_reconnect_backoff_ms", probe.interval_ms),
            ("grpc.min_reconnect_backoff_ms", probe.interval_ms),
            ("grpc.max_reconnect_backoff_ms", max(probe.interval_ms, 1000)),
        ])
        self.check = health_pb2_grpc.HealthStub(self.channel).Check
        self.request = health_pb2.HealthCheckRequest(service=probe.grpc_service)
        self.task: Optional[asyncio.Task] = None
        super().__init__(prober, backend, probe.interval_ms, probe.timeout_ms)

    def begin(self) -> None:
        self.task = self.prober._loop.create_task(self._call(self.round))

    async def _call(self, round_: int) -> None:
        t0 = _monotonic_ns()
        try:
            reply = await self.check(self.request, timeout=self.timeout_ns / 1e9)
        except self.grpc.aio.AioRpcError as e:
            if self.busy and round_ == self.round:
                self.fail(self._word(e))
            return
        except Exception as e:  # grpc's own errors outside AioRpcError: a failed probe
            if self.busy and round_ == self.round:
                self.fail(f"grpc {type(e).__name__}")
            return
        rtt_ns = _monotonic_ns() - t0
        if not (self.busy and round_ == self.round):
            return
        serving = self.health_pb2.HealthCheckResponse.SERVING
        if reply.status == serving:
            self.finish(rtt_ns)
        else:
            self.fail(self.health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def _word(self, e) -> str:
        code = e.code()
        if code == self.grpc.StatusCode.DEADLINE_EXCEEDED:
            return "timeout"
        if code == self.grpc.StatusCode.UNAVAILABLE:
            return "refused" if "refused" in (e.details() or "").lower() else "unavailable"
        return f"grpc {code.name}"

    def abort(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        await self.channel.close()


# ---------------------------------------------------------------- targets


class _Backend:
    """A target's checks, its Window and its last Load."""

    def __init__(self, prober: "Prober", target: Target, window: Optional[Window] = None,
                 last_load: Optional[Load] = None):
        self.prober = prober
        self.target = target
        self.key = target.key
        self.checks: list[_Check] = []
        probe, metrics = target.probe, target.metrics
        self.window: Optional[Window] = None
        if probe is not None:
            self.window = window if window is not None else Window(probe.window)
            self.window.resize(probe.window)
            if probe.kind == "tcp":
                self.checks.append(_TcpCheck(prober, self, probe.interval_ms, probe.timeout_ms))
            elif probe.kind == "http":
                self.checks.append(_HttpCheck(prober, self, probe.interval_ms, probe.timeout_ms, probe.path, False))
            else:
                self.checks.append(_GrpcCheck(prober, self, probe))
        self.last_load = last_load if metrics is not None else None
        if metrics is not None:
            self.checks.append(_HttpCheck(prober, self, metrics.interval_ms, metrics.interval_ms, metrics.path, True))

    def sample(self, sample: Sample) -> None:
        self.window.add(sample)
        callback = self.prober.on_sample
        if callback is not None:
            try:
                callback(self.key, sample)
            except Exception as e:
                self.prober._report("prober: on_sample failed", e)

    def load(self, load: Load) -> None:
        self.last_load = load
        callback = self.prober.on_load
        if callback is not None:
            try:
                callback(self.key, load)
            except Exception as e:
                self.prober._report("prober: on_load failed", e)

    def stop(self) -> None:
        for check in self.checks:
            check.stop()
            if isinstance(check, _GrpcCheck):
                self.prober._later(check.aclose())
        self.checks = []


class Prober:
    """Probes the targets given to set_targets() until close(); lives on one asyncio loop
    (the one running at the first set_targets())."""

    def __init__(self, on_sample: Optional[Callable[[Hashable, Sample], None]] = None,
                 on_load: Optional[Callable[[Hashable, Load], None]] = None, *, tick_s: float = TICK_S):
        self.on_sample = on_sample
        self.on_load = on_load
        self._tick_ns = max(1, int(tick_s * 1e9))
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ep: Optional[select.epoll] = None
        self._backends: dict[Hashable, _Backend] = {}
        self._slots: dict[int, list[_Check]] = {}  # tick number -> the checks to call then
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._handlers: dict[int, Callable[[int], None]] = {}  # fd -> on_event of the check owning it
        self._rview = memoryview(bytearray(RECV_SIZE))
        self._dead: list[socket.socket] = []  # closed while an event batch is dispatched
        self._in_batch = False
        self._closing: set[asyncio.Task] = set()
        self._closed = False

    # -- public

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Probe exactly these targets from now on; call on the loop."""
        if self._closed:
            raise RuntimeError("prober is closed")
        wanted: dict[Hashable, Target] = {}
        for target in targets:
            if target.key in wanted:
                raise ValueError(f"target key {target.key!r} given twice")
            wanted[target.key] = target
        self._bind()
        for key, backend in list(self._backends.items()):
            target = wanted.get(key)
            if target == backend.target:
                continue
            del self._backends[key]
            backend.stop()
            if target is not None:
                same = (target.address, target.port) == (backend.target.address, backend.target.port)
                self._backends[key] = _Backend(self, target, backend.window if same else None,
                                               backend.last_load if same else None)
        for key, target in wanted.items():
            if key not in self._backends:
                self._backends[key] = _Backend(self, target)

    def window(self, key: Hashable) -> Optional[Window]:
        """The recent samples of key; None for an unknown key or a target without probe."""
        backend = self._backends.get(key)
        return backend.window if backend is not None else None

    def last_load(self, key: Hashable) -> Optional[Load]:
        backend = self._backends.get(key)
        return backend.last_load if backend is not None else None

    def keys(self) -> list[Hashable]:
        return list(self._backends)

    async def close(self) -> None:
        """Stop every probe and close every socket and channel; the prober is then unusable."""
        self._closed = True
        for backend in self._backends.values():
            backend.stop()
        self._backends.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._slots.clear()
        for sock in self._dead:
            sock.close()
        self._dead.clear()
        if self._ep is not None:
            self._loop.remove_reader(self._ep.fileno())
            self._ep.close()
            self._ep = None
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    # -- for the checks

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._ep = select.epoll()
            loop.add_reader(self._ep.fileno(), self._on_epoll)
        elif loop is not self._loop:
            raise RuntimeError("prober used from another event loop")

    def _at(self, t_ns: int, check: _Check) -> None:
        """Call check.tick() at the first tick at or after t_ns (monotonic)."""
        tick = -(-t_ns // self._tick_ns)
        checks = self._slots.get(tick)
        if checks is None:
            checks = self._slots[tick] = []
            delay_s = (tick * self._tick_ns - _monotonic_ns()) / 1e9
            self._timers[tick] = self._loop.call_later(delay_s if delay_s > 0 else 0, self._fire, tick)
        checks.append(check)

    def _fire(self, tick: int) -> None:
        self._timers.pop(tick, None)
        due_ns = tick * self._tick_ns
        for check in self._slots.pop(tick, ()):
            try:
                check.tick(due_ns)
            except Exception as e:  # the tick's other probes still run
                self._report("prober: a scheduled call failed", e)

    def _on_epoll(self) -> None:
        handlers = self._handlers
        self._in_batch = True
        try:
            for fd, events in self._ep.poll(0):
                on_event = handlers.get(fd)
                if on_event is not None:
                    try:
                        on_event(events)
                    except Exception as e:  # a bug in one check must not stop the batch
                        on_event.__self__._fault(e)
        finally:
            self._in_batch = False
            dead, self._dead = self._dead, []
            for sock in dead:
                sock.close()

    def _watch(self, fd: int, on_event: Callable[[int], None]) -> None:
        self._handlers[fd] = on_event

    def _drop(self, fd: int, sock: socket.socket) -> None:
        """Forget and close sock. Inside an event batch the close waits for the batch's end,
        so that no new socket reuses the number while events for the old one are pending."""
        self._handlers.pop(fd, None)
        if self._in_batch:
            self._dead.append(sock)
        else:
            sock.close()

    def _later(self, coroutine) -> None:
        task = self._loop.create_task(coroutine)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _report(self, message: str, e: BaseException) -> None:
        if self._loop is not None:
            self._loop.call_exception_handler({"message": message, "exception": e})
