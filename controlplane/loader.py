"""The only module that imports bcc: compile bpf/, load, attach XDP and tc,
pin, and re-open pinned maps. It decides nothing: callers say what to attach
where, and every step that changes the node pushes its undo onto an Undo, so
a failed deploy can leave the node as it was. bcc raises bare Exception; it
is caught here only and turned into LoaderError with the step's context."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from controlplane import abi
from controlplane.bpfcalls import (  # noqa: F401  (re-exported: tests and tools use loader's names)
    _BPF_OBJ_GET_INFO_BY_FD,
    BPF_F_TEST_XDP_LIVE_FRAMES,
    TestRun,
    _sys_bpf,
    mem_available,
    pinned_max_entries,
    prog_test_run,
    verified_insns,
)
from controlplane.bpfmap import Prog, key_text, obj_pin, prog_fd_by_id
from controlplane.bpfsource import BPF_DIR, SOURCES, _amalgamate, source_text  # noqa: F401  (re-exported)
from controlplane.config import Node, ct6_size, half_open_size
from controlplane.errors import CompileError, LoaderError, MapError, NoBpffs

# Interfaces, routes, tc and sysctl are pyroute2's, in netlink.py; deploy and
# the data-path watch reach them through this module, the one that attaches.
from controlplane.netlink import (  # noqa: F401  (re-exported)
    TC_HANDLE,
    TC_INGRESS_PARENT,
    TC_PRIO,
    XdpState,
    attach_tc,
    detach_tc,
    has_clsact,
    ifindex,
    ifindexes,
    ifname,
    ip_forward,
    ipv6_forwarding,
    prog_name,
    return_filter,
    route_oif,
    route_oifs,
    set_ip_forward,
    set_xdp,
    xdp_state,
)
from controlplane.pinned import Pinned, open_pins
from controlplane.undo import Undo  # noqa: F401  (re-exported: deploy.py names loader.Undo)

# Every program of the data path and its kind (abi.py names them).
PROGRAMS = {
    abi.PROG_INGRESS: "xdp",
    abi.PROG_RETURN: "tc",
    abi.PROG_REPLY: "xdp",
    abi.PROG_INGRESS_SLOW: "xdp",
    abi.PROG_INGRESS_SCAN: "xdp",
    abi.PROG_INGRESS6: "xdp",
    abi.PROG_INGRESS6_SCAN: "xdp",
    abi.PROG_INGRESS6_DSR: "xdp",
    abi.PROG_INGRESS6_STATELESS: "xdp",
}
# Tail-call targets: edge_tails slot -> program, installed whenever an XDP program is loaded.
TAILS = {
    abi.TAIL_SLOW: abi.PROG_INGRESS_SLOW,
    abi.TAIL_SCAN: abi.PROG_INGRESS_SCAN,
    abi.TAIL_SCAN_MORE: abi.PROG_INGRESS_SCAN,
    abi.TAIL_V6: abi.PROG_INGRESS6,
    abi.TAIL_V6_SCAN: abi.PROG_INGRESS6_SCAN,
    abi.TAIL_V6_DSR: abi.PROG_INGRESS6_DSR,
    abi.TAIL_V6_STATELESS: abi.PROG_INGRESS6_STATELESS,
}
TAILS_V6 = frozenset(
    {abi.TAIL_V6, abi.TAIL_V6_SCAN, abi.TAIL_V6_DSR, abi.TAIL_V6_STATELESS}
)  # loaded only for a config with an IPv6 service

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
XDP_MODES = {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE}


_NODE = Node()  # the defaults are declared once, in config.Node


@dataclass(frozen=True)
class Params:
    """Sizes compiled into the data path (they also size the pinned maps); defaults: config.Node's."""

    maglev_m: int = _NODE.maglev_m
    max_services: int = _NODE.max_services
    max_backends: int = _NODE.max_backends
    ct_size: int = _NODE.ct_size

    @property
    def half_open_size(self) -> int:
        """Entries of edge_half_open (TCP connections between SYN and the client's ACK): a quarter
        of conntrack's, at least 1024."""
        return half_open_size(self.ct_size)

    @property
    def ct6_size(self) -> int:
        """Entries of edge_ct6 (IPv6 connections): a quarter of conntrack's, at least 1024."""
        return ct6_size(self.ct_size)

    @classmethod
    def of(cls, node: Node) -> "Params":
        return cls(node.maglev_m, node.max_services, node.max_backends, node.ct_size)


