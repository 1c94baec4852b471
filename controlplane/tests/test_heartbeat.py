"""controlplane.agent (edge-heartbeat): the pure part (deadlines, option parsing), the
health checks against a real HTTP server, and the agent as a process sending real UDP.

Everything stays on 127.0.0.1; every server, socket, thread and process a test starts is
stopped by the test, and every wait polls a condition with a bound.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from controlplane import abi
from controlplane.config import Heartbeat
from controlplane.agent import (
    DEFAULT_INTERVAL_MS,
    DEFAULT_ROUTER_PORT,
    Checker,
    CheckerGone,
    Gate,
    HttpCheck,
    Readiness,
    Result,
    StopFlag,
    Target,
    TcpCheck,
    Ticker,
    UsageError,
    main,
    options,
    parse_router,
    parse_token,
    parser,
    sleep_until,
)
from controlplane.agent import wire
from controlplane.lab.traffic import wait_until

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
MS = 1_000_000
TOKEN = 0x5EED0001
SERVICE_PORT = 8000


# ------------------------------------------------------------ pure: deadlines


def test_deadlines_are_absolute_so_lateness_never_accumulates():
    ticker = Ticker(start_ns=5_000, interval_ns=MS)

    for k in range(1, 1001):
        now = ticker.deadline_ns + 700_000  # every wake-up 0.7 ms late: still within its tick
        assert ticker.advance(now) == 0
        assert ticker.deadline_ns == 5_000 + k * MS

    assert ticker.deadline_ns == 5_000 + 1000 * MS  # not 1000 * 1.7 ms


def test_a_late_tick_skips_the_deadlines_it_missed_instead_of_bunching_them():
    ticker = Ticker(start_ns=0, interval_ns=MS)

    skipped = ticker.advance(3 * MS + 200_000)  # woke 3.2 ms after the tick at 0

    assert skipped == 3  # the ticks at 1, 2 and 3 ms are gone
    assert ticker.deadline_ns == 4 * MS  # the next one is in the future, not in the past
    assert ticker.advance(4 * MS) == 0 and ticker.deadline_ns == 5 * MS


def test_advance_always_moves_at_least_one_tick():
    ticker = Ticker(start_ns=0, interval_ns=MS)

    assert ticker.advance(-10 * MS) == 0  # a clock reading before the start
    assert ticker.deadline_ns == MS


@pytest.mark.parametrize("interval_ns", [0, -1])
def test_ticker_rejects_an_interval_that_is_not_positive(interval_ns):
    with pytest.raises(ValueError, match="not positive"):
        Ticker(0, interval_ns)


def test_sleep_until_sleeps_in_bounded_naps_to_the_deadline_and_stops_when_asked():
    now = [0]
    naps = []

    def nap(s: float) -> None:
        naps.append(s)
        now[0] += int(s * 1e9)

    assert sleep_until(120 * MS, StopFlag(), clock=lambda: now[0], nap=nap) is True
    assert naps == [0.05, 0.05, 0.02]  # never longer than MAX_NAP_S, ends exactly on the deadline

    stop = StopFlag()
    stop.set()
    assert sleep_until(120 * MS, stop, clock=lambda: 0, nap=nap) is False


# ------------------------------------------------------------ pure: options


@pytest.mark.parametrize("text, expected", [
    ("198.18.1.1", ("198.18.1.1", 7946)),
    ("198.18.1.1:9000", ("198.18.1.1", 9000)),
])
def test_router_is_an_address_with_an_optional_port(text, expected):
    addr, port = parse_router(text)
    assert (str(addr), port) == expected


@pytest.mark.parametrize("text, message", [
    ("router.example", "--router: 'router.example' is not an IPv4 address"),
    ("198.18.1.1:70000", "--router port: '70000' is not a port (1..65535)"),
    ("198.18.1.1:", "--router port: '' is not a port"),
    ("::1", "--router: '::1' is not an IPv4 address"),
])
def test_router_errors_name_the_option(text, message):
    with pytest.raises(UsageError) as e:
        parse_router(text)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("text, value", [("0x5eed0001", 0x5EED0001), ("12345", 12345),
                                         ("0xffffffffffffffff", 2**64 - 1)])
def test_tokens_are_decimal_or_hex_like_the_config(text, value):
    assert parse_token(text) == value


@pytest.mark.parametrize("text, message", [("zz", "is not an integer"), ("-1", "out of range"), ("0", "out of range"),
                                           ("0x10000000000000000", "out of range")])
def test_bad_tokens_are_refused(text, message):
    with pytest.raises(UsageError, match=message):
        parse_token(text)


TOKEN_FILES: dict[int, str] = {}


@pytest.fixture(scope="module", autouse=True)
def token_files(tmp_path_factory) -> Iterator[None]:
    """Files holding the tokens the tests pass with --token-file (token_file(t))."""
    directory = tmp_path_factory.mktemp("tokens")
    for token in (1, 7, TOKEN):
        path = directory / f"{token:#x}"
        path.write_text(f"{token:#x}\n")
        TOKEN_FILES[token] = str(path)
    yield
    TOKEN_FILES.clear()


def token_file(token: int) -> str:
    return TOKEN_FILES[token]


def test_the_token_comes_from_a_file_never_from_the_command_line(tmp_path):
    assert opts().token == 7
    assert "--token" not in parser().format_help().replace("--token-file", "").replace("--token-secret-file", "")
    missing = tmp_path / "absent"
    with pytest.raises(UsageError, match=f"^--token-file: cannot read {missing}: No such file or directory$"):
        options(parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000",
                                     "--token-file", str(missing)]))
    zero = tmp_path / "zero"
    zero.write_text("0\n")
    with pytest.raises(UsageError, match="^--token-file: the token is out of range 1..2"):
        options(parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000",
                                     "--token-file", str(zero)]))


def opts(*argv: str):
    return options(parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000",
                                        "--token-file", token_file(7), *argv]))


def test_check_defaults_follow_the_heartbeat_interval_and_the_source_address():
    fast = opts("--interval-ms", "1", "--source", "198.18.1.2")
    assert (fast.check_interval_ms, fast.check_timeout_ms) == (5.0, 20.0)  # floors: 5 ms, 20 ms
    assert fast.target.url == "http://198.18.1.2:8000/v2/health/ready"  # where the router sends traffic

    slow = opts()
    assert (slow.interval_ms, slow.check_interval_ms, slow.check_timeout_ms) == (100.0, 100.0, 200.0)
    assert slow.target.url == "http://127.0.0.1:8000/v2/health/ready"
    assert slow.router_port == 7946 and slow.duration_s is None and slow.rt_priority == 0

    assert opts("--check", "tcp", "--source", "198.18.1.2").target == Target("198.18.1.2", 8000)
    assert opts("--check", "tcp", "--check-url", "http://10.1.1.1:9000/").target.hostport == "10.1.1.1:9000"
    assert opts("--check", "none").target is None
    assert opts("--check-url", "http://[::1]:8001/health?full=1").target.url == "http://[::1]:8001/health?full=1"


def test_a_token_secret_file_gives_the_token_the_router_derives(tmp_path):
    from controlplane.discovery.tokens import derive_token
    secret = tmp_path / "chat.secret"
    secret.write_bytes(b"0123456789abcdef-secret\n")
    got = options(parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000", "--source",
                                       "198.18.1.2", "--token-secret-file", str(secret)]))
    assert got.token == derive_token(b"0123456789abcdef-secret", "198.18.1.2", 8000)
    # without --source: the address the kernel sends to the router from (here loopback's)
    local = options(parser().parse_args(["--router", "127.0.0.1", "--service-port", "8000",
                                         "--token-secret-file", str(secret)]))
    assert local.token == derive_token(b"0123456789abcdef-secret", "127.0.0.1", 8000)
    with pytest.raises(UsageError, match="^--token-file: give exactly one of --token-file, --token-secret-file$"):
        options(parser().parse_args(["--router", "127.0.0.1", "--service-port", "8000", "--token-file", token_file(1),
                                     "--token-secret-file", str(secret)]))


def test_the_agents_defaults_are_the_configs():
    assert DEFAULT_ROUTER_PORT == Heartbeat().port
    assert DEFAULT_INTERVAL_MS == Heartbeat().interval_ms


def test_the_console_script_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["edge-heartbeat"] == "controlplane.agent:main"


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --router, --service-port"),
    (["--interval-ms", "0"], "--interval-ms: '0' is not a number of milliseconds in 0.05..3.6e+06"),
    (["--interval-ms", "nan"], "--interval-ms: 'nan' is not a number of milliseconds"),
    (["--check", "icmp"], "argument --check: invalid choice: 'icmp'"),
    (["--check-url", "https://127.0.0.1/health"], "--check-url: 'https://127.0.0.1/health' is not an http://"),
    (["--check", "none", "--check-url", "http://127.0.0.1/"], "--check-url: given with --check none"),
    (["--duration-s", "-1"], "--duration-s: '-1' is not a number of seconds"),
    (["--rt-priority", "100"], "--rt-priority: 100 is not in 0..99"),
    (["--source", "198.18.1.300"], "--source: '198.18.1.300' is not an IPv4 address"),
    (["--service-port", "0"], "--service-port: '0' is not a port"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v) or "nothing")
def test_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    required = {"--router": "127.0.0.1", "--service-port": "8000", "--token-file": token_file(1)} if argv else {}
    for flag in argv[::2]:
        required.pop(flag, None)
    try:
        code = main([x for kv in required.items() for x in kv] + argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code

    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"edge-heartbeat: {message}"), err


# ------------------------------------------------------------ a real health endpoint


class HealthServer:
    """An HTTP/1.1 server on 127.0.0.1 whose answer can be flipped; counts what it served.

    mode: "length" (Content-Length, head and body written apart, as http.server does),
    "chunked", or "close" (no length: the body ends when the server closes).
    """

    def __init__(self, mode: str = "length"):
        self.status = 200
        self.mode = mode
        self.answers: Counter = Counter()
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with server.lock:
                    server.connections.append(self.connection)

            def do_GET(self) -> None:
                status, body = server.status, b'{"ready": true}'
                with server.lock:
                    server.answers[status] += 1
                self.send_response(status)
                if server.mode == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                elif server.mode == "close":
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body)
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away
                    super().handle_error(request, client_address)

        self.httpd = Server((LOOPBACK, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://{LOOPBACK}:{self.port}/v2/health/ready"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()
        self.alive = True

    def count(self, status: int) -> int:
        with self.lock:
            return self.answers[status]

    def kill(self) -> None:
        """Like a crashed server: the port closes and the kernel ends every connection."""
        if not self.alive:
            return
        self.alive = False
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
        with self.lock:
            for conn in self.connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def server() -> Iterator[HealthServer]:
    srv = HealthServer()
    try:
        yield srv
    finally:
        srv.kill()


def free_port() -> int:
    """A loopback port nothing listens on (bound once, released)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def test_http_check_keeps_one_connection_and_follows_the_status(server):
    check = HttpCheck(Target(LOOPBACK, server.port, "/v2/health/ready"))
    try:
        results = [check.check(1.0) for _ in range(20)]
        server.status = 503
        unready = check.check(1.0)
        server.status = 204
        again = check.check(1.0)
    finally:
        check.close()

    assert set(results) == {Result(True, "http 200")}
    assert unready == Result(False, "http 503")
    assert again == Result(True, "http 204")
    assert check.connections == 1 and len(server.connections) == 1  # keep-alive throughout


