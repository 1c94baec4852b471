"""Verifier headroom: every program of the data path, compiled with the default sizes and loaded
(not attached), must verify within 60% of the kernel's 1,000,000-instruction budget, so that new
features have room. The counts are printed (pytest -s shows them); bpf/include/select.h says
what the slow path holds and why it is a separate, tail-called program. The fallback scan looks
at EDGE_SCAN_CHUNK backends a run and tail-calls itself for the next chunk: a service of
EDGE_MAX_PER_SERVICE backends must be scanned within the kernel's tail calls per packet.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Iterator

import pytest

from controlplane import abi, loader

VERIFIER_BUDGET = 1_000_000  # BPF_COMPLEXITY_LIMIT_INSNS
HEADROOM_SHARE = 0.60
BPFFS = Path("/sys/fs/bpf")
MAX_TAIL_CALLS = 33  # MAX_TAIL_CALL_CNT: tail calls one packet may make
SELECT_H = Path(__file__).resolve().parents[1] / "bpf" / "include" / "select.h"


@pytest.fixture
def loaded() -> Iterator[loader.Loaded]:
    loader.check_bpffs(str(BPFFS))
    pin_path = BPFFS / f"edge-verifier-test-{secrets.token_hex(3)}"
    pin_path.mkdir()
    datapath = None
    try:
        datapath = loader.compile_datapath(pin_path, loader.Params())
        yield datapath
    finally:
        if datapath is not None:
            datapath.close()
        loader.remove_pins(pin_path)


def test_every_program_verifies_within_60_percent_of_the_budget(loaded: loader.Loaded) -> None:
    counts = {name: loader.verified_insns(loaded.load(name, kind).fd) for name, kind in loader.PROGRAMS.items()}
    for name, count in counts.items():
        print(f"verified_insns {name}: {count:,} ({count / VERIFIER_BUDGET:.1%} of {VERIFIER_BUDGET:,})")
    assert all(count > 0 for count in counts.values()), f"kernel reports no verified_insns: {counts}"
    over = {name: count for name, count in counts.items() if count > HEADROOM_SHARE * VERIFIER_BUDGET}
    assert over == {}, f"over {HEADROOM_SHARE:.0%} of the verifier budget: {over}"


def test_a_full_service_is_scanned_within_the_tail_calls_of_one_packet() -> None:
    chunk = int(re.search(r"^#define\s+EDGE_SCAN_CHUNK\s+(\d+)", SELECT_H.read_text(), re.M).group(1))
    runs = -(-abi.MAX_PER_SERVICE // chunk)
    # fast path -> slow path -> the scan's first run: two tail calls; each further run one more
    assert 2 + (runs - 1) <= MAX_TAIL_CALLS, f"{runs} runs of {chunk} backends for {abi.MAX_PER_SERVICE}"


FAST_PATH_SHARE = 0.10


def test_the_fast_path_stays_small(loaded: loader.Loaded) -> None:
    """edge_ingress, the program every packet enters and every deploy verifies first, keeps new
    policy loops out (they run in the tail-called slow path): each 100k instructions it is verified
    with cost every deploy, and so every namespace test, about a third of a second."""
    count = loader.verified_insns(loaded.load("edge_ingress", loader.PROGRAMS["edge_ingress"]).fd)
    assert count <= FAST_PATH_SHARE * VERIFIER_BUDGET, f"edge_ingress verifies in {count:,} instructions"