# ---------------------------------------------------------------- bpffs, pins


def _mount_fstype(path: Path) -> tuple[str, str]:
    """(mount point, fs type) of the mount holding path, for this process."""
    best = ("/", "?")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mnt = fields[4].replace("\\040", " ")
        fstype = fields[fields.index("-") + 1]
        inside = str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[0]):
            best = (mnt, fstype)
    return best


def check_bpffs(pin_dir: str) -> None:
    """Raises LoaderError unless pin_dir lies on a bpffs this process sees."""
    mnt, fstype = _mount_fstype(Path(pin_dir).resolve())
    if fstype != "bpf":
        raise NoBpffs(
            f"{pin_dir} is not on a bpffs here ({mnt} is {fstype}); under 'ip netns exec', "
            f"which remounts /sys, use 'nsenter --net=/run/netns/NAME' instead, "
            f"or mount one: mount -t bpf bpf /sys/fs/bpf"
        )


def check_pin_dir(pin_dir: str, pin_path: Path) -> None:
    """Raises LoaderError unless every directory from pin_dir down to pin_path that exists
    is one only root (or we) can change: owned by root or this user, writable by no group
    or other users, and no symlink. Maps pinned where another user can write could be
    unpinned and replaced under the router. Directories above pin_dir may be shared if
    sticky (bpffs is often mounted 1777, like /tmp)."""
    base = Path(pin_dir)
    rel = pin_path.relative_to(base).parts
    chain = [base, *(base.joinpath(*rel[: i + 1]) for i in range(len(rel)))]
    for d in [*reversed(base.parents), *chain]:
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return  # deploy makes it, and everything below it, itself
        where = f"node.pin_dir: {d}"
        if stat.S_ISLNK(st.st_mode) and d in chain:
            raise LoaderError(f"{where} is a symbolic link; pins go in a real directory")
        if st.st_uid not in (0, os.geteuid()):
            raise LoaderError(f"{where} is owned by uid {st.st_uid}, not root; remove it or chown it to root")
        loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if loose and (d in chain or not st.st_mode & stat.S_ISVTX):
            who = "others" if st.st_mode & stat.S_IWOTH else "its group"
            raise LoaderError(f"{where} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); chmod go-w it")


def netns_id() -> int:
    """Inode of this process's network namespace: unique per namespace."""
    return os.stat("/proc/self/ns/net").st_ino


def instance_name(iface: str) -> str:
    """Default instance name: unique per interface and network namespace."""
    return f"{iface}-{netns_id()}"


def instance_dir(pin_dir: str, instance: str) -> Path:
    return Path(pin_dir) / f"v{abi.ABI_VERSION}" / instance


def instances_here(pin_dir: str) -> list[str]:
    """Instances pinned for the current network namespace."""
    base = Path(pin_dir) / f"v{abi.ABI_VERSION}"
    suffix = f"-{netns_id()}"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.name.endswith(suffix))


def other_abi_pins(pin_dir: str, instance: str) -> list[Path]:
    """Pin directories of this instance made by a build with another ABI version."""
    base = Path(pin_dir)
    if not base.is_dir():
        return []
    return sorted(p / instance for p in base.glob("v*") if p.name != f"v{abi.ABI_VERSION}" and (p / instance).is_dir())


def other_abi_here(pin_dir: str) -> list[Path]:
    """Instances of this network namespace pinned by a build with another ABI version."""
    base, suffix = Path(pin_dir), f"-{netns_id()}"
    if not base.is_dir():
        return []
    return sorted(
        p
        for v in base.glob("v*")
        if v.name != f"v{abi.ABI_VERSION}" and v.is_dir()
        for p in v.iterdir()
        if p.name.endswith(suffix)
    )


