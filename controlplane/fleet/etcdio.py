"""The fleet's etcd I/O that is not one node's session: connecting with this node's etcd
user, a watch as a stream of events, the well-formed reports and operator marks among raw
key-values, the snapshot a new leader continues from, and `edgectl fleet status`'s read.
Everything read passes schema.py first; garbage is left out, never raised."""

from __future__ import annotations

import asyncio
import time
from typing import Iterable, Optional

import aetcd
import grpc

from controlplane.config import Fleet
from controlplane.discovery.etcd import client as etcd_client, close_quietly
from controlplane.discovery.tokens import read_secret
from controlplane.fleet import operator as op, schema, snapshot as fs
from controlplane.tasks import within

FAULTS = (asyncio.TimeoutError, aetcd.ClientError, grpc.RpcError, OSError, ConnectionError, ValueError)


def password(cfg: Fleet) -> Optional[bytes]:
    """node.fleet.password_file's password (None without etcd auth); ConfigError naming the field."""
    if cfg.password_file is None:
        return None
    return read_secret(cfg.password_file, "node.fleet.password_file")


async def connect(cfg: Fleet, host: str, port: int) -> aetcd.Client:
    """A client for one endpoint, with this node's etcd user if it has one (its password read
    off the loop, at every connect: a changed password takes effect at the next session)."""
    secret = await asyncio.to_thread(password, cfg)
    return etcd_client(host, port, cfg.timeout_ms, cfg.user, secret)


def continue_from(got, reports: Iterable[dict], revision: int) -> Optional[dict]:
    """The snapshot a new leader continues from: the last one if it is well-formed and its
    version no jump (never above its revision), with its version raised to the highest that a
    node reports having applied (never above the revision now): whatever was written to the
    snapshot key, the next version is newer than every node's."""
    last = None
    if got is not None:
        try:
            last = schema.snapshot(got.value)
        except ValueError:
            last = None
        if last is not None and last["version"] > got.mod_revision:
            last = None
    base = max([r["version"] for r in reports if r["version"] <= revision] + [last["version"] if last else 0])
    if last is None:
        return {"version": base, "services": {}} if base else None
    return {**last, "version": base}


def reports_of(kvs) -> list[dict]:
    """The well-formed reports among kvs (garbage counts as no report)."""
    out = []
    for kv in kvs:
        try:
            out.append(schema.report(kv.value, kv.key.decode(errors="replace")))
        except ValueError:
            continue
    return out


def marks_of(prefix: str, kvs) -> list[dict]:
    """The fleet-wide operator marks for `edgectl fleet status`, garbage left out."""
    out = []
    for kv in kvs:
        names = op.split_key(prefix, kv.key)
        try:
            mark = op.decode(kv.value) if names else None
        except ValueError:
            continue
        if mark is not None:
            out.append({"service": names[0], "backend": names[1], **mark})
    return out


async def events(
    c: aetcd.Client, key: bytes, range_end: Optional[bytes], timeout_ms: int, start_revision: Optional[int] = None
):
    """The watch's events one by one; ConnectionError when the stream ends."""
    watch = await within(c.watch(key, range_end=range_end, start_revision=start_revision), timeout_ms / 1000)
    try:
        async for event in watch:
            yield event
        raise ConnectionError("watch stream ended")
    finally:
        await watch.cancel()


async def read_status(cfg: Fleet) -> dict:
    """`edgectl fleet status`: the leader, the snapshot and every node's report, read from etcd
    (the first endpoint that answers). Raises ConnectionError naming the endpoints."""
    errors = []
    secret = password(cfg)
    for host, port in cfg.etcd:
        c = etcd_client(host, port, cfg.timeout_ms, cfg.user, secret)
        try:
            await within(c.connect(), cfg.timeout_ms / 1000)
            prefix = cfg.prefix.encode()
            leader = await within(c.get(prefix + fs.LEADER.encode()), cfg.timeout_ms / 1000)
            snap = await within(c.get(prefix + fs.SNAPSHOT.encode()), cfg.timeout_ms / 1000)
            nodes = await within(c.get_prefix(prefix + fs.NODES.encode()), cfg.timeout_ms / 1000)
            marked = await within(c.get_prefix(prefix + op.OPERATOR.encode()), cfg.timeout_ms / 1000)
        except FAULTS as e:
            errors.append(f"{host}:{port}: {' '.join(str(e).split())[:80] or type(e).__name__}")
            continue
        finally:
            await close_quietly(c)
        reports = {i: r for i, r in enumerate(reports_of(nodes))}
        try:
            snapshot = schema.snapshot(snap.value) if snap is not None else None
        except ValueError:
            snapshot = None
        leader_name = leader.value.decode(errors="replace") if leader is not None else ""
        return {
            "leader": leader_name,
            "version": int(snapshot["version"]) if snapshot else 0,
            "published_t": snapshot.get("t") if snapshot else None,
            "nodes": fs.status_rows(leader_name, snapshot, reports.values(), time.time()),
            "operator": marks_of(cfg.prefix, marked),
        }
    raise ConnectionError("etcd: " + "; ".join(errors))
