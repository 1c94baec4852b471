"""controlplane.agent (edge-heartbeat): the pure part (deadlines, option parsing) and the
health checks against a real HTTP server (the agent as a process: test_heartbeat_process.py).

Everything stays on 127.0.0.1; every server, socket, thread and process a test starts is
stopped by the test, and every wait polls a condition with a bound.
"""

from __future__ import annotations

import socket
import threading
import time
import tomllib
from typing import Iterator

import pytest

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
from controlplane.config import Heartbeat
from controlplane.lab.traffic import wait_until
from controlplane.tests.heartbeatstage import LOOPBACK, REPO, HealthServer, free_port, token_file, token_files_in

MS = 1_000_000


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


@pytest.mark.parametrize(
    "text, expected",
    [
        ("198.18.1.1", ("198.18.1.1", 7946)),
        ("198.18.1.1:9000", ("198.18.1.1", 9000)),
        ("2001:2:0:1::1", ("2001:2:0:1::1", 7946)),
        ("[2001:2:0:1::1]", ("2001:2:0:1::1", 7946)),
        ("[2001:2:0:1::1]:9000", ("2001:2:0:1::1", 9000)),
    ],
)
def test_router_is_an_address_with_an_optional_port(text, expected):
    addr, port = parse_router(text)
    assert (str(addr), port) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("router.example", "--router: 'router.example' is not an IPv4 or IPv6 address"),
        ("198.18.1.1:70000", "--router port: '70000' is not a port (1..65535)"),
        ("198.18.1.1:", "--router port: '' is not a port"),
        ("[198.18.1.1]:9000", "--router: '[198.18.1.1]:9000' is not [IPv6 address] with an optional :PORT"),
        ("[2001:2::1]9000", "--router: '[2001:2::1]9000' is not [IPv6 address] with an optional :PORT"),
        ("[2001:2::1]:", "--router port: '' is not a port"),
        ("2001:2::zz", "--router: '2001:2::zz' is not an IPv4 or IPv6 address"),
    ],
)
def test_router_errors_name_the_option(text, message):
    with pytest.raises(UsageError) as e:
        parse_router(text)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "text, value",
    [("0x5eed0001", 0x5EED0001), ("12345", 12345), ("0xffffffffffffffff", 2**64 - 1), ("0x" + "f" * 32, 2**128 - 1)],
)
def test_tokens_are_decimal_or_hex_like_the_config(text, value):
    assert parse_token(text) == value


@pytest.mark.parametrize(
    "text, message",
    [
        ("zz", "is not an integer"),
        ("-1", "out of range"),
        ("0", "out of range"),
        ("0x100000000000000000000000000000000", "out of range"),
    ],
)
def test_bad_tokens_are_refused(text, message):
    with pytest.raises(UsageError, match=message):
        parse_token(text)


@pytest.fixture(scope="module", autouse=True)
def token_files(tmp_path_factory) -> Iterator[None]:
    yield from token_files_in(tmp_path_factory.mktemp("tokens"))


def test_the_token_comes_from_a_file_never_from_the_command_line(tmp_path):
    assert opts().token == 7
    assert "--token" not in parser().format_help().replace("--token-file", "").replace("--token-secret-file", "")
    missing = tmp_path / "absent"
    with pytest.raises(UsageError, match=f"^--token-file: cannot read {missing}: No such file or directory$"):
        options(parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000", "--token-file", str(missing)]))
    zero = tmp_path / "zero"
    zero.write_text("0\n")
    with pytest.raises(UsageError, match="^--token-file: the token is out of range 1..2"):
        options(parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000", "--token-file", str(zero)]))


def opts(*argv: str):
    return options(
        parser().parse_args(["--router", "198.18.1.1", "--service-port", "8000", "--token-file", token_file(7), *argv])
    )


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
    got = options(
        parser().parse_args(
            [
                "--router",
                "198.18.1.1",
                "--service-port",
                "8000",
                "--source",
                "198.18.1.2",
                "--token-secret-file",
                str(secret),
            ]
        )
    )
    assert got.token == derive_token(b"0123456789abcdef-secret", "198.18.1.2", 8000)
    # without --source: the address the kernel sends to the router from (here loopback's)
    local = options(
        parser().parse_args(["--router", "127.0.0.1", "--service-port", "8000", "--token-secret-file", str(secret)])
    )
    assert local.token == derive_token(b"0123456789abcdef-secret", "127.0.0.1", 8000)
    with pytest.raises(UsageError, match="^--token-file: give exactly one of --token-file, --token-secret-file$"):
        options(
            parser().parse_args(
                [
                    "--router",
                    "127.0.0.1",
                    "--service-port",
                    "8000",
                    "--token-file",
                    token_file(1),
                    "--token-secret-file",
                    str(secret),
                ]
            )
        )


def test_the_agents_defaults_are_the_configs():
    assert DEFAULT_ROUTER_PORT == Heartbeat().port
    assert DEFAULT_INTERVAL_MS == Heartbeat().interval_ms


def test_the_console_script_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["edge-heartbeat"] == "controlplane.agent:main"


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "the following arguments are required: --router, --service-port"),
        (["--interval-ms", "0"], "--interval-ms: '0' is not a number of milliseconds in 0.05..3.6e+06"),
        (["--interval-ms", "nan"], "--interval-ms: 'nan' is not a number of milliseconds"),
        (["--check", "icmp"], "argument --check: invalid choice: 'icmp'"),
        (["--check-url", "https://127.0.0.1/health"], "--check-url: 'https://127.0.0.1/health' is not an http://"),
        (["--check", "none", "--check-url", "http://127.0.0.1/"], "--check-url: given with --check none"),
        (["--duration-s", "-1"], "--duration-s: '-1' is not a number of seconds"),
        (["--rt-priority", "100"], "--rt-priority: 100 is not in 0..99"),
        (["--source", "198.18.1.300"], "--source: '198.18.1.300' is not an IPv4 or IPv6 address"),
        (["--source", "2001:2::2"], "--source: 2001:2::2 is IPv6 but --router 127.0.0.1 is IPv4"),
        (["--service-port", "0"], "--service-port: '0' is not a port"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v) or "nothing",
)
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


# ------------------------------------------------------------ a real health endpoint (heartbeatstage.HealthServer)


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
    checker = Checker(
        kind(Target(LOOPBACK, server.port, "/")), readiness, interval_ms=60_000, timeout_ms=1_000, stop=stop
    )
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
    for ok, detail in [
        (True, "http 200"),
        (True, "http 200"),
        (False, "http 503"),
        (False, "http 500"),
        (True, "http 200"),
    ]:
        readiness.update(Result(ok, detail))

    assert lines == ["ready: http 200", "not ready: http 503", "ready: http 200"]