@pytest.mark.parametrize("mode", ["chunked", "close"])
def test_http_check_reads_chunked_and_close_delimited_answers(mode):
    srv = HealthServer(mode)
    check = HttpCheck(Target(LOOPBACK, srv.port, "/health"))
    try:
        results = [check.check(1.0) for _ in range(3)]
    finally:
        check.close()
        srv.kill()

    assert results == [Result(True, "http 200")] * 3
    assert check.connections == (1 if mode == "chunked" else 3)  # "close" ends each connection


def test_http_check_fails_when_refused_or_unanswered():
    refused = HttpCheck(Target(LOOPBACK, free_port()))
    with socket.socket() as silent:  # listens, so connects succeed, but never accepts nor answers
        silent.bind((LOOPBACK, 0))
        silent.listen(8)
        mute = HttpCheck(Target(LOOPBACK, silent.getsockname()[1]))
        try:
            t0 = time.monotonic()
            unanswered = mute.check(0.05)
            took_s = time.monotonic() - t0
            no_port = refused.check(1.0)
        finally:
            mute.close()
            refused.close()

    assert not no_port.ok and no_port.detail.startswith("http: connection refused (127.0.0.1:")
    assert not unanswered.ok and unanswered.detail.endswith("within 50 ms")
    assert took_s < 1.0  # bounded by the check's timeout, not by the server


