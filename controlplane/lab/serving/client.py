"""The load generator of tools/bench-serving: open-loop, streamed OpenAI-style completions over
plain asyncio sockets, in one of two client behaviours:

  new     a new TCP connection per request, closed after it (Connection: close);
  pooled  a pool of keep-alive connections as OpenAI-style SDKs keep them (httpx's defaults:
          a request takes an idle connection or opens one; at most POOL_IDLE idle ones are kept,
          the rest closed), so several requests ride one connection and one balancer decision.

Each request is sent at its scheduled time whatever came before (open loop), streams its
tokens as server-sent events, and ends as an accounting.Outcome: TTFT at the first event,
the end at [DONE], the server that answered (the simulator names itself in every chunk). No
root needed: it talks to any address it can reach (the tests run it on loopback).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Callable, Sequence

from controlplane.lab.serving.accounting import Outcome
from controlplane.lab.serving.workload import Req

POOL_IDLE = 20  # httpx's max_keepalive_connections
DEADLINE_S = 20.0  # a request not done by then failed (the client gave up)
WORD = "tok "
_BACKEND = re.compile(rb'"backend":"([^"]+)"')


class Failed(Exception):
    pass


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.buf = bytearray()

    async def more(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise Failed("closed by the peer")
        self.buf += data

    async def until(self, mark: bytes) -> bytes:
        """Bytes up to and with mark, taken off the buffer."""
        while (end := self.buf.find(mark)) < 0:
            await self.more()
        out = bytes(self.buf[: end + len(mark)])
        del self.buf[: end + len(mark)]
        return out

    def close(self) -> None:
        self.writer.close()


def _request(r: Req, host: str, keep_alive: bool) -> bytes:
    body = json.dumps(
        {"model": "sim-model", "prompt": WORD * r.prompt_tokens, "max_tokens": r.max_tokens, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


async def _stream(conn: _Conn, r: Req, sent: float) -> Outcome:
    """Read one streamed answer off conn: status, then events until [DONE] and the last chunk."""
    head = await conn.until(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        raise Failed(f"HTTP {status[0].decode() if status else '?'}")
    ttft, tokens, backend = None, 0, None
    while True:
        await conn.until(b"data: ")
        event = await conn.until(b"\n\n")
        if event.startswith(b"[DONE]"):
            break
        tokens += 1
        if ttft is None:
            ttft = time.monotonic() - sent
            m = _BACKEND.search(event)
            backend = m.group(1).decode() if m else None
    await conn.until(b"0\r\n\r\n")  # the chunked body's end
    return Outcome(r.i, ttft, time.monotonic() - sent, tokens, backend)


class Client:
    """Sends a schedule to host:port with one behaviour ("new" or "pooled")."""

    def __init__(self, host: str, port: int, behaviour: str, deadline_s: float = DEADLINE_S):
        if behaviour not in ("new", "pooled"):
            raise ValueError(f"behaviour: {behaviour!r} is not new or pooled")
        self.host, self.port, self.behaviour, self.deadline_s = host, port, behaviour, deadline_s
        self.idle: list[_Conn] = []
        self.opened = 0  # connections opened: one balancer decision each

    async def _connect(self) -> _Conn:
        self.opened += 1
        return _Conn(*await asyncio.open_connection(self.host, self.port))

    async def _one(self, r: Req, sent: float) -> Outcome:
        pooled = self.behaviour == "pooled"
        conn = self.idle.pop() if pooled and self.idle else await self._connect()
        reusable = False
        try:
            conn.writer.write(_request(r, self.host, pooled))
            await conn.writer.drain()
            out = await _stream(conn, r, sent)
            reusable = pooled
            return out
        finally:
            if reusable and len(self.idle) < POOL_IDLE:
                self.idle.append(conn)
            else:
                conn.close()

    async def send(self, r: Req) -> Outcome:
        sent = time.monotonic()
        try:
            return await asyncio.wait_for(self._one(r, sent), self.deadline_s)
        except asyncio.TimeoutError:
            return Outcome(r.i, None, None, 0, None, f"no answer within {self.deadline_s:g} s")
        except (OSError, Failed, ValueError) as e:
            return Outcome(r.i, None, None, 0, None, str(e) or type(e).__name__)

    async def run(self, reqs: list[Req], at: Sequence[tuple[float, Callable[[], object]]] = ()) -> list[Outcome]:
        """Send every request at its time from now (open loop); at: (time, a blocking call to make
        then in a thread: the faults). Returns the outcomes in the schedule's order."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        side = [asyncio.create_task(self._later(t0 + t, fn)) for t, fn in at]
        tasks = []
        for r in reqs:
            delay = t0 + r.t_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.send(r)))
        outcomes = await asyncio.gather(*tasks)
        await asyncio.gather(*side)
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        return list(outcomes)

    @staticmethod
    async def _later(when: float, fn: Callable[[], object]) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, when - loop.time()))
        await loop.run_in_executor(None, fn)
