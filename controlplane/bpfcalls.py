"""The bpf(2) calls the loader makes without bcc: BPF_PROG_TEST_RUN, the verifier's count of a
loaded program, a pinned map's size, and how much memory maps may still take (MemAvailable or
the memory cgroup's headroom). Imports no bcc; controlplane.loader re-exports every name."""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import LoaderError

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_TEST_RUN = 10
BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1


class _TestRunAttr(ctypes.Structure):
    # the BPF_PROG_TEST_RUN member of union bpf_attr (uapi/linux/bpf.h)
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32 * 5),
    ]


@dataclass(frozen=True)
class TestRun:
    retval: int
    duration_ns: int  # the kernel's mean per repetition
    data_out: bytes


def prog_test_run(
    prog_fd: int, data: bytes, repeat: int = 1, ctx: bytes | None = None, flags: int = 0, batch_size: int = 0
) -> TestRun:
    """Runs a loaded program on data through BPF_PROG_TEST_RUN."""
    data_in = ctypes.create_string_buffer(data, len(data))
    live = bool(flags & BPF_F_TEST_XDP_LIVE_FRAMES)
    data_out = ctypes.create_string_buffer(len(data) + 256)
    ctx_in = ctypes.create_string_buffer(ctx, len(ctx)) if ctx else None
    attr = _TestRunAttr(
        prog_fd=prog_fd,
        data_size_in=len(data),
        data_in=ctypes.addressof(data_in),
        data_size_out=0 if live else len(data_out),
        data_out=0 if live else ctypes.addressof(data_out),
        repeat=repeat,
        flags=flags,
        batch_size=batch_size,
        ctx_size_in=len(ctx) if ctx else 0,
        ctx_in=ctypes.addressof(ctx_in) if ctx_in else 0,
    )
    _sys_bpf(_BPF_PROG_TEST_RUN, ctypes.byref(attr), ctypes.sizeof(attr), "BPF_PROG_TEST_RUN")
    return TestRun(attr.retval, attr.duration, data_out.raw[: attr.data_size_out])


_BPF_OBJ_GET_INFO_BY_FD = 15
_PROG_INFO_SIZE = 232  # struct bpf_prog_info up to attach_btf_id (uapi/linux/bpf.h)
_PROG_INFO_VERIFIED_INSNS = 216  # offset of verified_insns (kernel 5.16+; 0 before)


def verified_insns(prog_fd: int) -> int:
    """Instructions the verifier processed to load the program (its budget is 1,000,000)."""
    info = ctypes.create_string_buffer(_PROG_INFO_SIZE)
    attr = ctypes.create_string_buffer(struct.pack("=IIQ", prog_fd, _PROG_INFO_SIZE, ctypes.addressof(info)))
    _sys_bpf(_BPF_OBJ_GET_INFO_BY_FD, attr, 16, "BPF_OBJ_GET_INFO_BY_FD")  # attr: the info member of bpf_attr
    return struct.unpack_from("=I", info.raw, _PROG_INFO_VERIFIED_INSNS)[0]


_BPF_OBJ_GET = 7
_MAP_INFO_SIZE = 24  # struct bpf_map_info up to map_flags: type, id, key_size, value_size, max_entries, flags


def pinned_max_entries(path: Path) -> int:
    """max_entries of the map pinned at path, as the kernel holds it."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    attr = ctypes.create_string_buffer(struct.pack("=QII", ctypes.addressof(name), 0, 0))
    fd = _sys_bpf(_BPF_OBJ_GET, attr, 16, f"BPF_OBJ_GET {path}")
    try:
        info = ctypes.create_string_buffer(_MAP_INFO_SIZE)
        attr = ctypes.create_string_buffer(struct.pack("=IIQ", fd, _MAP_INFO_SIZE, ctypes.addressof(info)))
        _sys_bpf(_BPF_OBJ_GET_INFO_BY_FD, attr, 16, f"BPF_OBJ_GET_INFO_BY_FD {path}")
        return struct.unpack_from("=I", info.raw, 16)[0]
    finally:
        os.close(fd)


def _sys_bpf(cmd: int, attr, size: int, what: str) -> int:
    """The bpf(2) system call; its non-negative result, or LoaderError naming what failed."""
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise LoaderError(f"{what}: unknown syscall number on {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.syscall(nr, cmd, attr, size)
    if done < 0:
        raise LoaderError(f"{what}: {os.strerror(ctypes.get_errno())}")
    return done


def mem_available() -> int | None:
    """Bytes this process may still take for maps: MemAvailable of /proc/meminfo, or less where
    its memory cgroup's limit leaves less (the kernel charges map memory to the cgroup of the
    process that creates the map). None where neither can be read."""
    found = [x for x in (_meminfo_available(), _cgroup_headroom()) if x is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    """limit - usage of this process's memory cgroup (v1 or v2); None when unlimited or unknown."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):  # v1
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return _headroom(base / "memory.limit_in_bytes", base / "memory.usage_in_bytes")
    for hierarchy, _, path in lines:
        if hierarchy == "0":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            return _headroom(base / "memory.max", base / "memory.current")
    return None


def _headroom(limit_file: Path, usage_file: Path) -> int | None:
    try:
        limit, usage = limit_file.read_text().strip(), usage_file.read_text().strip()
        if limit == "max" or int(limit) >= 1 << 62:
            return None
        return max(0, int(limit) - int(usage))
    except (OSError, ValueError):
        return None
