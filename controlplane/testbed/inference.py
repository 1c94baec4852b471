"""A simulated inference server (vLLM's OpenAI API, KServe v2 health) for the demo, tests and
benchmarks: completions with a bounded number of running requests, a FIFO queue, a fixed
time-to-first-token and time-per-output-token, Prometheus metrics named like vLLM's, and knobs
that degrade it while it runs (POST /sim/degrade). Owns the server and its engine model; knows
nothing of the router. Stdlib asyncio only; HTTP/1.1 with keep-alive, one request at a time.

    python -m controlplane.testbed.inference --name b0 --listen 198.18.1.2:8000 --max-running 4
    curl -d '{"hang": true}' http://198.18.1.2:8000/sim/degrade

The model, in short. A request waits for one of --max-running slots in arrival order; while
fill_queue is N, a request first waits N x ttft (the prefill of N phantom requests ahead of
it), and those N count in num_requests_waiting (and against --max-waiting) until the knob is
reset; meanwhile the engine reports every slot busy and its token counter grows as if
--max-running phantom requests were generating (a busy engine, not a hung one). A running request produces its first token after ttft, then one every tpot, exactly
max_tokens tokens (finish_reason "length"). A token is a whitespace-separated word: prompts
cost their word count. KV-cache use is the running requests' prompt and generated tokens over
--kv-capacity-tokens, unless kv_usage overrides it. hang freezes the engine: no token, no
admission; health stays 200, as vLLM's does on a hung engine. A client that disconnects aborts
its request. added_latency_ms delays every response except /sim/*, the simulator's own control.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import ipaddress
import json
import urllib.request
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from controlplane import agent

PROG = "sim-inference"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
MAX_HEADER_BYTES = 16384
MAX_BODY_BYTES = 1 << 20
BACKLOG = 4096
STOP_AGENT_TIMEOUT_S = 5.0  # edge-heartbeat needs ~0.1 s to stop, its checker up to ~1.2 s
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "GPUs",
         "hum", "in", "the", "rack", "tonight")


class UsageError(ValueError):
    """A bad option or knob value; the message names the option or the knob."""


class KnobError(UsageError):
    def __init__(self, knob: str, message: str):
        super().__init__(f"{knob}: {message}")
        self.knob = knob
        self.reason = message


# ------------------------------------------------------------ knobs and options


def _number(knob: str, value: Any, lo: float, hi: Optional[float], what: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < lo or (hi is not None and value > hi):
        bound = f"in {lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
        raise KnobError(knob, f"{json.dumps(value)} is not {what} {bound}")
    return float(value)


def _integer(knob: str, value: Any, lo: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise KnobError(knob, f"{json.dumps(value)} is not an integer >= {lo}")
    return value


def _flag(knob: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise KnobError(knob, f"{json.dumps(value)} is not true or false")
    return value


@dataclass
class Knobs:
    """What POST /sim/degrade changes at run time (see the module docstring for the model)."""

    added_latency_ms: float = 0.0  # before every response but /sim/*
    fill_queue: int = 0  # phantom waiting requests
    kv_usage: Optional[float] = None  # 0..1 overrides the modelled KV-cache use; None models it
    hang: bool = False  # engine frozen: no tokens, no admission; health still 200
    not_ready: bool = False  # /v2/health/ready answers 503
    metrics_off: bool = False  # /metrics answers 404
    die: bool = False  # close everything and end (the process exits 0)

    @staticmethod
    def checked(changes: Any) -> dict[str, Any]:
        """Validate a /sim/degrade body (any subset of the knobs); return the typed values."""
        if not isinstance(changes, dict):
            raise KnobError("body", "is not a JSON object of knobs")
        out: dict[str, Any] = {}
        for knob, value in changes.items():
            if knob == "added_latency_ms":
                out[knob] = _number(knob, value, 0, None, "a number of milliseconds")
            elif knob == "fill_queue":
                out[knob] = _integer(knob, value, 0)
            elif knob == "kv_usage":
                out[knob] = None if value is None else _number(knob, value, 0, 1, "null or a number")
            elif knob in ("hang", "not_ready", "metrics_off", "die"):
                out[knob] = _flag(knob, value)
            else:
                known = ", ".join(f.name for f in fields(Knobs))
                raise KnobError(str(knob), f"is not a knob (knobs: {known})")
        return out


@dataclass(frozen=True)
class Options:
    """What a server runs with; check() says what is wrong, naming the option."""

    name: str = "sim"
    host: str = "127.0.0.1"
    port: int = 0  # 0: the OS picks
    model: str = "sim-model"
    max_running: int = 4
    max_waiting: int = 1000
    ttft_ms: float = 20.0
    tpot_ms: float = 5.0
    kv_capacity_tokens: int = 8192
    knobs: Knobs = field(default_factory=Knobs)  # the knobs at start
    heartbeat: Optional[str] = None  # ROUTER[:PORT]: run edge-heartbeat beside this server
    token: Optional[str] = None  # the backend's heartbeat token, decimal or 0x hex
    hb_interval_ms: float = 1.0

    def check(self) -> "Options":
        if not self.name:
            raise UsageError("--name: is empty")
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--listen: port {self.port} is not in 0..65535")
        for flag, value, lo in (("--max-running", self.max_running, 1), ("--max-waiting", self.max_waiting, 0),
                                ("--kv-capacity-tokens", self.kv_capacity_tokens, 1)):
            if not isinstance(value, int) or value < lo:
                raise UsageError(f"{flag}: {value!r} is not an integer >= {lo}")
        for flag, value in (("--ttft-ms", self.ttft_ms), ("--tpot-ms", self.tpot_ms)):
            if not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise UsageError(f"{flag}: {value!r} is not a number of milliseconds >= 0")
        if self.knobs.die:
            raise UsageError("die: can only be set at run time (POST /sim/degrade)")
        try:
            Knobs.checked(asdict(self.knobs))
        except KnobError as e:
            raise UsageError(f"--{e.knob.replace('_', '-')}: {e.reason}") from None
        if (self.heartbeat is None) != (self.token is None):
            raise UsageError("--heartbeat and --token: give both or neither")
        if self.heartbeat is not None:
            try:
                agent.parse_router(self.heartbeat)
                agent.parse_token(str(self.token))
                agent.parse_ms(f"{self.hb_interval_ms}", "--hb-interval-ms")
            except agent.UsageError as e:
                raise UsageError(str(e).replace("--router", "--heartbeat")) from None
            try:
                ipaddress.IPv4Address(self.host)
            except ValueError:
                raise UsageError(f"--listen: {self.host!r} is not an IPv4 address "
                                 f"(heartbeats are sent from it)") from None
        return self


def heartbeat_command(opts: Options, port: int) -> list[str]:
    """The edge-heartbeat command line for a server of opts bound to port: it sends from the
    listening address (unless that is 0.0.0.0) while GET /health answers 2xx."""
    check_host = "127.0.0.1" if opts.host == "0.0.0.0" else opts.host
    cmd = [sys.executable, "-m", "controlplane.agent", "--router", str(opts.heartbeat),
           "--service-port", str(port), "--token", str(opts.token),
           "--interval-ms", f"{opts.hb_interval_ms:g}", "--check", "http",
           "--check-url", f"http://{check_host}:{port}/health"]
    if opts.host != "0.0.0.0":
        cmd += ["--source", opts.host]
    return cmd


# ------------------------------------------------------------ the engine model


class Overloaded(Exception):
    """The queue is at --max-waiting."""


@dataclass(eq=False)
class Request:
    prompt_tokens: int
    max_tokens: int
    generated: int = 0


class Engine:
    """Slots, the FIFO queue, token timing and the counters; no I/O."""

    def __init__(self, opts: Options, knobs: Knobs):
        self.opts = opts
        self.knobs = knobs
        self.running: set[Request] = set()
        self.queue: collections.deque[tuple[asyncio.Future, Request]] = collections.deque()
        self.delayed = 0  # requests waiting out fill_queue's phantom prefills
        self.unhung = asyncio.Event()
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.request_success = 0
        self._phantom_tokens = 0.0  # generated by fill_queue's phantom requests
        self._phantom_t = time.monotonic()
        self.set_hang(knobs.hang)

    def _phantom(self) -> int:
        """Tokens the phantom backlog has produced so far (none while hung)."""
        now = time.monotonic()
        if self.knobs.fill_queue and self.unhung.is_set():
            self._phantom_tokens += (now - self._phantom_t) * self.opts.max_running * 1000 / self.opts.tpot_ms
        self._phantom_t = now
        return int(self._phantom_tokens)

    @property
    def busy(self) -> int:
        """Requests running as the metrics report them: fill_queue keeps every slot busy."""
        return max(len(self.running), self.opts.max_running if self.knobs.fill_queue else 0)

    @property
    def waiting(self) -> int:
        return self.delayed + len(self.queue) + self.knobs.fill_queue

    def kv_usage(self) -> float:
        if self.knobs.kv_usage is not None:
            return self.knobs.kv_usage
        used = sum(r.prompt_tokens + r.generated for r in self.running)
        return min(1.0, used / self.opts.kv_capacity_tokens)

    def set_hang(self, hang: bool) -> None:
        if hang:
            self.unhung.clear()
        else:
            self.unhung.set()
            self._schedule()

    async def admit(self, req: Request) -> None:
        """Wait for a slot (FIFO); raise Overloaded when the queue is full."""
        if self.waiting >= self.opts.max_waiting:
            raise Overloaded()
        if self.knobs.fill_queue:
            self.delayed += 1
            try:
                await asyncio.sleep(self.knobs.fill_queue * self.opts.ttft_ms / 1000)
            finally:
                self.delayed -= 1
        slot = asyncio.get_running_loop().create_future()
        self.queue.append((slot, req))
        self._schedule()
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.release(req)  # admitted as the waiter was cancelled
            else:
                self.queue.remove((slot, req))
            raise

    def _schedule(self) -> None:
        while self.queue and len(self.running) < self.opts.max_running and self.unhung.is_set():
            slot, req = self.queue.popleft()
            self.running.add(req)
            slot.set_result(None)

    def release(self, req: Request) -> None:
        if req in self.running:
            self.running.discard(req)
            if req.generated == req.max_tokens:
                self.request_success += 1
            self._schedule()

    async def next_token(self, req: Request) -> str:
        """Wait for req's next token (ttft for the first, then tpot; never while hung)."""
        first = req.generated == 0
        await asyncio.sleep((self.opts.ttft_ms if first else self.opts.tpot_ms) / 1000)
        await self.unhung.wait()
        if first:
            self.prompt_tokens += req.prompt_tokens
        req.generated += 1
        self.generation_tokens += 1
        return " " + WORDS[(req.generated - 1) % len(WORDS)]

    def snapshot(self) -> dict[str, Any]:
        return {"running": self.busy, "waiting": self.waiting, "kv_cache_usage": self.kv_usage(),
                "generation_tokens_total": self.generation_tokens + self._phantom(),
                "prompt_tokens_total": self.prompt_tokens, "request_success_total": self.request_success}

    def metrics(self) -> str:
        """Prometheus text format 0.0.4, names and label as vLLM's."""
        label = self.opts.model.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
        rows = (
            ("gauge", "vllm:num_requests_running", "Number of requests running on the engine.",
             self.busy),
            ("gauge", "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             self.waiting),
            ("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", self.kv_usage()),
            ("counter", "vllm:prompt_tokens_total", "Number of prefill tokens processed.", self.prompt_tokens),
            ("counter", "vllm:generation_tokens_total", "Number of generation tokens processed.",
             self.generation_tokens + self._phantom()),
            ("counter", "vllm:request_success_total", "Count of successfully processed requests.",
             self.request_success),
        )
        out = []
        for kind, name, text, value in rows:
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f'{name}{{model_name="{label}"}} {value}']
        return "\n".join(out) + "\n"


