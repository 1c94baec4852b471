"""maps/sizing.py against the kernel: a deployed instance's pinned maps have the kinds, key and
value sizes and entries the table says, and cost the bytes it estimates (within 5 %, the
kernel's own accounting). Also: a node section whose maps would not fit in the memory the
process may take is refused by validate and deploy before anything is compiled, naming what to
lower."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from controlplane.config import Node
from controlplane.lab.router import DEPLOY_TIMEOUT_S, PACKAGE_ROOT
from controlplane.maps import sizing

NODE = {"max_services": 4, "max_backends": 64, "maglev_m": 1009, "ct_size": 4096}


def possible_cpus() -> int:
    with open("/sys/devices/system/cpu/possible") as f:
        last = f.read().strip().split(",")[-1]
    return int(last.split("-")[-1]) + 1


def pinned(path) -> dict:
    done = subprocess.run(
        ["bpftool", "-j", "map", "show", "pinned", str(path)], capture_output=True, text=True, timeout=10.0, check=True
    )
    return json.loads(done.stdout)


def test_the_table_matches_the_pinned_maps(net, router):
    router.deploy([router.service("web")], node=NODE)
    node, cpus = Node(**NODE), possible_cpus()
    names = sorted(p.name for p in router.pin_path.iterdir())
    assert names == sorted(sizing.SHAPES)
    for name in names:
        info, shape = pinned(router.pin_path / name), sizing.SHAPES[name]
        got = (info["type"], info["bytes_key"], info["bytes_value"], info["max_entries"])
        assert got == (shape.kind, shape.key, shape.value, shape.entries(node)), name
        estimate = sizing.map_bytes(shape, node, cpus)
        assert abs(estimate - info["bytes_memlock"]) <= 0.05 * info["bytes_memlock"], (name, estimate, info)


@contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A memory cgroup of its own (v1 or v2) limited to limit bytes; yields its cgroup.procs.
    Removed again after (the processes put in it have exited by then)."""
    v1 = Path("/sys/fs/cgroup/memory")
    base = v1 if v1.is_dir() else Path("/sys/fs/cgroup")
    group = base / f"edge-test-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        (group / ("memory.limit_in_bytes" if base == v1 else "memory.max")).write_text(str(limit))
        yield group / "cgroup.procs"
    finally:
        group.rmdir()


def edgectl_in(router, procs: Path, *args) -> subprocess.CompletedProcess:
    """edgectl ARGS in the router namespace, as a process of the cgroup whose cgroup.procs is procs."""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    argv = [
        "sh",
        "-c",
        'echo $$ > "$0" && exec "$@"',
        str(procs),
        sys.executable,
        "-m",
        "controlplane",
        *map(str, args),
    ]
    return router.net.router.run(argv, check=False, env=env, timeout=DEPLOY_TIMEOUT_S)


def test_a_node_section_that_does_not_fit_is_refused_before_compiling(net, router, tmp_path):
    """Map memory is charged to the memory cgroup of the process that makes the maps: in one
    limited to 512 MiB, the default sizes (tens of MiB) deploy and a 16M-entry conntrack is refused."""
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(router.config([router.service("web")], node={"ct_size": 16777216})))
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(router.config([router.service("web")])))
    assert sum(sizing.node_bytes(Node(ct_size=16777216), possible_cpus()).values()) > 512 << 20

    with memory_cgroup(512 << 20) as procs:
        for args in (("validate", "--config", big), ("-q", "deploy", "--iface", router.iface, "--config", big)):
            done = edgectl_in(router, procs, *args)
            assert done.returncode == 1, done.stderr
            (line,) = done.stderr.splitlines()
            assert line.startswith("edgectl: node: the maps would pin ") and "node.ct_size" in line, line
        assert not router.pin_path.exists() and router.iface_state(router.iface).xdp_prog_id is None

        done = edgectl_in(router, procs, "-q", "deploy", "--iface", router.iface, "--config", small)
        assert done.returncode == 0 and router.pin_path.exists(), done.stderr
    router.undeploy()


def test_validate_says_what_the_maps_pin(net, router, tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(router.config([router.service("web")], node=NODE)))
    done = router.edgectl("validate", "--config", path)
    assert done.returncode == 0, done.stderr
    largest = next(iter(sizing.node_bytes(Node(**NODE), possible_cpus())))  # which three lead depends on the map set
    assert "the maps pin " in done.stdout and f"({largest} " in done.stdout, done.stdout
    assert os.path.exists(path)
