"""The prober tests' stage (test_prober*.py): run a test's coroutine under a last bound (run),
poll a condition on the loop (wait_for), a port nobody listens on, an http Probe, the Recorder
of what a prober reports, and a small asyncio HTTP/1.1 server on 127.0.0.1 (HttpServer, started)
closed with its prober (closing).
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from controlplane.config import Probe
from controlplane.probe import Prober
from controlplane.samples import Load, Sample

LOOPBACK = "127.0.0.1"
TEST_TIMEOUT_S = 10.0  # each test's last bound


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, TEST_TIMEOUT_S))


async def wait_for(
    predicate: Callable[[], Any], timeout_s: float, what: str, observe: Optional[Callable[[], Any]] = None
) -> Any:
    """Poll predicate on the loop until it is truthy; TimeoutError naming what and the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not true after {timeout_s}s; last {observe() if observe else value!r}")
        await asyncio.sleep(0.005)  # poll interval, not a wait for the condition


def free_port() -> int:
    """A port nobody listens on (bound then closed: connecting to it is refused)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def http_probe(path: str = "/health", interval_ms: int = 20, timeout_ms: int = 20, window: int = 10) -> Probe:
    return Probe(kind="http", path=path, interval_ms=interval_ms, timeout_ms=timeout_ms, window=window)


class Recorder:
    """Collects every Sample and Load the prober reports, per key."""

    def __init__(self) -> None:
        self.samples: dict[Any, list[Sample]] = {}
        self.loads: dict[Any, list[Load]] = {}

    def sample(self, key: Any, sample: Sample) -> None:
        self.samples.setdefault(key, []).append(sample)

    def load(self, key: Any, load: Load) -> None:
        self.loads.setdefault(key, []).append(load)

    def of(self, key: Any) -> list[Sample]:
        return self.samples.get(key, [])

    def errors(self, key: Any) -> set:
        return {s.error for s in self.of(key)}


@dataclass
class HttpServer:
    """A small HTTP/1.1 keep-alive server: pages maps a path to (status, body)."""

    pages: dict[str, tuple[int, bytes]] = field(default_factory=lambda: {"/health": (200, b"ok")})
    delay_s: float = 0.0  # before each answer
    hang: bool = False  # read requests, never answer
    chunked: bool = False
    split_s: Optional[float] = None  # write the head, wait this long, then the body
    close_after: bool = False  # Connection: close on every answer
    connections: int = 0
    requests: int = 0
    port: int = 0

    async def start(self) -> "HttpServer":
        self.server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.writers: set[asyncio.StreamWriter] = set()
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                if self.hang:
                    continue
                path = head.split(b" ")[1].decode()
                status, body = self.pages.get(path, (404, b"not found"))
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                extra = b"Connection: close\r\n" if self.close_after else b""
                if self.chunked:
                    middle = len(body) // 2
                    payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:middle], body[middle:]) if p)
                    head_out = b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n%s\r\n" % (status, extra)
                    payload += b"0\r\n\r\n"
                else:
                    head_out = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n" % (status, len(body), extra)
                    payload = body
                if self.split_s is not None:
                    writer.write(head_out)
                    await writer.drain()
                    await asyncio.sleep(self.split_s)
                    writer.write(payload)
                else:
                    writer.write(head_out + payload)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def close(self) -> None:
        self.server.close()
        for writer in list(self.writers):
            writer.close()
        await self.server.wait_closed()


async def started(**kwargs: Any) -> HttpServer:
    return await HttpServer(**kwargs).start()


async def closing(prober_: Prober, *servers: Any) -> None:
    await prober_.close()
    for server in servers:
        await server.close()
