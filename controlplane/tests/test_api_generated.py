"""The gRPC modules of controlplane.api: committed next to the proto, equal to what
grpcio-tools makes of it, and never imported from anywhere else (a directory other
users can write, such as the system temp dir, would let them run code as root).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
API = REPO / "controlplane" / "api"
MODULES = ("edge_pb2", "edge_pb2_grpc")


def test_committed_modules_are_what_grpcio_tools_makes_of_the_proto(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a test dependency: pip install -e .[test]")
    from controlplane.api import _gen

    _gen.generate(tmp_path)
    for m in MODULES:
        committed = API / f"{m}.py"
        assert committed.is_file(), f"{committed.name} is not committed"
        assert (tmp_path / f"{m}.py").read_text() == committed.read_text(), (
            f"{committed.name} differs from the proto's: run python -m controlplane.api._gen and commit"
        )


def test_the_modules_are_tracked_by_git():
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "controlplane/api"], capture_output=True, text=True, timeout=10, check=True
    ).stdout.split()
    assert {f"controlplane/api/{m}.py" for m in MODULES} <= set(tracked)


def _predictable_temp_dir(tmp: Path) -> Path:
    """The shared temp directory earlier versions generated the modules into (and imported
    them from whenever its STAMP matched): its name follows from public facts."""
    import google.protobuf

    digest = hashlib.sha256((API / "edge" / "v1" / "edge.proto").read_bytes()).hexdigest()
    stamp = f"proto-sha256 {digest}\ngrpcio-tools {_version('grpcio-tools')}\nprotobuf {google.protobuf.__version__}\n"
    return tmp / f"edge-router-api-{os.getuid()}-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}", stamp


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def test_modules_planted_in_the_temp_dir_are_never_imported(tmp_path):
    """Another user plants edge_pb2.py in the temp dir, where an older version looked;
    a fresh install (no generated modules yet, no cache) imports the API. Nothing
    planted runs, and the modules come from the package."""
    pkg = tmp_path / "pkg"
    shutil.copytree(
        REPO / "controlplane", pkg / "controlplane", ignore=shutil.ignore_patterns("_generated", "__pycache__", "tests")
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    planted, stamp = _predictable_temp_dir(tmp)
    planted.mkdir(mode=0o700)
    marker = tmp_path / "planted-code-ran"
    for m in MODULES:
        (planted / f"{m}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "STAMP").write_text(stamp)
    env = {
        **os.environ,
        "PYTHONPATH": str(pkg),
        "TMPDIR": str(tmp),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HOME": str(tmp_path / "home"),
    }
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from controlplane.api import edge_pb2, edge_pb2_grpc; "
            "print(edge_pb2.__file__); print(edge_pb2_grpc.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert not marker.exists(), "code planted in the temp dir ran"
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(pkg / "controlplane" / "api" / f"{m}.py") for m in MODULES]
    assert sorted(p.name for p in tmp.iterdir()) == [planted.name]  # nothing new in the temp dir
