"""A kernel BPF map by file descriptor, through bpf(2) alone (no bcc, no LLVM in the process):
open and pin by path, lookup, update, delete, walk, and its kernel-held sizes. Map gives the
face controlplane/maps/ uses (Key, Leaf, sLeaf for per-CPU maps, item get/set/delete, keys,
items, getvalue, lookup_into), with bcc's meaning of each, and failures as MapError naming
the map and key (a lookup miss stays KeyError). It knows no layout: the caller gives the key
and value types (controlplane/maps/layouts.py reads them from abi.h)."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from controlplane.bpfcalls import _sys_bpf
from controlplane.errors import LoaderError, MapError

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_LOOKUP, _UPDATE, _DELETE, _NEXT_KEY, _OBJ_PIN, _OBJ_GET, _GET_INFO = 1, 2, 3, 4, 6, 7, 15
_PROG_GET_FD_BY_ID = 13
_LOOKUP_BATCH = 24
_UPDATE_BATCH = 26


class _ElemAttr(ctypes.Structure):
    # the BPF_MAP_*_ELEM member of union bpf_attr: map_fd, key, value or next_key, flags
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _ObjAttr(ctypes.Structure):
    # the BPF_OBJ_* member: pathname, bpf_fd, file_flags
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32), ("file_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    # the info member: bpf_fd, info_len, info
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class MapInfo(ctypes.Structure):
    # struct bpf_map_info up to map_flags
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
    ]


@functools.lru_cache(maxsize=1)
def _syscall():
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise LoaderError(f"bpf(2): unknown syscall number on {os.uname().machine}")
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return functools.partial(fn, ctypes.c_long(nr))


class _BatchAttr(ctypes.Structure):
    # the BPF_MAP_*_BATCH member of union bpf_attr
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    """bpf(2); its result, or -errno."""
    done = _syscall()(ctypes.c_long(cmd), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    return done if done >= 0 else -(ctypes.get_errno() or errno.EIO)


def obj_get(path: Path) -> int:
    """A new fd of the object pinned at path (BPF_OBJ_GET); LoaderError naming path."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    attr = _ObjAttr(pathname=ctypes.addressof(name))
    return _sys_bpf(_OBJ_GET, ctypes.byref(attr), ctypes.sizeof(attr), f"open the pin {path}")


def obj_pin(fd: int, path: Path) -> None:
    """Pins the object of fd at path (BPF_OBJ_PIN); LoaderError naming path."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    attr = _ObjAttr(pathname=ctypes.addressof(name), bpf_fd=fd)
    _sys_bpf(_OBJ_PIN, ctypes.byref(attr), ctypes.sizeof(attr), f"pin at {path}")


def map_info(fd: int, what: str) -> MapInfo:
    """The kernel's type, sizes and flags of the map of fd."""
    info = MapInfo()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _sys_bpf(_GET_INFO, ctypes.byref(attr), ctypes.sizeof(attr), f"BPF_OBJ_GET_INFO_BY_FD {what}")
    return info


def prog_fd_by_id(prog_id: int) -> int:
    """A new fd of the loaded program prog_id."""
    attr = (ctypes.c_uint32 * 4)(prog_id, 0, 0, 0)  # prog_id, next_id, open_flags
    return _sys_bpf(_PROG_GET_FD_BY_ID, ctypes.byref(attr), ctypes.sizeof(attr), f"BPF_PROG_GET_FD_BY_ID {prog_id}")


