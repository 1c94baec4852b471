"""Plain dicts <-> edge.v1 messages, by field name: a status dict as `edgectl status
--json` prints it becomes a GetStatusResponse and back without a table of names.

Rules: a proto field takes the dict value of the same key; None and missing keys
leave the field unset (an `optional` field then reads back as None); keys the
proto does not name are left out. Events carry their extra fields JSON-encoded.
No gRPC here, and no policy: server.py and client.py call these.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from controlplane import abi, statuspage
from controlplane.api import edge_pb2

EVENT_KEYS = ("t", "kind", "text", "service", "backend")


def _is_map(f: FieldDescriptor) -> bool:
    return f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def _repeated(f: FieldDescriptor) -> bool:
    # protobuf 7 dropped `label`; `is_repeated` is there since 5.x
    is_repeated = getattr(f, "is_repeated", None)
    return is_repeated if is_repeated is not None else f.label == FieldDescriptor.LABEL_REPEATED


def fill(msg: Message, data: dict) -> Message:
    """Sets msg's fields from data's keys of the same names; returns msg."""
    for f in msg.DESCRIPTOR.fields:
        value = data.get(f.name)
        if value is None:
            continue
        target = getattr(msg, f.name) if f.type == FieldDescriptor.TYPE_MESSAGE or _repeated(f) else None
        if _is_map(f):
            target.update(value)
        elif _repeated(f) and f.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value:
                fill(target.add(), item)
        elif _repeated(f):
            target.extend(value)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            target.SetInParent()
            fill(target, value)
        else:
            setattr(msg, f.name, value)
    return msg


def _plan(desc: Descriptor) -> tuple[frozenset[str], dict[str, tuple[Descriptor, bool]]]:
    """desc's field names, and its message fields (not maps) with their type and whether repeated."""
    plan = _PLANS.get(desc.full_name)
    if plan is None:
        names = frozenset(f.name for f in desc.fields)
        nested = {
            f.name: (f.message_type, _repeated(f))
            for f in desc.fields
            if f.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(f)
        }
        plan = _PLANS[desc.full_name] = (names, nested)
    return plan


_PLANS: dict[str, tuple[frozenset[str], dict[str, tuple[Descriptor, bool]]]] = {}


def _kwargs(desc: Descriptor, data: dict) -> dict:
    """data as keyword arguments of desc's message, by fill's rules (keys desc does not name and
    None left out), nested messages as dicts of their own."""
    names, nested = _plan(desc)
    kw = {k: v for k, v in data.items() if v is not None and k in names}
    for k in nested.keys() & kw.keys():
        sub, repeated = nested[k]
        kw[k] = [_kwargs(sub, item) for item in kw[k]] if repeated else _kwargs(sub, kw[k])
    return kw


def build(cls: type[Message], data: dict) -> Message:
    """As fill(cls(), data), in one call of the message's constructor (C in protobuf's upb): the
    status of 10,000 backends converts in a fraction of fill's time, which sets one field at a
    time from Python (tools/bench-probe --scale)."""
    return cls(**_kwargs(cls.DESCRIPTOR, data))


