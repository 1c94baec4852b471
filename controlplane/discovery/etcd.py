"""etcd discovery: one key per backend under a prefix, read once and then watched.

aetcd (asyncio, gRPC) does the protocol. The source reads the whole prefix,
reports it, then watches from the next revision and reports the set after every
event. Any fault (etcd down, a read or connect past timeout_ms, the watch
stream ending) is a failure; it then reconnects (next endpoint, after
retry_ms) and starts over with a full read, so a restarted or replaced etcd
is resumed without missing a change. A key whose value is not a backend
makes the whole answer a failure that names the key.

Value: {"address": "198.18.1.2", "port": 8000, "weight": 1, "standby": false,
"token": "0x5eed0001"}; weight, standby and token may be left out (a missing
token is derived from the service secret).
"""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import aetcd
import grpc
from aetcd import rpc, utils

from controlplane.config import Backend, Discovery, Etcd, parse_backend
from controlplane.discovery import Answer, Failure, Report, endpoint_name
from controlplane.discovery.tokens import read_secret
from controlplane.errors import ConfigError
from controlplane.tasks import within

VALUE_KEYS = ("address", "port", "weight", "standby", "token")
KEEPALIVE_MS = 5000  # etcd refuses pings more often than its --grpc-keepalive-min-time (5 s)


MAX_VALUE_BYTES = 4096  # a backend's value is ~100 bytes
MAX_RECEIVE_BYTES = 16 << 20  # gRPC's receive limit, explicit: a larger read is a failure that says so


def _load(value: bytes, where: str):
    """value as JSON; ConfigError naming where when it is too large, not JSON or nested too deep."""
    if len(value) > MAX_VALUE_BYTES:
        raise ConfigError(f"{where}: {len(value)} bytes, more than {MAX_VALUE_BYTES}")
    try:
        return json.loads(value)
    except RecursionError:
        raise ConfigError(f"{where}: nested too deep") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{where}: not JSON ({' '.join(str(e).split())[:80]})") from None


def parse_value(key: bytes, value: bytes) -> Backend:
    """One key's value as a Backend; ConfigError naming the key when it is not one (whatever
    is wrong with it: size, JSON, nesting, types)."""
    where = f"etcd {key.decode(errors='replace')[:200]}"
    doc = _load(value, where)
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a JSON object with {', '.join(VALUE_KEYS)}")
    unknown = sorted(str(k) for k in doc if k not in VALUE_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0][:40]}: unknown key (allowed: {', '.join(VALUE_KEYS)})")
    if "address" not in doc or "port" not in doc:
        raise ConfigError(f"{where}.{'address' if 'address' not in doc else 'port'}: missing")
    name = endpoint_name(doc["address"], doc["port"]) if isinstance(doc["port"], int) else "x"
    try:
        return parse_backend({"name": name, **doc}, where)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- a value no check foresaw is garbage, never a crash
        raise ConfigError(f"{where}: not a backend ({type(e).__name__})") from None


def client(
    host: str, port: int, timeout_ms: int, user: Optional[str] = None, password: Optional[bytes] = None
) -> aetcd.Client:
    """An aetcd client whose calls time out after timeout_ms and whose connection is kept alive
    (a dead etcd is noticed within KEEPALIVE_MS + timeout_ms); also the fleet's (fleet/member.py)."""
    options = {
        "grpc.keepalive_time_ms": KEEPALIVE_MS,
        "grpc.keepalive_timeout_ms": timeout_ms,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1000,
        "grpc.max_receive_message_length": MAX_RECEIVE_BYTES,
    }
    credentials = {"username": user, "password": password.decode(errors="replace")} if user and password else {}
    return aetcd.Client(host=host, port=port, timeout=timeout_ms / 1000, options=options, **credentials)


async def close_quietly(c: aetcd.Client) -> None:
    try:
        await within(c.close(), 1.0)
    except (asyncio.TimeoutError, aetcd.ClientError, grpc.RpcError, OSError):
        pass


def answer_of(kvs: dict[bytes, bytes]) -> Answer:
    """The set the keys describe; ConfigError for the first key (in key order) that is garbage."""
    return Answer(tuple(parse_value(k, kvs[k]) for k in sorted(kvs)))


def _parsed(key: bytes, value: bytes):
    """A Backend, or the ConfigError saying why the value is none."""
    try:
        return parse_value(key, value)
    except ConfigError as e:
        return e


