"""The simulator's HTTP/1.1 server: vLLM's OpenAI API (completions, chat, streamed or not),
the health endpoints, /metrics, /sim/degrade and /sim/state, over keep-alive connections
one request at a time; the heartbeat agent child; and running a server in a thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional

from controlplane.agent import parse_token
from controlplane.lab.heartbeats import write_token_file
from controlplane.lab.inference.engine import Engine, Overloaded, Request
from controlplane.lab.inference.options import KnobError, Knobs, Options, heartbeat_command

PACKAGE_ROOT = Path(__file__).resolve().parents[3]
MAX_HEADER_BYTES = 16384
MAX_BODY_BYTES = 1 << 20
BACKLOG = 4096
STOP_AGENT_TIMEOUT_S = 5.0  # edge-heartbeat needs ~0.1 s to stop, its checker up to ~1.2 s


class BadRequest(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    chunked_ok: bool  # HTTP/1.1: a streamed answer may use chunked encoding


class Conn:
    """One client connection: a read buffer over the stream, so bytes read while watching for
    a disconnect are kept for the next request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        host, port = writer.get_extra_info("peername")[:2]
        self.peer = f"{host}:{port}"

    async def fill(self) -> bool:
        """Read more into the buffer; False at EOF."""
        data = await self.reader.read(65536)
        self.buf += data
        return bool(data)

    async def read_request(self) -> Optional[HttpRequest]:
        """The next request, or None when the client closed between requests."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEADER_BYTES:
                raise BadRequest("431 Request Header Fields Too Large", "request head too large")
            if not await self.fill():
                if self.buf:
                    raise BadRequest("400 Bad Request", "connection closed mid-request")
                return None
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest("400 Bad Request", f"bad request line {lines[0][:80]!r}")
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise BadRequest("501 Not Implemented", "chunked request bodies are not supported")
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            raise BadRequest("400 Bad Request", f"bad content-length {length_text[:20]!r}")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise BadRequest("413 Content Too Large", f"body longer than {MAX_BODY_BYTES} bytes")
        if length and headers.get("expect", "").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(self.buf) < length:
            if not await self.fill():
                raise BadRequest("400 Bad Request", "connection closed mid-body")
        body = bytes(self.buf[:length])
        del self.buf[:length]
        connection = headers.get("connection", "").lower()
        keep = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        return HttpRequest(method, target.split("?", 1)[0], headers, body, keep, version != "HTTP/1.0")


def _head(status: str, ctype: str, keep_alive: bool, extra: str) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _count_tokens(value: Any) -> int:
    """Words in the strings of a prompt or messages; token ids count one each."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, int) and not isinstance(value, bool):
        return 1
    if isinstance(value, list):
        return sum(_count_tokens(v) for v in value)
    if isinstance(value, dict):
        return _count_tokens(value.get("content")) + _count_tokens(value.get("text"))
    return 0


