"""tools/install-node into a --prefix tree in a tmp dir: what lands where, and that a second run changes nothing.

Bootstrap and the venv are skipped (--no-bootstrap --no-venv): they install
packages and reach PyPI, which a unit test must not. Everything a test writes is
under its tmp_path.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "install-node"
COMMANDS = ("edgectl", "edged", "edge-heartbeat")


def install(prefix: Path, *extra: str) -> list[str]:
    """Runs install-node into prefix; returns its stdout lines."""
    out = subprocess.run(
        [str(TOOL), "--prefix", str(prefix), "--no-bootstrap", "--no-venv", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout.splitlines()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with what a change would touch: content, mode, mtime, link target."""
    seen = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        key = str(path.relative_to(root))
        if path.is_symlink():
            seen[key] = ("link", os.readlink(path))
        elif path.is_file():
            seen[key] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, path.read_bytes())
        else:
            seen[key] = ("dir", stat.S_IMODE(st.st_mode))
    return seen


def test_files_land_where_an_operator_expects_them(tmp_path):
    lines = install(tmp_path)

    assert all(line.startswith("install-node: ") for line in lines)
    assert len(lines) == 1 + len(COMMANDS) + 2  # source tree, links, unit, config
    src = tmp_path / "opt/edge/src"
    for rel in (
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "README.md",
        "controlplane/config.py",
        "controlplane/edged/sdnotify.py",
        "bpf/edge_xdp.c",
        "bpf/include/abi.h",
        "edge/edge.yaml",
    ):
        assert (src / rel).read_bytes() == (REPO / rel).read_bytes(), rel
    assert not list(src.rglob("__pycache__"))
    for name in COMMANDS:
        link = tmp_path / "usr/local/bin" / name
        assert os.readlink(link) == str(tmp_path / "opt/edge/venv/bin" / name)
    unit = tmp_path / "etc/systemd/system/edged.service"
    assert unit.read_bytes() == (REPO / "edge/edged.service").read_bytes()
    assert "ExecStart=/usr/local/bin/edged --config /etc/edge/edge.yaml" in unit.read_text()


def test_the_example_lands_beside_the_live_config_which_the_operator_writes(tmp_path):
    """The example (iface eth0, demo VIPs, public heartbeat tokens) never becomes the live config:
    edged would deploy it. It goes beside it, and the output says what to edit."""
    lines = install(tmp_path)

    assert not (tmp_path / "etc/edge/edge.yaml").exists()
    example = tmp_path / "etc/edge/edge.yaml.example"
    assert example.read_bytes() == (REPO / "edge/edge.yaml").read_bytes()
    (said,) = [line for line in lines if "edge.yaml" in line]
    assert str(example) in said and "/etc/edge/edge.yaml" in said
    for what in ("node.iface", "vip", "backends", "token", "edgectl validate", "systemctl enable --now edged"):
        assert what in said, what


def test_a_second_run_changes_nothing_and_says_nothing(tmp_path):
    install(tmp_path)
    before = snapshot(tmp_path)
    assert install(tmp_path) == []
    assert snapshot(tmp_path) == before


def test_an_operators_config_is_never_overwritten(tmp_path):
    conf = tmp_path / "etc/edge/edge.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text("version: 1  # mine\n")
    lines = install(tmp_path)
    assert conf.read_text() == "version: 1  # mine\n"
    (said,) = [line for line in lines if "edge.yaml" in line]
    assert "edge.yaml.example" in said and "copy" not in said


def test_a_live_config_that_is_still_the_example_is_left_alone_and_named(tmp_path):
    """An earlier install-node made the example live; it stays (edged may run it), with a warning
    on every run until it is edited."""
    conf = tmp_path / "etc/edge/edge.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_bytes((REPO / "edge/edge.yaml").read_bytes())
    for _ in range(2):
        lines = install(tmp_path)
        assert conf.read_bytes() == (REPO / "edge/edge.yaml").read_bytes()
        warned = [line for line in lines if line.startswith(f"install-node: warning: {conf} is still the example")]
        assert len(warned) == 1 and "token" in warned[0], lines


def test_a_changed_unit_and_stale_source_files_are_put_right(tmp_path):
    install(tmp_path)
    unit = tmp_path / "etc/systemd/system/edged.service"
    unit.write_text("[Service]\nExecStart=/bin/false\n")
    stale = tmp_path / "opt/edge/src/controlplane/retired.py"
    stale.write_text("")

    lines = install(tmp_path)

    assert unit.read_bytes() == (REPO / "edge/edged.service").read_bytes()
    assert not stale.exists()
    assert len(lines) == 2, lines
    assert "(0 files written, 1 removed)" in lines[0] and "edged.service" in lines[1]


def test_dry_run_says_what_it_would_do_and_writes_nothing(tmp_path):
    lines = install(tmp_path, "--dry-run")
    assert lines and all(line.startswith("install-node: [dry run] ") for line in lines)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, rc, text",
    [
        (["--help"], 0, "--prefix DIR"),
        (["--prefix", "relative/dir"], 2, "--prefix must be an absolute path"),
        (["--frobnicate"], 2, "unknown argument '--frobnicate'"),
    ],
    ids=["help", "relative-prefix", "unknown"],
)
def test_arguments(args, rc, text):
    out = subprocess.run([str(TOOL), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == rc
    assert text in out.stdout + out.stderr
