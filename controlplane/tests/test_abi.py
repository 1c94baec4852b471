"""abi.py against bpf/include/abi.h and maps.h: every number and map name
that crosses the C/Python boundary is written once in C and checked here."""

import re
from pathlib import Path

from controlplane import abi

BPF = Path(__file__).resolve().parents[2] / "bpf"
DEFINE = re.compile(r"^#define\s+EDGE_(\w+)\s+(0x[0-9a-fA-F]+|\d+)\b", re.M)
PINNED = re.compile(r"BPF_TABLE_PINNED\(\s*\"\w+\",[^,]+,[^,]+,\s*(\w+)\s*,", re.M)
ENTRY = re.compile(r"^int\s+(\w+)\s*\(struct (?:xdp_md|__sk_buff) \*", re.M)


def test_every_abi_constant_matches_the_header():
    header = {name: int(value, 0) for name, value in DEFINE.findall((BPF / "include" / "abi.h").read_text())}
    assert header, "no constants found in abi.h"
    assert {name: getattr(abi, name, None) for name in header} == header


def test_map_names_match_maps_h_and_fit_the_kernel_limit():
    declared = PINNED.findall((BPF / "include" / "maps.h").read_text())
    assert sorted(declared) == sorted(abi.MAP_NAMES)
    # the kernel keeps BPF_OBJ_NAME_LEN - 1 = 15 characters of a map name
    assert all(len(name) <= 15 and name.startswith("edge_") for name in declared)


def test_counter_and_drop_names_cover_every_index():
    assert sorted(abi.CNT_NAMES) == list(range(abi.CNT_MAX))
    assert sorted(abi.DROP_NAMES) == list(range(1, abi.DROP_MAX))


def test_entry_points_exist_in_the_c_sources():
    entries = ENTRY.findall("".join((BPF / name).read_text() for name in ("edge_xdp.c", "edge_tc.c", "edge_reply.c")))
    assert sorted(entries) == sorted(
        [
            abi.PROG_INGRESS,
            abi.PROG_INGRESS_SLOW,
            abi.PROG_INGRESS_SCAN,
            abi.PROG_INGRESS6,
            abi.PROG_INGRESS6_SCAN,
            abi.PROG_INGRESS6_DSR,
            abi.PROG_INGRESS6_STATELESS,
            abi.PROG_RETURN,
            abi.PROG_REPLY,
        ]
    )


def test_heartbeat_wire_format_has_the_size_the_header_asserts():
    assert abi.HEARTBEAT.size == abi.HEARTBEAT_SIZE
    hb = abi.heartbeat(8000, 7, 0x5EED0001, 1_700_000_000)
    assert len(hb) == abi.HEARTBEAT_SIZE
    assert hb[:4] == b"EDGE"