class Server:
    """A running simulated inference server. state: the knobs (change them with degrade());
    engine: the model behind the metrics; address: (host, port) bound."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.name = opts.name
        self.state = replace(opts.knobs)
        self.engine = Engine(opts, self.state)
        self.address: tuple[str, int] = (opts.host, opts.port)
        self.agent: Optional[subprocess.Popen] = None  # the edge-heartbeat child, if any
        self._token_dir: Optional[str] = None  # its token file's directory
        self._server: Optional[asyncio.base_events.Server] = None
        self._conns: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._closing: Optional[asyncio.Task] = None
        self._closed = asyncio.Event()
        self._seq = 0

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    async def _start(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self.opts.host, self.opts.port, backlog=BACKLOG, reuse_address=True
        )
        self.address = self._server.sockets[0].getsockname()[:2]
        if self.opts.heartbeat is not None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
            self._token_dir, token_file = write_token_file(parse_token(self.opts.token))
            # Its chatter goes to stderr: stdout keeps this server's one "listening" line.
            self.agent = subprocess.Popen(
                heartbeat_command(self.opts, self.address[1], token_file), env=env, stdin=subprocess.DEVNULL, stdout=2
            )

    def degrade(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply a subset of the knobs (all or none: KnobError names the first bad one); return
        the state. Call it in the server's event loop."""
        state = self._apply(changes)
        if self.state.die:
            self.close_soon()
        return state

    def _apply(self, changes: Any) -> dict[str, Any]:
        checked = Knobs.checked(changes)
        for knob, value in checked.items():
            setattr(self.state, knob, value)
        if "hang" in checked:
            self.engine.set_hang(self.state.hang)
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.opts.model,
            "knobs": asdict(self.state),
            "engine": self.engine.snapshot(),
        }

    def close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close())

    async def close(self) -> None:
        """Stop listening, drop every connection, stop the heartbeat agent. Idempotent."""
        self.close_soon()
        await asyncio.shield(self._closing)

    async def wait_closed(self) -> None:
        """Return once the server is closed (close(), or the die knob)."""
        await self._closed.wait()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def _close(self) -> None:
        try:
            if self._server is not None:
                self._server.close()
            for task, writer in list(self._conns.items()):
                task.cancel()
                writer.transport.abort()
            if self._conns:
                await asyncio.wait(list(self._conns), timeout=1.0)
            if self.agent is not None:
                await asyncio.to_thread(_stop_process, self.agent, STOP_AGENT_TIMEOUT_S)
            if self._token_dir is not None:
                shutil.rmtree(self._token_dir, ignore_errors=True)
        finally:
            self._closed.set()

    # -------------------------------------------------------- connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._closing is not None:
            writer.transport.abort()
            return
        self._conns[task] = writer
        conn = Conn(reader, writer)
        try:
            while True:
                try:
                    req = await conn.read_request()
                except BadRequest as e:
                    await self._send(conn, None, e.status, {"error": str(e)}, keep_alive=False)
                    break
                if req is None or not await self._dispatch(conn, req) or not req.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.pop(task, None)
            writer.close()

    async def _delay(self, req: Optional[HttpRequest]) -> None:
        if self.state.added_latency_ms and not (req is not None and req.path.startswith("/sim/")):
            await asyncio.sleep(self.state.added_latency_ms / 1000)

    async def _send(
        self,
        conn: Conn,
        req: Optional[HttpRequest],
        status: str,
        doc: Any,
        keep_alive: bool,
        ctype: str = "application/json",
    ) -> None:
        body = doc if isinstance(doc, bytes) else _json(doc)
        await self._delay(req)
        conn.writer.write(_head(status, ctype, keep_alive, f"Content-Length: {len(body)}\r\n") + body)
        await conn.writer.drain()

    async def _dispatch(self, conn: Conn, req: HttpRequest) -> bool:
        """Answer one request; False when the connection must end."""
        keep = req.keep_alive
        route = (req.method, req.path)
        if route in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
            return await self._completion(conn, req, chat=req.path.endswith("/chat/completions"))
        if req.method == "GET" and req.path in ("/health", "/v2/health/live"):
            await self._send(conn, req, "200 OK", b"", keep)
        elif route == ("GET", "/v2/health/ready"):
            ready = not self.state.not_ready
            await self._send(conn, req, "200 OK" if ready else "503 Service Unavailable", b"", keep)
        elif route == ("GET", "/metrics"):
            if self.state.metrics_off:
                await self._send(conn, req, "404 Not Found", {"error": "no /metrics (metrics_off)"}, keep)
            else:
                await self._send(
                    conn,
                    req,
                    "200 OK",
                    self.engine.metrics().encode(),
                    keep,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
        elif route == ("GET", "/v1/models"):
            await self._send(
                conn,
                req,
                "200 OK",
                {"object": "list", "data": [{"id": self.opts.model, "object": "model", "owned_by": self.name}]},
                keep,
            )
        elif route == ("GET", "/sim/state"):
            await self._send(conn, req, "200 OK", self.snapshot(), keep)
        elif route == ("POST", "/sim/degrade"):
            try:
                state = self._apply(json.loads(req.body or b"{}"))
            except ValueError as e:  # KnobError too
                why = str(e) if isinstance(e, KnobError) else f"body: not JSON ({e})"
                await self._send(conn, req, "400 Bad Request", {"error": why}, keep)
            else:
                if self.state.die:  # answered first, then everything closes
                    try:
                        await self._send(conn, req, "200 OK", state, False)
                    finally:
                        self.close_soon()
                    return False
                await self._send(conn, req, "200 OK", state, keep)
        elif req.method == "GET":
            await self._send(conn, req, "200 OK", {"backend": self.name, "peer": conn.peer}, keep)
        elif req.method == "POST":
            await self._send(conn, req, "404 Not Found", {"error": f"no POST {req.path[:80]}"}, keep)
        else:
            await self._send(conn, req, "405 Method Not Allowed", {"error": f"{req.method[:20]} not allowed"}, keep)
        return True

    # -------------------------------------------------------- completions

    async def _api_error(self, conn: Conn, req: HttpRequest, status: str, message: str) -> bool:
        code = int(status.split()[0])
        await self._send(
            conn,
            req,
            status,
            {"error": {"message": message, "type": status.split(" ", 1)[1], "code": code}, "backend": self.name},
            req.keep_alive,
        )
        return True

    async def _completion(self, conn: Conn, req: HttpRequest, chat: bool) -> bool:
        try:
            body = json.loads(req.body)
        except ValueError as e:
            return await self._api_error(conn, req, "400 Bad Request", f"body: not JSON ({e})")
        if not isinstance(body, dict):
            return await self._api_error(conn, req, "400 Bad Request", "body: not a JSON object")
        prompt_key = "messages" if chat else "prompt"
        if prompt_key not in body:
            return await self._api_error(conn, req, "400 Bad Request", f"{prompt_key}: required")
        max_tokens = (
            body.get("max_completion_tokens", body.get("max_tokens", 16)) if chat else body.get("max_tokens", 16)
        )
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return await self._api_error(
                conn, req, "400 Bad Request", f"max_tokens: {json.dumps(max_tokens)} is not an integer >= 1"
            )
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            return await self._api_error(conn, req, "400 Bad Request", f"stream: {json.dumps(stream)} is not a bool")
        options = body.get("stream_options")
        usage_chunk = isinstance(options, dict) and options.get("include_usage") is True
        work = Request(_count_tokens(body[prompt_key]), max_tokens)
        job = asyncio.create_task(self._serve_request(conn, req, work, chat, stream, usage_chunk))
        # A client that goes away aborts its request, waiting or running, as with vLLM; bytes it
        # sends meanwhile stay in the buffer for the next request.
        watch = asyncio.create_task(conn.fill())
        try:
            await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not job.done():
                if watch.exception() is not None or not watch.result():
                    return False
                await job
            return job.result()
        finally:
            if watch.done():
                watch.exception()  # retrieved: a reset after the answer is no news
            else:
                watch.cancel()
                await asyncio.wait({watch})  # its read must end before the connection's next one
            if not job.done():
                job.cancel()
                await asyncio.wait({job})

    async def _serve_request(
        self, conn: Conn, req: HttpRequest, work: Request, chat: bool, stream: bool, usage_chunk: bool
    ) -> bool:
        try:
            await self.engine.admit(work)
        except Overloaded:
            return await self._api_error(
                conn, req, "503 Service Unavailable", f"queue full ({self.opts.max_waiting} waiting)"
            )
        try:
            return await self._generate(conn, req, work, chat, stream, usage_chunk)
        finally:
            self.engine.release(work)

    async def _generate(
        self, conn: Conn, req: HttpRequest, work: Request, chat: bool, stream: bool, usage_chunk: bool
    ) -> bool:
        self._seq += 1
        common = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.name}-{self._seq}",
            "object": ("chat.completion" if chat else "text_completion") + (".chunk" if chat and stream else ""),
            "created": int(time.time()),
            "model": self.opts.model,
            "backend": self.name,
        }

        def usage() -> dict[str, int]:
            return {
                "prompt_tokens": work.prompt_tokens,
                "completion_tokens": work.generated,
                "total_tokens": work.prompt_tokens + work.generated,
            }

        def choice(text: str, last: bool) -> dict[str, Any]:
            done = "length" if last else None
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": done}
            if stream:
                delta = {"role": "assistant", "content": text} if work.generated == 1 else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": done}
            return {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": done,
            }

        if not stream:
            text = "".join([await self.engine.next_token(work) for _ in range(work.max_tokens)])
            await self._send(
                conn, req, "200 OK", {**common, "choices": [choice(text, True)], "usage": usage()}, req.keep_alive
            )
            return True
        keep = req.keep_alive and req.chunked_ok
        await self._delay(req)
        extra = "Cache-Control: no-cache\r\n" + ("Transfer-Encoding: chunked\r\n" if req.chunked_ok else "")
        conn.writer.write(_head("200 OK", "text/event-stream", keep, extra))

        async def event(data: bytes) -> None:
            data = b"data: " + data + b"\n\n"
            conn.writer.write(b"%x\r\n%s\r\n" % (len(data), data) if req.chunked_ok else data)
            await conn.writer.drain()

        for _ in range(work.max_tokens):
            text = await self.engine.next_token(work)
            await event(_json({**common, "choices": [choice(text, work.generated == work.max_tokens)]}))
        if usage_chunk:
            await event(_json({**common, "choices": [], "usage": usage()}))
        await event(b"[DONE]")
        if req.chunked_ok:
            conn.writer.write(b"0\r\n\r\n")
            await conn.writer.drain()
        return keep


