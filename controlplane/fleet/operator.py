"""Operator actions that hold for the whole fleet, pure: no etcd, no maps, no clock of its own.

An operator's drain or weight override (`edgectl drain`, `edgectl weight` on any node of a
fleet) is kept in etcd, one key per backend, and the leader folds every such mark into each
snapshot it publishes, so every node applies it and the tables stay equal:

  operator/SERVICE/BACKEND   {"drain": bool, "weight": int or null, "node": who set it last,
                              "t": when (UNIX time)}; no key: neither (a mark with no drain
                              and no weight is deleted, not written)

Folding: a drained backend gets weight 0 (the data path then marks it draining: no new flows,
its connections stay, as a drain on one node), else an override gets its weight. Names are
config names ([a-z0-9_.-]), so SERVICE/BACKEND splits unambiguously.

A mark outlives nothing it was set for: once neither the leader's config (with the backends
still draining out after a reload) nor a fresh report of any node names its backend, for
longer than the fleet's stale_ms, the leader deletes it (an event says so). A backend removed
and added again later under the same name then starts undrained, as a new backend does; until
the leader deletes it, a mark only waits (of_service leaves it out).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from controlplane.config import Service
from controlplane.fleet import schema

OPERATOR = "operator/"
KINDS = ("drain", "undrain", "weight")

Marks = dict[str, dict[str, dict]]  # service -> backend -> {"drain": bool, "weight": int | None}


def key(prefix: str, service: str, backend: str) -> bytes:
    return f"{prefix}{OPERATOR}{service}/{backend}".encode()


def split_key(prefix: str, k: bytes) -> Optional[tuple[str, str]]:
    """(service, backend) of an operator key, None for any other key."""
    text = k.decode(errors="replace")
    head = prefix + OPERATOR
    if not text.startswith(head):
        return None
    parts = text[len(head) :].split("/")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


def decode(value: bytes) -> dict:
    """A mark as stored (schema.mark: every field checked); ValueError when it is none (garbage
    counts as no mark)."""
    return schema.mark(value, "operator mark")


def change(before: Optional[Mapping], kind: str, weight: Optional[int], node: str, t: float) -> Optional[dict]:
    """The mark after one action (kind drain, undrain, or weight: weight None clears the
    override); None when nothing is left (the key goes)."""
    if kind not in KINDS:
        raise ValueError(f"operator action: {kind!r} is not one of {', '.join(KINDS)}")
    doc = {"drain": bool(before and before.get("drain")), "weight": before.get("weight") if before else None}
    if kind == "drain":
        doc["drain"] = True
    elif kind == "undrain":
        doc["drain"] = False
    else:
        doc["weight"] = None if weight is None else int(weight)
    if not doc["drain"] and doc["weight"] is None:
        return None
    return {**doc, "node": node, "t": t}


def collect(entries: Iterable[tuple[str, str, Mapping]]) -> Marks:
    """(service, backend, mark) -> the marks per service, as the leader folds them."""
    out: Marks = {}
    for service, backend, mark in entries:
        out.setdefault(service, {})[backend] = {"drain": bool(mark.get("drain")), "weight": mark.get("weight")}
    return out


def of_service(s: Service, marks: Optional[Mapping]) -> dict[str, dict]:
    """s's marks, limited to backends s has (a mark for a backend a config dropped waits)."""
    names = {b.name for b in s.backends}
    return {
        b: {"drain": bool(m.get("drain")), "weight": m.get("weight")}
        for b, m in sorted(((marks or {}).get(s.name) or {}).items())
        if b in names
    }


def unknown(
    marks: Mapping[bytes, tuple[str, str, Mapping]],
    services: Iterable[Service],
    reports: Iterable[Mapping],
    now: float,
    stale_s: float,
    unsettled: Iterable[str] = (),
) -> list[bytes]:
    """Keys of the marks (key -> (service, backend, mark)) whose backend neither services (the
    leader's, backends draining out included) nor any report fresher than stale_s names: a
    node running a newer config keeps the marks it set alive by reporting them. Never one of
    an unsettled service (discovery has said nothing yet: its backends are not known)."""
    known = {(s.name, b.name) for s in services for b in s.backends}
    for r in reports:
        if now - float(r.get("t", 0)) > stale_s:
            continue
        for name, doc in (r.get("services") or {}).items():
            known.update((name, b) for b in (doc.get("weights") or {}))
    waiting = set(unsettled)
    return [
        k for k, (service, backend, _) in marks.items() if (service, backend) not in known and service not in waiting
    ]


def fold(weights: Mapping[str, int], marks: Mapping[str, Mapping]) -> dict[str, int]:
    """weights with the marks in force: a drain is 0, else an override is its weight."""
    out = dict(weights)
    for name, m in marks.items():
        if name not in out:
            continue
        if m.get("drain"):
            out[name] = 0
        elif m.get("weight") is not None:
            out[name] = int(m["weight"])
    return out


def describe(mark: Mapping) -> str:
    """A few words for status: 'drained', 'weight 7', 'drained, weight 7'."""
    parts = ["drained"] if mark.get("drain") else []
    if mark.get("weight") is not None:
        parts.append(f"weight {mark['weight']}")
    return ", ".join(parts)
