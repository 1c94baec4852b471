"""What the package ships and needs (pyproject.toml): the product's packages without the tests,
the data path's C sources, scapy for the drill, matplotlib only as the `plot` extra, and the real
Python floor."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from setuptools import find_packages

from controlplane.tests.wheelbuild import build_wheel

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def shipped() -> set[str]:
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    return set(find_packages(str(REPO), include=find.get("include", ["*"]), exclude=find.get("exclude", [])))


def test_the_package_ships_every_product_package_and_not_the_tests():
    packages = shipped()
    assert {"controlplane", "controlplane.api", "controlplane.drill", "controlplane.lab"} <= packages
    assert not any(p == "controlplane.tests" or p.startswith("controlplane.tests.") for p in packages)


def test_the_drill_needs_scapy_and_only_its_plot_needs_matplotlib():
    deps = " ".join(PYPROJECT["project"]["dependencies"])
    assert "scapy" in deps and "matplotlib" not in deps
    assert any(d.startswith("matplotlib") for d in PYPROJECT["project"]["optional-dependencies"]["plot"])


def test_requires_python_is_the_floor_the_code_needs():
    # BaseException.add_note (controlplane/lab/topo.py) and tomllib are new in 3.11.
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    assert hasattr(BaseException, "add_note") and sys.version_info >= (3, 11)


def test_the_wheel_ships_the_data_path_sources_and_finds_them_when_installed(tmp_path):
    """edged compiles bpf/ at run time: a wheel without it cannot deploy (issue 21). The wheel is
    built from an sdist, as a release is; unpacked into a bare directory, its controlplane finds
    the C sources beside itself and amalgamates them."""
    wheel = build_wheel(tmp_path / "build")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    wanted = {
        f"controlplane/bpf/{p.relative_to(REPO / 'bpf')}" for p in (REPO / "bpf").rglob("*") if p.suffix in (".c", ".h")
    }
    assert {"controlplane/bpf/edge_xdp.c", "controlplane/bpf/include/abi.h"} <= wanted <= names
    assert not any(name.startswith("controlplane/tests/") for name in names)
    site = tmp_path / "site"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import controlplane; from controlplane import bpfsource; "
        "print(controlplane.__file__); print(bpfsource.BPF_DIR); print(len(bpfsource.source_text()))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(site)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    module, bpf_dir, size = done.stdout.split()
    assert Path(module).is_relative_to(site) and Path(bpf_dir) == site / "controlplane" / "bpf"
    assert int(size) > 10_000


def test_a_checkout_finds_its_top_level_bpf_dir():
    from controlplane import bpfsource

    assert bpfsource.BPF_DIR == REPO / "bpf"