# ------------------------------------------------------------ HTTP


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
        del self.buf[:end + 4]
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
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n").encode()


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
        self._server: Optional[asyncio.base_events.Server] = None
        self._conns: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._closing: Optional[asyncio.Task] = None
        self._closed = asyncio.Event()
        self._seq = 0

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.opts.host, self.opts.port,
                                                  backlog=BACKLOG, reuse_address=True)
        self.address = self._server.sockets[0].getsockname()[:2]
        if self.opts.heartbeat is not None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
            # Its chatter goes to stderr: stdout keeps this server's one "listening" line.
            self.agent = subprocess.Popen(heartbeat_command(self.opts, self.address[1]), env=env,
                                          stdin=subprocess.DEVNULL, stdout=2)

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
        return {"backend": self.name, "model": self.opts.model, "knobs": asdict(self.state),
                "engine": self.engine.snapshot()}

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

    async def _send(self, conn: Conn, req: Optional[HttpRequest], status: str, doc: Any,
                    keep_alive: bool, ctype: str = "application/json") -> None:
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
                await self._send(conn, req, "200 OK", self.engine.metrics().encode(), keep,
                                 "text/plain; version=0.0.4; charset=utf-8")
        elif route == ("GET", "/v1/models"):
            await self._send(conn, req, "200 OK", {"object": "list", "data": [
                {"id": self.opts.model, "object": "model", "owned_by": self.name}]}, keep)
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
            await self._send(conn, req, "405 Method Not Allowed", {"error": f"{req.method[:20]} not allowed"},
                             keep)
        return True

    # -------------------------------------------------------- completions

    async def _api_error(self, conn: Conn, req: HttpRequest, status: str, message: str) -> bool:
        code = int(status.split()[0])
        await self._send(conn, req, status, {"error": {"message": message, "type": status.split(" ", 1)[1],
                                                       "code": code}, "backend": self.name}, req.keep_alive)
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
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16)) if chat \
            else body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return await self._api_error(conn, req, "400 Bad Request",
                                         f"max_tokens: {json.dumps(max_tokens)} is not an integer >= 1")
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

    async def _serve_request(self, conn: Conn, req: HttpRequest, work: Request, chat: bool, stream: bool,
                             usage_chunk: bool) -> bool:
        try:
            await self.engine.admit(work)
        except Overloaded:
            return await self._api_error(conn, req, "503 Service Unavailable",
                                         f"queue full ({self.opts.max_waiting} waiting)")
        try:
            return await self._generate(conn, req, work, chat, stream, usage_chunk)
        finally:
            self.engine.release(work)

    async def _generate(self, conn: Conn, req: HttpRequest, work: Request, chat: bool, stream: bool,
                        usage_chunk: bool) -> bool:
        self._seq += 1
        common = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{self.name}-{self._seq}",
                  "object": ("chat.completion" if chat else "text_completion") + (".chunk" if chat and stream else ""),
                  "created": int(time.time()), "model": self.opts.model, "backend": self.name}

        def usage() -> dict[str, int]:
            return {"prompt_tokens": work.prompt_tokens, "completion_tokens": work.generated,
                    "total_tokens": work.prompt_tokens + work.generated}

        def choice(text: str, last: bool) -> dict[str, Any]:
            done = "length" if last else None
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": done}
            if stream:
                delta = {"role": "assistant", "content": text} if work.generated == 1 else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": done}
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": done}

        if not stream:
            text = "".join([await self.engine.next_token(work) for _ in range(work.max_tokens)])
            await self._send(conn, req, "200 OK", {**common, "choices": [choice(text, True)], "usage": usage()},
                             req.keep_alive)
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


