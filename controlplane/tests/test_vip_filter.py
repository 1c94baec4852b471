"""maps' edge_vip_filter bits against the data path's: hash_mix as bpf/include/flow.h has it,
compiled for this host and called through ctypes, and the bit index edge_xdp.c's maybe_vip
takes. A filter that disagrees breaks nothing (a VIP address ruled out is looked up after
the VIP), but its established flows would pay a third lookup. Unprivileged; needs a C
compiler and the kernel's UAPI headers (linux/types.h)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from controlplane import abi
from controlplane.maps.records import be32, hash_mix, vip_filter_words

INCLUDE = Path(__file__).resolve().parents[2] / "bpf" / "include"


@pytest.fixture(scope="module")
def c_hash_mix(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not Path("/usr/include/linux/types.h").exists():
        pytest.skip("needs a C compiler and the kernel UAPI headers (linux-libc-dev)")
    body = re.search(r"static __always_inline __u32 hash_mix\(__u32 h\)\n\{.*?\n\}",
                     (INCLUDE / "flow.h").read_text(), re.S)
    assert body, "hash_mix not found in flow.h"
    out = tmp_path_factory.mktemp("vipfilter")
    (out / "h.c").write_text("#include <linux/types.h>\n#ifndef __always_inline\n#define __always_inline inline\n#endif\n"
                             + body.group(0) + "\n__u32 mix(__u32 h) { return hash_mix(h); }\n")
    done = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out / "h.so"),
                           str(out / "h.c")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(out / "h.so"))
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
