"""The views of a status snapshot at scale (`edgectl status --summary, --service, --offset,
--limit, --full`; GetStatus's request): per service a summary (backends up, down, draining,
the sum of their weights, failovers) and a page of its backends, or the summaries alone, the
default above SUMMARY_ABOVE backends. Pure: edged's API server applies it to edged's snapshot
(so megabytes never cross the socket) and edgectl to the pinned maps', one shape either way.
Also the lines that say where a walk of the maps stopped early. statusview.py prints it all.
"""

from __future__ import annotations

from dataclasses import dataclass

SUMMARY_ABOVE = 256  # backends on the node above which status shows the summaries unless asked


@dataclass(frozen=True)
class View:
    """What of a snapshot to show. summary None: the summaries alone above SUMMARY_ABOVE
    backends, unless a page (service, offset, limit) or full is asked for."""

    summary: bool | None = None
    full: bool = False
    service: str = ""
    offset: int = 0
    limit: int | None = None

    def paged(self) -> bool:
        return bool(self.service) or self.offset > 0 or self.limit is not None

    def check(self) -> None:
        """ValueError naming the option that is out of range or contradicts another."""
        if self.offset < 0:
            raise ValueError(f"--offset: {self.offset} is negative")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit: {self.limit} is not a positive number")
        if self.summary and (self.full or self.offset or self.limit is not None):
            raise ValueError("--summary: lists no backends; --full, --offset and --limit list them")


def summarize(service: dict) -> dict:
    """One service's backends counted: up (takes new flows), draining (weight 0, connections
    kept), down (every other state: down, ejected, admin-down, probation, rising), the sum of
    their weights and failovers."""
    states = [b["state"] for b in service["backends"]]
    up, draining = states.count("up"), states.count("draining")
    return {
        "backends": len(states),
        "up": up,
        "down": len(states) - up - draining,
        "draining": draining,
        "weights_sum": sum(int(b["weight"] or 0) for b in service["backends"]),
        "failovers": sum(int(b.get("failovers") or 0) for b in service["backends"]),
    }


def apply(snap: dict, view: View) -> dict:
    """snap as view shows it (changed in place and returned): every service shown gets summary,
    backends_total and backends_offset; its backends are the page asked for, or none when
    summarized (snap["summarized"]). LookupError for a --service the snapshot lacks."""
    view.check()
    services = snap["services"]
    if view.service:
        services = [s for s in services if s["name"] == view.service]
        if not services:
            have = ", ".join(s["name"] for s in snap["services"]) or "none"
            raise LookupError(f"--service: no service {view.service!r} here (have: {have})")
    total = sum(len(s["backends"]) for s in snap["services"])
    summarized = view.summary
    if summarized is None:
        summarized = not view.full and not view.paged() and total > SUMMARY_ABOVE
    end = None if view.limit is None else view.offset + view.limit
    for s in services:
        s["summary"] = summarize(s)
        s["backends_total"] = len(s["backends"])
        s["backends_offset"] = 0 if summarized else min(view.offset, len(s["backends"]))
        s["backends"] = [] if summarized else s["backends"][view.offset : end]
    snap["services"] = services
    snap["summarized"] = summarized
    snap.setdefault("stopped_early", [])
    return snap


def fmt_summary(s: dict) -> str:
    """A summarized service's backends in one line."""
    m = s["summary"]
    return (
        f"backends {m['backends']}: up {m['up']}, down {m['down']}, draining {m['draining']}; "
        f"weights sum {m['weights_sum']}; failovers {m['failovers']}"
    )


def fmt_page(s: dict) -> str | None:
    """Which backends a paged service shows ('backends 101-200 of 5000'); None when all."""
    shown, total, first = len(s["backends"]), s["backends_total"], s["backends_offset"]
    if shown == total:
        return None
    if not shown:
        return f"no backends from {first + 1} (of {total})"
    return f"backends {first + 1}-{first + shown} of {total} (--offset, --limit for others)"


def fmt_conntrack(snap: dict) -> str:
    """'   conntrack entries: N', '   conntrack: >= N entries (the count stopped at its deadline)',
    or '' when not counted."""
    if snap.get("conntrack_entries") is not None:
        half_open = snap.get("half_open_entries")
        return f"   conntrack entries: {snap['conntrack_entries']}" + (
            f" (+ {half_open} half-open)" if half_open is not None else ""
        )
    if snap.get("conntrack_partial") is not None:
        return f"   conntrack: >= {snap['conntrack_partial']} entries (the count stopped at its deadline)"
    return ""
