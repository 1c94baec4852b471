"""edgectl's API commands as a subprocess against a real API socket (apistage.py's stand-in
daemon behind it): drains and weights, one-line errors, reload, events (and Ctrl-C), status
from edged and from the maps when no edged answers.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading

from controlplane import cli, statuspage
from controlplane.api.client import Client
from controlplane.errors import NotRunning
from controlplane.tests.apistage import CALL_TIMEOUT_S, REPO, SNAP, edgectl, wait_until

# ---------------------------------------------------------------- edgectl through a real socket


def test_edgectl_drain_undrain_and_weight(edged):
    sock = ("--socket", edged.path)
    outs = [
        edgectl("drain", "chat", "b0", *sock),
        edgectl("undrain", "chat", "b0", *sock),
        edgectl("weight", "chat", "b1", "0", *sock),
        edgectl("weight", "chat", "b1", "--clear", *sock),
        edgectl("weight", "chat", "b1", "50%", *sock),
    ]
    assert [(o.returncode, o.stdout, o.stderr) for o in outs] == [
        (0, "drained chat/b0: no new flows; established flows stay\n", ""),
        (0, "undrained chat/b0\n", ""),
        (0, "chat/b1: weight pinned at 0 (0% of the best backend's 3)\n", ""),
        (0, "chat/b1: weight override cleared\n", ""),
        (
            0,
            "chat/b1: weight pinned at 2 (66.7% of the best backend's 3)\n",  # 50% of 3, rounded
            "edgectl: note: 50% of the best backend's weight 3 is 2 (66.7%): the service's weights are too small "
            "to express it; give its backends larger weights (e.g. 100)\n",
        ),
    ]
    assert edged.daemon.calls == [
        ("drain", "chat", "b0"),
        ("undrain", "chat", "b0"),
        ("snapshot", False),
        ("set_override", "chat", "b1", 0),
        ("set_override", "chat", "b1", None),
        ("snapshot", False),
        ("set_override", "chat", "b1", 2),
    ]


def test_edgectl_errors_are_one_line(edged, sockdir):
    cases = [
        (("drain", "chat", "nope", "--socket", edged.path), 1, "edgectl: unknown backend chat/nope\n"),
        (("weight", "chat", "b0", "--socket", edged.path), 2, "edgectl: weight: give either N, P% or --clear\n"),
        (
            ("weight", "chat", "b0", "70000", "--socket", edged.path),
            2,
            "edgectl: weight: 70000 is out of range 0..65535\n",
        ),
        (
            ("weight", "chat", "b0", "half", "--socket", edged.path),
            2,
            "edgectl: weight: 'half' is not N (0..65535) or a share P% (0..100)\n",
        ),
        (
            ("undrain", "chat", "b0", "--socket", os.path.join(sockdir, "none.sock")),
            3,
            f"edgectl: edged is not running (no API socket at {os.path.join(sockdir, 'none.sock')})\n",
        ),
        (
            ("drain", "chat", "b0", "--socket", edged.path, "--cert", "/c.pem"),
            2,
            "edgectl: --cert, --key and --ca go with --api (the unix socket needs no TLS)\n",
        ),
    ]
    outs = [edgectl(*args) for args, _, _ in cases]
    assert [(o.returncode, o.stdout, o.stderr) for o in outs] == [(code, "", err) for _, code, err in cases]
    assert edged.daemon.calls == []


VALID = (
    "version: 1\nservices:\n- {name: chat, vip: 198.18.255.1, port: 8000,\n"
    "   backends: [{name: b0, address: 198.18.1.2, port: 8000}]}\n"
)


def test_edgectl_reload_sends_the_files_text(edged, tmp_path):
    (tmp_path / "edge.yaml").write_text(VALID)
    out = edgectl("reload", "--config", "edge.yaml", "--socket", edged.path, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == (
        "reloaded: services added: embed; services changed: chat; backends added: chat/b2; "
        "backends removed: chat/b1; backends draining: chat/b1\n"
    )
    plain = edgectl("reload", "--socket", edged.path)
    assert (plain.returncode, plain.stderr) == (0, "")
    assert edged.daemon.calls == [("reload", VALID), ("reload", None)]
    os.mkfifo(tmp_path / "fifo")  # edgectl reads the file itself, with the same cap and checks
    fifo = edgectl("reload", "--config", str(tmp_path / "fifo"), "--socket", edged.path)
    assert (fifo.returncode, fifo.stderr) == (1, f"edgectl: config: {tmp_path / 'fifo'} is not a regular file\n")
    assert len(edged.daemon.calls) == 2


def test_edgectl_reload_refuses_a_bad_file_naming_it_before_edged_sees_it(edged, tmp_path):
    """A YAML error was reported as 'config_text ...' (edged's name for the text) before."""
    bad = tmp_path / "broken.yaml"
    bad.write_text("services: [\n")
    out = edgectl("reload", "--config", str(bad), "--socket", edged.path)
    assert out.returncode == 1 and out.stderr.startswith(f"edgectl: config: {bad} line 2: "), out.stderr
    assert "config_text" not in out.stderr and len(out.stderr.splitlines()) == 1
    (tmp_path / "invalid.yaml").write_text(VALID.replace("8000", "70000", 1))
    invalid = edgectl("reload", "--config", str(tmp_path / "invalid.yaml"), "--socket", edged.path)
    assert (invalid.returncode, invalid.stderr) == (1, "edgectl: services[0].port: 70000 is not a port\n")
    assert edged.daemon.calls == []


def _start_edgectl(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_edgectl_events_prints_count_events_as_json(edged):
    proc = _start_edgectl("events", "--kind", "state", "--count", "2", "--json", "--socket", edged.path)
    try:
        wait_until(edged.subscribers, timeout_s=15, what="edgectl to subscribe")
        edged.emit("progress", "not asked for")
        edged.emit("state", "chat/b0: up -> down", service="chat", backend="b0", new="down")
        edged.emit("state", "chat/b0: down -> up", service="chat", backend="b0", new="up")
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
        proc.wait(5)
    assert (proc.returncode, err) == (0, "")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["kind"], e["text"], e["backend"], e["new"]) for e in lines] == [
        ("state", "chat/b0: up -> down", "b0", "down"),
        ("state", "chat/b0: down -> up", "b0", "up"),
    ]


