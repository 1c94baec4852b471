"""tools/_probe_scale.py's pure part (`tools/bench-probe --scale`): the two accept processes'
counts merged, and how evenly the window's probes went over the backends. No root."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import _probe_scale as ps  # noqa: E402


def test_the_accept_processes_counts_are_summed_per_address():
    total, per = ps.merged(
        [{"accepts": 5, "per": {"198.19.0.1": 3, "198.19.0.2": 2}}, {"accepts": 4, "per": {"198.19.0.1": 4}}]
    )
    assert (total, per) == (9, {"198.19.0.1": 7, "198.19.0.2": 2})


def test_spread_counts_every_backend_including_those_never_probed():
    addresses = [f"198.19.0.{i}" for i in range(1, 11)]
    before = {a: 10 for a in addresses}
    after = {a: 10 + 2 * i for i, a in enumerate(addresses)}  # the first one got nothing in the window
    s = ps.spread(before, after, addresses, wall_s=2.0)
    assert s["probed"] == 9 and s["min_hz"] == 0.0
    assert s["p10_hz"] == 1.0 and s["median_hz"] == 5.0
