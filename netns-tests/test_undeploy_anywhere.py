"""Undeploy finds and removes everything a deploy made, whatever the config said, and an
interrupted deploy rolls back:

- a config with its own node.pin_dir (a bpffs of the test's own): `edgectl undeploy` without
  --pin-dir used to print "undeployed", exit 0, and leave every pin, the reply XDP, tc on the
  backend links and ip_forward=1 (a second undeploy then said "nothing deployed");
- Ctrl-C (SIGINT) to `edgectl deploy` just after it says "return path on ...": an edge_reply
  program used to be left on a backend link.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import yaml

from controlplane.lab.daemon import env_with_package
from controlplane.lab.router import ip_forward_off, node_state


def _pins_under(mnt) -> list[str]:
    return sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*"))


def test_undeploy_finds_the_pins_of_a_config_with_its_own_pin_dir(net, router, tmp_path, monkeypatch):
    run = tmp_path / "run"  # the run dir of locks and marks (the unit's /run/edge)
    monkeypatch.setenv("EDGE_LOCK_DIR", str(run))
    mnt = tmp_path / "bpffs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(mnt)], check=True, timeout=30)
    try:
        with ip_forward_off(router):
            before, empty = node_state(router), _pins_under(mnt)  # a new bpffs: maps.debug, progs.debug
            router.deploy([router.service("web")], node={"pin_dir": str(mnt / "edge")})
            assert _pins_under(mnt) != empty
            deployed = node_state(router)
            assert deployed["ip_forward"] == "1"
            assert any(s.xdp_prog_id for n, s in deployed["ifaces"].items() if n != router.iface)

            done = router.undeploy()  # no --pin-dir: the default, not where the pins are
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"undeployed from {router.iface}"
            assert node_state(router) == before
            assert _pins_under(mnt) == empty
            again = router.undeploy()
            assert again.stdout.strip() == f"nothing deployed on {router.iface}"
            none = router.undeploy("nosuch0")
            assert none.stdout.strip() == "nothing deployed on nosuch0"
            assert sorted(p.name for p in run.iterdir()) == []  # no lock files piling up (issue 21)
    finally:
        router.edgectl("-q", "undeploy", "--iface", router.iface, "--pin-dir", str(mnt / "edge"))
        subprocess.run(["umount", str(mnt)], check=False, timeout=30)


def _interrupted_deploy(net, router, after: str) -> subprocess.CompletedProcess:
    """`edgectl deploy` of the web service, SIGINT as soon as its progress line starts with after."""
    fd, path = tempfile.mkstemp(prefix="edge-test-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(router.config([router.service("web")]), f)
    try:
        proc = net.router.popen(
            [sys.executable, "-m", "controlplane", "deploy", "--iface", router.iface, "--config", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env_with_package(),
        )
        lines = []
        for raw in proc.stderr:
            lines.append(raw.decode(errors="replace"))
            if after in lines[-1]:
                proc.send_signal(signal.SIGINT)  # the edgectl this test started
                break
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, out.decode(), "".join(lines) + err.decode(errors="replace")
        )
    finally:
        os.unlink(path)


def test_ctrl_c_after_the_return_path_rolls_the_whole_deploy_back(net, router):
    with ip_forward_off(router):
        before = node_state(router)
        for _ in range(3):
            done = _interrupted_deploy(net, router, "return path on ")
            assert done.returncode != 0, done.stderr
            assert node_state(router) == before, done.stderr
