"""Who may use edged's API socket, under the shipped unit: members of node.api_group
may, other local users may not. Real users and a real group (created here, removed
after, also when a test fails), a real socket made the way edged makes it (api/server.py)
in a directory made the way systemd makes RuntimeDirectory= (root:root, the unit's
RuntimeDirectoryMode), and a client process running as each user.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from controlplane.api import server
from controlplane.config import Node
from controlplane.edged import Events

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "edge" / "edged.service"
PREFIX = "edgetest-api"  # every user and group made here starts with it
GROUP, MEMBER, OTHER = f"{PREFIX}-g", f"{PREFIX}-m", f"{PREFIX}-o"


def unit_value(key: str) -> str:
    values = [
        line.split("=", 1)[1].strip() for line in UNIT.read_text().splitlines() if line.strip().startswith(f"{key}=")
    ]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def accounts():
    """GROUP, MEMBER (in GROUP) and OTHER (not in it); removed afterwards whatever happens."""
    made: list[tuple[str, str]] = []
    try:
        _run("groupadd", "--system", GROUP)
        made.append(("groupdel", GROUP))
        for user, groups in ((MEMBER, [GROUP]), (OTHER, [])):
            _run(
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                *(["--groups", ",".join(groups)] if groups else []),
                user,
            )
            made.append(("userdel", user))
        yield
    finally:
        for tool, name in reversed(made):
            subprocess.run([tool, name], capture_output=True, timeout=30)


class Daemon:
    """What the API server needs of edged for a health check: its event hub."""

    config_path = None
    not_serving = ""

    def __init__(self):
        self.events = Events()


def serve(node: Node):
    """The API server on a loop in a thread; returns (stop, handle)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    handle = asyncio.run_coroutine_threadsafe(server.start(Daemon(), node), loop).result(30)

    def stop():
        asyncio.run_coroutine_threadsafe(handle.stop(0.2), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return stop


def health_as(user: str, socket_path: str) -> subprocess.CompletedProcess:
    """grpc.health.v1 Check on the socket from a process running as user, with the groups the
    user database gives it (as a login would)."""
    pw = pwd.getpwnam(user)
    code = (
        "import sys\nfrom controlplane.api.client import Client\nfrom controlplane.errors import EdgeError\n"
        "try:\n    print(Client(sys.argv[1], timeout_s=10).health())\n"
        "except EdgeError as e:\n    print(e)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, socket_path],
        capture_output=True,
        text=True,
        timeout=60,
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=os.getgrouplist(user, pw.pw_gid),
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd="/",
    )


def test_api_group_members_reach_the_socket_and_other_users_do_not(accounts):
    run = Path(tempfile.mkdtemp(prefix="edgetest-run-"))  # stands in for /run
    try:
        os.chmod(run, 0o755)
        runtime = run / unit_value("RuntimeDirectory")
        runtime.mkdir(mode=int(unit_value("RuntimeDirectoryMode"), 8))  # systemd: root:root, this mode
        os.chmod(runtime, int(unit_value("RuntimeDirectoryMode"), 8))
        path = str(runtime / "edged.sock")
        stop = serve(Node(api_socket=path, api_group=GROUP))
        try:
            member, other = health_as(MEMBER, path), health_as(OTHER, path)
        finally:
            stop()
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(run)], timeout=30)
    assert (member.returncode, member.stdout.strip(), member.stderr) == (0, "SERVING", "")
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == f"{path}: permission denied (edgectl must run as root or in group {GROUP})"
