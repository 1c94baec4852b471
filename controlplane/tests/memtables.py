"""An in-memory model of the pinned maps for tests of maps.py without a kernel:
tables with the interface maps.py uses from bcc's (Key, Leaf, item get, set and
delete, keys, items, getvalue and sLeaf for per-CPU arrays, len = max_entries
for arrays), typed by controlplane/maps/layouts.py (abi.h and maps.h) so no layout is
written twice, and a memfd for the mmap'd Maglev array. Hash maps refuse a new key
when full, as the kernel does (E2BIG). `fail_at` makes the n-th write raise,
and `on_write` sees the maps after every write (for invariants). c_struct and Array give
the record tests one abi.h struct and a bare array map; compile_c builds a C harness over
bpf/include for this host, to call the data path's pure helpers through ctypes."""

from __future__ import annotations

import ctypes as ct
import errno
import mmap
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from controlplane import abi
from controlplane.config import ct6_size, half_open_size
from controlplane.maps import MAGLEV_STRIDE, Maps, layouts
from controlplane.maps.family6 import named_vip
from controlplane.maps.records import vip_filter_words

INCLUDE = Path(__file__).resolve().parents[2] / "bpf" / "include"
NCPU = 2


def _defines() -> dict[str, int]:
    return layouts.defines(INCLUDE)


def c_struct(name: str) -> type:
    """struct name of abi.h as ctypes, as bcc builds it from the same header."""
    return layouts.structs(INCLUDE)[name]


def compile_c(tmp_path_factory, source: str, stem: str) -> ct.CDLL:
    """source compiled as a shared library with bpf/include on the path; skips without a C
    compiler or the kernel UAPI headers."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not Path("/usr/include/linux/types.h").exists():
        pytest.skip("needs a C compiler and the kernel UAPI headers (linux-libc-dev)")
    out = tmp_path_factory.mktemp(stem)
    (out / f"{stem}.c").write_text(source)
    done = subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            f"-I{INCLUDE}",
            "-o",
            str(out / f"{stem}.so"),
            str(out / f"{stem}.c"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return ct.CDLL(str(out / f"{stem}.so"))


class Array:
    """A bcc array map's Python face, in memory: Key, Leaf, item get and set."""

    Key = ct.c_uint32

    def __init__(self, leaf: type, n: int) -> None:
        self.Leaf = leaf
        self.values = [leaf() for _ in range(n)]

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key):
        v = self.Leaf()
        ct.memmove(ct.addressof(v), ct.addressof(self.values[key.value]), ct.sizeof(v))
        return v

    def __setitem__(self, key, value) -> None:
        self.values[key.value] = value


class Faults:
    """Counts writes across all tables; raises at write number fail_at."""

    def __init__(self) -> None:
        self.writes = 0
        self.last = ""  # the table written last
        self.fail_at: int | None = None
        self.on_write = None

    def tick(self, name: str) -> None:
        self.writes += 1
        self.last = name
        if self.fail_at is not None and self.writes == self.fail_at:
            raise Exception(f"Could not update table: injected fault in {name}")