def pin_maps(loaded: "Loaded | Pinned", pin_path: Path) -> None:
    """Pins every map of a data path at pin_path again (after its bpffs was unmounted and
    mounted again): the same maps, so nothing they hold is lost. bpf(2) only, no bcc."""
    for d in reversed([pin_path, *pin_path.parents]):
        if not d.exists():
            d.mkdir()
    for name in abi.MAP_NAMES:
        path = pin_path / name
        if not path.exists():
            obj_pin(loaded.map_fd(name), path)


def remove_pins(path: Path) -> None:
    """Unpins every map of an instance and removes its directory."""
    if not path.exists():
        return
    for entry in path.iterdir():
        entry.unlink()
    path.rmdir()


# ---------------------------------------------------------------- compile


@contextlib.contextmanager
def _captured_stderr(fds: tuple[int, ...] = (2,)) -> Iterator[Callable[[], str]]:
    """Routes fd 2 (where clang and libbpf write; and fd 1 if asked, where bcc says it found
    no kernel headers) to a buffer while inside."""
    saved = [os.dup(fd) for fd in fds]
    with tempfile.TemporaryFile(mode="w+b") as buf:
        for fd in fds:
            os.dup2(buf.fileno(), fd)

        def text() -> str:
            buf.seek(0)
            return buf.read().decode(errors="replace")

        try:
            yield text
        finally:
            for fd, old in zip(fds, saved):
                os.dup2(old, fd)
                os.close(old)


def _first_error(log: str) -> str:
    if "Argument list too long" in log:  # bcc words E2BIG as a size problem; it is the verifier's budget
        return "the verifier gave up: program too complex (E2BIG); simplify the last change to bpf/"
    for line in log.splitlines():
        if "error:" in line or "invalid" in line.lower() or "outside" in line:
            return line.strip()
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[-1] if lines else "no details"


_NO_HEADERS = (
    "Unable to find kernel headers",
    "chdir(",
    "linux/kconfig.h' file not found",
    "asm/types.h' file not found",
)


def _compile_failure(log: str, e: Exception) -> str:
    """One line for a compile that failed: missing kernel headers said as such."""
    release = os.uname().release
    first = _first_error(log) if log.strip() else str(e)
    if any(sign in log or sign in str(e) for sign in _NO_HEADERS):
        detail = next((ln.strip() for ln in log.splitlines() if "chdir(" in ln or "file not found" in ln), first)
        return (
            f"cannot compile the data path for kernel {release}: its kernel headers are missing "
            f"({detail}); install them (tools/bootstrap links Debian's) and start edged again"
        )
    return f"cannot compile the data path for kernel {release}: {first}"


