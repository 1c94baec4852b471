"""nodelock: the router's lock files do not pile up in the run dir (issue: ~94 seen in /run/edge,
some for interfaces that do not exist). Asking whether edged runs leaves no file, a router
that goes takes its lock files with it, and a writer waiting on a removed file locks the new one."""

from __future__ import annotations

import subprocess
import sys
import threading

from controlplane import nodelock
from controlplane.nodelock import NodeLock, owned, remove_locks


def test_asking_whether_edged_runs_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, str(tmp_path))
    assert not owned("nosuch0-1", "nosuch0")
    assert list(tmp_path.iterdir()) == []


def test_a_router_that_goes_takes_its_lock_files(tmp_path, monkeypatch):
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, str(tmp_path))
    with NodeLock("eth9-1", "eth9"), NodeLock("eth9-1", "eth9", "write"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eth9-1.lock", "eth9-1.write"]
    remove_locks("eth9-1", "eth9")
    assert list(tmp_path.iterdir()) == []


def test_remove_locks_leaves_a_held_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, str(tmp_path))
    code = (
        "import sys; from controlplane.nodelock import NodeLock; l = NodeLock('eth9-1', 'eth9'); "
        "l.acquire(); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        remove_locks("eth9-1", "eth9")
        assert (tmp_path / "eth9-1.lock").exists()  # edged holds it: stays
        assert owned("eth9-1", "eth9")
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_a_waiter_on_a_removed_lock_file_locks_the_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, str(tmp_path))
    first = NodeLock("eth9-1", "eth9", "write")
    first.acquire()
    got = []
    waiter = NodeLock("eth9-1", "eth9", "write", wait_s=10.0)
    t = threading.Thread(target=lambda: (waiter.acquire(), got.append(True)))
    t.start()
    first.release(remove=True)  # the router went while the waiter waited
    t.join(timeout=10)
    assert got == [True]
    # the waiter holds the file the path names: a third writer is refused, not let in beside it
    try:
        third = NodeLock("eth9-1", "eth9", "write")
        refused = False
        try:
            third.acquire()
            third.release()
        except Exception:
            refused = True
        assert refused
    finally:
        waiter.release()
