"""tools/_datapath_c.py and tools/_datapath_report.py, the pure parts of tools/bench-datapath: the
template restore it writes in C, and the summary it prints from results. No root."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import _datapath_c  # noqa: E402
import _datapath_report  # noqa: E402

STORE = re.compile(r"\*\((__u\d+) \*\)\(data \+ (\d+)\) = (0x[0-9a-f]+)ULL;")


def test_template_writer_stores_exactly_the_header_bytes():
    template = bytes(range(1, 65))
    text = _datapath_c.template_writer("t", template, 54)
    out = bytearray(64)
    for ctype, off, value in STORE.findall(text):
        size = int(ctype[3:]) // 8
        out[int(off) : int(off) + size] = int(value, 16).to_bytes(size, sys.byteorder)
    assert bytes(out[:54]) == template[:54]
    assert bytes(out[54:]) == bytes(10)  # the rest is the data path's to keep (the counter)


def test_summary_lists_every_ratio_with_its_floor(capsys):
    def case(ns):
        return {
            "label": "x",
            "ns_per_packet": ns,
            "raw_ns_per_packet": ns,
            "wrapper_ns_per_packet": 0.0,
            "samples_raw_ns": [int(ns)],
            "action": "XDP_REDIRECT",
        }

    ratios = {
        "established": ("floor", 1.3, 1.5),
        "new_flow": ("floor_new", 1.2, 1.1),
        "reply_xdp": ("reply_xdp_floor", 1.3, 1.25),
        "reply": ("reply_floor", 1.3, 1.8),
    }
    keys = [
        "established",
        "new_flow",
        "pass",
        "reference",
        "floor",
        "floor_new",
        "reply_xdp",
        "reply_xdp_floor",
        "reply",
        "reply_floor",
    ]
    run = {
        "ct_flags": "0",
        "results": {
            "cases": {k: case(10.0 * (i + 1)) for i, k in enumerate(keys)},
            "ratios": {
                k: {"floor": f, "value": v, "target_max": t, "met": v <= t, "to_reference": None}
                for k, (f, t, v) in ratios.items()
            },
        },
        "checks": {"established_backend": "198.18.1.3:8000"},
        "measured": {"conntrack_full_in_round": None, "new_flows": 1, "a_repins": 0},
    }
    out = {
        "env": {"kernel": "k", "cpu_model": None, "cpu": 1, "bpf_jit_enable": "1", "bpf_stats_enabled": "0"},
        "params": {
            "frame_len": 64,
            "rounds": 1,
            "repeat": 1,
            "repeat_new": 1,
            "maglev_m": 7,
            "backends": 3,
            "health": "none",
            "ct_size": 10,
        },
        "ct_types": {"lru": run},
    }

    _datapath_report.print_table(out)

    printed = capsys.readouterr().out
    assert re.search(r"\(i\)/\(j\) reply, XDP +1\.25x +target <= 1\.3x +met\b", printed)
    assert re.search(r"\(a\)/\(e\) established +1\.50x +target <= 1\.3x +NOT met", printed)
    summary = printed.splitlines()[-1].split()
    assert summary[0] == "lru" and summary[3::3] == ["1.50x", "1.10x", "1.25x", "1.80x"]


def test_ratio_pairs_each_round_with_its_floor():
    import _datapath_cases

    @dataclass
    class C:
        key: str
        wrapper: str
        samples: list

    # the floor drifts between rounds (a full LRU turning over); the case moves with it
    cases = {
        "w": C("w", "w", [10, 10, 10]),
        "b": C("b", "w", [130, 250, 70]),
        "f": C("f", "w", [110, 210, 60]),
    }
    net_b, net_f = _datapath_cases.net_samples(cases, "b"), _datapath_cases.net_samples(cases, "f")
    assert net_b == [120, 240, 60] and net_f == [100, 200, 50]
    assert _datapath_cases.paired_ratios(net_b, net_f) == [1.2, 1.2, 1.2]
    # a round whose floor is not above zero is left out
    assert _datapath_cases.paired_ratios([5.0, 6.0], [0.0, 3.0]) == [2.0]
