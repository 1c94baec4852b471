"""The /metrics HTTP endpoint of edged: HOST:PORT or [IPv6]:PORT parsing, a threaded server
with a bound on connections and an idle timeout, started and stopped from edged. It serves
whatever registry it is given (metrics.make_registry) and knows no metric."""

from __future__ import annotations

import re
import socket
import threading
from http.server import ThreadingHTTPServer

from prometheus_client import MetricsHandler
from prometheus_client.registry import CollectorRegistry

from controlplane import limits
from controlplane.errors import EdgeError

# The endpoint is reachable by any local user: a connection that sends nothing is closed after
# IDLE_TIMEOUT_S, and at most MAX_CONNECTIONS are served at once (each holds a thread and an
# fd); one more is closed as soon as it is accepted. A scrape sends its request at once.
IDLE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32

_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*)):(?P<port>[0-9]{1,5})")


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT -> (host, port); port 0 picks a free one."""
    m = _LISTEN.fullmatch(listen)
    if m is None or not limits.is_port(int(m["port"]), zero=True):
        raise EdgeError(f"metrics: {listen!r} is not HOST:PORT")
    return m["v6"] or m["host"], int(m["port"])


class _Server4(ThreadingHTTPServer):
    """One thread per connection, at most max_connections of them (see MAX_CONNECTIONS)."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    request_queue_size = 64  # the listen backlog: a burst is accepted (and refused) quickly

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.refused = 0
        super().server_activate()

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Server6(_Server4):
    address_family = socket.AF_INET6


class MetricsServer:
    """The running endpoint; close() stops it and frees the port."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread):
        self._httpd, self._thread = httpd, thread
        host, port = httpd.server_address[:2]
        self.port: int = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_http(listen: str, registry: CollectorRegistry, idle_timeout_s: float = IDLE_TIMEOUT_S) -> MetricsServer:
    """Serves registry at /metrics on listen (node.metrics_listen) from a thread; a connection
    silent for idle_timeout_s is closed, and at most MAX_CONNECTIONS are served at once."""
    host, port = split_listen(listen)
    handler = type("EdgeMetricsHandler", (MetricsHandler.factory(registry),), {"timeout": idle_timeout_s})
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server = _Server6 if family == socket.AF_INET6 else _Server4
        httpd = server(addr[:2], handler)
    except OSError as e:
        raise EdgeError(f"metrics: cannot listen on {listen}: {e.strerror or e}") from None
    # a short poll keeps close() quick
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"metrics {listen}", daemon=True
    )
    thread.start()
    return MetricsServer(httpd, thread)
