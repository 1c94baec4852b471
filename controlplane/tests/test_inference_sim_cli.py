"""controlplane.lab.inference (sim-inference) as a command: options it refuses, each naming the
option (Options.check), usage errors in one line with exit 2, --help naming every flag, the
process exiting 0 on SIGTERM, SIGINT and a die knob, and the tools/sim-inference wrapper. The
server's behaviour over HTTP and its heartbeats are test_inference_sim.py's.

Every process a test starts is stopped by the test; every wait has a bound.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from controlplane.lab.inference import Knobs, Options, UsageError

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
TIMEOUT_S = 5.0


@pytest.mark.parametrize(
    "opts, message",
    [
        (Options(max_running=0), "--max-running: "),
        (Options(ttft_ms=-1), "--ttft-ms: "),
        (Options(knobs=Knobs(kv_usage=2.0)), "--kv-usage: "),
        (Options(knobs=Knobs(die=True)), "die: "),
        (Options(heartbeat="127.0.0.1:7946"), "--heartbeat and --token"),
        (Options(heartbeat="router", token="1"), "--heartbeat: "),
        (Options(heartbeat="127.0.0.1", token="x"), "--token: "),
        (Options(host="localhost", heartbeat="127.0.0.1", token="1"), "--listen: "),
    ],
)
def test_bad_options_are_refused_naming_the_option(opts, message):
    with pytest.raises(UsageError) as e:
        opts.check()
    assert str(e.value).startswith(message)


# ------------------------------------------------------------ the command line


def start_cli(*args: str) -> tuple[subprocess.Popen, tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.lab.inference", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(TIMEOUT_S * 2)
    if not line or not line[0].startswith("listening "):
        proc.kill()
        proc.wait()
        pytest.fail(f"no listening line: {line!r} {proc.stderr.read()!r}")
    host, _, port = line[0].split()[2].rpartition(":")
    return proc, (host, int(port))


def stopped(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.mark.parametrize("how", ["sigterm", "sigint", "die"])
def test_the_process_exits_0_on_sigterm_sigint_and_die(how):
    proc, addr = start_cli("--name", "c0", "--listen", f"{LOOPBACK}:0", "--max-running", "2")
    try:
        conn = http.client.HTTPConnection(*addr, timeout=TIMEOUT_S)
        conn.request("GET", "/")
        assert json.loads(conn.getresponse().read())["backend"] == "c0"
        if how == "die":
            conn.request("POST", "/sim/degrade", body=b'{"die": true}')
            assert conn.getresponse().status == 200
        else:
            proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        conn.close()
        assert stopped(proc) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--listen", "127.0.0.1:0"], "the following arguments are required: --name"),
        (["--name", "x", "--listen", "nowhere"], "--listen: 'nowhere' is not ADDR:PORT"),
        (["--name", "x", "--fill-queue", "-2"], "--fill-queue: -2 is not an integer >= 0"),
        (["--name", "x", "--token", "5"], "--heartbeat and --token: give both or neither"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, message):
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.lab.inference", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 2,
    )

    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr


def test_help_documents_every_flag():
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.lab.inference", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 2,
    )

    assert done.returncode == 0
    for flag in (
        "--name",
        "--listen",
        "--model",
        "--max-running",
        "--max-waiting",
        "--ttft-ms",
        "--tpot-ms",
        "--kv-capacity-tokens",
        "--added-latency-ms",
        "--fill-queue",
        "--kv-usage",
        "--hang",
        "--not-ready",
        "--metrics-off",
        "--tpot-factor",
        "--heartbeat",
        "--token",
        "--hb-interval-ms",
    ):
        assert flag in done.stdout, flag


def test_the_tools_wrapper_runs_the_module():
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("tools/sim-inference runs the repo's .venv, which tools/bootstrap creates")
    done = subprocess.run(
        [str(REPO / "tools" / "sim-inference"), "--help"], capture_output=True, text=True, timeout=TIMEOUT_S * 2
    )
    assert done.returncode == 0 and "--max-running" in done.stdout
