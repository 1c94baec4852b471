"""What one run of tools/bench-serving measured, reduced to its figures: each request's outcome,
percentiles, goodput against the SLO, the row of one peer at one load level, the goals, the table.
Pure.

A failed request (refused, reset, an HTTP error, a stream cut short, the client's deadline) counts
as infinitely late in the latency percentiles (a peer cannot look fast by failing its slow ones),
and is counted in `failed`. Goodput: the share of the offered requests that completed with TTFT
<= SLO_TTFT_S and a mean time per output token within SLO_TPOT_FACTOR x the nominal tpot of the
server that answered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

SLO_TTFT_S = 0.5
SLO_TPOT_FACTOR = 1.5


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it; times in seconds from its send."""

    i: int
    ttft_s: Optional[float]  # first streamed token; None when none came
    e2e_s: Optional[float]  # the end of the stream; None when it never ended well
    tokens: int  # output tokens received
    backend: Optional[str]  # the server that answered (the simulator names itself in every chunk)
    error: Optional[str] = None  # None: completed

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    def mean_tpot_s(self) -> Optional[float]:
        """(end - first token) / (tokens - 1); None for a request of one token or a failed one."""
        if not self.ok or self.ttft_s is None or self.tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1)


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of values; inf entries sort last; nan when empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def good(o: Outcome, nominal_tpot_s: Mapping[str, float]) -> bool:
    """Completed within the SLO: TTFT and mean tpot against the answering server's nominal."""
    if not o.ok or o.ttft_s is None or o.ttft_s > SLO_TTFT_S:
        return False
    tpot = o.mean_tpot_s()
    if tpot is None:
        return True
    nominal = nominal_tpot_s.get(o.backend or "")
    return nominal is not None and tpot <= SLO_TPOT_FACTOR * nominal


@dataclass(frozen=True)
class Row:
    """One peer at one load level and client behaviour."""

    peer: str
    load: float
    clients: str  # "new" (a connection per request) or "pooled"
    offered: int
    ttft_p50: float
    ttft_p99: float
    ttft_p999: float
    e2e_p50: float
    e2e_p99: float
    goodput: float  # share of offered requests within the SLO
    failed: int
    router_cpu_s: Optional[float]  # CPU seconds of the router's process(es) during the run; None: none runs
    late_ttft: int = 0  # completed, but TTFT over the SLO
    slow_tpot: int = 0  # completed with TTFT within the SLO, but mean tpot over SLO_TPOT_FACTOR x nominal


def row(
    peer: str,
    load: float,
    clients: str,
    outcomes: list[Outcome],
    nominal_tpot_s: Mapping[str, float],
    router_cpu_s: Optional[float],
) -> Row:
    ttft = [o.ttft_s if o.ttft_s is not None and o.error is None else math.inf for o in outcomes]
    e2e = [o.e2e_s if o.ok else math.inf for o in outcomes]
    n = len(outcomes)
    return Row(
        peer=peer,
        load=load,
        clients=clients,
        offered=n,
        ttft_p50=percentile(ttft, 50),
        ttft_p99=percentile(ttft, 99),
        ttft_p999=percentile(ttft, 99.9),
        e2e_p50=percentile(e2e, 50),
        e2e_p99=percentile(e2e, 99),
        goodput=sum(good(o, nominal_tpot_s) for o in outcomes) / n if n else math.nan,
        failed=sum(not o.ok for o in outcomes),
        router_cpu_s=router_cpu_s,
        late_ttft=sum(o.ok and (o.ttft_s is None or o.ttft_s > SLO_TTFT_S) for o in outcomes),
        slow_tpot=sum(
            o.ok and o.ttft_s is not None and o.ttft_s <= SLO_TTFT_S and not good(o, nominal_tpot_s) for o in outcomes
        ),
    )


def _find(rows: list[Row], peer: str, load: float, clients: str) -> Optional[Row]:
    return next((r for r in rows if r.peer == peer and r.load == load and r.clients == clients), None)


def goals(
    rows: list[Row], load: float = 0.8, clients: str = "new", peer: str = "edge-default"
) -> list[tuple[str, Optional[bool], str]]:
    """(goal, met or None when a peer is missing, the figures) of issue 24 at load with clients,
    for peer (this router's default steering, or a policy measured against it)."""
    d = _find(rows, peer, load, clients)
    s = _find(rows, "edge-static", load, clients)
    lc = _find(rows, "haproxy-leastconn", load, clients)
    out: list[tuple[str, Optional[bool], str]] = []
    if d and s:
        out.append(
            ("TTFT p99 <= 0.5x static's", d.ttft_p99 <= 0.5 * s.ttft_p99, f"{_ms(d.ttft_p99)} vs {_ms(s.ttft_p99)} ms")
        )
    else:
        out.append(("TTFT p99 <= 0.5x static's", None, "a peer is missing"))
    if d and lc:
        out.append(
            (
                "TTFT p99 <= 1.1x leastconn's",
                d.ttft_p99 <= 1.1 * lc.ttft_p99,
                f"{_ms(d.ttft_p99)} vs {_ms(lc.ttft_p99)} ms",
            )
        )
        out.append(
            (
                "goodput within 5 % of leastconn's",
                d.goodput >= lc.goodput - 0.05 * lc.goodput,
                f"{d.goodput:.1%} vs {lc.goodput:.1%}",
            )
        )
    else:
        out.append(("TTFT p99 <= 1.1x leastconn's", None, "a peer is missing"))
        out.append(("goodput within 5 % of leastconn's", None, "a peer is missing"))
    return out


def _ms(x: float) -> str:
    return "inf" if math.isinf(x) else "nan" if math.isnan(x) else f"{x * 1000:.0f}"


HEADER = (
    "peer",
    "load",
    "clients",
    "offered",
    "ttft p50",
    "p99",
    "p99.9",
    "e2e p50",
    "p99",
    "goodput",
    "failed",
    "router cpu s",
)


def table(rows: list[Row]) -> list[str]:
    """The figures as an aligned text table; latencies in ms."""
    cells = [HEADER] + [
        (
            r.peer,
            f"{r.load:.0%}",
            r.clients,
            str(r.offered),
            _ms(r.ttft_p50),
            _ms(r.ttft_p99),
            _ms(r.ttft_p999),
            _ms(r.e2e_p50),
            _ms(r.e2e_p99),
            f"{r.goodput:.1%}",
            str(r.failed),
            "-" if r.router_cpu_s is None else f"{r.router_cpu_s:.2f}",
        )
        for r in rows
    ]
    widths = [max(len(c[k]) for c in cells) for k in range(len(HEADER))]
    return ["  ".join(c[k].rjust(widths[k]) if k else c[k].ljust(widths[k]) for k in range(len(c))) for c in cells]
