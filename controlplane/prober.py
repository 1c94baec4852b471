"""The probe engine: TCP connect, HTTP GET and gRPC health probes of every backend, and
scrapes of their Prometheus metrics, on the caller's asyncio loop. Owns the schedules, the
sockets and channels, the per-backend Window and the last Load; decides nothing about
weights (weights.py) and touches no map. A failed probe is a Sample, never an exception.

First version: one task per target and per schedule, asyncio.wait_for around each probe.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import random
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane import config
from controlplane.signals import Load, Sample, Window

MAX_RESPONSE_BYTES = 4 << 20  # a metrics page larger than this is refused
_LINGER_RST = struct.pack("ii", 1, 0)


@dataclass(frozen=True)
class Target:
    """One backend to probe: key names it in callbacks, window() and last_load()."""

    key: Hashable
    address: str
    port: int
    probe: Optional[config.Probe] = None
    metrics: Optional[config.MetricsScrape] = None


# ---------------------------------------------------------------- metrics text

# signal -> metric names, most preferred first; counters without their _total suffix
SIGNALS: dict[str, tuple[str, ...]] = {
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "progress": ("vllm:generation_tokens", "vllm:request_success", "sglang:generation_tokens",
                 "sglang:num_requests", "tgi_request_success"),
}
_COMBINE_MAX = {"kv_usage"}  # a fraction per engine: the fullest one counts, a sum would exceed 1
_NAMES = tuple(dict.fromkeys(n for names in SIGNALS.values() for n in names))
_NEEDLES = tuple((name, ("\n" + name).encode()) for name in _NAMES)


class MetricsError(ValueError):
    """The page is not Prometheus text with any engine metric."""


def parse_metrics(body: bytes) -> dict[str, float]:
    """Sum (kv_usage: max) of each known metric over its label sets; names without _total.

    Only lines that start with a known name are read; a value that is not a finite number
    (NaN, garbage) is skipped. Raises MetricsError when no known metric is found.
    """
    text = b"\n" + body
    found: dict[str, float] = {}
    for name, needle in _NEEDLES:
        at = text.find(needle)
        while at >= 0:
            start = at + len(needle)
            end = text.find(b"\n", start)
            if end < 0:
                end = len(text)
            value = _sample_value(text, start, end)
            if value is not None:
                if name in found:
                    found[name] = max(found[name], value) if name in _MAX_NAMES else found[name] + value
                else:
                    found[name] = value
            at = text.find(needle, end)
    if not found:
        raise MetricsError("no engine metrics")
    return found


_MAX_NAMES = {n for s in _COMBINE_MAX for n in SIGNALS[s]}


def _sample_value(text: bytes, start: int, end: int) -> Optional[float]:
    """The value of the sample line whose name ends at start, or None if it is not ours or bad."""
    if text.startswith(b"_total", start):
        start += 6
    if start >= end:
        return None
    c = text[start]
    if c == 0x7B:  # '{': labels; no '}' can follow the label block on the line
        close = text.rfind(b"}", start, end)
        if close < 0:
            return None
        rest = text[close + 1:end]
    elif c == 0x20 or c == 0x09:
        rest = text[start:end]
    else:
        return None  # a longer name that starts with ours
    parts = rest.split()
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def load_from(found: dict[str, float], t_ns: int) -> Load:
    """A Load from parse_metrics' result: for each signal the first name found."""
    values = {}
    for signal, names in SIGNALS.items():
        values[signal] = next((found[n] for n in names if n in found), None)
    return Load(t_ns=t_ns, ok=True, **values)


# ---------------------------------------------------------------- errors in words


def _errno_word(code: int) -> str:
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.ECONNRESET, errno.EPIPE):
        return "reset"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable"
    if code == errno.ETIMEDOUT:
        return "timeout"
    return os.strerror(code).lower()


def _why(e: BaseException) -> str:
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(e, OSError) and e.errno:
        return _errno_word(e.errno)
    if isinstance(e, EOFError):
        return "closed"
    return str(e) or type(e).__name__


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    # RST on close: thousands of probes a second would otherwise leave as many TIME_WAITs.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    return sock