# ------------------------------------------------------------ command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, as every error of this program
        print(f"{PROG}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    d = Options()
    p = _Parser(prog=PROG, description="A simulated vLLM / KServe-v2 inference server: "
                "POST /v1/completions and /v1/chat/completions (JSON or stream), GET /health, "
                "/v2/health/live, /v2/health/ready, /metrics (vllm:* names), /v1/models; any other GET "
                "answers {\"backend\": NAME, \"peer\": ...}. Knobs change at run time with POST /sim/degrade "
                "(a JSON object of added_latency_ms, fill_queue, kv_usage, hang, not_ready, metrics_off, "
                "die) and read with GET /sim/state. Prints 'listening NAME ADDR:PORT' once bound; exits 0 on "
                "SIGTERM, SIGINT or die.")
    p.add_argument("--name", required=True, help="backend name put in every answer (the \"backend\" field)")
    p.add_argument("--listen", default=f"{d.host}:{d.port}", metavar="ADDR:PORT",
                   help="where to listen; port 0 picks a free one (default: %(default)s)")
    p.add_argument("--model", default=d.model, help="model name served, the metrics' model_name label "
                   "(default: %(default)s)")
    p.add_argument("--max-running", type=int, default=d.max_running, metavar="N",
                   help="requests generating at once; the rest wait in FIFO order (default: %(default)s)")
    p.add_argument("--max-waiting", type=int, default=d.max_waiting, metavar="N",
                   help="requests waiting (fill_queue's included) beyond which new ones get 503 "
                        "(default: %(default)s)")
    p.add_argument("--ttft-ms", type=float, default=d.ttft_ms, metavar="MS",
                   help="time to first token once running (default: %(default)s)")
    p.add_argument("--tpot-ms", type=float, default=d.tpot_ms, metavar="MS",
                   help="time per further output token (default: %(default)s)")
    p.add_argument("--kv-capacity-tokens", type=int, default=d.kv_capacity_tokens, metavar="N",
                   help="KV cache size: vllm:kv_cache_usage_perc is running requests' tokens over this "
                        "(default: %(default)s)")
    knobs = p.add_argument_group("knobs at start (POST /sim/degrade changes them later; die is run time only)")
    knobs.add_argument("--added-latency-ms", type=float, default=0.0, metavar="MS",
                       help="delay before every response but /sim/* (a slow or far host)")
    knobs.add_argument("--fill-queue", type=int, default=0, metavar="N",
                       help="phantom waiting requests: counted as waiting; each real request first "
                            "waits N x ttft")
    knobs.add_argument("--kv-usage", type=float, metavar="FRACTION",
                       help="report this KV-cache use (0..1) instead of modelling it")
    knobs.add_argument("--hang", action="store_true",
                       help="start hung: health 200, but no request is admitted and no token produced")
    knobs.add_argument("--not-ready", action="store_true", help="/v2/health/ready answers 503")
    knobs.add_argument("--metrics-off", action="store_true", help="/metrics answers 404")
    hb = p.add_argument_group("heartbeats (runs edge-heartbeat as a child process)")
    hb.add_argument("--heartbeat", metavar="ROUTER[:PORT]",
                    help="send the router heartbeats from the --listen address while GET /health "
                         "answers 2xx: a hung server keeps sending, as a real one would; an added "
                         "latency beyond the agent's check timeout (20 ms at a 1 ms interval) stops it")
    hb.add_argument("--token", metavar="TOKEN", help="this backend's heartbeat token (decimal or 0x hex)")
    hb.add_argument("--hb-interval-ms", type=float, default=d.hb_interval_ms, metavar="MS",
                    help="heartbeat interval (default: %(default)s)")
    return p


def options(args: argparse.Namespace) -> Options:
    """Parsed arguments -> checked Options."""
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen: {args.listen!r} is not ADDR:PORT")
    knobs = Knobs(added_latency_ms=args.added_latency_ms, fill_queue=args.fill_queue, kv_usage=args.kv_usage,
                  hang=args.hang, not_ready=args.not_ready, metrics_off=args.metrics_off)
    return Options(name=args.name, host=host.strip("[]"), port=int(port), model=args.model,
                   max_running=args.max_running, max_waiting=args.max_waiting, ttft_ms=args.ttft_ms,
                   tpot_ms=args.tpot_ms, kv_capacity_tokens=args.kv_capacity_tokens, knobs=knobs,
                   heartbeat=args.heartbeat, token=args.token, hb_interval_ms=args.hb_interval_ms).check()


async def _run(opts: Options) -> None:
    server = await serve(opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.close_soon)
    try:
        print(f"listening {server.name} {server.address[0]}:{server.address[1]}", flush=True)
        await server.wait_closed()
    finally:
        await server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        opts = options(args)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(opts))
    except OSError as e:
        print(f"{PROG} {opts.name}: {os.strerror(e.errno).lower() if e.errno else e} "
              f"({opts.host}:{opts.port})", file=sys.stderr)
        return 1
    return 0



def degrade_from(ns, address, port: int, **values) -> dict:
    """POST /sim/degrade to the server at address:port from network namespace ns (a testbed
    Ns); returns the server's state. For tests, the demo and benchmarks."""
    req = urllib.request.Request(f"http://{address}:{port}/sim/degrade", data=json.dumps(values).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with ns.enter():
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

if __name__ == "__main__":
    raise SystemExit(main())
