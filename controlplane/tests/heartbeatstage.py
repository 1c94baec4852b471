"""The heartbeat agent tests' stage (test_heartbeat*.py): their constants, the token files they
pass with --token-file (token_files_in, token_file), and a real HTTP/1.1 health endpoint on
127.0.0.1 whose answer can be flipped (HealthServer; its fixture, server, is in conftest.py).
"""

from __future__ import annotations

import socket
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
TOKEN = 0x5EED0001
SERVICE_PORT = 8000

TOKEN_FILES: dict[int, str] = {}


def token_files_in(directory: Path) -> Iterator[None]:
    """Files holding the tokens the tests pass with --token-file (token_file(t)), while in use."""
    for token in (1, 7, TOKEN):
        path = directory / f"{token:#x}"
        path.write_text(f"{token:#x}\n")
        TOKEN_FILES[token] = str(path)
    yield
    TOKEN_FILES.clear()


def token_file(token: int) -> str:
    return TOKEN_FILES[token]


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


def free_port() -> int:
    """A loopback port nothing listens on (bound once, released)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]
