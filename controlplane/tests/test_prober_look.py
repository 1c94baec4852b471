"""Relaxed tcp probes looked at on the grid (checks._TcpCheck): the pure parts (look_at,
_rtt_if_connected) and, with real servers on 127.0.0.1 as in test_prober.py, that a relaxed
round's result is read without epoll and decides what an immediate read would."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Iterator

import pytest

from controlplane.config import Probe
from controlplane.probe import Prober, Target, checks
from controlplane.probe.checks import SLOW_GRID_NS, _rtt_if_connected, look_at
from controlplane.tests.proberstage import LOOPBACK, Recorder, closing, run, started, wait_for

FAR_NS = 3600 * 10**9


def tcp_info(state: int, rtt_us: int) -> bytes:
    info = bytearray(checks._TCP_INFO_LEN)
    info[0] = state
    struct.pack_into("I", info, checks._TCPI_RTT, rtt_us)
    return bytes(info)


def test_a_relaxed_round_is_looked_at_on_the_next_grid_step():
    assert look_at(0) == SLOW_GRID_NS
    assert look_at(SLOW_GRID_NS - 1) == SLOW_GRID_NS
    assert look_at(SLOW_GRID_NS) == 2 * SLOW_GRID_NS
    assert look_at(5 * SLOW_GRID_NS + 3) == 6 * SLOW_GRID_NS


def test_a_connection_counts_as_made_when_the_syn_ack_came_whatever_happened_after():
    assert _rtt_if_connected(tcp_info(1, 120)) == 120  # ESTABLISHED
    assert _rtt_if_connected(tcp_info(8, 90)) == 90  # CLOSE_WAIT: accepted, then closed
    assert _rtt_if_connected(tcp_info(7, 75)) == 75  # CLOSE with an RTT: accepted, then reset
    assert _rtt_if_connected(tcp_info(7, 0)) is None  # refused, unreachable, or reset by us
    assert _rtt_if_connected(tcp_info(2, 0)) is None  # SYN_SENT: still connecting


class CountingEpoll:
    """The prober's epoll set, counting registrations and re-arms."""

    def __init__(self, ep) -> None:
        self.ep, self.arms = ep, 0

    def register(self, *a):
        self.arms += 1
        return self.ep.register(*a)

    def modify(self, *a):
        self.arms += 1
        return self.ep.modify(*a)

    def __getattr__(self, name):
        return getattr(self.ep, name)


def test_relaxed_tcp_rounds_of_a_loopback_listener_pass_without_epoll():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = Probe(kind="tcp", interval_ms=20, timeout_ms=200, rise=1, fall=3, relaxed_interval_ms=100)
        p.set_targets([Target("b", LOOPBACK, server.port, probe)])
        p._ep = counting = CountingEpoll(p._ep)
        p.relax(["b"], time.monotonic_ns() + FAR_NS)
        await wait_for(lambda: p.relaxed("b"), 3, "relaxed")
        await wait_for(lambda: any(s.ok for s in rec.of("b")), 3, "a probe")
        arms, since = counting.arms, len(rec.of("b"))
        # a loopback connect is made within connect() itself: the grid's look finds it made
        await wait_for(lambda: len(rec.of("b")) >= since + 3, 5, "3 relaxed probes")
        relaxed = rec.of("b")[since:]
        await closing(p, server)

        assert all(s.ok and 0 < s.rtt_s < 0.2 for s in relaxed), relaxed
        assert counting.arms == arms

    run(main())


def test_a_relaxed_round_to_a_server_that_accepts_and_resets_passes_and_a_refused_one_fails():
    async def main() -> None:
        resets = 0

        def reset(conn: socket.socket) -> None:
            nonlocal resets
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            resets += 1

        listener = socket.socket()
        listener.bind((LOOPBACK, 0))
        listener.listen(16)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        loop = asyncio.get_running_loop()
        loop.add_reader(listener.fileno(), lambda: reset(listener.accept()[0]))
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = Probe(kind="tcp", interval_ms=20, timeout_ms=200, rise=1, fall=3, relaxed_interval_ms=60)
        p.set_targets([Target("b", LOOPBACK, port, probe)])
        p.relax(["b"], time.monotonic_ns() + FAR_NS)
        await wait_for(lambda: p.relaxed("b") and resets >= 3 and len(rec.of("b")) >= 3, 5, "relaxed probes")
        ok = list(rec.of("b"))
        loop.remove_reader(listener.fileno())
        listener.close()  # the next round is refused and brings the full rate back
        since = len(rec.of("b"))
        await wait_for(lambda: any(not s.ok for s in rec.of("b")[since:]), 5, "a refused probe")
        failed = next(s for s in rec.of("b")[since:] if not s.ok)
        relaxed_after = p.relaxed("b")
        await closing(p)

        assert all(s.ok for s in ok), ok
        assert failed.error == "refused" and failed.rtt_s is None
        assert not relaxed_after

    run(main())