def test_http_check_fails_when_the_server_closes_without_answering():
    """check() never raises: a server that accepts and closes is a failed check."""
    with socket.socket() as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen(8)
        check = HttpCheck(Target(LOOPBACK, listener.getsockname()[1]))

        def hang_up() -> None:
            conn, _ = listener.accept()
            conn.recv(4096)  # the request
            conn.close()

        closer = threading.Thread(target=hang_up, daemon=True)
        closer.start()
        try:
            result = check.check(2.0)
        finally:
            check.close()
            closer.join(5.0)

    assert not result.ok and result.detail.startswith("http: connection closed by the server"), result


def test_tcp_check_connects_to_the_service_port(server):
    check = TcpCheck(Target(LOOPBACK, server.port))
    try:
        up = check.check(1.0)
        server.kill()
        down = check.check(1.0)
    finally:
        check.close()

    assert up == Result(True, f"tcp connect to 127.0.0.1:{server.port}")
    assert not down.ok and down.detail.startswith("tcp connect: connection refused")


@pytest.mark.parametrize("kind", [HttpCheck, TcpCheck])
def test_a_server_that_dies_is_noticed_at_once_not_at_the_next_check(server, kind):
    """The next scheduled check is a minute away; the closed connection triggers one now."""
    lines: list[str] = []
    readiness = Readiness(lines.append)
    stop = StopFlag()
    checker = Checker(kind(Target(LOOPBACK, server.port, "/")), readiness, interval_ms=60_000,
                      timeout_ms=1_000, stop=stop)
    checker.start()
    try:
        wait_until(lambda: readiness.ready, 5.0, "first check passes", observe=lambda: lines)
        server.kill()
        wait_until(lambda: readiness.ready is False, 5.0, "not ready after the server died", observe=lambda: lines)
    finally:
        stop.set()
        checker.join(timeout=5)

    assert not checker.is_alive()
    assert checker.checks == 2  # the first, and the one the closed connection triggered
    assert lines[0].startswith("ready: ") and lines[1].startswith("not ready: ")
    assert "connection refused" in lines[1]


