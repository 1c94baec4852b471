"""maps' edge_vip_filter bits against the data path's: hash_mix as bpf/include/flow.h has it,
compiled for this host and called through ctypes, and the bit index edge_xdp.c's maybe_vip
takes. A filter that disagrees breaks nothing (a VIP address ruled out is looked up after
the VIP), but its established flows would pay a third lookup. Unprivileged; needs a C
compiler and the kernel's UAPI headers (linux/types.h)."""

from __future__ import annotations

import ctypes
import re
from ipaddress import IPv4Address

import pytest
from hypothesis import given, strategies as st

from controlplane import abi
from controlplane.maps.records import be32, hash_mix, vip_filter_words
from controlplane.tests.memtables import INCLUDE, compile_c


@pytest.fixture(scope="module")
def c_hash_mix(tmp_path_factory):
    body = re.search(
        r"static __always_inline __u32 hash_mix\(__u32 h\)\n\{.*?\n\}", (INCLUDE / "flow.h").read_text(), re.S
    )
    assert body, "hash_mix not found in flow.h"
    lib = compile_c(
        tmp_path_factory,
        "#include <linux/types.h>\n#ifndef __always_inline\n#define __always_inline inline\n#endif\n"
        + body.group(0)
        + "\n__u32 mix(__u32 h) { return hash_mix(h); }\n",
        "vipfilter",
    )
    lib.mix.argtypes, lib.mix.restype = [ctypes.c_uint32], ctypes.c_uint32
    return lib.mix


@given(st.integers(0, 0xFFFFFFFF))
def test_hash_mix_is_flow_h_s(c_hash_mix, h):
    assert hash_mix(h) == c_hash_mix(h)


def test_a_vip_address_sets_the_bit_maybe_vip_tests(c_hash_mix):
    addr = be32(IPv4Address("198.18.255.1"))
    bit = c_hash_mix(addr) & (abi.VIP_FILTER_BITS - 1)  # edge_xdp.c, maybe_vip
    words = vip_filter_words([addr])
    assert (words[bit // 64] >> (bit % 64)) & 1
    assert sum(bin(w).count("1") for w in words) == 1
    assert abi.VIP_FILTER_BITS == 64 * abi.VIP_FILTER_WORDS
