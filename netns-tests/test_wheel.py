"""The package as an operator installs it: a wheel built from an sdist of this checkout, installed
into a fresh venv, deploys the router in a namespace lab and forwards through the VIP.

Before the wheel shipped bpf/ as package data, deploy from it failed with
`cannot compile the data path for kernel ...: No such file ... bpf/edge_xdp.c` (issue 21).

The fresh venv gets the wheel with pip (no index, no network). Its third-party dependencies
(numpy, grpcio, pyroute2, ...) come from this test's own venv through a .pth line, and Debian's bcc
through a folder holding only a link to it, as tools/bootstrap gives .venv; neither path holds
controlplane, which the test checks before deploying. Every command runs outside the checkout
and without PYTHONPATH, so only the installed copy can answer.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from controlplane.lab.router import DEPLOY_TIMEOUT_S, Router
from controlplane.lab.traffic import http_get
from controlplane.tests.wheelbuild import REPO, build_wheel

PORT = 8000  # conftest.BACKEND_PORT, also the VIP port


class WheelRouter(Router):
    """The lab's Router, with edgectl the installed console script of a venv."""

    def __init__(self, net, venv: Path, cwd: Path):
        super().__init__(net)
        self.venv = venv
        self.cwd = cwd

    def edgectl(self, *args: object, timeout_s: float = DEPLOY_TIMEOUT_S) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return self.net.router.run(
            [str(self.venv / "bin" / "edgectl"), *map(str, args)], check=False, env=env, cwd=self.cwd, timeout=timeout_s
        )


def _run(argv: list, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:3]}: {done.stderr.strip()[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; its path."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work / "build")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv], work)
    python = venv / "bin" / "python"
    bcc = importlib.util.find_spec("bcc")  # where Debian's bcc is; loader.py stays its only importer
    link = venv / "bcc-link"
    link.mkdir()
    (link / "bcc").symlink_to(bcc.submodule_search_locations[0])
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work).strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / "edge-deps.pth").write_text(f"{link}\n{ours}\n")
    probe = "import importlib.util as u; print(u.find_spec('controlplane'))"
    assert _run([python, "-I", "-c", probe], work).strip() == "None"  # the deps' paths hold no controlplane
    _run([venv / "bin" / "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check", wheel], work)
    return venv


def test_a_wheel_installed_in_a_fresh_venv_deploys_and_forwards(installed, net, router, tmp_path):
    """`router` (the checkout's edgectl) only undeploys in teardown, should the test fail midway."""
    where = _run(
        [
            installed / "bin" / "python",
            "-I",
            "-c",
            "import controlplane, controlplane.bpfsource as b; print(controlplane.__file__); print(b.BPF_DIR)",
        ],
        tmp_path,
    ).split()
    assert all(Path(p).is_relative_to(installed) for p in where), where
    assert not any(Path(p).is_relative_to(REPO) for p in where)
    wheel_router = WheelRouter(net, installed, tmp_path)

    wheel_router.deploy([wheel_router.service("web")])
    replies = [http_get(net.client, net.vip, PORT) for _ in range(30)]
    status = wheel_router.status()
    undeployed = wheel_router.undeploy()

    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.vip}:{PORT}")}
    assert {r.backend for r in replies} == {"b0", "b1", "b2"}  # 3 * (2/3)**30 ~ 2e-5 to miss one
    assert status["services"][0]["new_flows"] == 30
    assert undeployed.returncode == 0 and wheel_router.pinned_ifaces() == []
