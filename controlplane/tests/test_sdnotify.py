"""controlplane.edged.sdnotify against a real unix datagram socket standing in for systemd's NOTIFY_SOCKET.

Each test binds its own socket (a path in a tmp dir, or a unique abstract name),
closes it at the end, and every receive has a timeout.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from typing import Iterator

import pytest

from controlplane.edged.sdnotify import Notifier, watchdog_loop

RECV_TIMEOUT_S = 2.0
WATCHDOG_USEC = 200_000  # pings every 0.1 s


class FakeManager:
    """The receiving end of NOTIFY_SOCKET: what the service manager would read."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(RECV_TIMEOUT_S)
        self.env_value = "@" + address[1:] if address.startswith("\0") else address

    def recv(self, timeout_s: float = RECV_TIMEOUT_S) -> list[str]:
        """The next message as its lines; socket.timeout if none comes within timeout_s."""
        self.sock.settimeout(timeout_s)
        return self.sock.recv(4096).decode().split("\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def manager(tmp_path_factory) -> Iterator[FakeManager]:
    # A short directory: unix socket paths are limited to 107 bytes.
    path = tmp_path_factory.mktemp("nfy") / "notify"
    fake = FakeManager(str(path))
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def abstract_manager() -> Iterator[FakeManager]:
    fake = FakeManager(f"\0edge-test-sdnotify-{uuid.uuid4().hex[:12]}")
    try:
        yield fake
    finally:
        fake.close()


def notifier_for(manager: FakeManager, **env: str) -> Notifier:
    return Notifier({"NOTIFY_SOCKET": manager.env_value, **env})


# ------------------------------------------------------------ messages


def test_ready_sends_ready_and_status_in_one_datagram(manager):
    n = notifier_for(manager)
    assert n.enabled
    assert n.ready("serving 2 services on eth0")
    assert manager.recv() == ["READY=1", "STATUS=serving 2 services on eth0"]
    n.close()


def test_ready_without_status_sends_only_ready(manager):
    n = notifier_for(manager)
    n.ready()
    assert manager.recv() == ["READY=1"]
    n.close()


def test_status_is_one_line_even_when_the_text_has_several(manager):
    n = notifier_for(manager)
    n.status("chat: weights h100-a 3->5\nembed: unchanged")
    assert manager.recv() == ["STATUS=chat: weights h100-a 3->5 embed: unchanged"]
    n.close()


def test_stopping_and_watchdog(manager):
    n = notifier_for(manager)
    n.stopping()
    n.watchdog()
    assert manager.recv() == ["STOPPING=1"]
    assert manager.recv() == ["WATCHDOG=1"]
    n.close()


def test_reloading_carries_the_monotonic_clock_in_microseconds(manager):
    n = notifier_for(manager)
    before_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    n.reloading()
    after_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = manager.recv()
    assert lines[0] == "RELOADING=1"
    key, _, value = lines[1].partition("=")
    assert key == "MONOTONIC_USEC" and before_us <= int(value) <= after_us
    n.close()


def test_abstract_namespace_socket(abstract_manager):
    assert abstract_manager.env_value.startswith("@")
    n = notifier_for(abstract_manager)
    assert n.ready("up")
    assert abstract_manager.recv() == ["READY=1", "STATUS=up"]
    n.close()


# ------------------------------------------------------------ disabled and broken


def test_without_notify_socket_everything_is_a_quiet_no_op():
    logged = []
    n = Notifier({}, log=logged.append)
    assert not n.enabled
    assert not n.ready("x") and not n.status("x") and not n.watchdog()
    assert not n.stopping() and not n.reloading()
    assert n.watchdog_interval_s() is None
    asyncio.run(asyncio.wait_for(watchdog_loop(n, lambda: True), RECV_TIMEOUT_S))  # returns at once
    n.close()
    assert logged == []


def test_a_relative_notify_socket_disables_and_says_so_once():
    logged = []
    n = Notifier({"NOTIFY_SOCKET": "notify"}, log=logged.append)
    assert not n.enabled and not n.ready()
    assert logged == ["NOTIFY_SOCKET='notify' is neither an absolute path nor @abstract; not notifying"]


def test_a_send_error_is_logged_once_and_never_raised(tmp_path):
    logged = []
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}, log=logged.append)
    assert n.enabled
    assert not n.ready("x")
    assert not n.watchdog()
    assert not n.stopping()
    assert len(logged) == 1 and "cannot notify the service manager on" in logged[0]
    n.close()


# ------------------------------------------------------------ watchdog


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"WATCHDOG_USEC": str(WATCHDOG_USEC)}, 0.1),
        ({"WATCHDOG_USEC": str(WATCHDOG_USEC), "WATCHDOG_PID": str(os.getpid())}, 0.1),
        ({"WATCHDOG_USEC": str(WATCHDOG_USEC), "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
    ids=["usec", "our-pid", "other-pid", "zero", "garbage", "unset"],
)
def test_watchdog_interval_is_half_of_watchdog_usec_when_meant_for_us(manager, env, expected):
    assert notifier_for(manager, **env).watchdog_interval_s() == expected


def test_watchdog_loop_pings_at_half_the_watchdog_interval(manager):
    n = notifier_for(manager, WATCHDOG_USEC=str(WATCHDOG_USEC))
    arrivals = []

    async def run():
        task = asyncio.create_task(watchdog_loop(n, lambda: True))
        try:
            while len(arrivals) < 6:
                lines = await asyncio.to_thread(manager.recv)
                assert lines == ["WATCHDOG=1"]
                arrivals.append(time.monotonic())
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 10 * RECV_TIMEOUT_S))
    # Sent 0.1 s apart. Arrival times carry thread wake-up jitter, so the mean gap
    # is checked: not early, and the upper bound only leaves room for a busy machine.
    mean_gap = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
    assert 0.08 <= mean_gap < 0.3, arrivals
    n.close()


def test_watchdog_loop_is_silent_while_unhealthy_and_resumes_when_healthy(manager):
    n = notifier_for(manager, WATCHDOG_USEC=str(WATCHDOG_USEC))
    healthy = False
    silent = None

    async def run():
        nonlocal healthy, silent
        task = asyncio.create_task(watchdog_loop(n, lambda: healthy))
        try:
            # Three ping intervals with no ping is what systemd would see as a hang.
            try:
                await asyncio.to_thread(manager.recv, 0.35)
                silent = False
            except socket.timeout:
                silent = True
            healthy = True
            assert await asyncio.to_thread(manager.recv) == ["WATCHDOG=1"]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 10 * RECV_TIMEOUT_S))
    assert silent
    n.close()


def test_watchdog_loop_returns_when_no_watchdog_is_set(manager):
    n = notifier_for(manager)
    asyncio.run(asyncio.wait_for(watchdog_loop(n, lambda: True), RECV_TIMEOUT_S))
    n.close()
