"""edgectl's command line as an operator meets it, run as a real process: exit codes (0 ok,
1 refused, 2 usage, 3 environment, 4 internal), global flags after the command, the node's
config read by default, a closed pipe, running without root, validate's every error, --json
and the generated bash completion."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli import exits
from controlplane.errors import CompileError, ConfigError, NotRunning
from controlplane.tests.apistage import REPO

EDGE_YAML = REPO / "edge" / "edge.yaml"


def edgectl(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """edgectl ARGS as a process, with env (default: no node config of this host's)."""
    env = env if env is not None else no_node_config(Path("/nonexistent"))
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        capture_output=True,
        text=True,
        timeout=20.0,
        env=env,
        cwd=kw.pop("cwd", REPO),
        **kw,
    )


def no_node_config(tmp_path: Path) -> dict:
    """An environment whose node config is none of this host's (EDGE_CONFIG to a missing file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    return {**env, "PYTHONPATH": str(REPO), "EDGE_CONFIG": str(tmp_path / "absent.yaml")}


def write(path: Path, doc: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(doc))
    return path


def service(**extra) -> dict:
    return {
        "name": "chat",
        "vip": "198.18.255.1",
        "port": 8000,
        "backends": [{"name": "b0", "address": "198.18.1.2", "port": 8000}],
        **extra,
    }


# ---------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    "exc, code",
    [
        (ConfigError("services[0].port: 70000 is not a port"), exits.REFUSED),
        (exits.UsageError("weight: give either N, P% or --clear"), exits.USAGE),
        (CompileError("cannot compile the data path"), exits.HOST),
        (NotRunning("edged is not running"), exits.HOST),
        (PermissionError(13, "Permission denied", "/run/edge/x.lock"), exits.HOST),
        (ZeroDivisionError("division by zero"), exits.INTERNAL),
    ],
)
def test_each_kind_of_failure_has_its_exit_code(exc, code):
    assert exits.classify(exc)[0] == code


def test_help_lists_the_exit_codes():
    out = edgectl("--help")
    assert out.returncode == 0
    for line in ("0  ok", "1  refused", "2  usage", "3  environment", "4  internal"):
        assert line in out.stdout


def test_a_usage_error_exits_2_and_a_refused_config_1(tmp_path):
    env = no_node_config(tmp_path)
    assert edgectl("status", "--no-such-flag", env=env).returncode == 2
    bad = write(tmp_path / "bad.yaml", {"version": 1, "services": [service(port=70000)]})
    out = edgectl("validate", "--config", str(bad), env=env)
    assert (out.returncode, out.stderr) == (1, "edgectl: services[0].port: 70000 is not a port\n")


# ---------------------------------------------------------------- global flags, --json


def test_global_flags_work_after_the_command(tmp_path):
    env = no_node_config(tmp_path)
    before = edgectl("--json", "validate", "--config", str(EDGE_YAML), env=env)
    after = edgectl("validate", "--config", str(EDGE_YAML), "--json", "-q", env=env)
    assert before.returncode == after.returncode == 0, after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert json.loads(after.stdout)["config"] == str(EDGE_YAML) and json.loads(after.stdout)["ok"]
    assert (json.loads(after.stdout)["services"], json.loads(after.stdout)["backends"]) == (2, 5)
    debug = edgectl("validate", "--config", str(tmp_path / "none.yaml"), "--debug", env=env)
    assert debug.returncode == 1 and "Traceback" in debug.stderr  # --debug after the command


# ---------------------------------------------------------------- validate: every error


def test_validate_reports_every_error_not_only_the_first(tmp_path):
    doc = {
        "version": 1,
        "node": {"maglev_m": 10},
        "services": [
            service(port=70000),
            {
                "name": "embed",
                "vip": "nope",
                "port": 9000,
                "colour": "red",
                "backends": [{"name": "e0", "address": "198.18.2.2", "port": 0}],
            },
        ],
    }
    out = edgectl("validate", "--config", str(write(tmp_path / "bad.yaml", doc)), env=no_node_config(tmp_path))
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and out.stdout == ""
    assert [line.split(":")[1].strip() for line in lines[:-1]] == [
        "node.maglev_m",
        "services[0].port",
        "services[1].colour",
        "services[1].vip",
        "services[1].backends[0].port",
    ], out.stderr
    assert lines[-1] == f"edgectl: {tmp_path / 'bad.yaml'}: 5 errors"
    as_json = edgectl("validate", "--json", "--config", str(tmp_path / "bad.yaml"), env=no_node_config(tmp_path))
    assert as_json.returncode == 1 and len(json.loads(as_json.stdout)["errors"]) == 5


# ---------------------------------------------------------------- the node's config


def test_status_reads_pin_dir_from_the_nodes_config(tmp_path):
    """With a custom pin_dir status looked under /sys/fs/bpf/edge and said "nothing deployed"."""
    custom = tmp_path / "pins"
    custom.mkdir()
    node_yaml = write(tmp_path / "edge.yaml", {"version": 1, "node": {"pin_dir": str(custom)}, "services": [service()]})
    env = no_node_config(tmp_path)
    by_flag = edgectl("status", "--maps", "--config", str(node_yaml), env=env)
    by_env = edgectl("status", "--maps", env={**env, "EDGE_CONFIG": str(node_yaml)})
    for out in (by_flag, by_env):  # tmp is no bpffs: the error names the config's pin_dir
        assert out.returncode == 3 and out.stderr.startswith(f"edgectl: {custom} is not on a bpffs"), out.stderr


def test_the_socket_comes_from_the_nodes_config(tmp_path):
    sock = tmp_path / "run" / "edged.sock"
    node_yaml = write(
        tmp_path / "edge.yaml", {"version": 1, "node": {"api_socket": str(sock)}, "services": [service()]}
    )
    out = edgectl("drain", "chat", "b0", env={**no_node_config(tmp_path), "EDGE_CONFIG": str(node_yaml)})
    assert (out.returncode, out.stderr) == (3, f"edgectl: edged is not running (no API socket at {sock})\n")


# ---------------------------------------------------------------- pipes and privileges


def test_a_reader_that_goes_away_ends_edgectl_quietly(tmp_path):
    """`edgectl status | head -1` said 'internal error: BrokenPipeError' with exit 2."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before edgectl writes
    try:
        done = subprocess.run(
            [sys.executable, "-m", "controlplane", "completion", "bash"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=20,
            env=no_node_config(tmp_path),
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.skipif(os.geteuid() != 0, reason="running edgectl as another user needs root")
def test_without_root_edgectl_says_so_in_one_line(tmp_path):
    """As non-root it said 'internal error: PermissionError ...'."""
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    env = {**no_node_config(tmp_path), "EDGE_LOCK_DIR": str(locks), "EDGE_PIN_DIR": "/sys/fs/bpf/edge"}
    out = edgectl(
        "undeploy", "--iface", "lo", env=env, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], cwd="/"
    )
    assert out.returncode == 3, out.stderr
    assert len(out.stderr.splitlines()) == 1 and "permission denied: edgectl needs root" in out.stderr
    assert "internal error" not in out.stderr


# ---------------------------------------------------------------- completion


def complete(words: list[str], script: str, tmp_path: Path) -> list[str]:
    (tmp_path / "edgectl.bash").write_text(script)
    cword = len(words) - 1
    line = " ".join(f"'{w}'" for w in words)
    probe = (
        f"source {tmp_path / 'edgectl.bash'}; COMP_WORDS=({line}); COMP_CWORD={cword}; _edgectl; "
        f"printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    done = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_knows_commands_flags_and_choices(tmp_path):
    out = edgectl("completion", "bash", env=no_node_config(tmp_path))
    assert out.returncode == 0
    script = out.stdout
    assert complete(["edgectl", "dr"], script, tmp_path) == ["drain", "drain-node", "drill"]
    assert complete(["edgectl", "drill", "failover", "--mode", ""], script, tmp_path) == ["heartbeat", "link", "kill"]
    assert "--conntrack" in complete(["edgectl", "-q", "status", "--"], script, tmp_path)
    assert complete(["edgectl", "fleet", "st"], script, tmp_path) == ["status"]
    assert complete(["edgectl", "weight", "--cle"], script, tmp_path) == ["--clear"]


def test_zsh_completion_is_generated_from_the_same_definitions(tmp_path):
    out = edgectl("completion", "zsh", env=no_node_config(tmp_path))
    assert out.returncode == 0 and out.stdout.startswith("#compdef edgectl\n")
    assert '"drill failover|--mode") echo "heartbeat link kill"' in out.stdout


@pytest.mark.parametrize(
    "module, prog",
    [("controlplane", "edgectl"), ("controlplane.agent", "edge-heartbeat"), ("controlplane.edged.cli", "edged")],
)
def test_every_program_says_its_version(module, prog):
    from controlplane import __version__

    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        timeout=20,
        env=no_node_config(Path("/nonexistent")),
        cwd=REPO,
    )
    assert (done.returncode, done.stdout) == (0, f"{prog} {__version__}\n"), done.stderr


@pytest.mark.parametrize(
    "text, scale, weight",
    [
        ("50%", 10_000, 5000),
        ("0.04%", 10_000, 4),
        ("0%", 10_000, 0),
        ("100%", 10_000, 10_000),
        ("50%", 1, 1),  # a share is never a drain, even where the scale cannot show it
        ("7", 10_000, 7),
    ],
)
def test_weight_takes_a_share_of_the_services_scale(text, scale, weight):
    from controlplane.cli.served import parse_weight, share_to_weight

    n, pct = parse_weight(text)
    assert (n if pct is None else share_to_weight(pct, scale)) == weight


@pytest.mark.parametrize(
    "pct, scale, warned",
    [(50, 1, True), (30, 2, True), (50, 10_000, False), (33, 3, False), (100, 1, False), (0, 1, False)],
)
def test_a_share_the_services_weights_cannot_express_is_said(pct, scale, warned):
    """`edgectl weight web b0 50%` on static weights of 1 pins 1 (100 %): said in one line, not silently."""
    from controlplane.cli.served import share_note, share_to_weight

    note = share_note(pct, share_to_weight(pct, scale), scale)
    assert (note is not None) == warned
    if warned:
        assert f"{pct:g}%" in note and "weights" in note
