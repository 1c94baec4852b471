"""The HTTP/1.1 response reader that every client of this project shares: the prober's
health probes and metrics scrapes (non-blocking sockets on epoll) and the heartbeat agent's
health check (a blocking socket). Owns parsing only; the callers own sockets and timeouts."""

from __future__ import annotations

from typing import Optional

HEAD_MAX = 16384  # a head not ended within this many bytes is a "bad response"
CHUNKED = -1  # body length: chunked transfer encoding
TO_CLOSE = -2  # body length: the body runs until the server closes


def parse_head(buf, end: int) -> tuple[int, int, int, bool]:
    """(status, body start, body length or CHUNKED or TO_CLOSE, keep-alive) of the
    response head buf[:end]; ValueError("bad response") if it is not HTTP/1.x."""
    if not (buf.startswith(b"HTTP/1.") and buf[8:9] == b" " and buf[9:12].isdigit()):
        raise ValueError("bad response")
    status = int(buf[9:12])
    headers = bytes(buf[buf.find(b"\r\n") : end]).lower() + b"\r\n"
    keep = buf[7:8] == b"1"  # HTTP/1.1 keeps the connection unless told otherwise
    at = headers.find(b"\r\nconnection:")
    if at >= 0:
        value = headers[at + 13 : headers.find(b"\r\n", at + 2)]
        keep = b"keep-alive" in value if not keep else b"close" not in value
    if 100 <= status < 200 or status in (204, 304):
        return status, end + 4, 0, keep
    at = headers.find(b"\r\ntransfer-encoding:")
    if at >= 0 and b"chunked" in headers[at : headers.find(b"\r\n", at + 2)]:
        return status, end + 4, CHUNKED, keep
    at = headers.find(b"\r\ncontent-length:")
    if at < 0:
        return status, end + 4, TO_CLOSE, False
    value = headers[at + 17 : headers.find(b"\r\n", at + 2)].strip()
    if not value.isdigit():
        raise ValueError("bad response")
    return status, end + 4, int(value), keep


class Response:
    """One HTTP/1.1 answer at a time, read from the bytes of a connection as they arrive.

        reply = Response(limit=65536, keep_body=False)
        reply.start()                      # before each request
        done = reply.feed(data)            # per read; True once the answer is complete
        done = reply.eof()                 # the server closed: True if that ends the answer
        reply.status, reply.body, reply.keep

    Interim answers (1xx) are skipped; bodies come by length, chunked or up to the close.
    An answer longer than limit raises ValueError("too large"), one that is not HTTP/1.x
    ValueError("bad response"): the connection is then not to be used again. keep is False
    when the server said so or sent more than one answer. The head of the last answer is
    remembered, so a server's identical heads are parsed once (they differ by Date only
    each second). The first feed() keeps its bytes object as is: no copy when one read
    holds the whole answer, the usual case.
    """

    def __init__(self, limit: int, keep_body: bool):
        self.limit = limit
        self.keep_body = keep_body
        self.last_head = b""
        self.last_parsed = (0, 0, 0, False)
        self.start()

    def start(self) -> None:
        self.buf = None
        self.head: Optional[tuple[int, int, int, bool]] = None
        self.chunk_at = 0
        self.chunks: list[bytes] = []
        self.status = 0
        self.body = b""
        self.keep = False

    @property
    def begun(self) -> bool:
        """Some of this answer has arrived."""
        return self.buf is not None

    def feed(self, data: bytes) -> bool:
        if self.buf is None:
            self.buf = data
        else:
            if not isinstance(self.buf, bytearray):
                self.buf = bytearray(self.buf)
            self.buf += data
        return self._parse()

    def eof(self) -> bool:
        if self.head is None or self.head[2] != TO_CLOSE:
            return False
        status, body_at, _, _ = self.head
        self._done(status, bytes(self.buf[body_at:]) if self.keep_body else b"", False)
        return True

    def _done(self, status: int, body: bytes, keep: bool) -> bool:
        self.status, self.body, self.keep = status, body, keep
        return True

    def _parse(self) -> bool:
        buf = self.buf
        while self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > HEAD_MAX:
                    raise ValueError("bad response")
                return False
            if buf[:end] == self.last_head:
                head = self.last_parsed
            else:
                head = parse_head(buf, end)
                self.last_head, self.last_parsed = bytes(buf[:end]), head
            if 100 <= head[0] < 200:  # an interim answer (100 Continue): the real one follows
                buf = self.buf = bytearray(buf[head[1] :])
                continue
            self.head = head
            self.chunk_at = head[1]
            self.chunks = []
        status, body_at, length, keep = self.head
        if len(buf) > self.limit:
            raise ValueError("too large")
        if length >= 0:
            if len(buf) < body_at + length:
                return False
            body = buf[body_at : body_at + length] if self.keep_body else b""
            if len(buf) > body_at + length:
                keep = False  # more than one answer: never asked for, so not ours to trust
            return self._done(status, body, keep)
        if length == CHUNKED:
            body = self._dechunk()
            return body is not None and self._done(status, body, keep)
        return False  # the body runs until the server closes: eof() completes it

    def _dechunk(self) -> Optional[bytes]:
        buf, at = self.buf, self.chunk_at
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                break
            try:
                size = int(bytes(buf[at:eol]).split(b";")[0], 16)
            except ValueError:
                raise ValueError("bad response") from None
            if size == 0:
                if buf.startswith(b"\r\n", eol + 2) or buf.find(b"\r\n\r\n", eol) >= 0:  # trailers end
                    return b"".join(self.chunks)
                break
            if len(buf) < eol + 2 + size + 2:
                break
            if self.keep_body:
                self.chunks.append(bytes(buf[eol + 2 : eol + 2 + size]))
            at = eol + 2 + size + 2
        self.chunk_at = at
        return None
