"""What the package ships and needs (pyproject.toml): the product's packages without the tests,
scapy for the drill, matplotlib only as the `plot` extra, and the real Python floor."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

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