def test_edgectl_events_ends_quietly_on_ctrl_c(edged):
    proc = _start_edgectl("events", "--socket", edged.path)
    try:
        wait_until(edged.subscribers, timeout_s=15, what="edgectl to subscribe")
        edged.emit("weights", "chat: weights b0 1->3", service="chat")
        assert select.select([proc.stdout], [], [], 10)[0], "no event line within 10s"
        assert "chat: weights b0 1->3" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait(5)
    assert (proc.returncode, err) == (0, "")
    wait_until(lambda: edged.subscribers() == 0, what="edged to drop the watch")


def test_edgectl_events_ends_quietly_on_ctrl_c_in_the_middle_of_a_fast_stream(edged):
    """Ctrl-C while events pour in lands anywhere in grpc's iterator; edgectl still ends at
    once with status 0 and nothing on stderr (it cancels the call instead of raising there)."""
    for attempt in range(5):
        proc = _start_edgectl("events", "--socket", edged.path)
        stop = threading.Event()

        def pump(stop=stop):
            for n in range(20000):  # bounded: stops by itself
                if stop.is_set():
                    return
                edged.emit("weights", f"chat: weights push {n}", service="chat")

        pumper = threading.Thread(target=pump, daemon=True)
        try:
            wait_until(edged.subscribers, timeout_s=15, what="edgectl to subscribe")
            pumper.start()
            for _ in range(20 + 40 * attempt):
                assert select.select([proc.stdout], [], [], 10)[0], "no event line within 10s"
                proc.stdout.readline()
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=10)
        finally:
            stop.set()
            proc.kill()
            proc.wait(5)
            pumper.join(10) if pumper.is_alive() else None
        assert (proc.returncode, err) == (0, ""), f"attempt {attempt}"
        wait_until(lambda: edged.subscribers() == 0, what="edged to drop the watch")


def test_edgectl_status_shows_edgeds_view(edged):
    out = edgectl("status", "--json", "--socket", edged.path)
    assert (out.returncode, out.stderr) == (0, "")
    (snap,) = json.loads(out.stdout)
    assert snap.pop("edged")["pid"] == os.getpid()
    # every key status can have is there (statusview.same_shape), None where this edged has nothing
    # with the view edgectl asks for (statuspage): two backends, below the summary's threshold
    services = [
        {**s, "summary": statuspage.summarize(s), "backends_total": len(s["backends"]), "backends_offset": 0}
        for s in SNAP["services"]
    ]
    assert snap == {
        **SNAP,
        "services": services,
        "fleet": None,
        "conntrack_partial": None,
        "summarized": False,
        "stopped_early": [],
        "probe_budget": None,
    }
    table = edgectl("status", "--socket", edged.path)
    assert (table.returncode, table.stderr) == (0, "")
    lines = table.stdout.splitlines()
    assert lines[0].startswith("eth-test  (XDP native, prog 42; instance eth-test-4026531840; edged ")
    assert any(
        line.split()[:2] == ["b0", "198.18.1.2:8000"] and "1.5/4.2ms" in line and "q 4+2 kv 38%" in line
        for line in lines
    )
    assert "    b0: weight pinned at 3 by an operator (edgectl weight --clear to end it)" in lines
    # edged does not know b1 yet: what it last wrote to the maps says drained
    assert "    b1: drained by an operator (edgectl undrain to end it)" in lines
    assert "    b1: probe timeouts" in lines


def test_status_reads_the_maps_when_no_edged_answers(monkeypatch, capsys, sockdir):
    import socket as sk

    from controlplane import deploy

    asked = []
    monkeypatch.setattr(deploy, "status", lambda pin_dir, iface, count_conntrack: asked.append(iface) or [])
    missing = os.path.join(sockdir, "none.sock")
    stale = os.path.join(sockdir, "stale.sock")
    s = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    s.bind(stale)
    s.close()
    assert cli.main(["status", "--socket", missing]) == 0
    assert cli.main(["status", "--socket", stale, "--iface", "eth9"]) == 0
    assert asked == [None, "eth9"]
    assert capsys.readouterr().out == "nothing deployed in this network namespace\n" * 2


def test_a_socket_that_appears_between_the_call_and_the_diagnosis_is_still_not_running(tmp_path):
    """edged starting: grpc found no socket file, and by the time the client looks why, edged
    has bound it. The call failed because edged was not running yet; callers waiting for a
    starting edged retry on NotRunning (seen as a flake of test_ecmp's restart test)."""
    import socket as socketlib

    path = str(tmp_path / "edged.sock")
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        with Client(socket_path=path, timeout_s=CALL_TIMEOUT_S) as c:
            err = c._unreachable(
                f"failed to connect to all addresses; last error: FAILED_PRECONDITION: "
                f"unix:{path}: connect failed: addr: unix:{path} error: No such file or directory"
            )
        assert isinstance(err, NotRunning), err
        assert str(err) == f"edged is not running (no API socket at {path})"
    finally:
        listener.close()
