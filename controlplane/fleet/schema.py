"""Strict checks of every fleet document read from etcd (reports, snapshots, operator marks), pure.

Any etcd writer can put anything under the fleet's prefix, so nothing read there is used
before it passed these checks: the size first (MAX_DOC_BYTES, before JSON is parsed), then
JSON (nesting too deep for the parser is refused, not raised), then every field's type and
range. A document that fails is refused whole with a ValueError whose text is one line naming
the field ("nodes/r1.services.web.weights.b0: [] is not an integer 0..65535"); the caller
counts it and carries on. Only ValueError ever leaves this module.

What the documents mean is snapshot.py's and operator.py's; this file only says what shape
they must have. Unknown keys are dropped, so an older node reads a newer one's documents.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

from controlplane import limits

MAX_DOC_BYTES = 1 << 20  # a report or snapshot of 1,024 backends with wire signals is ~200 KiB
MAX_NAME = 253
MAX_WEIGHT = limits.WEIGHT_MAX
MAX_VERSION = (1 << 63) - 1  # etcd's revisions are int64: a version is never above its revision


def load(value: bytes, what: str) -> Any:
    """value as JSON; ValueError naming what when it is too large, not JSON or nested too deep."""
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"{what}: not bytes")
    if len(value) > MAX_DOC_BYTES:
        raise ValueError(f"{what}: {len(value)} bytes, more than {MAX_DOC_BYTES}")
    try:
        return json.loads(value)
    except RecursionError:
        raise ValueError(f"{what}: nested too deep") from None
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{what}: not JSON") from None


def obj(doc: Any, where: str) -> Mapping:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: {_show(doc)} is not an object")
    return doc


def text(doc: Any, where: str) -> str:
    if not isinstance(doc, str) or len(doc) > MAX_NAME:
        raise ValueError(f"{where}: {_show(doc)} is not a name of at most {MAX_NAME} characters")
    return doc


def integer(doc: Any, where: str, lo: int = 0, hi: int = MAX_VERSION) -> int:
    if isinstance(doc, bool) or not isinstance(doc, int) or not lo <= doc <= hi:
        raise ValueError(f"{where}: {_show(doc)} is not an integer {lo}..{hi}")
    return doc


def number(doc: Any, where: str) -> float:
    if isinstance(doc, bool) or not isinstance(doc, (int, float)) or not math.isfinite(doc):
        raise ValueError(f"{where}: {_show(doc)} is not a number")
    return float(doc)


def flag(doc: Any, where: str) -> bool:
    if not isinstance(doc, bool):
        raise ValueError(f"{where}: {_show(doc)} is not true or false")
    return doc


def weight(doc: Any, where: str) -> int:
    return integer(doc, where, 0, MAX_WEIGHT)


def opt_weight(doc: Any, where: str) -> Any:
    return None if doc is None else weight(doc, where)


def mapping(doc: Any, where: str, each: Callable[[Any, str], Any]) -> dict:
    """An object of names -> each(value, where.name)."""
    return {text(k, f"{where} key"): each(v, f"{where}.{k}") for k, v in obj(doc, where).items()}


def _optional(doc: Mapping, key: str, where: str, each: Callable[[Any, str], Any], out: dict) -> None:
    if doc.get(key) is not None:
        out[key] = each(doc[key], f"{where}.{key}")


# ------------------------------------------------------------ reports


def _wire(doc: Any, where: str) -> dict:
    return mapping(doc, where, lambda w, at: mapping(w, at, number))


def _report_service(doc: Any, where: str) -> dict:
    doc = obj(doc, where)
    out = {
        "digest": text(doc.get("digest"), f"{where}.digest"),
        "weights": mapping(doc.get("weights"), f"{where}.weights", weight),
        "states": mapping(doc.get("states", {}), f"{where}.states", text),
    }
    _optional(doc, "wire", where, _wire, out)
    return out


def report(value: bytes, what: str) -> dict:
    """A node's report (snapshot.report's format), checked."""
    doc = obj(load(value, what), what)
    out = {
        "node": text(doc.get("node"), f"{what}.node"),
        "t": number(doc.get("t"), f"{what}.t"),
        "version": integer(doc.get("version"), f"{what}.version"),
        "serving": flag(doc.get("serving"), f"{what}.serving"),
        "services": mapping(doc.get("services"), f"{what}.services", _report_service),
    }
    _optional(doc, "local", what, lambda v, at: mapping(v, at, lambda x, a: mapping(x, a, text)), out)
    return out


# ------------------------------------------------------------ snapshots


def _mark(doc: Any, where: str) -> dict:
    doc = obj(doc, where)
    return {
        "drain": flag(doc.get("drain", False), f"{where}.drain"),
        "weight": opt_weight(doc.get("weight"), f"{where}.weight"),
    }


def _backends(doc: Any, where: str) -> list:
    if not isinstance(doc, list) or len(doc) > MAX_WEIGHT:
        raise ValueError(f"{where}: {_show(doc)} is not a list of [name, address, port]")
    out = []
    for i, b in enumerate(doc):
        at = f"{where}[{i}]"
        if not isinstance(b, list) or len(b) != 3:
            raise ValueError(f"{at}: {_show(b)} is not [name, address, port]")
        out.append([text(b[0], at), text(b[1], at), integer(b[2], at, 0, limits.PORT_MAX)])
    return out


def _snapshot_service(doc: Any, where: str) -> dict:
    doc = obj(doc, where)
    out = {
        "digest": text(doc.get("digest"), f"{where}.digest"),
        "weights": mapping(doc.get("weights"), f"{where}.weights", weight),
        "backends": _backends(doc.get("backends", []), f"{where}.backends"),
    }
    _optional(doc, "operator", where, lambda v, at: mapping(v, at, _mark), out)
    _optional(doc, "computed", where, lambda v, at: mapping(v, at, weight), out)
    return out


def snapshot(value: bytes, what: str = "snapshot") -> dict:
    """The leader's snapshot (snapshot.next_snapshot's format), checked; lease is the leader's
    lease id (0 in a snapshot of a version that did not carry it)."""
    doc = obj(load(value, what), what)
    out = {
        "version": integer(doc.get("version"), f"{what}.version", 1),
        "leader": text(doc.get("leader"), f"{what}.leader"),
        "t": number(doc.get("t"), f"{what}.t"),
        "lease": integer(doc.get("lease", 0), f"{what}.lease"),
        "services": mapping(doc.get("services"), f"{what}.services", _snapshot_service),
    }
    _optional(doc, "trigger_t", what, number, out)
    return out


# ------------------------------------------------------------ operator marks


def mark(value: bytes, what: str = "operator mark") -> dict:
    """An operator mark (operator.py's format), checked."""
    doc = obj(load(value, what), what)
    out = _mark(doc, what)
    out["node"] = text(doc.get("node", ""), f"{what}.node")
    out["t"] = number(doc.get("t", 0) or 0, f"{what}.t")
    return out


def _show(doc: Any) -> str:
    """A value for an error: its type, or a short repr of a scalar (never the whole document)."""
    if isinstance(doc, (dict, list)):
        return f"{'an object' if isinstance(doc, dict) else 'a list'} of {len(doc)}"
    return repr(doc)[:40]