class Table:
    def __init__(self, name: str, kind: str, key: type, leaf: type, size: int, faults: Faults):
        self.name, self.kind, self.max_entries, self.faults = name, kind, size, faults
        self.Key = key
        self.array = "array" in kind
        self.percpu = kind.startswith("percpu")
        if self.percpu:
            self.sLeaf = leaf
            self.Leaf = (leaf if ct.sizeof(leaf) % 8 == 0 else ct.c_uint64) * NCPU
        else:
            self.Leaf = leaf
        self.data: dict[bytes, bytes] = {}

    def _k(self, key) -> bytes:
        if isinstance(key, int):
            key = self.Key(key)
        if self.array and not 0 <= key.value < self.max_entries:
            raise IndexError("Array index out of range")
        return bytes(key)

    def __len__(self) -> int:
        return self.max_entries if self.array else len(self.data)

    def __getitem__(self, key):
        k = self._k(key)
        if k in self.data:
            return self.Leaf.from_buffer_copy(self.data[k])
        if self.array:
            return self.Leaf()
        raise KeyError(key)

    getvalue = __getitem__

    def lookup_into(self, key, address: int) -> None:
        ct.memmove(address, bytes(self[key]), ct.sizeof(self.Leaf))

    def __setitem__(self, key, leaf) -> None:
        k = self._k(key)
        if not self.array and k not in self.data and len(self.data) >= self.max_entries:
            raise Exception(f"Could not update table: {os.strerror(errno.E2BIG)}")
        self.faults.tick(self.name)
        self.data[k] = bytes(leaf)
        if self.faults.on_write:
            self.faults.on_write()

    def __delitem__(self, key) -> None:
        k = self._k(key)
        if self.array:
            self.faults.tick(self.name)
            self.data.pop(k, None)
        else:
            if k not in self.data:
                raise KeyError(key)
            self.faults.tick(self.name)
            del self.data[k]
        if self.faults.on_write:
            self.faults.on_write()

    def keys(self):
        if self.array:
            return [self.Key(i) for i in range(self.max_entries)]
        return [self.Key.from_buffer_copy(k) for k in list(self.data)]

    def __iter__(self):
        return iter(self.keys())

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def dump(self) -> dict[bytes, bytes]:
        """Contents as bytes; arrays without their all-zero entries."""
        return {k: v for k, v in self.data.items() if not (self.array and not any(v))}


