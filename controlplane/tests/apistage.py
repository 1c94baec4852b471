"""The API tests' stage (test_api*.py): a stand-in daemon (FakeDaemon) holding plain data
behind the real gRPC server, an asyncio loop in a thread for it (LoopThread), the served
handle tests talk to (Served, serving), and edgectl run as a subprocess. Their fixtures
(lt, sockdir, edged) are in conftest.py.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from controlplane import abi, statuspage
from controlplane.api import server
from controlplane.api.client import Client
from controlplane.config import parse_config
from controlplane.edged import Events
from controlplane.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CALL_TIMEOUT_S = 5.0


def wait_until(pred: Callable[[], Any], timeout_s: float = 5.0, what: str = "condition") -> Any:
    """pred()'s first true value; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {value!r})")
        time.sleep(0.01)


# ---------------------------------------------------------------- the stand-in daemon


CONFIG = parse_config(
    {
        "version": 1,
        "services": [
            {
                "name": "chat",
                "vip": "198.18.255.1",
                "port": 8000,
                "backends": [
                    {"name": "b0", "address": "198.18.1.2", "port": 8000},
                    {"name": "b1", "address": "198.18.2.2", "port": 8000, "weight": 2},
                ],
            }
        ],
    }
)


def _backend(bid: int, name: str, address: str, edged: dict) -> dict:
    return {
        "id": bid,
        "name": name,
        "address": address,
        "port": 8000,
        "weight": 3 + bid,
        "standby": bid == 1,
        "state": "up" if bid == 0 else "down",
        "health": {
            "state": "up",
            "usable": True,
            "heartbeat": True,
            "heartbeat_age_s": 0.0125 if bid == 0 else None,
            "rise_count": 3,
            "heartbeat_seq": 2**40 + bid,
            "passive": False,
            "ejected_for_s": 0.0,
            "ejections": 1,
            "syn_outstanding": 0,
            "probation": bid == 1,
        },
        "slots": 600 + bid,
        "probe": {
            "updated_ns": 10**15,
            "config_weight": 1,
            "rtt_p50_us": 1500,
            "rtt_p99_us": 4200,
            "rtt_smoothed_us": 1700,
            "waiting": 4 if bid == 0 else None,
            "running": 2 if bid == 0 else None,
            "kv_permille": 375 if bid == 0 else None,
            "probes_ok": 90,
            "probes_failed": 3,
            "flags": abi.PROBE_F_DRAINED if bid == 1 else 0,
            "override_weight": 0,
            "state": "up",
            "reason": "" if bid == 0 else "probe timeouts",
            "leave_until_s": 0,
        },
        "packets": 1000 + bid,
        "bytes": 2**33 + bid,
        "new_flows": 10 + bid,
        "return_packets": 900 + bid,
        "failovers": bid,
        "edged": edged,
        "wire": {
            "handshake_buckets": [0] * 6 + [40 + bid] + [0] * 17,
            "first_byte_buckets": [0] * 18 + [3] + [0] * 5,
            "handshake_sum_s": 0.004,
            "first_byte_sum_s": 1.2,
            "handshakes": 40 + bid,
            "first_bytes": 3,
            "handshake_p50_s": 9.6e-05,
            "first_byte_p50_s": None if bid else 0.39,
            "opened": 40 + bid,
            "closed": 38,
            "active": 2 + bid,
            "open": 2 + bid,
        },
    }


