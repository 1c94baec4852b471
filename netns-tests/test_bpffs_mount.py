"""tools/mount-bpffs (run by tools/bootstrap) mounts bpffs closed to other users. It runs in
a private mount namespace of its own, where /sys/fs/bpf is unmounted first: the host's
bpffs is never touched.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def in_private_mounts(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_bootstrap_mounts_bpffs_mode_0700_when_none_is_there():
    done = in_private_mounts(
        "umount /sys/fs/bpf 2>/dev/null || true\n"
        "tools/mount-bpffs\n"
        "stat -f -c %T /sys/fs/bpf; stat -c %a /sys/fs/bpf\n"
        "tools/mount-bpffs\n"
    )  # again: nothing to do
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "bootstrap: mounted bpffs on /sys/fs/bpf (mode 0700)",
        "bpf_fs",
        "1700",
    ]  # the kernel adds the sticky bit


def test_bootstrap_runs_it():
    assert '"$top/tools/mount-bpffs"' in (REPO / "tools" / "bootstrap").read_text()
