"""A deployed instance's data path as a process holds it without bcc: every pinned map opened
with bpf(2) (controlplane/bpfmap.py) and typed by controlplane/maps/layouts.py, plus the
programs a compile handed over by fd (controlplane/compilechild.py), which stay loaded while
held, so edged can attach them again (the data-path watch) or on a new backend-facing link
without compiling. Never creates a pin; decides nothing."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Mapping

from controlplane import abi
from controlplane.bpfmap import Map, Prog, map_info, obj_get
from controlplane.errors import LoaderError, NotDeployed
from controlplane.maps import layouts


class Pinned:
    """Open maps of one instance (fds this object owns) and the programs it holds."""

    def __init__(self, pin_path: Path, params, fds: Mapping[str, int], progs: Mapping[str, Prog] | None = None):
        self.pin_path = pin_path
        self.params = params  # loader.Params: the sizes the pins were made with
        self._fds = dict(fds)
        self._progs = dict(progs or {})
        self._tables: dict[str, Map] | None = None
        self.compile_log = ""

    def map_fd(self, name: str) -> int:
        return self._fds[name]

    def tables(self) -> Mapping[str, Map]:
        if self._tables is None:
            self._tables = {name: self.table(name) for name in abi.MAP_NAMES}
        return self._tables

    def table(self, name: str) -> Map:
        lay = layouts.layouts()[name]
        fd = self._fds[name]
        info = map_info(fd, name)
        value = ctypes.sizeof(lay.value)
        if info.key_size != ctypes.sizeof(lay.key) or info.value_size != value:
            raise LoaderError(
                f"{name}: pinned with key/value of {info.key_size}/{info.value_size} bytes, this build's abi.h "
                f"says {ctypes.sizeof(lay.key)}/{value} (undeploy and deploy again)"
            )
        return Map(name, fd, lay.key, lay.value, lay.kind, info.max_entries)

    def progs(self) -> dict[str, Prog]:
        return dict(self._progs)

    def load(self, func: str, kind: str) -> Prog:
        """A program this object holds (the compile's), by name: what loader.Loaded.load gives
        for a program it loaded. LoaderError for one it does not hold."""
        prog = self._progs.get(func)
        if prog is None:
            raise LoaderError(
                f"{func}: not loaded by this data path's compile (held: {', '.join(self._progs) or 'none'})"
            )
        return prog

    def close(self) -> None:
        """Drops the fds; pinned maps and attached programs stay in the kernel."""
        for fd in [*self._fds.values(), *(p.fd for p in self._progs.values())]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds, self._progs, self._tables = {}, {}, None


def open_pins(pin_path: Path, params=None, progs: Mapping[str, Prog] | None = None) -> Pinned:
    """Opens every map pinned at pin_path (never creates one); params: the sizes, read from the
    pins by default. progs: programs to hold with them (their fds pass to the result)."""
    from controlplane import loader  # Params, pinned_params: loader imports this module's users

    missing = [name for name in abi.MAP_NAMES if not (pin_path / name).exists()]
    if missing:
        if len(missing) == len(abi.MAP_NAMES):
            raise NotDeployed(f"nothing pinned at {pin_path}")
        raise LoaderError(f"{pin_path}: incomplete pins, missing {', '.join(missing)} (undeploy and deploy again)")
    fds: dict[str, int] = {}
    try:
        for name in abi.MAP_NAMES:
            fds[name] = obj_get(pin_path / name)
        return Pinned(pin_path, params or loader.pinned_params(pin_path), fds, progs)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
