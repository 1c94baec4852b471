"""A tiny testbed backend: HTTP/1.1 and UDP echo on one address and port number.

Every GET (or HEAD), whatever the path, answers 200 with {"backend": NAME, "peer": "ip:port"},
the peer being the client as this server sees it; connections are kept alive unless the client
asks otherwise. A UDP datagram to the same port is answered with NAME. NAME @local stands
for the address a connection reached (one server on 0.0.0.0 for many backend addresses of one
namespace tells them apart). Prints
`listening NAME ADDR:PORT` once both sockets are bound; exits 0 on SIGTERM or SIGINT.

    python -m controlplane.lab.backend --name b0 --listen 198.18.1.2:8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from controlplane import limits

MAX_HEADER_BYTES = 16384
BACKLOG = 4096
LOCAL_NAME = "@local"  # --name: answer with the local address a connection reached


def _response(status: str, body: bytes, keep_alive: bool, head_only: bool = False) -> bytes:
    headers = (
        f"HTTP/1.1 {status}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode()
    return headers if head_only else headers + body


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses pipelined requests and answers each in order."""

    def __init__(self, name: str, live: set[asyncio.Transport]):
        self.name = name
        self.live = live
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.body = b""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.live.add(transport)
        host, port = transport.get_extra_info("peername")[:2]
        name = transport.get_extra_info("sockname")[0] if self.name == LOCAL_NAME else self.name
        self.body = json.dumps({"backend": name, "peer": f"{host}:{port}"}).encode()

    def connection_lost(self, exc: Exception | None) -> None:
        self.live.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None and not self.transport.is_closing():
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEADER_BYTES:
                    self._finish(_response("431 Request Header Fields Too Large", b"{}", False))
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            request_line = lines[0].split()
            if len(request_line) != 3 or not request_line[2].startswith("HTTP/1."):
                self._finish(_response("400 Bad Request", b"{}", False))
                return
            method, _, version = request_line
            headers = {}
            for line in lines[1:]:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip().lower()
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                self._finish(_response("400 Bad Request", b"{}", False))
                return
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            connection = headers.get("connection", "")
            keep_alive = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
            if method in ("GET", "HEAD"):
                out = _response("200 OK", self.body, keep_alive, head_only=method == "HEAD")
            else:
                out = _response("405 Method Not Allowed", b"{}", keep_alive)
            if keep_alive:
                self.transport.write(out)
            else:
                self._finish(out)

    def _finish(self, out: bytes) -> None:
        self.transport.write(out)
        self.transport.close()


class UdpEcho(asyncio.DatagramProtocol):
    """Answers every datagram with the backend's name."""

    def __init__(self, name: str):
        self.reply = name.encode()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.DatagramTransport) -> None:  # type: ignore[override]
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.transport.sendto(self.reply, addr)


async def serve(name: str, host: str, port: int, host6: str | None = None) -> None:
    """Serve until SIGTERM or SIGINT; on host6 (an IPv6 address) too when given, same port."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    live: set[asyncio.Transport] = set()
    server = await loop.create_server(lambda: HttpProtocol(name, live), host, port, backlog=BACKLOG, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    udp, _ = await loop.create_datagram_endpoint(lambda: UdpEcho(name), local_addr=(host, port))
    server6 = udp6 = None
    if host6:
        server6 = await loop.create_server(
            lambda: HttpProtocol(name, live), host6, port, backlog=BACKLOG, reuse_address=True
        )
        udp6, _ = await loop.create_datagram_endpoint(lambda: UdpEcho(name), local_addr=(host6, port))
    print(f"listening {name} {host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        udp.close()
        if server6 is not None and udp6 is not None:
            server6.close()
            udp6.close()
        for transport in list(live):
            transport.abort()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane.lab.backend", description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="backend name put in every answer")
    parser.add_argument("--listen", required=True, metavar="ADDR:PORT", help="port 0 picks a free one")
    parser.add_argument("--listen6", metavar="ADDR", help="an IPv6 address to serve on as well, on the same port")
    args = parser.parse_args(argv)
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not limits.is_port(int(port), zero=True):
        parser.error(f"--listen: {args.listen!r} is not ADDR:PORT")
    try:
        asyncio.run(serve(args.name, host, int(port), args.listen6))
    except OSError as e:
        print(f"backend {args.name}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