# ------------------------------------------------------------ the wheel's calls of one relaxed round


class WheelStub:
    """What a check asks of its Prober (checks.Host), recorded: the wheel's calls (at) and epoll arms."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.arms = 0
        self.relaxed: dict = {}
        self.recv_view = memoryview(bytearray(4096))
        self.stretch = 1.0

    def at(self, t_ns: int, check) -> None:
        self.calls.append(t_ns)

    def relaxed_until(self, key) -> int:
        return self.relaxed.get(key, 0)

    def register(self, fd: int, events: int) -> None:
        self.arms += 1

    modify = register

    def watch(self, fd, on_event) -> None:
        pass

    def drop(self, fd, sock) -> None:
        sock.close()

    def spawn(self, coroutine):
        raise AssertionError("a tcp check starts no task")

    def report(self, message, e) -> None:
        raise AssertionError(message) from e


class BackendStub:
    def __init__(self, port: int) -> None:
        self.key = "b"
        self.target = Target("b", LOOPBACK, port)
        self.samples: list = []

    def sample(self, sample) -> None:
        self.samples.append(sample)


class StillConnecting:
    """A probe socket whose TCP_INFO says SYN_SENT (a SYN-ACK not come yet)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def getsockopt(self, level, name, size=None):
        if name == socket.TCP_INFO:
            return tcp_info(checks._TCP_SYN_SENT, 0)
        return self.sock.getsockopt(level, name)

    def __getattr__(self, name):
        return getattr(self.sock, name)


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections (a backlog of 16) for the test's duration."""
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen(16)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def relaxed_round(port: int) -> tuple[WheelStub, BackendStub, checks._TcpCheck]:
    """A tcp check of a relaxed target whose next round starts relaxed (rise passed), started."""
    wheel, backend = WheelStub(), BackendStub(port)
    check = checks._TcpCheck(wheel, backend, 50, 50)
    check.adapt(500, 1)
    check.passes, check.slow = 1, True
    wheel.relaxed["b"] = time.monotonic_ns() + FAR_NS
    wheel.calls.clear()
    check.tick(check.next_ns)
    return wheel, backend, check


def test_a_relaxed_round_its_look_settles_asks_for_no_deadline_call(listening_port):
    wheel, backend, check = relaxed_round(listening_port)
    assert check.busy and check.look_ns and check.look_ns < check.deadline_ns
    assert sorted(wheel.calls) == [check.look_ns, check.next_ns]  # no deadline call
    wheel.calls.clear()
    check.tick(check.look_ns)  # a loopback connect is made within connect(): settled
    assert not check.busy and [s.ok for s in backend.samples] == [True]
    assert wheel.calls == [] and wheel.arms == 0
    check.stop()


def test_a_relaxed_round_its_look_leaves_connecting_goes_to_epoll_and_gets_its_deadline_call(listening_port):
    wheel, backend, check = relaxed_round(listening_port)
    check.sock = StillConnecting(check.sock)
    wheel.calls.clear()
    check.tick(check.look_ns)
    assert check.busy and wheel.arms == 1 and wheel.calls == [check.deadline_ns]
    check.tick(check.deadline_ns)  # still "connecting" at the deadline: a timeout
    assert [(s.ok, s.error) for s in backend.samples] == [(False, "timeout")]
    assert not check.slow  # and the full rate is back
    check.stop()


def test_a_start_that_fell_due_while_a_relaxed_round_went_on_begins_when_its_look_settles_it(listening_port):
    wheel, backend, check = relaxed_round(listening_port)
    check.next_ns = check.look_ns - 1  # as after a hurry with an interval below the grid's step
    check.tick(check.next_ns)  # busy and before the deadline: the start waits
    assert check.round == 1
    check.tick(check.look_ns)  # settled by the look; the start that waited begins at once
    assert [s.ok for s in backend.samples] == [True] and check.round == 2 and check.busy
    check.stop()


def test_a_full_rate_tcp_round_is_looked_at_on_the_grid_too_unless_its_timeout_is_shorter(monkeypatch):
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    try:
        wheel, backend = WheelStub(), BackendStub(port)
        check = checks._TcpCheck(wheel, backend, 50, 50)  # never relaxed
        check.tick(check.next_ns)
        assert check.busy and not check.slow_round and check.look_ns and wheel.arms == 0
        check.tick(check.look_ns)
        assert [s.ok for s in backend.samples] == [True] and wheel.arms == 0
        check.stop()
        now = (time.monotonic_ns() // SLOW_GRID_NS + 1) * SLOW_GRID_NS + 1  # just after a grid step
        monkeypatch.setattr(checks, "_monotonic_ns", lambda: now)
        short = checks._TcpCheck(wheel, BackendStub(port), 50, 1)  # 1 ms: below the grid's step
        short.next_ns = now
        short.tick(now)
        assert short.look_ns == 0 and wheel.arms == 1  # on epoll, as ever
        short.stop()
    finally:
        listener.close()
