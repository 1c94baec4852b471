"""The metrics endpoint against idle connections: any local user can open them, so each one
is closed after a read timeout and at most metricsserver.MAX_CONNECTIONS are served at once (the
rest are closed at once), so neither edged's descriptors nor its threads run out."""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from controlplane.edged import metricsserver

IDLE = 200  # well over the cap, well under the test process's 1,024 descriptors


class _One:
    def collect(self):
        g = GaugeMetricFamily("edge_test_up", "a gauge for the test")
        g.add_metric([], 1)
        yield g


def _registry() -> CollectorRegistry:
    r = CollectorRegistry(auto_describe=False)
    r.register(_One())
    return r


def _scrape(server) -> str:
    with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10) as r:
        return r.read().decode()


def _closed_by_peer(s: socket.socket, within_s: float) -> bool:
    """True when the server closes s (EOF or reset) within within_s."""
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request" in t.name)


def test_idle_connections_beyond_the_cap_take_no_thread_and_are_closed():
    server = metricsserver.start_http("127.0.0.1:0", _registry())
    host, port = server.address.rsplit(":", 1)
    idle = []
    try:
        for _ in range(IDLE):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        deadline = time.monotonic() + 20
        while getattr(server._httpd, "refused", 0) == 0 and time.monotonic() < deadline:
            assert _handler_threads() <= metricsserver.MAX_CONNECTIONS
            time.sleep(0.02)
        assert _handler_threads() <= metricsserver.MAX_CONNECTIONS
        # those over the cap were closed by the server without a thread
        readable, _, _ = select.select(idle, [], [], 5.0)
        assert any(_closed_by_peer(s, within_s=1) for s in readable)
    finally:
        for s in idle:
            s.close()
        server.close()


def test_an_idle_connection_is_closed_after_the_read_timeout_and_scrapes_go_on():
    server = metricsserver.start_http("127.0.0.1:0", _registry(), idle_timeout_s=0.3)
    host, port = server.address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /metr")  # half a request line, then nothing
            assert _closed_by_peer(s, within_s=10)
        assert "edge_test_up 1.0" in _scrape(server)
    finally:
        server.close()


def test_the_default_read_timeout_is_bounded():
    assert 0 < metricsserver.IDLE_TIMEOUT_S <= 30
    assert 8 <= metricsserver.MAX_CONNECTIONS <= 256