class Loaded:
    """A compiled data path whose maps are open (created or re-used pins)."""

    def __init__(self, bpf, pin_path: Path, params: Params):
        self._bpf = bpf
        self.pin_path = pin_path
        self.params = params
        self.compile_log = ""
        # Tail slots left empty: the IPv6 programs (TAILS_V6) when the config has no IPv6 service;
        # their verification costs about 1.3 s a deploy, and the ingress passes IPv6 then.
        self.skip_tails: frozenset[int] = frozenset()

    def tables(self) -> Mapping[str, "Table"]:
        return {name: Table(name, self._bpf[name]) for name in abi.MAP_NAMES}

    def table(self, name: str) -> "Table":
        """Any map of the compiled source by name (a benchmark's own, say)."""
        return Table(name, self._bpf[name])

    def map_fd(self, name: str) -> int:
        return self._bpf[name].map_fd

    def load(self, func: str, kind: str):
        """Loads one program; an ingress (an XDP program other than a tail or the reply) with
        the tail programs it calls (load_all)."""
        return self.load_all([(func, kind)])[0]

    def load_all(self, progs: Sequence[tuple[str, str]]) -> list:
        """Loads progs ((function, "xdp" | "tc")) and, when an ingress is among them, the tail
        programs it calls, verified two at a time (_load_many); puts the tails in edge_tails.
        Returns progs' programs in order."""
        ingress = any(k == "xdp" and f not in TAILS.values() and f != abi.PROG_REPLY for f, k in progs)
        slots = {slot: f for slot, f in TAILS.items() if slot not in self.skip_tails} if ingress else {}
        fns = _load_many(self._bpf, [*progs, *((f, "xdp") for f in slots.values())])
        if ingress:
            self._install_tails({slot: fns[f] for slot, f in slots.items()})
        return [fns[f] for f, _ in progs]

    def _install_tails(self, fns: Mapping[int, object]) -> None:
        """Puts the loaded tail programs in edge_tails (pinned: the kernel keeps them there after
        this process exits; a deploy again replaces them with its own); empties skip_tails'."""
        table = self.tables()[abi.MAP_TAILS]
        for slot, func in TAILS.items():
            if slot in self.skip_tails:  # and no program of an earlier deploy stays there
                with contextlib.suppress(KeyError, MapError):
                    del table[table.Key(slot)]
                continue
            self._put(table, slot, func, fns[slot])

    def install_tails(self, slots: frozenset[int]) -> None:
        """Loads the tail programs of slots and puts them in the pinned edge_tails, the entry
        (abi.TAIL_V6) last: until it is there, the running ingress passes what it would call. The
        other slots and the attached programs are left as they are (a reload adding the first
        IPv6 service, over a data path deployed without the IPv6 programs)."""
        table = self.tables()[abi.MAP_TAILS]
        fns = _load_many(self._bpf, [(TAILS[slot], "xdp") for slot in slots])
        for slot in sorted(slots, key=lambda s: s == abi.TAIL_V6):
            self._put(table, slot, TAILS[slot], fns[TAILS[slot]])

    @staticmethod
    def _put(table, slot: int, func: str, fn) -> None:
        try:
            table[table.Key(slot)] = table.Leaf(fn.fd)
        except MapError as e:
            raise LoaderError(f"install tail call {func}: {e}") from e

    def close(self) -> None:
        # Drops our fds; pinned maps and attached programs stay in the kernel.
        self._bpf.cleanup()


def _prog_type(kind: str) -> int:
    from bcc import BPF

    return {"xdp": BPF.XDP, "tc": BPF.SCHED_CLS}[kind]


def _load_func(bpf, func: str, kind: str):
    """bcc's load_func for an "xdp" or "tc" program; LoaderError with the verifier's first error."""
    return _load_many(bpf, [(func, kind)])[func]


def _load_many(bpf, progs: Sequence[tuple[str, str]]) -> dict[str, object]:
    """bcc's load_func for each (function, kind), two at a time: the kernel's verifier is most of
    a load and runs outside the GIL (bcc calls libbcc through ctypes), so the ingress's slow and
    scan programs (440k and 460k instructions processed) are verified on both cores. Returns
    the programs by function; LoaderError with the verifier's first error for the first that
    failed (stderr is captured around all of them: threads share fd 2)."""
    jobs = dict(progs)  # a function asked twice (two tail slots) is loaded once
    with _captured_stderr() as log:
        with ThreadPoolExecutor(max_workers=min(2, len(jobs))) as pool:
            futures = {func: pool.submit(bpf.load_func, func, _prog_type(kind)) for func, kind in jobs.items()}
        failed = [(func, f.exception()) for func, f in futures.items() if f.exception() is not None]
        if failed:  # bcc raises bare Exception
            func, e = failed[0]
            raise LoaderError(f"load {func}: {_first_error(log())} ({e})") from e
    return {func: f.result() for func, f in futures.items()}


class Standalone:
    """A compiled program file outside the data path (the benchmarks' floors and sinks): no pins,
    no tail calls; its maps live as long as this object or an attached program."""

    def __init__(self, bpf) -> None:
        self._bpf = bpf

    def load(self, func: str, kind: str):
        return _load_func(self._bpf, func, kind)

    def table(self, name: str) -> "Table":
        return Table(name, self._bpf[name])

    def close(self) -> None:
        self._bpf.cleanup()


