"""Where an instance's pins are, whatever config deployed it: every bpffs this process sees is
searched for v<N>/<instance> (undeploy with a config that set its own node.pin_dir). Reads
the file system only."""

from __future__ import annotations

import os
import re
from pathlib import Path


def pin_dirs_holding(instance: str, max_depth: int = 4) -> list[str]:
    """Every directory on a bpffs this process sees (at most max_depth below its mount point)
    that holds v<N>/<instance> of any ABI: where deploys of a config with its own node.pin_dir
    put this instance's pins."""
    found = set()
    for mnt in _bpffs_mounts():
        for root, dirs, _ in os.walk(mnt):
            if root[len(mnt) :].count("/") >= max_depth:
                dirs[:] = []
                continue
            if any(re.fullmatch(r"v[0-9]+", d) and os.path.isdir(os.path.join(root, d, instance)) for d in dirs):
                found.add(root)
    return sorted(found)


def _bpffs_mounts() -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] == "bpf":
            out.append(fields[4].replace("\\040", " "))
    return sorted(set(out))
