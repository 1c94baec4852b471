"""Builds the package as a release would, for the tests that check what a wheel ships and that it
deploys: the checkout's files (no .git, .venv or build output) are copied to a temporary tree,
an sdist is built from it through setuptools' PEP 517 hooks, unpacked, and the wheel is built from
that sdist (what `python -m build` does). No network: setuptools comes from the running Python
(no build isolation), and nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache"
)
TIMEOUT_S = 300


def _hook(tree: Path, call: str, out: Path) -> str:
    """Runs setuptools.build_meta.CALL(out) in tree; returns the file name it made."""
    code = f"import sys; from setuptools import build_meta as b; print(b.{call}(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=tree, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{call} failed in {tree}: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def build_wheel(work: Path) -> Path:
    """The wheel built from an sdist of the checkout, made under work; returns its path."""
    tree = work / "checkout"
    shutil.copytree(REPO, tree, ignore=SKIP, symlinks=True)
    dist = work / "dist"
    dist.mkdir()
    sdist = dist / _hook(tree, "build_sdist", dist)
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "sdist")  # our own sdist (Python 3.11.2 has no extraction filter)
    (unpacked,) = (work / "sdist").iterdir()
    return dist / _hook(unpacked, "build_wheel", dist)
