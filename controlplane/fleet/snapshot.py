"""The fleet's data and decisions, pure: no etcd, no maps, no clock of its own.

Keys under node.fleet.prefix:
  leader          the leader's name, on its lease (created only while absent: the election)
  nodes/NAME      NAME's report, on its lease: {"node", "t", "version", "serving", "services":
                  {service: {"digest", "weights": {backend: w}, "states": {backend: state},
                  "wire": {backend: {"handshake_p50_s", "first_byte_p50_s", "active"}}}}}
                  (weights as that node's weights.decide() computes them from its own probes;
                  wire: what its data path saw of real traffic over weights.wire.window_ms,
                  for operators only, the leader does not combine it)
  snapshot        the leader's snapshot: {"version", "leader", "lease" (the leader key's lease
                  id: nodes apply only a snapshot whose leader and lease are the leader key's
                  now, refused()), "t", "services": {service:
                  {"digest", "backends": [[name, address, port], ...], "weights": {backend: w}}}}
                  with operator marks (operator.py) also "operator": {backend: mark} and
                  "computed": the weights before the marks were folded in
  operator/...    operator drains and overrides for the whole fleet (operator.py)

A service's digest covers what makes two nodes' tables comparable (VIP, port, protocol, the
backends with their addresses, ports, configured weights and standby flags, the weight
policy): reports and snapshots are used only between nodes whose digests agree, so a node with
a different config never applies weights meant for other backends. The leader combines the
reports of one backend by their median (robust to one node's odd view: a node whose path to a
backend is slow does not move everyone's flows) and publishes a new version only when a weight
moves past the service's hysteresis (weights.push_due), as a single node would.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from controlplane import limits, weights as policy
from controlplane.config import Service
from controlplane.fleet import operator as op, schema

LEADER, NODES, SNAPSHOT = "leader", "nodes/", "snapshot"


def digest(s: Service) -> str:
    """What two nodes must agree on for one service before they share its weights."""
    doc = [
        str(s.vip),
        s.port,
        s.protocol,
        s.weights.policy,
        sorted([b.name, str(b.address), b.port, b.weight, b.standby] for b in s.backends),
    ]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]


def encode(doc: Mapping) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes, what: str) -> dict:
    """A report or snapshot, its shape only roughly known (schema.report and schema.snapshot
    check every field); ValueError naming what when it is not one."""
    doc = schema.load(value, what)
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise ValueError(f"{what}: not a fleet document (no services)")
    return doc


WIRE_KEYS = ("handshake_p50_s", "first_byte_p50_s", "active")


def report(
    node: str,
    t: float,
    version: int,
    serving: bool,
    services: Iterable[Service],
    computed: Mapping[str, Mapping[str, int]],
    states: Mapping[str, Mapping[str, str]],
    local: Optional[Mapping[str, Mapping[str, str]]] = None,
    wire: Optional[Mapping[str, Mapping[str, Mapping]]] = None,
) -> dict:
    """This node's report: what it computed for each service it has computed weights for;
    local: service -> backend -> what an operator set on this node only (its table differs);
    wire: its backends' wire signals (service -> backend -> WIRE_KEYS and more; None values
    left out)."""
    out = {}
    for s in services:
        if s.name in computed:
            out[s.name] = {
                "digest": digest(s),
                "weights": dict(computed[s.name]),
                "states": dict(states.get(s.name, {})),
            }
            seen = {
                b: {k: w[k] for k in WIRE_KEYS if w.get(k) is not None}
                for b, w in ((wire or {}).get(s.name) or {}).items()
            }
            if any(seen.values()):
                out[s.name]["wire"] = {b: w for b, w in seen.items() if w}
    doc = {"node": node, "t": t, "version": version, "serving": serving, "services": out}
    if local:
        doc["local"] = {name: dict(v) for name, v in local.items()}
    return doc


def _median(values: list[int]) -> int:
    values = sorted(values)
    return values[(len(values) - 1) // 2]  # the lower median: always one node's own value


def combine(s: Service, reports: Iterable[Mapping], now: float, stale_s: float) -> Optional[dict[str, int]]:
    """The weights of s from every fresh report whose digest agrees; None when there is none."""
    d = digest(s)
    per_backend: dict[str, list[int]] = {b.name: [] for b in s.backends}
    seen = False
    for r in reports:
        if now - float(r.get("t", 0)) > stale_s:
            continue
        mine = r.get("services", {}).get(s.name)
        if not mine or mine.get("digest") != d:
            continue
        ws = mine.get("weights", {})
        if set(ws) != set(per_backend):
            continue
        seen = True
        for name, w in ws.items():
            per_backend[name].append(int(w))
    if not seen:
        return None
    return {name: _median(ws) for name, ws in per_backend.items()}


def next_snapshot(
    services: Iterable[Service],
    reports: Iterable[Mapping],
    last: Optional[Mapping],
    leader: str,
    now: float,
    stale_s: float,
    operator: Optional[Mapping] = None,
) -> Optional[dict]:
    """The snapshot the leader publishes now, or None when the last one still holds (no weight
    moved past its service's hysteresis, no operator mark changed and no service came or went).
    operator: the fleet's operator marks (operator.collect), folded into the weights."""
    reports = list(reports)
    last_services = (last or {}).get("services", {})
    out, changed = {}, False
    for s in services:
        wanted = combine(s, reports, now, stale_s)
        before = last_services.get(s.name)
        same = before is not None and before.get("digest") == digest(s)
        prev = (before.get("computed") or before.get("weights")) if same else None  # before the marks
        marks = op.of_service(s, operator)
        if marks != ((before.get("operator") or {}) if same else {}):
            changed = True
        if wanted is None:
            if prev is None and not marks:
                continue
            # nobody reports it now: the last weights stay (the configured ones if there are none)
            wanted = dict(prev) if prev is not None else {b.name: b.weight for b in s.backends}
        elif prev is None or policy.push_due(wanted, prev, s.weights):
            changed = True
        else:
            wanted = dict(prev)
        out[s.name] = {
            "digest": digest(s),
            "weights": op.fold(wanted, marks),
            "backends": [[b.name, str(b.address), b.port] for b in s.backends],
        }
        if marks:
            out[s.name].update(operator=marks, computed=wanted)
    if set(out) != set(last_services):
        changed = True
    if not changed:
        return None
    return {"version": int((last or {}).get("version", 0)) + 1, "leader": leader, "t": now, "services": out}


@dataclass(frozen=True)
class Apply:
    """What a node does with a snapshot: the weights it takes per service, and why it takes none
    for the others."""

    version: int
    weights: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    operator: dict[str, dict[str, dict]] = field(default_factory=dict)  # the marks folded in, per service
    refused: dict[str, str] = field(default_factory=dict)  # services whose weights are unsafe: the last ones stay


def refused(snap: Mapping, holder: Optional[str], lease: int, mod_revision: int) -> Optional[str]:
    """Why a (schema-checked) snapshot must not be applied, or None: it must come from the
    current holder of the leader key (holder, on lease: the key's value and lease now), and its
    version may not exceed the etcd revision it was written at (every version the leaders
    published took one revision at least, so a larger one was made up: it would freeze the fleet)."""
    if holder is None:
        return f"from {snap['leader']!r}, but no node holds the leader key"
    if snap["leader"] != holder or snap.get("lease", 0) != lease:
        return f"from {snap['leader']!r} (lease {snap.get('lease', 0):x}), not from the leader {holder!r} (lease {lease:x})"
    if snap["version"] > mod_revision:
        return f"version {snap['version']} is past etcd's revision {mod_revision}: a jump no leader made"
    return None


def _all_zero_unasked(s: Service, weights: Mapping[str, int], marks: Mapping[str, Mapping]) -> bool:
    """Every weight 0 while some backend is neither configured at 0 nor drained (or set to 0) by
    an operator: no leader computes that (the policy fails open), so it is refused."""
    if any(weights.values()):
        return False
    asked = {n for n, m in marks.items() if m.get("drain") or m.get("weight") == 0}
    return any(b.weight > 0 and b.name not in asked for b in s.backends)


def _take(s: Service, theirs: Mapping) -> tuple[Optional[dict], Optional[dict], str, bool]:
    """(weights, marks, '', False) of one service's part of a snapshot, or (None, None, why not,
    unsafe): unsafe weights are refused (the last ones stay), another config's are skipped."""
    if theirs.get("digest") != digest(s):
        return None, None, "this node's config of it differs from the leader's", False
    weights = dict(theirs["weights"])
    if set(weights) != {b.name for b in s.backends}:
        return None, None, "its backends differ from this node's", False
    if not all(limits.is_weight(w) for w in weights.values()):
        return None, None, f"a weight is out of {limits.WEIGHTS}", True
    marks = op.of_service(s, {s.name: theirs.get("operator") or {}})
    if _all_zero_unasked(s, weights, marks):
        return None, None, "every weight is 0 and no operator drained them", True
    return weights, marks, "", False


def to_apply(snap: Mapping, services: Iterable[Service], applied: int) -> Optional[Apply]:
    """None when snap is not newer than the version applied; else what to take from it (a
    service whose part is not usable is skipped, saying why)."""
    version = int(snap.get("version", 0))
    if version <= applied:
        return None
    take, skipped, marks, refused = {}, {}, {}, {}
    shared = snap.get("services", {})
    for s in services:
        theirs = shared.get(s.name)
        if theirs is None:
            skipped[s.name] = "not in the snapshot"
            continue
        weights, folded, why, unsafe = _take(s, theirs)
        if weights is None:
            (refused if unsafe else skipped)[s.name] = why
            continue
        take[s.name] = weights
        if folded:
            marks[s.name] = folded
    return Apply(version, take, skipped, marks, refused)


def status_rows(leader: str, snap: Optional[Mapping], reports: Iterable[Mapping], now: float) -> list[dict]:
    """`edgectl fleet status`: one row per reporting node."""
    current = int(snap.get("version", 0)) if snap else 0
    rows = []
    for r in sorted(reports, key=lambda r: str(r.get("node"))):
        states = [st for svc in r.get("services", {}).values() for st in svc.get("states", {}).values()]
        down = sum(st in ("down", "hung") for st in states)
        rows.append(
            {
                "node": r.get("node"),
                "leader": r.get("node") == leader,
                "version": int(r.get("version", 0)),
                "current": int(r.get("version", 0)) == current,
                "serving": bool(r.get("serving")),
                "backends": len(states),
                "backends_down": down,
                "report_age_s": round(max(0.0, now - float(r.get("t", 0))), 3),
                "local": {
                    f"{svc}/{b}": what
                    for svc, v in sorted((r.get("local") or {}).items())
                    for b, what in sorted(v.items())
                },
                "wire": {
                    f"{name}/{b}": w
                    for name, svc in sorted(r.get("services", {}).items())
                    for b, w in sorted((svc.get("wire") or {}).items())
                },
            }
        )
    return rows


def format_status(status: Mapping) -> str:
    """`edgectl fleet status` as text: the snapshot, then one line per node."""
    lines = [f"leader {status.get('leader') or '(none)'}, snapshot v{status.get('version', 0)}"]
    lines.append(f"{'NODE':<16} {'ROLE':<8} {'VERSION':>8} {'SERVING':<8} {'BACKENDS DOWN':>14} {'REPORT AGE':>11}")
    for r in status.get("nodes", []):
        version = f"v{r['version']}" + ("" if r["current"] else "*")
        lines.append(
            f"{str(r['node']):<16} {'leader' if r['leader'] else '-':<8} {version:>8} "
            f"{'yes' if r['serving'] else 'NO':<8} {r['backends_down']:>7}/{r['backends']:<6} "
            f"{r['report_age_s']:>10.1f}s"
        )
        if r.get("wire"):
            lines.append(
                "    wire (handshake/first byte p50, active): "
                + ", ".join(
                    f"{k} {_ms(w.get('handshake_p50_s'))}/{_ms(w.get('first_byte_p50_s'))} {w.get('active', '-')}"
                    for k, w in r["wire"].items()
                )
            )
    if any(not r["current"] for r in status.get("nodes", [])):
        lines.append("* not on the current snapshot yet")
    for m in status.get("operator", []):
        lines.append(f"fleet-wide: {m['service']}/{m['backend']} {op.describe(m)} (set on {m['node'] or '?'})")
    for r in status.get("nodes", []):
        for name, what in (r.get("local") or {}).items():
            lines.append(f"{r['node']}: {name} {what} on this node only: its table differs from the fleet's")
    return "\n".join(lines)


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}ms"