def compile_standalone(path: Path, defines: Mapping[str, int] | None = None) -> Standalone:
    """Compiles one self-contained bcc source (e.g. tools/bench_bare.c) with -D name=value flags."""
    try:
        from bcc import BPF
    except ImportError as e:
        raise LoaderError(f"bcc is not importable ({e}); run tools/bootstrap") from e

    flags = [f"-D{name}={value}" for name, value in (defines or {}).items()]
    with _captured_stderr((1, 2)) as log:
        try:
            return Standalone(BPF(src_file=str(path), cflags=flags))
        except Exception as e:  # bcc raises bare Exception
            raise CompileError(f"compile {path.name}: {_first_error(log()) if log().strip() else e}") from e


def cflags(pin_path: Path, params: Params) -> list[str]:
    """The compiler flags: where the maps are pinned and every size (maps.h has no defaults)."""
    return [
        f"-I{BPF_DIR}",
        f'-DEDGE_PIN_DIR="{pin_path}"',
        f"-DEDGE_MAGLEV_M={params.maglev_m}",
        f"-DEDGE_MAX_SERVICES={params.max_services}",
        f"-DEDGE_MAX_BACKENDS={params.max_backends}",
        f"-DEDGE_CT_SIZE={params.ct_size}",
        f"-DEDGE_HALF_OPEN_SIZE={params.half_open_size}",
        f"-DEDGE_CT6_SIZE={params.ct6_size}",
    ]


_END = object()
_lookup_elem = None  # bcc's bpf_lookup_elem, once a Table.lookup_into() needs it


class Table:
    """One bcc table whose failures raise MapError naming the map and the key: bcc raises
    bare Exception for a failed update (E2BIG, EPERM, ...). A missing key stays KeyError
    (a lookup miss is an answer, not a failure). Everything else is bcc's table as is."""

    def __init__(self, name: str, table) -> None:
        self.name = name
        self._t = table

    def __getattr__(self, attr: str):
        return getattr(self._t, attr)  # Key, Leaf, sLeaf, map_fd, ...

    def __len__(self) -> int:
        return len(self._t)

    def _fail(self, op: str, key, e: Exception) -> MapError:
        where = "" if key is None else f" {key_text(key)}"
        return MapError(f"{self.name}: {op}{where}: {e}", map=self.name)

    def _guarded(self, op: str, key, call: Callable, *args):
        try:
            return call(*args)
        except KeyError:
            raise
        except Exception as e:  # bcc raises bare Exception
            raise self._fail(op, key, e) from e

    def __getitem__(self, key):
        return self._guarded("lookup", key, self._t.__getitem__, key)

    def __setitem__(self, key, value) -> None:
        self._guarded("update", key, self._t.__setitem__, key, value)

    def __delitem__(self, key) -> None:
        self._guarded("delete", key, self._t.__delitem__, key)

    def getvalue(self, key):
        """key's value; every CPU's for a per-CPU table (bcc's getvalue), the Leaf for the others
        (bcc's plain tables have no getvalue)."""
        return self._guarded("lookup", key, getattr(self._t, "getvalue", self._t.__getitem__), key)

    def lookup_into(self, key, address: int) -> None:
        """Copies key's value (every CPU's, for a per-CPU map) to memory at address (sizeof(Leaf)
        bytes): no new Leaf per lookup (edged reads thousands a second). KeyError when absent."""
        global _lookup_elem
        if _lookup_elem is None:
            from bcc import libbcc

            _lookup_elem = libbcc.lib.bpf_lookup_elem
        rc = _lookup_elem(self._t.map_fd, ctypes.byref(key), ctypes.c_void_p(address))
        if rc < 0:
            err = ctypes.get_errno() or -rc
            if err == errno.ENOENT:
                raise KeyError(key)
            raise self._fail("lookup", key, OSError(err, os.strerror(err)))

    def _walk(self, items: bool):
        it = self._guarded("walk", None, lambda: iter(self._t.items() if items else self._t.keys()))
        while (entry := self._guarded("walk", None, next, it, _END)) is not _END:
            yield entry

    def keys(self):
        return self._walk(False)

    def __iter__(self):
        return self._walk(False)

    def items(self):
        return self._walk(True)