def test_the_gate_opens_only_while_ready_and_checks_keep_finishing():
    lines: list[str] = []
    readiness = Readiness(lambda line: None)
    gate = Gate(readiness, stale_ns=100 * MS, say=lines.append, now_ns=0)

    assert not gate.open(50 * MS)  # no verdict yet
    readiness.update(Result(True, "http 200"))
    assert gate.open(60 * MS)
    assert gate.open(150 * MS)  # 90 ms since the last check finished: still fresh
    assert not gate.open(161 * MS)  # 101 ms: the checker hangs
    assert not gate.open(500 * MS)
    readiness.update(Result(True, "http 200"))
    assert gate.open(501 * MS)
    readiness.update(Result(False, "http 503"))
    assert not gate.open(502 * MS)

    assert lines == ["not ready: no check finished for 100 ms", "checks resumed"]


def test_a_gate_without_a_checker_never_goes_stale_and_a_dead_checker_raises():
    readiness = Readiness(lambda line: None)
    readiness.update(Result(True, "no check"))
    assert Gate(readiness, None, lambda line: None, now_ns=0).open(10**15)

    dead = Gate(readiness, 100 * MS, lambda line: None, now_ns=0, gone=lambda: "exited with 1")
    assert dead.open(100 * MS)
    with pytest.raises(CheckerGone, match="exited with 1"):
        dead.open(101 * MS)


def test_readiness_speaks_only_on_transitions():
    lines: list[str] = []
    readiness = Readiness(lines.append)
    for ok, detail in [(True, "http 200"), (True, "http 200"), (False, "http 503"), (False, "http 500"),
                       (True, "http 200")]:
        readiness.update(Result(ok, detail))

    assert lines == ["ready: http 200", "not ready: http 503", "ready: http 200"]


# ------------------------------------------------------------ the agent as a process


@dataclass(frozen=True)
class Datagram:
    t: float  # time.monotonic() at receipt
    magic: int
    version: int
    port: int
    seq: int
    epoch: int
    token: int


