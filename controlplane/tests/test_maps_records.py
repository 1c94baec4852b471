"""controlplane.maps: the records only maps.py packs and unpacks. edge_be_probe (struct
backend_probe) against the struct as bpf/include/abi.h declares it, and the per-CPU
counters as bpftool dumps them.

Unprivileged: the record's ctypes layout is read from abi.h here (what bcc builds from
the same header), and Maps runs over an in-memory array of it.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

from controlplane import abi
from controlplane.maps import (
    PROBE_TEXT,
    Maps,
    ProbeStatus,
    counts_from_dump,
    pack_probe,
    slot_counts,
    unpack_probe,
    values_from_dump,
)
from controlplane.tests.memtables import Array, c_struct

ABI_H = Path(__file__).resolve().parents[2] / "bpf" / "include" / "abi.h"
PROBE = c_struct("backend_probe")


def test_the_struct_read_from_abi_h_has_the_size_abi_h_asserts():
    size = int(re.search(r"sizeof\(struct backend_probe\) == (\d+)", ABI_H.read_text()).group(1))
    assert ctypes.sizeof(PROBE) == size


def test_pack_probe_fills_every_field_of_the_struct_and_no_other():
    assert set(pack_probe(ProbeStatus())) == {f for f, _ in PROBE._fields_ if not f.startswith("pad")}
    assert {f: getattr(PROBE, f).size for f in PROBE_TEXT} == PROBE_TEXT


seconds = st.none() | st.floats(1e-6, 4000.0)
counts = st.none() | st.integers(0, 10**6).map(float)
text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80)


@settings(max_examples=100, deadline=None)
@given(
    p=st.builds(
        ProbeStatus,
        updated_ns=st.integers(0, 2**63),
        config_weight=st.integers(0, 65535),
        rtt_p50_s=seconds,
        rtt_p99_s=seconds,
        rtt_smoothed_s=seconds,
        waiting=counts,
        running=counts,
        kv_usage=st.none() | st.floats(0.0, 1.0),
        probes_ok=st.integers(0, 2**32 - 1),
        probes_failed=st.integers(0, 2**32 - 1),
        state=text,
        reason=text,
        drained=st.booleans(),
        override=st.none() | st.integers(0, 65535),
        leave_until_s=st.none() | st.integers(1, 2**32 - 1),
    )
)
def test_a_status_written_through_maps_reads_back_the_same_to_the_units_of_the_record(p):
    maps = Maps(
        {abi.MAP_BACKENDS: Array(ctypes.c_uint8, 4), abi.MAP_BE_PROBE: Array(PROBE, 4)},
        maglev_fd=-1,
        maglev_m=13,
        max_services=1,
    )
    maps.write_status(2, p)
    got = maps.read_status(2)

    def rounded(s):
        return None if s is None else max(1, round(s * 1e6)) / 1e6

    assert got == ProbeStatus(
        updated_ns=p.updated_ns,
        config_weight=p.config_weight,
        rtt_p50_s=rounded(p.rtt_p50_s),
        rtt_p99_s=rounded(p.rtt_p99_s),
        rtt_smoothed_s=rounded(p.rtt_smoothed_s),
        waiting=p.waiting,
        running=p.running,
        kv_usage=None if p.kv_usage is None else round(p.kv_usage * 1000) / 1000,
        probes_ok=p.probes_ok,
        probes_failed=p.probes_failed,
        state=p.state[: PROBE_TEXT["state"] - 1],
        reason=p.reason[: PROBE_TEXT["reason"] - 1],
        drained=p.drained,
        override=p.override,
        leave_until_s=p.leave_until_s,
    )
    raw = maps.read_probe(2)  # what `status --json` shows: the C names
    assert raw["flags"] == pack_probe(p)["flags"] and raw["state"] == got.state
    assert unpack_probe(pack_probe(got)) == got  # a restarted edged writes back what it read


def test_out_of_range_load_signals_are_clamped_not_wrapped():
    packed = pack_probe(ProbeStatus(waiting=-3.0, running=1e12, kv_usage=1.7, rtt_p50_s=1e9))
    assert (packed["waiting"], packed["running"], packed["kv_permille"]) == (0, 0xFFFFFFFE, 1000)
    assert packed["rtt_p50_us"] == 0xFFFFFFFE


def _hexes(n: int, size: int) -> list[str]:
    return [f"0x{b:02x}" for b in n.to_bytes(size, sys.byteorder)]


def _entry(key: int, *per_cpu: int) -> dict:
    return {"key": _hexes(key, 4), "values": [{"cpu": c, "value": _hexes(v, 8)} for c, v in enumerate(per_cpu)]}


def test_a_bpftool_dump_of_the_counters_sums_cpus_and_services_by_name():
    """edge_svc_counts: slot s holds SVC_COUNTERS counters from s * SVC_COUNTERS, verdicts then
    drops; the node's counts are every slot's."""
    n = abi.SVC_COUNTERS
    dump = [
        _entry(abi.CNT_REDIRECT, 5, 2**40),  # slot 0
        _entry(n + abi.CNT_REDIRECT, 1),  # slot 1
        _entry(2 * n + abi.CNT_PASS, 7),  # slot 2
        _entry(n + abi.CNT_MAX + abi.DROP_NO_BACKEND, 3),
        _entry(n + abi.CNT_DROP, 3),
    ]
    node = counts_from_dump(dump)
    assert node["verdicts"]["redirect"] == 6 + 2**40
    assert (node["verdicts"]["pass"], node["verdicts"]["drop"], node["drops"]["no_backend"]) == (7, 3, 3)
    assert set(node["drops"]) == set(abi.DROP_NAMES.values())
    one = slot_counts(values_from_dump(dump), 1)
    assert one["verdicts"]["redirect"] == 1 and one["drops"]["no_backend"] == 3
    assert sum(one["verdicts"].values()) == 4 and sum(one["drops"].values()) == 3


def test_return_nat_counts_the_replies_of_tc_and_of_xdp():
    """edge_reply counts a reply once, under return_xdp; tc's edge_return counts its own under
    return_nat (EDGE_CNT_RETURN_NAT). Readers show return_nat as every reverse-NATed reply:
    both, from a bpftool dump and from the maps."""
    dump = [_entry(abi.CNT_RETURN_NAT, 7, 1), _entry(abi.CNT_RETURN_XDP, 5, 2)]
    verdicts = counts_from_dump(dump)["verdicts"]
    assert (verdicts["return_nat"], verdicts["return_xdp"]) == (15, 7)

    from controlplane.tests.memtables import NCPU, MemMaps

    mem = MemMaps(1009, 2, 4)
    try:
        t = mem.tables[abi.MAP_SVC_COUNTS]
        for idx, per_cpu in ((abi.CNT_RETURN_NAT, (3, 4)), (abi.SVC_COUNTERS + abi.CNT_RETURN_XDP, (10, 20))):
            leaf = t.Leaf()
            for cpu in range(NCPU):
                leaf[cpu] = per_cpu[cpu]
            t[t.Key(idx)] = leaf
        verdicts = mem.maps().counters()["verdicts"]
        assert (verdicts["return_nat"], verdicts["return_xdp"]) == (37, 30)
    finally:
        mem.close()
