"""A second edged for a router that one already runs is told so (the owner lock) before it
touches anything the first one holds, such as the metrics port: the real Daemon.start, with
the first edged's lock held by this test and its metrics port bound."""

from __future__ import annotations

import asyncio
import socket

import pytest

from controlplane import deploy
from controlplane.config import parse_config
from controlplane.edged import Daemon, Events
from controlplane.errors import LoaderError


def test_a_second_edged_meets_the_lock_before_the_metrics_port(tmp_path, monkeypatch):
    monkeypatch.setenv(deploy.LOCK_DIR_ENV, str(tmp_path))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cfg = parse_config(
        {
            "version": 1,
            "node": {"metrics_listen": f"127.0.0.1:{port}"},
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "backends": [{"name": "b0", "address": "198.18.1.2", "port": 8000}],
                }
            ],
        }
    )
    second = Daemon(cfg, "eth-test", Events())
    first = deploy.NodeLock(second.state.instance, "eth-test")  # the first edged's
    first.acquire()
    try:
        with pytest.raises(LoaderError, match=r"^eth-test: another writer holds this router"):
            asyncio.run(second.start())  # said "Address already in use" before
    finally:
        asyncio.run(second.close())
        first.release()
        taken.close()
