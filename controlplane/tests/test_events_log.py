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
        "bgp: withdrew 198.18.255.1 (not serving: test)"]


def test_a_text_event_too():
    out = _run("text")
    assert (out.stdout, out.stderr) == ("kept\n", "edged: bgp: withdrew 198.18.255.1 (not serving: test)\n")
