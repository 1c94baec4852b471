"""Status at scale: the summaries (the default above statuspage.SUMMARY_ABOVE backends, or
--summary), pages of backends (--service, --offset, --limit) as edgectl prints them and as the
API sends them, and walks of the maps that stop at their deadline and say so (the snapshot of
in-memory maps, memtables). Netns: test_status_scale.py with 1,000 backends."""

from __future__ import annotations

import copy
import time

import pytest

from controlplane import statuspage, statusview
from controlplane.config import parse_config
from controlplane.statuspage import View
from controlplane.tests.apistage import SNAP
from controlplane.tests.memtables import MemMaps

M = 1021


def many(n_services: int, per_service: int) -> dict:
    """A snapshot of n_services services of per_service backends each (SNAP's backend b0 copied),
    every third draining and every fifth down."""
    snap = copy.deepcopy(SNAP)
    template = snap["services"][0]
    services = []
    for i in range(n_services):
        s = copy.deepcopy(template)
        s["name"], s["id"] = f"s{i}", i
        s["backends"] = []
        for j in range(per_service):
            b = copy.deepcopy(template["backends"][0])
            b["name"], b["id"], b["weight"], b["failovers"] = f"b{j}", i * per_service + j, 10, 1
            b["state"] = "draining" if j % 3 == 0 else "down" if j % 5 == 0 else "up"
            s["backends"].append(b)
        services.append(s)
    snap["services"] = services
    return snap


def test_above_the_threshold_the_summaries_are_the_default():
    snap = statuspage.apply(many(2, 200), View())  # 400 backends > SUMMARY_ABOVE
    assert snap["summarized"] and all(s["backends"] == [] for s in snap["services"])
    s0 = snap["services"][0]
    up = sum(1 for j in range(200) if j % 3 and j % 5)
    assert s0["summary"] == {
        "backends": 200,
        "up": up,
        "down": 200 - up - 67,
        "draining": 67,
        "weights_sum": 2000,
        "failovers": 200,
    }
    assert s0["backends_total"] == 200
    small = statuspage.apply(many(1, 10), View())
    assert not small["summarized"] and len(small["services"][0]["backends"]) == 10
    assert statuspage.apply(many(1, 10), View(summary=True))["summarized"]
    assert not statuspage.apply(many(2, 200), View(full=True))["summarized"]


def test_a_page_of_one_service():
    snap = statuspage.apply(many(3, 300), View(service="s1", offset=100, limit=50))
    assert [s["name"] for s in snap["services"]] == ["s1"] and not snap["summarized"]
    s1 = snap["services"][0]
    assert [b["name"] for b in s1["backends"]] == [f"b{j}" for j in range(100, 150)]
    assert (s1["backends_total"], s1["backends_offset"]) == (300, 100)
    assert statuspage.fmt_page(s1) == "backends 101-150 of 300 (--offset, --limit for others)"
    past = statuspage.apply(many(1, 5), View(offset=10))["services"][0]
    assert past["backends"] == [] and statuspage.fmt_page(past) == "no backends from 6 (of 5)"
    with pytest.raises(LookupError, match=r"--service: no service 'nope' here \(have: s0\)"):
        statuspage.apply(many(1, 5), View(service="nope"))


@pytest.mark.parametrize(
    "view, message",
    [
        (View(offset=-1), r"^--offset: -1 is negative$"),
        (View(limit=0), r"^--limit: 0 is not a positive number$"),
        (View(summary=True, limit=5), r"^--summary: lists no backends"),
    ],
)
def test_a_bad_view_names_its_option(view, message):
    with pytest.raises(ValueError, match=message):
        statuspage.apply(many(1, 1), view)


def test_the_text_of_summaries_and_of_a_page(capsys):
    snap = statusview.same_shape(statuspage.apply(many(2, 200), View()))
    statusview.print_status(snap)
    out = capsys.readouterr().out
    assert "summaries only (400 backends): --service S, --offset N, --limit N or --full list them" in out
    assert "    backends 200: up 107, down 26, draining 67; weights sum 2000; failovers 200" in out
    assert "198.18.1.2:8000" not in out  # no backend rows
    statusview.print_status(statusview.same_shape(statuspage.apply(many(2, 200), View(service="s0", limit=3))))
    out = capsys.readouterr().out
    assert "backends 1-3 of 200 (--offset, --limit for others)" in out and out.count("198.18.1.2:8000") == 3


