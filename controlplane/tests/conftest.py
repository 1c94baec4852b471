"""Fixtures shared by several test modules: the API tests' (test_api*.py, over apistage.py) an
asyncio loop in a thread (lt), a short socket directory (sockdir) and the stand-in daemon served
on a unix socket (edged); the heartbeat agent tests' health endpoint (server, heartbeatstage.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

from controlplane.config import Node
from controlplane.tests.apistage import LoopThread, Served, serving
from controlplane.tests.heartbeatstage import HealthServer


@pytest.fixture
def lt() -> Iterator[LoopThread]:
    t = LoopThread()
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def sockdir() -> Iterator[str]:
    """A short path (unix socket paths are limited to 107 bytes) any user may traverse."""
    d = tempfile.mkdtemp(prefix="edge-api-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def edged(lt, sockdir) -> Iterator[Served]:
    with serving(lt, Node(api_socket=os.path.join(sockdir, "run", "edged.sock"))) as served:
        yield served


@pytest.fixture
def server() -> Iterator[HealthServer]:
    srv = HealthServer()
    try:
        yield srv
    finally:
        srv.kill()
