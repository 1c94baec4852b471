"""Compiling the data path in a child process, so bcc and LLVM (about 100 MB, and more while
clang runs) never live in the process that asks: build() starts `python -m
controlplane.compilechild`, which compiles bpf/ (loader.compile_datapath), pins the maps,
loads the programs asked for (the ingress installs its tail calls in the pinned edge_tails),
hands their fds back over a socket (SCM_RIGHTS) and exits. install_tails() only puts tail
programs into a deployed data path's edge_tails (the IPv6 ones, at a reload). The caller then holds the
programs and opens the pins with bpf(2) alone (pinned.Pinned). A failure in the child comes
back as the same EdgeError (type and one line) the compile would have raised in-process.
Cancel ends a compile under way from another thread (edged's stop during its start).
Imports no bcc itself: the child's loader does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from controlplane import errors, loader
from controlplane.bpfmap import Prog
from controlplane.pinned import Pinned, open_pins

_MAX_MSG = 1 << 16


class Cancel:
    """Ends, from any thread, the compile a build() given this runs, and any it starts after:
    its child is killed at once and build() raises errors.Cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def _running(self, proc: subprocess.Popen | None) -> None:
        with self._lock:
            self._proc = proc
            if proc is not None and self.cancelled:
                proc.kill()


def build(
    pin_path: Path,
    params: loader.Params,
    progs: Sequence[tuple[str, str]],
    ipv6: bool = True,
    cancel: Cancel | None = None,
) -> Pinned:
    """Compiles the data path sized by params in a child, with its maps pinned at pin_path
    (made there when missing), and loads progs ((function, "xdp" | "tc"), in order); returns
    the pins opened, holding those programs. Without ipv6 the IPv6 tail programs are not
    loaded (loader.TAILS_V6). Raises the child's EdgeError, or errors.Cancelled once cancel
    was cancelled (the child killed)."""
    cancel = cancel or Cancel()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = json.dumps(
        {"pin_path": str(pin_path), "params": asdict(params), "progs": list(map(list, progs)), "ipv6": ipv6}
    )
    with ours, tempfile.TemporaryFile() as err:
        proc = _spawn(theirs, request, err)
        cancel._running(proc)
        try:
            msg, fds, _, _ = socket.recv_fds(ours, _MAX_MSG, len(progs))
            proc.wait()
        finally:
            cancel._running(None)
            if proc.poll() is None:  # we were interrupted: the compile ends with us
                proc.kill()
                proc.wait()
        if cancel.cancelled:
            for fd in fds:
                os.close(fd)
            raise errors.Cancelled("compiling the data path: stopped before it was done")
        held = _received(msg, fds, progs, proc.returncode, err)
    try:
        return open_pins(pin_path, params, held)
    except BaseException:
        for p in held.values():
            os.close(p.fd)
        raise


def install_tails(pin_path: Path, params: loader.Params, slots: frozenset[int]) -> None:
    """Compiles the data path sized by params in a child, over the maps pinned at pin_path, and
    puts the tail programs of slots into the pinned edge_tails (loader.Loaded.install_tails);
    nothing else of the deployed data path changes. Raises the child's EdgeError."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = json.dumps({"pin_path": str(pin_path), "params": asdict(params), "tails": sorted(slots)})
    with ours, tempfile.TemporaryFile() as err:
        proc = _spawn(theirs, request, err)
        try:
            msg = ours.recv(_MAX_MSG)
            proc.wait()
        finally:
            if proc.poll() is None:  # we were interrupted: the compile ends with us
                proc.kill()
                proc.wait()
        _received(msg, [], [], proc.returncode, err)


def load_ipv6(pinned) -> None:
    """Puts the IPv6 programs into the empty IPv6 slots of a data path deployed without them
    (for IPv4 services only; pinned: its pins held), compiled in a child over its pins; the
    attached programs, the maps and every IPv4 flow stay as they are. ConfigError when IPv6
    forwarding is off (the IPv6 programs' FIB lookups need it); the child's EdgeError when the
    compile or load fails."""
    if not loader.ipv6_forwarding():
        raise errors.ConfigError(
            "an IPv6 VIP needs net.ipv6.conf.all.forwarding=1 (the data path's FIB lookups); set it and reload again"
        )
    install_tails(pinned.pin_path, pinned.params, loader.TAILS_V6)


def _spawn(theirs: socket.socket, request: str, err) -> subprocess.Popen:
    """Starts the child with its end of the socket pair (closed here once it is passed on)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "controlplane.compilechild", str(theirs.fileno()), request],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        theirs.close()


def _received(msg: bytes, fds: list[int], progs: Sequence[tuple[str, str]], rc: int, err) -> dict[str, Prog]:
    """The programs the child handed over, or its failure raised."""
    if not msg:
        for fd in fds:
            os.close(fd)
        err.seek(0)
        lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
        raise errors.CompileError(
            f"compiling the data path: the compiler process ended (exit {rc}) without an answer"
            + (f": {lines[-1].strip()}" if lines else "")
        )
    answer = json.loads(msg)
    if "error" in answer:
        for fd in fds:
            os.close(fd)
        kind = getattr(errors, answer["error"], None)
        if not (isinstance(kind, type) and issubclass(kind, errors.EdgeError)):
            kind = errors.LoaderError
        raise kind(answer["text"])
    return {name: Prog(name, fd) for (name, _), fd in zip(progs, fds)}


def _serve(sock: socket.socket, request: dict) -> None:
    params = loader.Params(**request["params"])
    try:
        # a reload's install_tails asks for the IPv6 tails: compiled with them
        ipv6 = request.get("ipv6", True) or "tails" in request
        loaded = loader.compile_datapath(Path(request["pin_path"]), params, ipv6=ipv6)
        if "tails" in request:
            try:
                loaded.install_tails(frozenset(request["tails"]))
                sock.send(json.dumps({"ok": []}).encode())
            finally:
                loaded.close()
            return
        try:
            fns = loaded.load_all([(name, kind) for name, kind in request["progs"]])
            socket.send_fds(sock, [json.dumps({"ok": [n for n, _ in request["progs"]]}).encode()], [f.fd for f in fns])
        finally:
            loaded.close()
    except errors.EdgeError as e:
        sock.send(json.dumps({"error": type(e).__name__, "text": str(e)}).encode())


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    with sock:
        _serve(sock, json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
