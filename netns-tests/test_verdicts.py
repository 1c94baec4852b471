"""The data path's verdicts as a table: one row per case, each an input frame, the maps set-up it
meets, and what the program must do with it: its verdict (XDP_* or TC_ACT_*), the frame it leaves
(unchanged, or rewritten field by field with checksums computed here, independently of the data
path), by how much each verdict and drop counter grows, and the service they grow under
(edge_svc_counts' slot: svc, "" for a packet no service is known for); every counter not named,
and every other service's, must stay put. Every drop reason and every NAT case has a row.

The rows live in verdicts_v4.py (IPv4) and verdicts6.py, verdicts_icmp6.py, verdicts_hb6.py,
verdicts_dsr6.py, verdicts_malformed6.py, verdicts_state6.py, verdicts_wire6.py (IPv6). The programs are compiled once for the module and run through BPF_PROG_TEST_RUN (verdicts.py):
no namespace, no interface, no traffic; the rows take well under a second. Each row starts from
World.reset(): no connections, the heartbeat backends alive, budgets unspent, hops cached.

A row that finds a defect stays, marked xfail with the reason, until the data path is fixed.
The namespace suites (test_forwarding, test_malformed, test_health_abuse, ...) test the same
behaviour end to end; this table is the specification at the level of single packets.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from conftest import require_privileges
from verdicts import (
    TC_ACT_OK,
    TC_ACT_REDIRECT,
    TC_ACT_SHOT,
    TC_ACT_UNSPEC,
    XDP_DROP,
    XDP_PASS,
    XDP_REDIRECT,
    World,
    parsed,
)
from verdicts6 import ROWS6
from verdicts_dsr6 import rows as rows_dsr6
from verdicts_hb6 import rows as rows_hb6
from verdicts_icmp6 import ROWS_ICMP6
from verdicts_malformed6 import ROWS_MALFORMED6
from verdicts_state6 import rows as rows_state6
from verdicts_v4 import ING, REP, RET, ROWS as ROWS4, SAME, Row, row
from verdicts_wire6 import rows as rows_wire6
from verdicts_wlc import rows as rows_wlc

from controlplane import abi

VERDICTS = {
    ING: {XDP_DROP: "XDP_DROP", XDP_PASS: "XDP_PASS", XDP_REDIRECT: "XDP_REDIRECT"},
    RET: {
        TC_ACT_OK: "TC_ACT_OK",
        TC_ACT_UNSPEC: "TC_ACT_UNSPEC",
        TC_ACT_SHOT: "TC_ACT_SHOT",
        TC_ACT_REDIRECT: "TC_ACT_REDIRECT",
    },
}
VERDICTS[REP] = VERDICTS[ING]
VERDICTS[abi.PROG_INGRESS6_DSR] = VERDICTS[ING]  # a tail program run on its own (verdicts_dsr6.py)


ROWS = [
    *ROWS4,  # IPv4 (verdicts_v4.py)
    *(row(*r[:6], *r[7:], svc=r[6]) for r in ROWS6 + ROWS_ICMP6),  # IPv6 (verdicts6.py, verdicts_icmp6.py)
    *(row(*r[:6], *r[7:], svc=r[6]) for r in ROWS_MALFORMED6),  # IPv6's malformed corpus (verdicts_malformed6.py)
    *rows_hb6(row),  # IPv6 backends' heartbeats (verdicts_hb6.py)
    *rows_dsr6(row),  # IPv6 DSR (verdicts_dsr6.py)
    *rows_state6(row),  # IPv6 half-open, stateless and direct (verdicts_state6.py)
    *rows_wire6(row),  # IPv6 wire signals (verdicts_wire6.py)
    *rows_wlc(row),  # least_loaded weighed by slots (verdicts_wlc.py)
]


# ---------------------------------------------------------------- running the table


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_privileges()  # module scope: before the autouse gate, which is per test
    w = World()
    try:
        w.build()
        yield w
    finally:
        w.close()


def params() -> list:
    return [
        pytest.param(
            r, id=f"{r.prog}: {r.name}", marks=[pytest.mark.xfail(reason=r.xfail, strict=True)] if r.xfail else []
        )
        for r in ROWS
    ]


@pytest.mark.parametrize("r", params())
def test_verdict(world: World, r: Row) -> None:
    world.reset()
    for step in r.setup:
        step(world)
    frame = r.frame(world) if callable(r.frame) else r.frame
    verdict, out, counters, by_service = world.run(r.prog, frame)
    names = VERDICTS[r.prog]
    assert names.get(verdict, verdict) == names[r.verdict], f"counters moved: {counters}"
    assert counters == r.counters
    assert by_service == ({r.svc: r.counters} if r.counters else {}), "counted under another service"
    if r.out == SAME:
        assert out == frame, "the frame was changed"
    elif r.out is not None and b"\x86\xdd" in (frame[12:14], r.out(frame)[12:14]):  # IPv6: scapy's checksums
        assert out == r.out(frame), "the rewritten IPv6 frame differs"
    elif r.out is not None:
        want = r.out(frame)
        assert parsed(want).checksums_ok(want)
        assert parsed(out).fields(out) == parsed(want).fields(want)
        assert out == want, "the rewritten fields are right, other bytes differ"
    for what, holds in r.after:
        assert holds(world), what


def test_every_drop_reason_has_a_row() -> None:
    """A new EDGE_DROP_* reason needs a row here."""
    covered = {k.split(":", 1)[1] for r in ROWS for k in r.counters if k.startswith("drop:")}
    assert covered == set(abi.DROP_NAMES.values())


def test_every_verdict_counter_has_a_row() -> None:
    """Every verdict counter the data path can move in one packet has a row that moves it."""
    moved = {k for r in ROWS for k in r.counters if not k.startswith("drop:")}
    assert moved == set(abi.CNT_NAMES.values())