SNAP = {
    "node": {
        "maglev_m": 65537,
        "max_services": 16,
        "max_backends": 1024,
        "ct_size": 262144,
        "ingress_ifindex": 7,
        "xdp_flags": 2,
        "ip_forward_was": 0,
        "return_ifindex": [8, 9],
        "return_clsact_added": [True, False],
        "answer_ping": True,
    },
    "services": [
        {
            "name": "chat",
            "id": 0,
            "vip": "198.18.255.1",
            "port": 8000,
            "protocol": "tcp",
            "table": 1,
            "existing_flows": "reselect",
            "packets": 2001,
            "bytes": 2**34 + 1,
            "new_flows": 21,
            "return_packets": 1801,
            "failovers": 1,
            "verdicts": {name: 50 + i for i, name in enumerate(abi.CNT_NAMES.values())},
            "drops": {name: 2 * i for i, name in enumerate(abi.DROP_NAMES.values())},
            "discovery": {
                "source": "dns",
                "state": "stale",
                "age_s": 12.5,
                "failures": 3,
                "backends": 2,
                "changes": 4,
                "error": "_chat._tcp.fleet.test.: no server answered (SERVFAIL)",
            },
            "backends": [
                _backend(
                    0,
                    "b0",
                    "198.18.1.2",
                    {
                        "rtt_p50_s": 0.0015,
                        "rtt_p99_s": 0.0042,
                        "rtt_smoothed_s": 0.0017,
                        "rtt_window": [0.0014, 0.0015, 0.0042],
                        "waiting": 4,
                        "running": 2,
                        "kv_usage": 0.375,
                        "load_state": "ok",
                        "hung": False,
                        "probes_ok": 90,
                        "probes_failed": 3,
                        "weight": 3,
                        "config_weight": 1,
                        "state": "up",
                        "reason": "",
                        "drained": False,
                        "override": 3,
                        "fleet_drained": True,
                        "fleet_override": 5,
                        "probe_relaxed": True,
                        "probe_interval_s": 1.0,
                        "wire": {
                            "window_s": 2.0,
                            "handshakes": 12,
                            "first_bytes": 0,
                            "handshake_p50_s": 9.6e-05,
                            "handshake_p99_s": 0.000127,
                            "first_byte_p50_s": None,
                            "first_byte_p99_s": None,
                            "active": 2,
                            "fresh": True,
                        },
                    },
                ),
                _backend(
                    1,
                    "b1",
                    "198.18.2.2",
                    {  # nothing known yet: every optional value absent
                        "rtt_p50_s": None,
                        "rtt_p99_s": None,
                        "rtt_smoothed_s": None,
                        "rtt_window": [],
                        "waiting": None,
                        "running": None,
                        "kv_usage": None,
                        "load_state": None,
                        "hung": None,
                        "probes_ok": None,
                        "probes_failed": None,
                        "weight": None,
                        "config_weight": None,
                        "state": None,
                        "reason": None,
                        "drained": None,
                        "override": None,
                        "fleet_drained": None,
                        "fleet_override": None,
                        "probe_relaxed": None,
                        "probe_interval_s": None,
                        "wire": None,
                    },
                ),
            ],
        }
    ],
    "verdicts": {name: 100 + i for i, name in enumerate(abi.CNT_NAMES.values())},
    "drops": {name: i for i, name in enumerate(abi.DROP_NAMES.values())},
    "no_service": {
        "verdicts": {name: 10 + i for i, name in enumerate(abi.CNT_NAMES.values())},
        "drops": {name: 3 * i for i, name in enumerate(abi.DROP_NAMES.values())},
    },
    "conntrack_entries": None,
    "half_open_entries": None,
    "node_drained": True,
    "node_drained_t": 1764540000.5,
    "bgp": {"announced": [], "withdrawn": {"198.18.255.1": "node drained"}},
    "instance": "eth-test-4026531840",
    "pin_path": "/sys/fs/bpf/edge/v3/eth-test-4026531840",
    "iface": "eth-test",
    "xdp": {"attached": True, "mode": "native", "prog_id": 42},
    "return_ifaces": ["eth-b0", "eth-b1"],
    "reply_xdp_ifaces": ["eth-b0"],
}


