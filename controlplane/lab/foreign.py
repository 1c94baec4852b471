"""A foreign XDP program on a router interface, for tests of what the router does next to one:
loaded without a compiler (BPF_PROG_LOAD of "r0 = XDP_PASS; exit"), attached in native mode,
detached and closed on exit."""

from __future__ import annotations

import ctypes
import os
import struct
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from controlplane.lab.router import Router

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_XDP = 6
_XDP_FLAGS_DRV_MODE = 1 << 2
_XDP_PASS_PROG = bytes.fromhex("b7000000020000009500000000000000")  # mov64 r0, 2; exit


@contextmanager
def foreign_xdp(router: "Router", ifname: str, name: bytes = b"foreign") -> Iterator[int]:
    """Attach a trivial XDP program (native mode) to ifname in the router namespace; detach it on exit."""
    nr = _SYS_BPF[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    insns = ctypes.create_string_buffer(_XDP_PASS_PROG, len(_XDP_PASS_PROG))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)  # union bpf_attr, the BPF_PROG_LOAD member
    struct.pack_into(
        "=IIQQ",
        attr,
        0,
        _BPF_PROG_TYPE_XDP,
        len(_XDP_PASS_PROG) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
    )
    struct.pack_into("16s", attr, 48, name)  # prog_name
    fd = libc.syscall(nr, _BPF_PROG_LOAD, attr, ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_LOAD: {os.strerror(err)}")
    try:
        with router.net.router.iproute() as ipr:
            index = ipr.link_lookup(ifname=ifname)[0]
            ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", _XDP_FLAGS_DRV_MODE)]})
        try:
            yield router.iface_state(ifname).xdp_prog_id
        finally:
            with router.net.router.iproute() as ipr:
                ipr.link(
                    "set", index=index, xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", _XDP_FLAGS_DRV_MODE)]}
                )
    finally:
        os.close(fd)