class EtcdSource:
    kind = "etcd"
    watched = True

    def __init__(self, d: Discovery):
        self.cfg: Etcd = d.etcd
        self.retry_s = d.retry_ms / 1000
        self.max_keys = d.max_backends
        self.prefix = self.cfg.prefix.encode()

    async def _client(self, host: str, port: int) -> aetcd.Client:
        """A client for one endpoint, with the section's etcd user if it has one (its password
        read off the loop at every connect; ConfigError naming the field when it cannot be)."""
        password = None
        if self.cfg.password_file is not None:
            password = await asyncio.to_thread(read_secret, self.cfg.password_file, "discovery.etcd.password_file")
        return client(host, port, self.cfg.timeout_ms, self.cfg.user, password)

    async def _count(self, client: aetcd.Client) -> int:
        """How many keys the prefix holds, without reading them (aetcd's get_prefix has no
        count_only: its stub is asked directly, on the connection client.connect() made)."""
        request = rpc.RangeRequest(key=self.prefix, range_end=utils.prefix_range_end(self.prefix), count_only=True)
        reply = await client.kvstub.Range(request, timeout=self.cfg.timeout_ms / 1000, metadata=client.metadata)
        return reply.count

    async def _read(self, client: aetcd.Client) -> tuple[dict, int]:
        """Every key's parsed value (parsed off the loop) and the revision read at; ConfigError
        when the prefix holds more keys than max_backends (counted first, nothing read)."""
        timeout_s = self.cfg.timeout_ms / 1000
        count = await within(self._count(client), timeout_s)
        if count > self.max_keys:
            raise ConfigError(
                f"etcd {self.cfg.prefix}: {count} keys, more than discovery.max_backends "
                f"({self.max_keys}); over the cap, nothing read"
            )
        got = await within(client.get_prefix(self.prefix), timeout_s)
        kvs = await asyncio.to_thread(lambda: {kv.key: _parsed(kv.key, kv.value) for kv in got})
        return kvs, got.header.revision

    async def _follow(self, client: aetcd.Client, report: Report) -> None:
        """Reads the prefix, reports it, then reports after every watch event (each value parsed
        once, when it is put); returns or raises when the stream breaks."""
        timeout_s = self.cfg.timeout_ms / 1000
        await within(client.connect(), timeout_s)
        kvs, revision = await self._read(client)
        await self._report(kvs, report)
        watch = await within(client.watch_prefix(self.prefix, start_revision=revision + 1), timeout_s)
        # The events of one revision (a transaction, a prefix delete) arrive one by one; a pump
        # moves them into a queue, and the set is reported once per batch that is there, so no
        # half-applied revision ever reaches the maps.
        queue: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in watch:
                    queue.put_nowait(event)
                queue.put_nowait(ConnectionError("watch stream ended"))
            except Exception as e:  # handed to the reader below, which decides what is a fault
                queue.put_nowait(e)

        pumping = asyncio.create_task(pump())
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                for event in batch:
                    if isinstance(event, Exception):
                        raise event
                    if event.kind == aetcd.EventKind.PUT:
                        kvs[event.kv.key] = _parsed(event.kv.key, event.kv.value)
                    else:
                        kvs.pop(event.kv.key, None)
                await self._report(kvs, report)
        finally:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            await watch.cancel()

    async def _report(self, kvs: dict, report: Report) -> None:
        if len(kvs) > self.max_keys:
            await report(
                Failure(
                    f"etcd {self.cfg.prefix}: {len(kvs)} keys, more than discovery.max_backends "
                    f"({self.max_keys}); over the cap"
                )
            )
            return
        bad = next((kvs[k] for k in sorted(kvs) if isinstance(kvs[k], ConfigError)), None)
        if bad is not None:
            await report(Failure(str(bad)))
        else:
            await report(Answer(tuple(kvs[k] for k in sorted(kvs))))

    def _why(self, e: BaseException) -> str:
        if isinstance(e, asyncio.TimeoutError):
            return f"no answer in {self.cfg.timeout_ms} ms"
        if isinstance(e, grpc.RpcError) and getattr(e, "code", lambda: None)() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"a read of {self.cfg.prefix} is larger than {MAX_RECEIVE_BYTES >> 20} MiB; over the cap"
        if isinstance(e, grpc.RpcError) and callable(getattr(e, "details", None)):
            text = " ".join(str(e.details() or e.code()).split())[:160]  # a raw stub call's (_count's)
        else:
            text = " ".join(str(e).split())[:160] or type(e).__name__
        if isinstance(e, (aetcd.ClientError, grpc.RpcError, OSError, ConnectionError, ConfigError)):
            return text
        return f"{type(e).__name__}: {text}"

    async def run(self, report: Report) -> None:
        """Never raises (but CancelledError): any fault is a failure, then the next endpoint after
        retry_ms, doubled (up to 30 s) while the faults go on without an answer in between."""
        turn, delay = 0, self.retry_s
        while True:
            host, port = self.cfg.endpoints[turn % len(self.cfg.endpoints)]
            client = None
            self.answered = False
            try:
                client = await self._client(host, port)
                await self._follow(client, _noting(self, report))
                why = "watch stream ended"
            except Exception as e:  # noqa: BLE001 -- a fault of the source, never the end of it
                why = self._why(e)
            finally:
                if client is not None:
                    await close_quietly(client)
            await report(Failure(f"etcd {host}:{port}: {why}" if "etcd " not in why[:5] else why))
            turn += 1
            delay = self.retry_s if self.answered else min(MAX_RETRY_S, delay * 2)
            await asyncio.sleep(delay)


MAX_RETRY_S = 30.0


def _noting(source: EtcdSource, report: Report) -> Report:
    """report, noting on source whether an answer (not a failure) got through."""

    async def wrapped(result) -> None:
        if isinstance(result, Answer):
            source.answered = True
        await report(result)

    return wrapped
