"""controlplane.probe.http: the HTTP/1.1 response reader the prober and the heartbeat agent
share, fed byte strings as a socket would give them (pure)."""

import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.probe.http import CHUNKED, TO_CLOSE, Response, parse_head


def feed(reply: Response, *reads: bytes) -> list[bool]:
    reply.start()
    return [reply.feed(data) for data in reads]


def test_parse_head_reads_status_length_and_keep_alive():
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: Close\r\n\r\n"
    assert parse_head(head, head.index(b"\r\n\r\n")) == (503, len(head), 0, False)
    head = b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n"
    assert parse_head(head, head.index(b"\r\n\r\n")) == (200, len(head), CHUNKED, True)
    head = b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n"
    assert parse_head(head, head.index(b"\r\n\r\n")) == (200, len(head), TO_CLOSE, False)
    for bad in (b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"):
        with pytest.raises(ValueError, match="bad response"):
            parse_head(bad, bad.index(b"\r\n\r\n"))


def test_an_answer_split_over_reads_completes_on_its_last_byte():
    reply = Response(limit=65536, keep_body=True)
    whole = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    assert feed(reply, *(whole[i : i + 1] for i in range(len(whole)))) == [False] * (len(whole) - 1) + [True]
    assert (reply.status, reply.body, reply.keep) == (200, b"hello", True)


def test_interim_answers_are_skipped_and_chunks_joined():
    reply = Response(limit=65536, keep_body=True)
    assert feed(
        reply,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"2;x=1\r\nde\r\n0\r\n\r\n",
    ) == [False, True]
    assert (reply.status, reply.body, reply.keep) == (200, b"abcde", True)


def test_without_a_length_the_close_ends_the_body_and_the_connection():
    reply = Response(limit=65536, keep_body=True)
    assert feed(reply, b"HTTP/1.1 200 OK\r\n\r\npart") == [False]
    assert reply.eof()
    assert (reply.status, reply.body, reply.keep) == (200, b"part", False)
    reply.start()
    assert not reply.eof()  # nothing came: the close is an error for the caller


def test_a_second_answer_nobody_asked_for_ends_keep_alive_and_bodies_are_dropped_unless_kept():
    reply = Response(limit=65536, keep_body=False)
    assert feed(reply, b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n\r\n") == [True]
    assert (reply.status, reply.body, reply.keep) == (204, b"", False)
    assert feed(reply, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc") == [True]
    assert (reply.status, reply.body, reply.keep) == (200, b"", True)


@pytest.mark.parametrize(
    "reads, error",
    [
        ((b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"x" * 100), "too large"),
        ((b"HTTP/1.1 200 OK\r\nX: " + b"y" * 20000,), "bad response"),
        ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",), "bad response"),
        ((b"garbage\r\n\r\n",), "bad response"),
    ],
)
def test_oversize_and_malformed_answers_raise(reads, error):
    reply = Response(limit=64, keep_body=True)
    reply.start()
    with pytest.raises(ValueError, match=error):
        for data in reads:
            reply.feed(data)


def test_a_repeated_head_is_parsed_once():
    reply = Response(limit=65536, keep_body=False)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    feed(reply, answer)
    parsed = reply.last_parsed
    feed(reply, answer)
    assert reply.last_parsed is parsed and reply.status == 200


def test_the_heartbeat_agent_loads_the_reader_without_the_probe_engine():
    """The agent runs beside every inference server: it imports probe.http, not the engine
    and its dependencies."""
    code = (
        "import sys, controlplane.agent; "
        "print(sorted(m for m in ('asyncio', 'numpy', 'yaml', 'controlplane.config', "
        "'controlplane.probe.engine') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == "[]"


def test_the_package_names_load_their_modules():
    import controlplane.probe as probe
    from controlplane.probe.engine import Prober

    assert probe.Prober is Prober and set(probe.__all__) <= set(dir(probe))
    assert all(getattr(probe, name) is not None for name in probe.__all__)
    with pytest.raises(AttributeError):
        _ = probe.no_such_name