def test_the_text_says_where_a_walk_stopped(capsys):
    snap = statusview.same_shape(many(1, 1))
    snap["conntrack_partial"] = 123456
    snap["stopped_early"] = ["conntrack: >= 123456 entries (counted for 3.0 s)"]
    statusview.print_status(snap)
    out = capsys.readouterr().out
    assert "conntrack: >= 123456 entries (the count stopped at its deadline)" in out
    assert "  stopped early: conntrack: >= 123456 entries (counted for 3.0 s)" in out


def _deployed(n_backends: int) -> tuple[MemMaps, object]:
    cfg = parse_config(
        {
            "version": 1,
            "node": {"maglev_m": M, "max_services": 2, "max_backends": 1024},
            "services": [
                {
                    "name": "big",
                    "vip": "198.19.0.1",
                    "port": 80,
                    "backends": [
                        {"name": f"b{j}", "address": f"198.18.{j // 200}.{j % 200 + 1}", "port": 80}
                        for j in range(n_backends)
                    ],
                }
            ],
        }
    )
    mem = MemMaps(M, 2, 1024)
    maps = mem.maps()
    maps.apply(cfg)
    return mem, maps


def test_the_backends_walk_stops_at_its_deadline_and_says_so():
    """A snapshot past its deadline reads no further than the next check (every 256 ids) and
    says how far it read; in time it reads every backend and says nothing."""
    mem, maps = _deployed(600)
    try:
        whole = maps.snapshot(deadline_ns=time.monotonic_ns() + 60 * 10**9)
        cut = maps.snapshot(deadline_ns=time.monotonic_ns() - 1)
    finally:
        maps.close()
        mem.close()
    assert len(whole["services"][0]["backends"]) == 600 and whole["stopped_early"] == []
    assert len(cut["services"][0]["backends"]) == 255
    assert len(cut["stopped_early"]) == 1
    assert cut["stopped_early"][0].startswith("backends: read 255 of 1024 backend ids in ")
    assert cut["stopped_early"][0].endswith("s; the others are not shown")


def test_the_api_sends_the_view_asked_for(edged):
    """edged applies the view before the snapshot crosses the socket: the summaries alone, or
    a page; without a view the whole snapshot, as before."""
    from controlplane.errors import EdgeError

    with edged.client() as c:
        summed = c.status(view=View(summary=True))
        paged = c.status(view=View(service="chat", offset=1, limit=1))
        whole = c.status()
        with pytest.raises(EdgeError, match=r"--service: no service 'nope' here \(have: chat\)"):
            c.status(view=View(service="nope"))
        with pytest.raises(EdgeError, match=r"--limit: 0 is not a positive number"):
            c.status(view=View(limit=0))
    chat = summed["services"][0]
    assert summed["summarized"] and chat["backends"] == [] and chat["backends_total"] == 2
    assert chat["summary"] == {"backends": 2, "up": 1, "down": 1, "draining": 0, "weights_sum": 7, "failovers": 1}
    page = paged["services"][0]
    assert [b["name"] for b in page["backends"]] == ["b1"] and (page["backends_total"], page["backends_offset"]) == (
        2,
        1,
    )
    assert "summary" not in whole["services"][0] and len(whole["services"][0]["backends"]) == 2


def test_edged_adds_its_view_to_the_backends_shown_only():
    """edged applies the view before it adds its view of each backend: a page costs edged's
    loop the backends on it, the summaries none."""
    import asyncio

    from controlplane.tests.edgedstage import config, daemon

    async def go():
        d = daemon(config(("b0", "b1", "b2")))
        return await d.snapshot(view=View(offset=1, limit=1)), await d.snapshot(view=View(summary=True))

    paged, summed = asyncio.run(go())
    (web,) = paged["services"]
    assert [b["name"] for b in web["backends"]] == ["b1"] and web["backends"][0]["edged"]["config_weight"] == 100
    assert summed["summarized"] and summed["services"][0]["summary"]["backends"] == 3
