"""tools/bench-serving --short: a smoke run of the serving benchmark in its own namespaces. It
asserts only that every peer completes and the figures and the plot are produced; the figures
themselves are the benchmark's to report, never a test's to judge."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench-serving"
PEERS = {
    "haproxy-roundrobin",
    "haproxy-leastconn",
    "edge-static",
    "edge-default",
    "edge-two_choices",
    "edge-least_loaded",
    "edge-least_loaded_static",
    "jsq-bound",
}


def test_a_short_run_completes_every_peer_and_produces_the_figures(tmp_path):
    out, png = tmp_path / "serving.json", tmp_path / "serving.png"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--short", "--json", str(out), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert {r["peer"] for r in rows} == PEERS
    for r in rows:
        assert r["offered"] > 0, r
        assert all(
            k in r
            for k in ("ttft_p50", "ttft_p99", "ttft_p999", "e2e_p50", "e2e_p99", "goodput", "failed", "router_cpu_s")
        ), r
        assert math.isfinite(r["ttft_p50"]) and 0 <= r["goodput"] <= 1, r
        assert (r["router_cpu_s"] is None) == (r["peer"] == "jsq-bound"), r
    assert set(doc["plot"]) == PEERS
    assert png.stat().st_size > 0
    assert "edge-default" in done.stdout