def compile_datapath(
    pin_path: Path, params: Params, debug: bool = False, text: str | None = None, ipv6: bool = True
) -> Loaded:
    """Compiles bpf/ with params; maps are opened from pin_path or created there.
    text replaces the source (benchmarks wrap the entry points). Without ipv6 the IPv6 tail
    programs are left out of the compile (EDGE_NO_INGRESS6, about 0.6 of its 3 s) and their
    slots stay empty (skip_tails)."""
    try:
        from bcc import BPF
    except ImportError as e:
        raise LoaderError(f"bcc is not importable ({e}); run tools/bootstrap") from e

    with _captured_stderr((1, 2)) as log:
        try:
            flags = cflags(pin_path, params) + ([] if ipv6 else ["-DEDGE_NO_INGRESS6"])
            bpf = BPF(text=source_text() if text is None else text, cflags=flags)
        except Exception as e:  # bcc raises bare Exception
            raise CompileError(_compile_failure(log(), e)) from e
    loaded = Loaded(bpf, pin_path, params)
    loaded.skip_tails = frozenset() if ipv6 else TAILS_V6
    loaded.compile_log = log() if debug else ""
    return loaded


def maps_text() -> str:
    """The map declarations alone: what opening pins needs, at a third of the compile time."""
    return "#include <uapi/linux/bpf.h>\n" + _amalgamate(BPF_DIR / "include" / "maps.h", set())


def open_pinned(pin_path: Path, params: Params | None = None) -> Pinned:
    """Re-opens the maps of a deployed instance with bpf(2) alone (no bcc, no compile); never
    creates a pin. Sized as the pins are unless params says otherwise."""
    return open_pins(pin_path, params)


def hold_prog(prog_id: int, name: str) -> Prog:
    """A loaded program (e.g. one a deploy attached) by id, on a new fd: it stays loaded, and
    attach_xdp/attach_tc take it, until the caller closes its .fd."""
    return Prog(name, prog_fd_by_id(prog_id))


def pinned_params(pin_path: Path) -> Params:
    """The sizes a deployed instance was compiled with, read from its pinned maps (so a reader
    never opens them with other sizes than the deploy's node section gave)."""
    services = pinned_max_entries(pin_path / abi.MAP_SVC_CFG)
    return Params(
        maglev_m=pinned_max_entries(pin_path / abi.MAP_MAGLEV) * abi.MAGLEV_PER_VALUE // (2 * services),
        max_services=services,
        max_backends=pinned_max_entries(pin_path / abi.MAP_BACKENDS),
        ct_size=pinned_max_entries(pin_path / abi.MAP_CT),
    )


# ---------------------------------------------------------------- XDP attach (netlink)


def attach_xdp(iface: str, fn, mode: str, replace: bool) -> int:
    """Attaches (or atomically replaces) the XDP program fn (anything with .fd) on iface;
    returns the flags it used (for detach_xdp)."""
    flags = XDP_MODES[mode] | (0 if replace else XDP_FLAGS_UPDATE_IF_NOEXIST)
    try:
        set_xdp(ifindex(iface), fn.fd, flags)
    except LoaderError as e:
        hint = " (driver without native XDP? set node.xdp_mode: generic)" if mode == "native" else ""
        raise LoaderError(f"attach XDP ({mode}) on {iface}: {e}{hint}") from e
    return flags & ~XDP_FLAGS_UPDATE_IF_NOEXIST


def detach_xdp(iface: str, flags: int) -> None:
    try:
        set_xdp(ifindex(iface), -1, flags & ~XDP_FLAGS_UPDATE_IF_NOEXIST)
    except LoaderError as e:
        raise LoaderError(f"detach XDP on {iface}: {e}") from e