def _stop_process(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the child by its pid, wait at most timeout_s, then SIGKILL; reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def serve(opts: Options) -> Server:
    """Check opts, bind, start the heartbeat agent if asked; the server runs in this event loop
    until close() or the die knob."""
    server = Server(opts.check())
    try:
        await server._start()
    except BaseException:
        await server.close()  # the socket bound before the agent failed to start
        raise
    return server


# ------------------------------------------------------------ in a thread, for synchronous tests


class Handle:
    """A Server running in its own thread and event loop (run_in_thread)."""

    def __init__(self, server: Server, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self.server = server
        self.loop = loop
        self.thread = thread
        self.address: tuple[str, int] = server.address
        self.url = server.url

    def _call(self, fn: Any, timeout_s: float) -> Any:
        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def degrade(self, timeout_s: float = 5.0, **changes: Any) -> dict[str, Any]:
        """Set knobs as POST /sim/degrade would; KnobError for a bad one."""
        return self._call(lambda: self.server.degrade(changes), timeout_s)

    def state(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """What GET /sim/state answers: knobs and engine counts."""
        return self._call(self.server.snapshot, timeout_s)

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the server and end its thread. Idempotent."""
        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(timeout_s)
            except RuntimeError:  # the loop ended meanwhile (die)
                pass
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise TimeoutError(f"{self.server.name}: server thread still running after {timeout_s}s")

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_in_thread(opts: Options, timeout_s: float = 10.0) -> Handle:
    """Start a server in a new thread; return once it listens (or raise what serve() raised)."""
    started: concurrent.futures.Future = concurrent.futures.Future()

    async def life() -> None:
        try:
            server = await serve(opts)
        except BaseException as e:
            started.set_exception(e)
            return
        started.set_result((server, asyncio.get_running_loop()))
        await server.wait_closed()

    thread = threading.Thread(target=asyncio.run, args=(life(),), name=f"sim-{opts.name}", daemon=True)
    thread.start()
    server, loop = started.result(timeout_s)
    return Handle(server, loop, thread)