class MemMaps:
    """Every map of the data path in memory, and a Maps over them."""

    def __init__(self, maglev_m: int, max_services: int, max_backends: int, ct_size: int = 1024):
        sizes = {
            "EDGE_MAGLEV_M": maglev_m,
            "EDGE_MAX_SERVICES": max_services,
            "EDGE_MAX_BACKENDS": max_backends,
            "EDGE_CT_SIZE": ct_size,
            "EDGE_HALF_OPEN_SIZE": half_open_size(ct_size),
            "EDGE_CT6_SIZE": ct6_size(ct_size),
            **_defines(),
        }
        self.faults = Faults()
        self.tables: dict[str, Table] = {}
        for name, lay in layouts.layouts(INCLUDE).items():
            if name == abi.MAP_MAGLEV:
                continue  # the mmap'd memfd below
            n = layouts.entries(lay, sizes, INCLUDE)
            self.tables[name] = Table(name, lay.kind, lay.key, lay.value, n, self.faults)
        self.m, self.max_services = maglev_m, max_services
        size = max_services * 2 * maglev_m * MAGLEV_STRIDE
        self.maglev_fd = os.memfd_create("edge-maglev")
        os.ftruncate(self.maglev_fd, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._mm = mmap.mmap(self.maglev_fd, size)

    def maps(self) -> Maps:
        return Maps(self.tables, self.maglev_fd, self.m, self.max_services)

    def image(self) -> dict:
        """Everything in the maps, byte for byte, but edge_node's rnat_gen: it rises whenever
        edge_rnat changed, also back by a rollback (RnatCopies checks it)."""
        out = {**{n: t.dump() for n, t in self.tables.items()}, abi.MAP_MAGLEV: bytes(self._mm)}
        t = self.tables[abi.MAP_NODE]
        for k, v in out[abi.MAP_NODE].items():
            node = t.Leaf.from_buffer_copy(v)
            node.rnat_gen = 0
            out[abi.MAP_NODE][k] = bytes(node)
        return out

    def rnat_gen(self) -> int:
        return self.tables[abi.MAP_NODE][0].rnat_gen

    def close(self) -> None:
        self._mm.close()
        os.close(self.maglev_fd)


def _ids_to_names(mem: MemMaps):
    t = mem.tables
    svcs = {}
    for k, v in t[abi.MAP_SVC_META].data.items():
        meta = t[abi.MAP_SVC_META].Leaf.from_buffer_copy(v)
        if meta.in_use:
            svcs[int.from_bytes(k, "little")] = meta.name.decode()
    bes, health = {}, {}
    for k, v in t[abi.MAP_BACKENDS].data.items():
        b = t[abi.MAP_BACKENDS].Leaf.from_buffer_copy(v)
        if b.flags & abi.BE_F_VALID:
            bid = int.from_bytes(k, "little")
            name = t[abi.MAP_BE_META][bid].name.decode()
            bes[bid] = (svcs.get(b.vip_id, f"?{b.vip_id}"), name)
            health[b.health_id] = (b.addr, b.port)
    return svcs, bes, health


def active_tables(mem: MemMaps) -> dict[tuple, list]:
    """VIP key -> the backend ids of its active Maglev half."""
    words = memoryview(mem._mm).cast("I")  # 4 bytes a slot (maps/records.py, MAGLEV_STRIDE)
    out = {}
    for k, v in mem.tables[abi.MAP_VIPS].items():
        base = (v.id * 2 + v.table) * mem.m
        out[(k.addr, k.port, k.proto)] = (v.id, list(words[base : base + mem.m]))
    return out


def canonical(mem: MemMaps) -> dict:
    """What the data path and status see, with every id replaced by the name it stands for."""
    t = mem.tables
    svcs, bes, health = _ids_to_names(mem)
    name = lambda bid: bes.get(bid, ("?", f"?{bid}")) if bid != abi.NO_BACKEND else None  # noqa: E731
    out: dict = {"services": sorted(svcs.values())}
    vips = {}
    for key, (vid, table) in active_tables(mem).items():
        info = t[abi.MAP_VIPS][t[abi.MAP_VIPS].Key(*key)]
        vips[key] = (svcs.get(vid), info.flags, [name(b) for b in table])
    out["vips"] = vips
    cfgs = {}
    for vid, sname in svcs.items():
        c = t[abi.MAP_SVC_CFG][vid]
        backends = [name(c.backends[i]) for i in range(c.n_backends)]
        c.backends = (ct.c_uint32 * abi.MAX_PER_SERVICE)()
        cfgs[sname] = (bytes(c), backends)
    out["svc_cfg"] = cfgs
    backends = {}
    for bid, key in bes.items():
        b, m, p = t[abi.MAP_BACKENDS][bid], t[abi.MAP_BE_META][bid], t[abi.MAP_BE_PROBE][bid]
        backends[key] = (
            b.addr,
            b.port,
            b.flags,
            svcs.get(b.vip_id),
            health.get(b.health_id),
            m.name,
            m.weight,
            m.slots,
            p.config_weight,
        )
    out["backends"] = backends
    out["rnat"] = {
        bytes(k): (v.vip_addr, v.vip_port, name(v.backend_id), svcs.get(v.vip_id)) for k, v in t[abi.MAP_RNAT].items()
    }
    out["hb"] = {
        bytes(k): (v.token, v.timeout_ns, health.get(v.health_id), v.ifindex) for k, v in t[abi.MAP_HB].items()
    }
    out["hb_ports"] = sorted(bytes(k) for k in t[abi.MAP_HB_PORTS].keys())
    out["vip_addrs"] = {bytes(k): v.value for k, v in t[abi.MAP_VIP_ADDRS].items()}
    return out


def vip_keys(cfg) -> dict[tuple, str]:
    """VIP key -> the name of the service cfg puts there."""
    from controlplane.maps import PROTOS, be16, be32

    return {(be32(s.vip), be16(s.port), PROTOS[s.protocol]): s.name for s in cfg.services}


def half_states(mem: MemMaps, target: dict[tuple, str] | None = None) -> list[str]:
    """What a packet arriving now could trip over: a VIP whose address the fast test misses,
    a table or service list naming a backend that is not valid or not the VIP's, a backend
    that takes new flows without the reverse NAT entry its replies need, a service config
    naming a VIP key (service_cfg.vip_*) that is not its VIP entry, a VIP address the
    fast path's filter (edge_vip_filter) rules out. target: the VIPs
    of the config being applied; a VIP not in it, or the target's for another service, is
    going away from the service it names now (a moved VIP's replies are the new VIP's a
    moment before the move, and that is allowed)."""
    t = mem.tables
    svcs = _ids_to_names(mem)[0]
    bad = []
    addrs = {k.value for k in t[abi.MAP_VIP_ADDRS].keys()}
    vips = {(k.addr, k.port, k.proto): v.id for k, v in t[abi.MAP_VIPS].items()}
    words = list(t[abi.MAP_VIP_FILTER][0].bits)
    for key in vips:  # the fast path's filter must not rule a VIP address out (only costs a lookup)
        if any(w & ~have for w, have in zip(vip_filter_words([key[0]]), words)):
            bad.append(f"VIP {key}: its bit in {abi.MAP_VIP_FILTER} is clear")
    vips6 = {(0, tuple(k.addr.w), k.port, k.proto): v.id for k, v in t[abi.MAP_VIPS6].items()}
    for vid in range(mem.max_services):  # the fast paths forward conntrack hits to a VIP key named here
        c = t[abi.MAP_SVC_CFG][vid]
        named = named_vip(c)  # (IPv4 address, IPv6 words, port, protocol)
        key = named if any(named[1]) else (c.vip_addr, c.vip_port, c.vip_proto)
        owner6 = vips6.get(named)
        if any(named[1]) and owner6 != vid:
            owner = "gone" if owner6 is None else f"id {owner6}'s"
            bad.append(f"service id {vid} names IPv6 VIP {key} ({owner}): its conntrack hits skip the VIP lookup")
        elif not any(named[1]) and key != (0, 0, 0) and vips.get(key) != vid:
            owner = "gone" if key not in vips else f"id {vips[key]}'s"
            bad.append(f"service id {vid} names VIP {key} ({owner}): its conntrack hits skip the VIP lookup")
    rnat = {(k.addr, k.port, k.proto): v for k, v in t[abi.MAP_RNAT].items()}
    for key, (vid, table) in active_tables(mem).items():
        if key[0] not in addrs:
            bad.append(f"VIP {key} missing from {abi.MAP_VIP_ADDRS}")
        c = t[abi.MAP_SVC_CFG][vid]
        listed = {c.backends[i] for i in range(c.n_backends)}
        for bid in set(table) - {abi.NO_BACKEND} | listed:
            b = t[abi.MAP_BACKENDS][bid]
            if not b.flags & abi.BE_F_VALID or b.vip_id != vid:
                bad.append(f"VIP {key} (id {vid}) names backend {bid}, which is not valid for it")
                continue
            if b.flags & abi.BE_F_DRAINING and bid not in table:
                continue
            r = rnat.get((b.addr, b.port, key[2]))
            if target is not None and target.get(key) != svcs.get(vid):
                continue
            if r is None or r.backend_id != bid or (r.vip_addr, r.vip_port) != key[:2]:
                bad.append(f"VIP {key}: backend {bid} takes new flows, its replies are not reverse-NATed")
    return bad


class RnatCopies:
    """What edge_reply's per-CPU copies of edge_rnat and edge_rnat6 entries (bpf/edge_reply.c,
    rnat_cached; bpf/include/reply6.h, rnat6_cached) may hold: a copy is used while
    node_info.rnat_gen is the one it was made under. So a generation never comes back, and
    either table changes under one generation only until the writes of the reverse-NAT tables
    are done: the generation moves before any other map is written and before apply() returns
    or raises. after_write() (Faults.on_write) and settled() note what breaks that in `bad`."""

    TABLES = (abi.MAP_RNAT, abi.MAP_RNAT6)

    def __init__(self, mem: MemMaps):
        self.mem = mem
        self.gen = mem.rnat_gen()
        self.rnat = self._dump()  # as under self.gen
        self.seen = {self.gen}
        self.bad: list[str] = []

    def _dump(self) -> list:
        return [self.mem.tables[name].dump() for name in self.TABLES]

    def after_write(self) -> None:
        gen, rnat = self.mem.rnat_gen(), self._dump()
        if gen != self.gen:
            if gen in self.seen:
                self.bad.append(f"rnat_gen {gen} came back")
            self.seen.add(gen)
            self.gen, self.rnat = gen, rnat
        elif rnat != self.rnat and self.mem.faults.last not in self.TABLES:
            self.bad.append(
                f"{self.mem.faults.last} written while edge_rnat/edge_rnat6 differ from their copies "
                f"under rnat_gen {gen}"
            )

    def settled(self) -> list[str]:
        """bad, and whether edge_rnat and edge_rnat6 are what copies under the current generation hold."""
        if self._dump() != self.rnat:
            return [*self.bad, f"edge_rnat/edge_rnat6 changed under rnat_gen {self.gen}, which is still current"]
        return list(self.bad)
