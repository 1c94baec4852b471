"""Who may change a router, and the marks that outlive edged: flocks and small files in the run
dir (/run/edge, EDGE_LOCK_DIR), one set per router instance (<iface>-<netns id>). Owns no map,
no program and no policy; deploy.py and edged use it.

    <instance>.lock        the owner lock: edged for its life, edgectl deploy for its run
    <instance>.write       the write lock: every change of the maps, waited for
    <instance>.drained     `edgectl drain-node` (JSON: since_t, pid)
    <instance>.undeployed  `edgectl undeploy` under a running edged (JSON: t, pid)

A lock file is removed by whoever holds it when the router goes (undeploy, a failed first
deploy: NodeLock.release(remove=True)); a waiter that opened the removed file locks the new
one (acquire checks the inode it locked is the one the path names), so removal is safe. The
marks go with undeploy; a reboot clears them all, as it clears the pins.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path

from controlplane.errors import LoaderError

LOCK_DIR_ENV = "EDGE_LOCK_DIR"  # where the writer locks live; the unit's /run/edge by default
WRITE_WAIT_S = 10.0  # how long a write waits for another router writer to finish
POLL_S = 0.02


def run_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV, "/run/edge"))


class NodeLock:
    """Who may change a router, as flocks on files in the run dir (a holder that dies
    releases them). "owner" (<instance>.lock): edged holds it for its life, edgectl deploy
    for its run; a second one is refused in one line naming the holder. "write"
    (<instance>.write): every change of the maps takes it, edged's reloads and drain
    expiry, deploy and undeploy, waiting up to wait_s for the one before to finish;
    so undeploy, the stop button, still works under edged, but never midway through
    one of its writes."""

    def __init__(self, instance: str, iface: str, kind: str = "owner", wait_s: float = 0.0):
        suffix = {"owner": "lock", "write": "write"}[kind]
        self.path = run_dir() / f"{instance}.{suffix}"
        self.iface, self.kind, self.wait_s = iface, kind, wait_s
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if self._try(fd):
                if _names(self.path, fd):
                    self._fd = fd
                    return
                os.close(fd)  # locked a file its holder removed: lock the one there now
                continue
            if time.monotonic() >= deadline:
                break
            os.close(fd)
            time.sleep(POLL_S)
        who = holder(self.path)
        os.close(fd)
        raise LoaderError(self._refusal(who))

    def _try(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            os.close(fd)
            raise LoaderError(f"{self.path}: cannot lock: {e.strerror}") from e

    def _refusal(self, who: str) -> str:
        if self.kind == "owner":
            return (
                f"{self.iface}: another writer holds this router ({who}); "
                f"while edged runs, change it with 'edgectl reload'"
            )
        return (
            f"{self.iface}: another writer is changing this router ({who}) and did not finish within {self.wait_s:g} s"
        )

    def release(self, remove: bool = False) -> None:
        """Lets go; remove: the router is gone, so is its lock file (while still held)."""
        if self._fd is None:
            return
        if remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "NodeLock":
        self.acquire()
        return self

    def __exit__(self, *_) -> None:
        self.release()


def _names(path: Path, fd: int) -> bool:
    """Whether path still names the file open as fd (its holder may have removed it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def owned(instance: str, iface: str) -> bool:
    """Whether a running edged (or a deploy) holds the router's owner lock."""
    lock = NodeLock(instance, iface)
    try:
        lock.acquire()
    except LoaderError:
        return True
    lock.release(remove=True)  # only asked: no file left for it
    return False


def remove_locks(instance: str, iface: str) -> None:
    """The router is gone: its lock files go too, unless someone holds them (edged does)."""
    for kind in ("owner", "write"):
        lock = NodeLock(instance, iface, kind)
        try:
            lock.acquire()
        except LoaderError:
            continue
        lock.release(remove=True)


def holder(path: Path) -> str:
    """'pid N: command line' of the process holding a flock on path, from /proc/locks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a process this one cannot see"
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if "FLOCK" in fields and len(fields) > 5 and fields[5] == inode:
            return f"pid {fields[4]}: {_cmdline(fields[4])}"
    return "a process this one cannot see"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


# ---------------------------------------------------------------- marks


def _mark_time(instance: str, suffix: str, key: str) -> float | None:
    """The time (UNIX, under key) a mark file beside the router's locks (<instance>.<suffix>)
    holds; None when there is none, 0.0 when it cannot be read (the mark counts all the same)."""
    try:
        return float(json.loads((run_dir() / f"{instance}.{suffix}").read_text())[key])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _set_mark(instance: str, suffix: str, key: str, on: bool, what: str) -> None:
    """Writes (atomically, with the time and this pid) or removes a mark file; LoaderError naming
    the file if it cannot."""
    path = run_dir() / f"{instance}.{suffix}"
    try:
        if not on:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{suffix}.tmp")
        tmp.write_text(json.dumps({key: time.time(), "pid": os.getpid()}) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise LoaderError(f"{path}: cannot {'write' if on else 'remove'} the {what}: {e.strerror}") from e


def node_drain(instance: str) -> float | None:
    """When `edgectl drain-node` drained this router (UNIX time), None when it is not drained
    (0.0 when the mark is unreadable: drained rather than announced by mistake; undrain-node
    rewrites it). The mark is a small file beside the router's locks (<instance>.drained): it
    outlives edged, as the pinned data path does, and goes with undeploy (and a reboot, as the
    pins do)."""
    return _mark_time(instance, "drained", "since_t")


def set_node_drain(instance: str, drained: bool) -> None:
    _set_mark(instance, "drained", "since_t", drained, "drain-node mark")


def undeployed_at(instance: str) -> float | None:
    """When `edgectl undeploy` took the data path from under a running edged (UNIX time); None
    when it did not. The mark (<instance>.undeployed, beside the locks) tells that edged's watch
    to put nothing back: undeploy is the stop button, not a fault to repair. The next deploy
    (edged's own at its start, or edgectl deploy) removes it, and so does edged when it stops."""
    return _mark_time(instance, "undeployed", "t")


def set_undeployed(instance: str, undeployed: bool) -> None:
    _set_mark(instance, "undeployed", "t", undeployed, "undeploy mark")