class Receiver:
    """A UDP socket on 127.0.0.1 standing in for the router; a thread records what arrives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((LOOPBACK, 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.got: list[Datagram] = []
        self.sizes: set[int] = set()
        self.running = True
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while self.running:  # ends within 50 ms of close()
            try:
                data = self.sock.recv(2048)
            except socket.timeout:
                continue
            self.sizes.add(len(data))
            if len(data) == abi.HEARTBEAT_SIZE:
                self.got.append(Datagram(time.monotonic(), *abi.HEARTBEAT.unpack(data)))

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=5)
        self.sock.close()


class AgentProcess:
    """edge-heartbeat run as `python -m controlplane.agent`; a thread collects its lines."""

    def __init__(self, *argv: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "controlplane.agent", *argv], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []  # (time.monotonic(), line)
        self.stderr = ""  # all of it, once stopped
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # ends when the process closes stdout (it exits)
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> list[str]:
        return [line for _, line in self.lines]

    def first(self, prefix: str, after: float = 0.0) -> float | None:
        """When the first line starting with prefix (seen after time `after`) arrived, or None."""
        return next((t for t, line in self.lines if t > after and line.startswith(prefix)), None)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the agent (by its pid), wait for its exit; returns the exit code."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            return self.proc.wait(timeout=5)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=5)
            self.thread.join(timeout=5)
            self.stderr = self.proc.stderr.read()  # the process is gone: read to EOF at once
            self.proc.stdout.close()
            self.proc.stderr.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rx = Receiver()
    try:
        yield rx
    finally:
        rx.close()


def agent_args(receiver: Receiver, *extra: str) -> list[str]:
    return ["--router", f"{LOOPBACK}:{receiver.port}", "--source", LOOPBACK, "--service-port",
            str(SERVICE_PORT), "--token-file", token_file(TOKEN), "--interval-ms", "1", *extra]


def test_agent_sends_only_while_its_server_is_ready(server, receiver):
    agent = AgentProcess(*agent_args(receiver, "--check-url", server.url, "--check-interval-ms", "5"))
    try:
        wait_until(lambda: len(receiver.got) >= 50, 10.0, "50 heartbeats", observe=agent.text)

        server.status = 503
        stopped_at = wait_until(lambda: agent.first("not ready: http 503"), 5.0, "agent says not ready",
                                observe=agent.text)
        checks = server.count(503)
        # The agent goes on checking (every 5 ms) while it sends nothing; 10 more checks = ~50 ticks.
        wait_until(lambda: server.count(503) >= checks + 10, 5.0, "10 more checks answered 503")
        silent_until = time.monotonic()
        server.status = 200
        wait_until(lambda: agent.first("ready: http 200", after=stopped_at), 5.0, "agent ready again",
                   observe=agent.text)
        resumed = len(receiver.got)
        wait_until(lambda: len(receiver.got) >= resumed + 50, 10.0, "50 heartbeats after resuming")
    finally:
        code = agent.stop()

    during = [d for d in receiver.got if stopped_at < d.t < silent_until]
    # One heartbeat may already be on its way as the agent prints "not ready".
    assert len(during) <= 1, during
    assert code == 0
    assert receiver.sizes == {abi.HEARTBEAT_SIZE}
    assert {(d.magic, d.version, d.port, d.token) for d in receiver.got} == {
        (abi.HB_MAGIC, abi.HB_VERSION, SERVICE_PORT, TOKEN)}
    # One run, one epoch; seq counts heartbeats sent: consecutive (loopback loses none), none sent
    # while not ready.
    assert len({d.epoch for d in receiver.got}) == 1
    assert [d.seq - receiver.got[0].seq for d in receiver.got] == list(range(len(receiver.got)))
    text = agent.text()
    assert text[0].startswith(f"sending to 127.0.0.1:{receiver.port} from 127.0.0.1 every 1 ms")
    assert text[1:4] == ["ready: http 200", "not ready: http 503", "ready: http 200"]
    assert text[-1].startswith(f"stopped: {len(receiver.got)} heartbeats sent")
    assert agent.stderr == ""


def test_agent_sends_nothing_before_the_first_check_passes(server, receiver):
    server.status = 503
    agent = AgentProcess(*agent_args(receiver, "--check-url", server.url, "--check-interval-ms", "5"))
    try:
        wait_until(lambda: server.count(503) >= 20, 10.0, "20 checks answered 503", observe=agent.text)
    finally:
        code = agent.stop(signal.SIGINT)

    assert code == 0
    assert receiver.got == []
    assert agent.text()[1] == "not ready: http 503"
    assert agent.text()[-1].startswith("stopped: 0 heartbeats sent")


def test_agent_without_a_check_sends_at_once_until_its_duration_ends(receiver):
    agent = AgentProcess(*agent_args(receiver, "--check", "none", "--duration-s", "0.3"))
    try:
        code = agent.proc.wait(timeout=10)
    finally:
        agent.stop()

    assert code == 0
    assert agent.text()[1] == "ready: no check"
    assert receiver.got, "no heartbeat arrived"
    assert [d.seq - receiver.got[0].seq for d in receiver.got] == list(range(len(receiver.got)))


def checker_pid(agent: AgentProcess) -> int:
    """The agent's one child: its checker process."""
    pid = agent.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_a_hung_checker_stops_the_sending_until_it_checks_again(server, receiver):
    agent = AgentProcess(*agent_args(receiver, "--check-url", server.url, "--check-interval-ms", "5"))
    child = None
    try:
        wait_until(lambda: len(receiver.got) >= 20, 10.0, "20 heartbeats", observe=agent.text)
        child = checker_pid(agent)
        os.kill(child, signal.SIGSTOP)  # a checker stuck somewhere: no verdict comes any more
        # 5 ms interval + 20 ms timeout + 100 ms grace without a finished check:
        stale_at = wait_until(lambda: agent.first("not ready: no check finished for 125 ms"), 5.0,
                              "the sender notices", observe=agent.text)
        quiet_from = len(receiver.got)
        answers = sum(server.answers.values())
        os.kill(child, signal.SIGCONT)
        child = None
        wait_until(lambda: agent.first("checks resumed", after=stale_at), 5.0, "checks resume",
                   observe=agent.text)
        resumed_at = agent.first("checks resumed")
        wait_until(lambda: len(receiver.got) >= quiet_from + 20, 10.0, "20 heartbeats after resuming")
    finally:
        if child is not None:
            os.kill(child, signal.SIGCONT)
        code = agent.stop()

    assert code == 0
    # Nothing was sent between going stale and resuming (one may have been in flight).
    assert len([d for d in receiver.got if stale_at < d.t < resumed_at]) <= 1
    assert sum(server.answers.values()) > answers


