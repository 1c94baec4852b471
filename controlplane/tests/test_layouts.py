"""controlplane/maps/layouts.py, the map types read from bpf/include (what edged opens the pins
with, without bcc): every struct has the size abi.h asserts, nested structs keep their fields,
and every map of the data path has a layout whose kind and sizes name what maps.h declares.
(netns-tests/test_map_layouts.py compares them with bcc's types and the kernel's maps.)"""

from __future__ import annotations

import ctypes as ct
import re

from controlplane import abi
from controlplane.bpfsource import BPF_DIR
from controlplane.maps import layouts

ASSERT = re.compile(r"_Static_assert\(sizeof\(struct (\w+)\)\s*(\*\s*8\s*)?==\s*(\w+)")


def test_every_struct_has_the_size_abi_h_asserts():
    text = (BPF_DIR / "include" / "abi.h").read_text()
    found = layouts.structs()
    consts = layouts.defines()
    checked = 0
    for name, times8, expr in ASSERT.findall(text):
        want = consts[expr] if expr in consts else int(expr)
        got = ct.sizeof(found[name]) * (8 if times8 else 1)
        assert got == want, name
        checked += 1
    assert checked >= 20


def test_a_struct_inside_a_struct_keeps_its_fields():
    half_open, flow_info = layouts.structs()["half_open"], layouts.structs()["flow_info"]
    assert [name for name, _ in half_open._fields_] == ["ct", "ack_seq", "flags"]
    assert half_open.ct.size == ct.sizeof(flow_info) and half_open.ack_seq.offset == ct.sizeof(flow_info)


def test_every_map_has_a_layout_of_its_declared_kind():
    found = layouts.layouts()
    assert sorted(found) == sorted(abi.MAP_NAMES)
    assert found[abi.MAP_CT].kind == "lru_hash" and found[abi.MAP_WIRE].percpu and found[abi.MAP_NODE].array
    assert found[abi.MAP_SVC_COUNTS].value is ct.c_ulonglong
    sizes = {"EDGE_MAX_SERVICES": 16, "EDGE_MAGLEV_M": 4099}
    assert layouts.entries(found[abi.MAP_MAGLEV], sizes) == 16 * 4099
    assert layouts.entries(found[abi.MAP_SVC_COUNTS], sizes) == 17 * (abi.CNT_MAX + abi.DROP_MAX)
