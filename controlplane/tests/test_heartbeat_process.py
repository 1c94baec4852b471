"""edge-heartbeat as a process (python -m controlplane.agent) sending real UDP to a receiver on
127.0.0.1: it sends only while its check passes, stops while its checker hangs, exits 1 when the
checker dies, refuses a source address it does not have, and numbers its heartbeats across
restarts. The tokens and helpers are heartbeatstage.py's, the health endpoint (server) conftest.py's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from controlplane import abi
from controlplane.agent import wire
from controlplane.lab.traffic import wait_until
from controlplane.tests.heartbeatstage import LOOPBACK, REPO, SERVICE_PORT, TOKEN, token_file, token_files_in


@pytest.fixture(scope="module", autouse=True)
def token_files(tmp_path_factory) -> Iterator[None]:
    yield from token_files_in(tmp_path_factory.mktemp("tokens"))


@dataclass(frozen=True)
class Datagram:
    t: float  # time.monotonic() at receipt
    magic: int
    version: int
    port: int
    seq: int
    epoch: int
    mac: int


def stamped_and_macd(got: list[Datagram], token: int) -> bool:
    """Every heartbeat carries the MAC under token's key, its (epoch, seq) rises strictly (the
    router refuses anything else as a replay) and its epoch is this clock's second, give or take
    the time the test took."""
    now = wire.clock_ns() // 1_000_000_000
    stamps = [(d.epoch, d.seq) for d in got]
    macs_ok = all(abi.heartbeat(d.port, d.seq, token, d.epoch)[16:] == d.mac.to_bytes(8, "big") for d in got)
    return macs_ok and stamps == sorted(set(stamps)) and all(now - 60 <= e <= now for e, _ in stamps)


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
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.agent", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
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
    return [
        "--router",
        f"{LOOPBACK}:{receiver.port}",
        "--source",
        LOOPBACK,
        "--service-port",
        str(SERVICE_PORT),
        "--token-file",
        token_file(TOKEN),
        "--interval-ms",
        "1",
        *extra,
    ]


def test_agent_sends_only_while_its_server_is_ready(server, receiver):
    agent = AgentProcess(*agent_args(receiver, "--check-url", server.url, "--check-interval-ms", "5"))
    try:
        wait_until(lambda: len(receiver.got) >= 50, 10.0, "50 heartbeats", observe=agent.text)

        server.status = 503
        stopped_at = wait_until(
            lambda: agent.first("not ready: http 503"), 5.0, "agent says not ready", observe=agent.text
        )
        checks = server.count(503)
        # The agent goes on checking (every 5 ms) while it sends nothing; 10 more checks = ~50 ticks.
        wait_until(lambda: server.count(503) >= checks + 10, 5.0, "10 more checks answered 503")
        silent_until = time.monotonic()
        server.status = 200
        wait_until(
            lambda: agent.first("ready: http 200", after=stopped_at), 5.0, "agent ready again", observe=agent.text
        )
        resumed = len(receiver.got)
        wait_until(lambda: len(receiver.got) >= resumed + 50, 10.0, "50 heartbeats after resuming")
    finally:
        code = agent.stop()

    during = [d for d in receiver.got if stopped_at < d.t < silent_until]
    # One heartbeat may already be on its way as the agent prints "not ready".
    assert len(during) <= 1, during
    assert code == 0
    assert receiver.sizes == {abi.HEARTBEAT_SIZE}
    assert {(d.magic, d.version, d.port) for d in receiver.got} == {(abi.HB_MAGIC, abi.HB_VERSION, SERVICE_PORT)}
    assert stamped_and_macd(receiver.got, TOKEN)
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
    assert stamped_and_macd(receiver.got, TOKEN)


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
        stale_at = wait_until(
            lambda: agent.first("not ready: no check finished for 125 ms"),
            5.0,
            "the sender notices",
            observe=agent.text,
        )
        quiet_from = len(receiver.got)
        answers = sum(server.answers.values())
        os.kill(child, signal.SIGCONT)
        child = None
        wait_until(lambda: agent.first("checks resumed", after=stale_at), 5.0, "checks resume", observe=agent.text)
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
    agent = AgentProcess(
        "--router",
        f"{LOOPBACK}:{receiver.port}",
        "--source",
        "198.18.0.99",
        "--service-port",
        "8000",
        "--token-file",
        token_file(1),
        "--check",
        "none",
    )
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


def test_each_heartbeat_is_stamped_with_the_clock_and_rises_even_when_the_clock_does_not():
    """epoch follows the clock's second and seq its microsecond, so the router's window check
    sees the sender's clock; a clock that stands still or steps back still yields a higher
    (epoch, seq), and seq moves to a newer epoch instead of wrapping."""
    assert wire.next_epoch_seq(5, 7, 9 * 1_000_000_000 + 42_000) == (9, 42)
    assert wire.next_epoch_seq(5, 7, 0) == (5, 8)
    assert wire.next_epoch_seq(5, 7, 5 * 1_000_000_000 + 3_000) == (5, 8)
    assert wire.next_epoch_seq(5, wire.SEQ_MAX, 3 * 1_000_000_000) == (6, 0)