def to_dict(msg: Message) -> dict:
    """msg as a dict with one key per field; unset optional fields and messages are None."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if _is_map(f):
            out[f.name] = dict(value)
        elif _repeated(f) and f.type == FieldDescriptor.TYPE_MESSAGE:
            out[f.name] = [to_dict(item) for item in value]
        elif _repeated(f):
            out[f.name] = list(value)
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            out[f.name] = to_dict(value)
        else:
            out[f.name] = value
    return out


def _set_time(ts, t: float) -> None:
    """Sets a Timestamp to UNIX seconds t, to the nanosecond t holds (t * 1e9 would round)."""
    seconds = math.floor(t)
    nanos = round((t - seconds) * 1e9)
    ts.seconds, ts.nanos = (seconds + 1, 0) if nanos >= 10**9 else (seconds, nanos)


def _seconds(ts) -> float:
    """A Timestamp as UNIX seconds (float(ns) / 1e9 would round twice)."""
    return ts.seconds + ts.nanos / 1e9


def _in_order(counts: dict[str, int], names: dict[int, str]) -> dict[str, int]:
    """Counters in the ABI's order (a proto map has none), unknown names last."""
    order = {name: i for i, name in enumerate(names.values())}
    return dict(sorted(counts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


_SERVICE = edge_pb2.GetStatusResponse.DESCRIPTOR.fields_by_name["services"].message_type


def status_to_proto(snap: dict, edged: dict | None = None) -> edge_pb2.GetStatusResponse:
    """A daemon snapshot (one instance) as a GetStatusResponse; edged: version, pid."""
    msg = build(edge_pb2.GetStatusResponse, {k: v for k, v in snap.items() if k not in ("edged", "services")})
    # a constructor call per service: one for the whole message held the interpreter throughout (C,
    # 0.1 s at 10,000 backends on an idle machine, edged's loop waiting: tools/bench-probe --scale)
    services, desc = msg.services, _SERVICE
    for svc in snap.get("services") or ():
        services.add(**_kwargs(desc, svc))
    if edged:
        msg.edged.version = edged.get("version", "")
        msg.edged.pid = edged.get("pid", 0)
        if edged.get("t") is not None:
            _set_time(msg.edged.time, edged["t"])
        msg.edged.not_serving = edged.get("not_serving") or ""
    return msg


def view_to_proto(view: statuspage.View) -> edge_pb2.StatusView:
    return fill(edge_pb2.StatusView(), dataclasses.asdict(view))


def view_from_proto(msg: edge_pb2.StatusView) -> statuspage.View:
    return statuspage.View(**to_dict(msg))


def status_from_proto(msg: edge_pb2.GetStatusResponse) -> dict:
    """The snapshot dict `edgectl status --json` prints for one instance, with edged's additions."""
    snap = to_dict(msg)
    for counts in (snap, snap["no_service"] or {}, *snap["services"]):
        if "verdicts" not in counts:
            continue
        counts["verdicts"] = _in_order(counts["verdicts"], abi.CNT_NAMES)
        counts["drops"] = _in_order(counts["drops"], abi.DROP_NAMES)
    del snap["edged"]
    # no node.fleet / node.bgp, a complete count, no edged: the key is absent, as in the daemon's snapshot
    for key in ("fleet", "bgp", "conntrack_partial", "summarized", "probe_budget"):
        if snap[key] is None:
            del snap[key]
    if not snap["stopped_early"]:
        del snap["stopped_early"]
    for s in snap["services"]:  # a snapshot without a view: no summaries, as the daemon's
        for key in ("summary", "backends_total", "backends_offset"):
            if s[key] is None:
                del s[key]
    if msg.HasField("edged"):
        snap["edged"] = {
            "version": msg.edged.version,
            "pid": msg.edged.pid,
            "t": _seconds(msg.edged.time) if msg.edged.HasField("time") else None,
        }
        if msg.edged.not_serving:
            snap["edged"]["not_serving"] = msg.edged.not_serving
    return snap


def event_to_proto(event: dict) -> edge_pb2.Event:
    """An edged event dict as an Event: fields it does not name go to `fields`, JSON-encoded."""
    msg = edge_pb2.Event(
        kind=str(event.get("kind", "")),
        text=str(event.get("text", "")),
        service=str(event.get("service") or ""),
        backend=str(event.get("backend") or ""),
    )
    if event.get("t") is not None:
        _set_time(msg.time, event["t"])
    for key, value in event.items():
        if key not in EVENT_KEYS:
            msg.fields[str(key)] = json.dumps(value, default=str, sort_keys=True)
    return msg


def event_from_proto(msg: edge_pb2.Event) -> dict:
    """An Event as the dict edged emitted (values that were not JSON come back as strings)."""
    event: dict[str, Any] = {"t": _seconds(msg.time), "kind": msg.kind, "text": msg.text}
    if msg.service:
        event["service"] = msg.service
    if msg.backend:
        event["backend"] = msg.backend
    for key in sorted(msg.fields):
        try:
            event[key] = json.loads(msg.fields[key])
        except ValueError:
            event[key] = msg.fields[key]
    return event