# ---------------------------------------------------------------- HTTP/1.1 client


class _HttpConnection(asyncio.Protocol):
    """One kept-alive connection; get() sends a request and waits for the complete answer."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.buf = bytearray()
        self.waiter: Optional[asyncio.Future] = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > MAX_RESPONSE_BYTES:
            self._fail(ValueError("response too large"))
            return
        if self.waiter is None:
            self._fail(ValueError("data while idle"))
            return
        try:
            done = _parse_response(self.buf)
        except ValueError as e:
            self._fail(e)
            return
        if done is not None and not self.waiter.done():
            self.waiter.set_result(done)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or EOFError("closed"))

    def _fail(self, e: Exception) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(e)
        if self.transport is not None:
            self.transport.abort()

    async def get(self, request: bytes) -> tuple[int, bytes, bool]:
        self.buf.clear()
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            self.transport.write(request)
            return await self.waiter
        finally:
            self.waiter = None


def _parse_response(buf: bytearray) -> Optional[tuple[int, bytes, bool]]:
    """(status, body, keep-alive) once buf holds a complete response, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).decode("latin-1").split("\r\n")
    parts = head[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError("bad response")
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    keep = "close" not in headers.get("connection", "") and parts[0] != "HTTP/1.0"
    body_at = end + 4
    if "chunked" in headers.get("transfer-encoding", ""):
        body = bytearray()
        at = body_at
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                return None
            size = int(bytes(buf[at:eol]).split(b";")[0], 16)
            if size == 0:
                return int(parts[1]), bytes(body), keep
            if len(buf) < eol + 2 + size + 2:
                return None
            body += buf[eol + 2:eol + 2 + size]
            at = eol + 2 + size + 2
    length = int(headers.get("content-length", "0"))
    if len(buf) < body_at + length:
        return None
    return int(parts[1]), bytes(buf[body_at:body_at + length]), keep


class _HttpClient:
    def __init__(self, address: str, port: int, path: str):
        self.address, self.port = address, port
        self.request = f"GET {path} HTTP/1.1\r\nHost: {address}:{port}\r\nAccept: */*\r\n\r\n".encode()
        self.conn: Optional[_HttpConnection] = None

    async def get(self) -> tuple[int, bytes, int]:
        """(status, body, rtt_ns); the RTT is from sending the request to the whole answer."""
        loop = asyncio.get_running_loop()
        if self.conn is None or self.conn.closed:
            sock = _socket()
            try:
                await loop.sock_connect(sock, (self.address, self.port))
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _, self.conn = await loop.create_connection(_HttpConnection, sock=sock)
        sent = time.monotonic_ns()
        try:
            status, body, keep = await self.conn.get(self.request)
        except BaseException:
            self.close()
            raise
        rtt = time.monotonic_ns() - sent
        if not keep:
            self.close()
        return status, body, rtt

    def close(self) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.abort()
        self.conn = None


# ---------------------------------------------------------------- probes


class _Backend:
    """The schedules and state of one target."""

    def __init__(self, prober: "Prober", target: Target):
        self.prober = prober
        self.target = target
        self.window = Window(target.probe.window if target.probe else 1)
        self.last_load: Optional[Load] = None
        self.tasks: list[asyncio.Task] = []
        self.stopped = False
        self.http: Optional[_HttpClient] = None
        self.scrape: Optional[_HttpClient] = None
        self.channel: Optional[grpc.aio.Channel] = None
        probe, metrics = target.probe, target.metrics
        if probe is not None:
            if probe.kind == "http":
                self.http = _HttpClient(target.address, target.port, probe.path)
            elif probe.kind == "grpc":
                self.channel = grpc.aio.insecure_channel(f"{target.address}:{target.port}")
                self.stub = health_pb2_grpc.HealthStub(self.channel)
            self.tasks.append(asyncio.ensure_future(self._probe_loop(probe)))
        if metrics is not None:
            self.scrape = _HttpClient(target.address, target.port, metrics.path)
            self.tasks.append(asyncio.ensure_future(self._scrape_loop(metrics)))

    async def _probe_loop(self, probe: config.Probe) -> None:
        interval = probe.interval_ms / 1000
        timeout = probe.timeout_ms / 1000
        await asyncio.sleep(random.random() * interval)
        run = {"tcp": self._tcp, "http": self._http, "grpc": self._grpc}[probe.kind]
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self.stopped:  # asyncio.wait_for (3.11) may swallow a cancel
            t_ns = time.monotonic_ns()
            try:
                rtt_ns = await asyncio.wait_for(run(probe, timeout), timeout)
                sample = Sample(t_ns=t_ns, ok=True, rtt_s=rtt_ns / 1e9)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                sample = Sample(t_ns=t_ns, ok=False, error=_why(e))
            self.window.add(sample)
            if self.prober.on_sample is not None:
                self.prober.on_sample(self.target.key, sample)
            next_at += interval
            now = loop.time()
            if next_at < now:
                next_at = now
            await asyncio.sleep(next_at - now)

    async def _tcp(self, probe: config.Probe, timeout: float) -> int:
        loop = asyncio.get_running_loop()
        sock = _socket()
        try:
            start = time.monotonic_ns()
            await loop.sock_connect(sock, (self.target.address, self.target.port))
            return time.monotonic_ns() - start
        finally:
            sock.close()

    async def _http(self, probe: config.Probe, timeout: float) -> int:
        status, _, rtt = await self.http.get()
        if not 200 <= status < 300:
            raise ValueError(f"HTTP {status}")
        return rtt

    async def _grpc(self, probe: config.Probe, timeout: float) -> int:
        start = time.monotonic_ns()
        try:
            reply = await self.stub.Check(health_pb2.HealthCheckRequest(service=probe.grpc_service),
                                          timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise asyncio.TimeoutError() from None
            raise ValueError(f"grpc {e.code().name}") from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise ValueError(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        return time.monotonic_ns() - start

    async def _scrape_loop(self, metrics: config.MetricsScrape) -> None:
        interval = metrics.interval_ms / 1000
        await asyncio.sleep(random.random() * interval)
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self.stopped:  # asyncio.wait_for (3.11) may swallow a cancel
            t_ns = time.monotonic_ns()
            try:
                status, body, _ = await asyncio.wait_for(self.scrape.get(), interval)
                if status != 200:
                    raise ValueError(f"HTTP {status}")
                load = load_from(parse_metrics(body), t_ns)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                load = Load(t_ns=t_ns, ok=False, error=_why(e))
            self.last_load = load
            if self.prober.on_load is not None:
                self.prober.on_load(self.target.key, load)
            next_at += interval
            now = loop.time()
            if next_at < now:
                next_at = now
            await asyncio.sleep(next_at - now)

    async def stop(self) -> None:
        self.stopped = True
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        for client in (self.http, self.scrape):
            if client is not None:
                client.close()
        if self.channel is not None:
            await self.channel.close()


class Prober:
    """Probes the targets given to set_targets() until close()."""

    def __init__(self, on_sample: Optional[Callable[[Hashable, Sample], None]] = None,
                 on_load: Optional[Callable[[Hashable, Load], None]] = None):
        self.on_sample = on_sample
        self.on_load = on_load
        self._backends: dict[Hashable, _Backend] = {}
        self._stopping: set[asyncio.Task] = set()

    def set_targets(self, targets: Iterable[Target]) -> None:
        wanted = {t.key: t for t in targets}
        for key in list(self._backends):
            if key not in wanted or wanted[key] != self._backends[key].target:
                self._stop(self._backends.pop(key))
        for key, target in wanted.items():
            if key not in self._backends:
                self._backends[key] = _Backend(self, target)

    def _stop(self, backend: _Backend) -> None:
        task = asyncio.ensure_future(backend.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def window(self, key: Hashable) -> Optional[Window]:
        backend = self._backends.get(key)
        return backend.window if backend else None

    def last_load(self, key: Hashable) -> Optional[Load]:
        backend = self._backends.get(key)
        return backend.last_load if backend else None

    async def close(self) -> None:
        backends = list(self._backends.values())
        self._backends.clear()
        await asyncio.gather(*(b.stop() for b in backends), *self._stopping)