def test_the_agent_exits_1_when_its_checker_dies(server, receiver):
    agent = AgentProcess(*agent_args(receiver, "--check-url", server.url))
    try:
        wait_until(lambda: agent.first("ready: http 200"), 10.0, "first check", observe=agent.text)
        child = checker_pid(agent)
        os.kill(child, signal.SIGKILL)
        code = agent.proc.wait(timeout=10)
    finally:
        agent.stop()

    assert code == 1
    assert agent.stderr == f"edge-heartbeat: checker process {child} was killed by signal 9\n"
    assert agent.text()[-1].startswith("not ready: no check finished for")


def test_agent_refuses_a_source_address_it_does_not_have(receiver):
    agent = AgentProcess("--router", f"{LOOPBACK}:{receiver.port}", "--source", "198.18.0.99",
                         "--service-port", "8000", "--token-file", token_file(1), "--check", "none")
    try:
        code = agent.proc.wait(timeout=10)
    finally:
        agent.stop()

    assert code == 2
    assert agent.stderr == "edge-heartbeat: --source 198.18.0.99: cannot assign requested address\n"


def test_a_restart_within_the_same_second_starts_above_the_previous_runs_seq():
    """The router takes a heartbeat only with a newer epoch or a higher seq in the same one. A
    run that sent one heartbeat per microsecond (far faster than any interval) since it started
    is still below a run restarted later in the same second."""
    second = 1_700_000_000 * 1_000_000_000
    epoch, seq = wire.first_epoch_seq(second + 250_000_000)
    assert (epoch, seq) == (1_700_000_000, 250_000)
    later = second + 600_000_000
    sent = (later - (second + 250_000_000)) // 1000  # one per microsecond
    restarted = wire.first_epoch_seq(later)
    assert restarted[0] == epoch and restarted[1] > seq + sent - 1


def test_seq_moves_to_a_newer_epoch_instead_of_wrapping():
    assert wire.next_epoch_seq(5, 7, 0) == (5, 8)
    assert wire.next_epoch_seq(5, wire.SEQ_MAX, 3 * 1_000_000_000) == (6, 0)
    assert wire.next_epoch_seq(5, wire.SEQ_MAX, 9 * 1_000_000_000) == (9, 0)