@functools.lru_cache(maxsize=1)
def possible_cpus() -> int:
    """CPUs the kernel may bring up: per-CPU maps hold a value for each
    (/sys/devices/system/cpu/possible, e.g. "0-3" or "0,2-5")."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


@dataclass(frozen=True)
class Prog:
    """A loaded program held by fd (what attach_xdp and attach_tc take): name and fd."""

    name: str
    fd: int


def key_text(key) -> str:
    """A map key for an error line: the number of an array index, else its bytes in hex."""
    value = getattr(key, "value", None)
    if isinstance(value, int):
        return str(value)
    try:
        return bytes(key).hex()
    except TypeError:
        return repr(key)


class Map:
    """One kernel map by fd, with the face of bcc's table for its kind (see the module
    docstring). Does not own fd: whoever opened it closes it."""

    def __init__(self, name: str, fd: int, key: type, value: type, kind: str, max_entries: int) -> None:
        self.name, self.map_fd, self.kind, self.max_entries = name, fd, kind, max_entries
        self.array = "array" in kind or kind == "prog"
        self.Key = key
        if kind.startswith("percpu"):
            self.sLeaf = value
            self.Leaf = (value if ctypes.sizeof(value) % 8 == 0 else ctypes.c_uint64) * possible_cpus()
        else:
            self.Leaf = value

    def __len__(self) -> int:
        if self.array:
            return self.max_entries
        return sum(1 for _ in self.keys())

    def _fail(self, op: str, key, err: int) -> MapError:
        where = "" if key is None else f" {key_text(key)}"
        return MapError(f"{self.name}: {op}{where}: {os.strerror(err)}", map=self.name)

    def _key(self, key, op: str):
        if isinstance(key, int):
            key = self.Key(key)
        if self.array and not 0 <= key.value < self.max_entries:
            raise MapError(f"{self.name}: {op} {key.value}: Array index out of range", map=self.name)
        return key

    def lookup_into(self, key, address: int) -> None:
        """Copies key's value (every CPU's, for a per-CPU map) to memory at address
        (sizeof(Leaf) bytes). KeyError when absent."""
        key = self._key(key, "lookup")
        attr = _ElemAttr(map_fd=self.map_fd, key=ctypes.addressof(key), value=address)
        rc = _bpf(_LOOKUP, attr)
        if rc < 0:
            if rc == -errno.ENOENT:
                raise KeyError(key)
            raise self._fail("lookup", key, -rc)

    def __getitem__(self, key):
        leaf = self.Leaf()
        self.lookup_into(key, ctypes.addressof(leaf))
        return leaf

    getvalue = __getitem__  # a per-CPU map's value is every CPU's, as bcc's getvalue gives it

    def __setitem__(self, key, value) -> None:
        key = self._key(key, "update")
        if isinstance(value, int):
            value = self.Leaf(value)
        attr = _ElemAttr(map_fd=self.map_fd, key=ctypes.addressof(key), value=ctypes.addressof(value))
        rc = _bpf(_UPDATE, attr)
        if rc < 0:
            raise self._fail("update", key, -rc)

    def __delitem__(self, key) -> None:
        """Deletes key; an array's entry is set to zero instead (as bcc does)."""
        if self.array:
            self[key] = self.Leaf()
            return
        key = self._key(key, "delete")
        rc = _bpf(_DELETE, _ElemAttr(map_fd=self.map_fd, key=ctypes.addressof(key)))
        if rc < 0:
            if rc == -errno.ENOENT:
                raise KeyError(key)
            raise self._fail("delete", key, -rc)

    def keys(self):
        """Every key: an array's indexes, a hash map's keys as the kernel walks them."""
        if self.array:
            yield from (self.Key(i) for i in range(self.max_entries))
            return
        key = None
        while True:
            nxt = self.Key()
            attr = _ElemAttr(
                map_fd=self.map_fd, key=0 if key is None else ctypes.addressof(key), value=ctypes.addressof(nxt)
            )
            rc = _bpf(_NEXT_KEY, attr)
            if rc == -errno.ENOENT:
                return
            if rc < 0:
                raise self._fail("walk", None, -rc)
            yield nxt
            key = nxt

    def __iter__(self):
        return self.keys()

    def value_chunks(self, chunk: int = 4096):
        """A hash map's values, chunk entries at a time, as (raw bytes, count) (BPF_MAP_LOOKUP_BATCH:
        one call per chunk instead of two per entry). The kernel walks its buckets meanwhile, so
        an entry changed during the walk may be seen or not, as with keys()."""
        ksz, vsz = ctypes.sizeof(self.Key), ctypes.sizeof(self.Leaf)
        keys, values = ctypes.create_string_buffer(ksz * chunk), ctypes.create_string_buffer(vsz * chunk)
        token_in, token_out = ctypes.c_uint64(0), ctypes.c_uint64(0)  # a hash map's token is its u32 bucket
        first = True
        while True:
            attr = _BatchAttr(
                in_batch=0 if first else ctypes.addressof(token_in),
                out_batch=ctypes.addressof(token_out),
                keys=ctypes.addressof(keys),
                values=ctypes.addressof(values),
                count=chunk,
                map_fd=self.map_fd,
            )
            rc = _bpf(_LOOKUP_BATCH, attr)
            if rc < 0 and rc != -errno.ENOENT:
                raise self._fail("batch walk", None, -rc)
            if attr.count:
                yield values.raw[: attr.count * vsz], attr.count
            if rc == -errno.ENOENT:
                return
            token_in.value, first = token_out.value, False

    def rows(self, chunk: int = 4096, start: int = 0, count: int | None = None):
        """An array's values from index start (count of them; default: to the end), as a ctypes
        array of Leaf (BPF_MAP_LOOKUP_BATCH: one call per chunk entries instead of one per entry).
        Entries changed meanwhile may be seen before or after, as with a walk of lookups."""
        n = self.max_entries - start if count is None else count
        if not self.array or start < 0 or n < 0 or start + n > self.max_entries:
            raise self._fail(f"batch read {start}+{n}", None, errno.EINVAL)
        vsz = ctypes.sizeof(self.Leaf)
        out = (self.Leaf * n)()
        keys = (ctypes.c_uint32 * min(chunk, max(n, 1)))()
        token_in, token_out = ctypes.c_uint64(start - 1), ctypes.c_uint64(0)  # an array's token: the last index read
        done = 0
        while done < n:
            attr = _BatchAttr(
                in_batch=0 if start + done == 0 else ctypes.addressof(token_in),
                out_batch=ctypes.addressof(token_out),
                keys=ctypes.addressof(keys),
                values=ctypes.addressof(out) + done * vsz,
                count=min(len(keys), n - done),
                map_fd=self.map_fd,
            )
            rc = _bpf(_LOOKUP_BATCH, attr)
            if rc < 0 and rc != -errno.ENOENT:
                raise self._fail("batch read", None, -rc)
            got = attr.count
            if got and (keys[0] != start + done or keys[got - 1] != start + done + got - 1):  # in order
                raise self._fail("batch read", None, errno.EIO)
            done += got
            if rc == -errno.ENOENT or not got:
                break
            token_in.value = token_out.value
        if done != n:
            raise self._fail(f"batch read ({done} of {n})", None, errno.EIO)
        return out

    def update_rows(self, indexes, values) -> None:
        """An array's entries indexes set to values (a ctypes array of Leaf, one each) in one call
        (BPF_MAP_UPDATE_BATCH) instead of one a value."""
        n = len(indexes)
        if not n:
            return
        if not self.array or len(values) != n:
            raise self._fail("batch update", None, errno.EINVAL)
        keys = (ctypes.c_uint32 * n)(*indexes)
        attr = _BatchAttr(keys=ctypes.addressof(keys), values=ctypes.addressof(values), count=n, map_fd=self.map_fd)
        rc = _bpf(_UPDATE_BATCH, attr)
        if rc < 0 or attr.count != n:
            where = keys[attr.count] if attr.count < n else None
            raise self._fail("batch update", None if where is None else self.Key(where), -rc if rc < 0 else errno.EIO)

    def items(self):
        """(key, value) of every entry; one deleted during the walk is left out."""
        for k in self.keys():
            try:
                yield k, self[k]
            except KeyError:
                continue

    def clear(self) -> None:
        for k in list(self.keys()):
            try:
                del self[k]
            except KeyError:
                continue