class FakeDaemon:
    """The interface server.py calls (see edged.Daemon), over plain data.
    `fail` is raised by the next call that reaches the daemon."""

    def __init__(self):
        self.cfg = CONFIG
        self.iface = "eth-test"
        self.events = Events()  # edged's own: one line per event on stderr
        self.calls: list[tuple] = []
        self.fail: BaseException | None = None

    def _check(self, service: str, backend: str | None = None) -> None:
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        services = {s.name: s for s in self.cfg.services}
        if service not in services:
            raise LookupError(f"unknown service {service!r}")
        if backend is not None and backend not in {b.name for b in services[service].backends}:
            raise LookupError(f"unknown backend {service}/{backend}")

    def snapshot(self, count_conntrack: bool = False, view: statuspage.View | None = None) -> dict:
        self.calls.append(("snapshot", count_conntrack))
        snap = copy.deepcopy(SNAP)
        if count_conntrack:
            snap["conntrack_entries"] = 12345
            snap["half_open_entries"] = 77
        return statuspage.apply(snap, view) if view is not None else snap  # as edged.Daemon

    async def operate(
        self, kind: str, service: str, backend: str, weight: int | None = None, local: bool = False
    ) -> str:
        {
            "drain": lambda: self.drain(service, backend),
            "undrain": lambda: self.undrain(service, backend),
            "weight": lambda: self.set_override(service, backend, weight),
        }[kind]()
        return "node"  # this fake is in no fleet

    def drain(self, service: str, backend: str) -> None:
        self._check(service, backend)
        self.calls.append(("drain", service, backend))

    def undrain(self, service: str, backend: str) -> None:
        self._check(service, backend)
        self.calls.append(("undrain", service, backend))

    def set_override(self, service: str, backend: str, weight: int | None) -> None:
        self._check(service, backend)
        self.calls.append(("set_override", service, backend, weight))

    config_path = "/etc/edge/edge.yaml"  # the file edged was started with
    not_serving = ""  # the data path is whole

    async def drain_node(self, drained: bool = True) -> dict:
        self.calls.append(("drain_node", drained))
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        if drained:
            return {"announced": [], "withdrawn": {"198.18.255.1": "node drained"}}
        return {"announced": ["198.18.255.1"], "withdrawn": {}}

    async def reload(self, text: str | None = None) -> dict:
        self._check("chat")
        self.calls.append(("reload", text))
        await asyncio.sleep(0)
        if text is not None and "70000" in text:
            raise ConfigError("services[0].port: 70000 is not a port")
        return {
            "added_services": ["embed"],
            "removed_services": [],
            "updated_services": ["chat"],
            "added_backends": ["chat/b2"],
            "removed_backends": ["chat/b1"],
            "draining_backends": ["chat/b1"],
        }


# ---------------------------------------------------------------- fixtures


class LoopThread:
    """An asyncio loop in a thread: the server lives there, the sync client calls from here."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-test-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, fn: Callable, *args, **kwargs) -> Any:
        async def on_loop():
            return fn(*args, **kwargs)

        return self.run(on_loop())

    def close(self) -> None:
        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Served:
    def __init__(self, lt: LoopThread, daemon: FakeDaemon, handle: server.ApiServer, path: str | None):
        self.lt, self.daemon, self.handle, self.path = lt, daemon, handle, path

    def subscribers(self) -> int:
        return self.lt.call(lambda: len(self.daemon.events.queues))

    def emit(self, kind: str, text: str, **fields) -> None:
        self.lt.call(self.daemon.events.emit, kind, text, **fields)

    def client(self, **kw) -> Client:
        return Client(self.path, timeout_s=CALL_TIMEOUT_S, **kw)


@contextmanager
def serving(lt: LoopThread, node: Any, daemon: FakeDaemon | None = None, unix: bool = True) -> Iterator[Served]:
    daemon = daemon or FakeDaemon()
    handle = lt.run(server.start(daemon, node, unix=unix))
    try:
        yield Served(lt, daemon, handle, node.api_socket if unix else None)
    finally:
        lt.run(handle.stop(0.5))


def edgectl(*args: str, timeout_s: float = 20.0, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=kw.pop("cwd", REPO),
        **kw,
    )
