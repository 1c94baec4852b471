"""tools/bench-datapath runs end to end (a smoke run: few repetitions, both families): every case
is measured and every ratio reported. It compiles the real data path with its own pin directory
and runs the programs through BPF_PROG_TEST_RUN; the figures themselves are the benchmark's, not
asserted here. A run of the tool is the only test of its glue with the maps' reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench-datapath"


def test_smoke_run_measures_every_case(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--rounds", "1", "--repeat", "200", "--repeat-new", "200", "--check-repeat", "5", "--ct-types", "lru"]
    run = subprocess.run(
        [sys.executable, str(TOOL), *args, "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    lru = result["ct_types"]["lru"]["results"]
    cases, ratios = lru["cases"], lru["ratios"]
    for key in ("established", "new_flow", "floor", "floor_new", "reference", "established6", "new_flow6"):
        assert cases[key]["samples_raw_ns"], key
    assert {"established", "new_flow", "established6", "new_flow6"} <= set(ratios), sorted(ratios)
    assert all(r["value"] > 0 for r in ratios.values()), ratios
