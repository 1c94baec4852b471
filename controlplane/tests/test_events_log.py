"""The event log reaches stderr even while the loader routes fd 2 to a buffer: bcc's
compiles and attaches run in worker threads (deploy, reload, the watch's repair) while
edged's loop goes on emitting events. A fleet test lost r0's BGP withdraw event this way:
the line went into the buffer of the watch's XDP attach. Run in a child process, whose fd 2
is a real pipe (pytest's own capture would stand in for sys.stderr)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import sys
from controlplane import loader
from controlplane.edged.events import Events
events = Events(json_lines=sys.argv[1] == "json")
with loader._captured_stderr((1, 2)) as log:
    events.emit("bgp", "bgp: withdrew 198.18.255.1 (not serving: test)")
    swallowed = log()
print("swallowed" if "withdrew" in swallowed else "kept")
"""


def _run(fmt: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, fmt], capture_output=True, text=True, timeout=30)


def test_a_json_event_emitted_while_fd2_is_captured_reaches_the_log():
    out = _run("json")
    assert out.stdout == "kept\n"
    assert [json.loads(ln)["text"] for ln in out.stderr.splitlines()] == [
        "bgp: withdrew 198.18.255.1 (not serving: test)"
    ]


def test_a_text_event_too():
    out = _run("text")
    assert (out.stdout, out.stderr) == ("kept\n", "edged: info: bgp: withdrew 198.18.255.1 (not serving: test)\n")


# ---------------------------------------------------------------- levels, journald

LEVELS_CHILD = """
import sys
from controlplane.edged.events import Events, LEVELS
events = Events(json_lines=sys.argv[1] == "json", level=LEVELS[sys.argv[2]])
events.emit("weights", "web: weights b0 1->2")
events.emit("state", "web/b0: up -> down", new="down")
events.emit("reload-rejected", "reload rejected, the running config stays: services[0].port: 0 is not a port")
"""


def _levels(fmt: str, level: str, journal_stream: bool = False) -> str:
    """The child's stderr; with journal_stream, stderr is a pipe JOURNAL_STREAM names (as systemd does)."""
    import os

    read_end, write_end = os.pipe()
    st = os.fstat(write_end)
    env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}" if journal_stream else ""}
    try:
        done = subprocess.run([sys.executable, "-c", LEVELS_CHILD, fmt, level], stderr=write_end, env=env, timeout=30)
    finally:
        os.close(write_end)
    with os.fdopen(read_end) as f:
        out = f.read()
    assert done.returncode == 0, out
    return out


def test_every_text_line_names_its_level():
    assert _levels("text", "info").splitlines() == [
        "edged: info: web: weights b0 1->2",
        "edged: warning: web/b0: up -> down",
        "edged: error: reload rejected, the running config stays: services[0].port: 0 is not a port",
    ]


def test_under_journald_lines_carry_priority_prefixes_and_no_program_name():
    assert _levels("text", "info", journal_stream=True).splitlines() == [
        "<6>web: weights b0 1->2",
        "<4>web/b0: up -> down",
        "<3>reload rejected, the running config stays: services[0].port: 0 is not a port",
    ]


def test_json_lines_carry_a_severity_and_the_log_level_quiets_weight_pushes():
    lines = [json.loads(line) for line in _levels("json", "notice").splitlines()]
    assert [(e["kind"], e["severity"]) for e in lines] == [("state", "warning"), ("reload-rejected", "error")]
    journal = _levels("json", "error", journal_stream=True).splitlines()
    assert len(journal) == 1 and journal[0].startswith("<3>{") and json.loads(journal[0][3:])["severity"] == "error"


def test_a_config_error_at_start_is_one_error_line_and_the_status_systemd_does_not_restart(tmp_path):
    from controlplane.edged.cli import EXIT_CONFIG

    bad = tmp_path / "edge.yaml"
    bad.write_text("version: 1\nservices: []\n")
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.edged.cli", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stderr) == (EXIT_CONFIG, "edged: error: services: must not be empty\n")
