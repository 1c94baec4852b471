"""What test_dsr.py and test_dsr6.py share, for either family: tools/dsr-backend run in a backend's
namespace, the heartbeat agent's refusals on a backend not (fully) set up for DSR, and what a DSR
service's direct replies must look like: every reply from the VIP, the backend seeing the client
itself, every backend used, and the router counting each packet as DSR with nothing NATed,
returned or dropped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from controlplane.lab.heartbeats import agent_argv, write_token_file

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "dsr-backend"


def dsr_tool(ns, *args: str) -> subprocess.CompletedProcess:
    return ns.run([sys.executable, str(TOOL), *args], check=False)


def agent_refusals(net, token: int, vip: str, prefix: int, family: int = 4) -> tuple:
    """(first, second): edge-heartbeat --dsr-vip vip run on b0 without the DSR setup, then again
    after tools/dsr-backend setup with the VIP (vip/prefix) taken off lo."""
    directory, token_file = write_token_file(token)
    try:
        argv = agent_argv(net, 0, token_file=token_file, check="none", dsr_vip=vip, family=family)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        first = net.backends[0].run(argv, check=False, env=env)
        dsr_tool(net.backends[0], "setup", "--vip", vip, "--decap", "xdp")
        net.backends[0].run(["ip", "addr", "del", f"{vip}/{prefix}", "dev", "lo"])
        second = net.backends[0].run(argv, check=False, env=env)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return first, second


def assert_direct_replies(replies, seen: dict, snap: dict, vip, port: int, client: str, backends: set) -> None:
    """replies: 30 HTTP replies through the VIP; seen: 150 more flows by backend; snap: status."""
    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{vip}:{port}")}
    assert all(r.peer.startswith(f"{client}:") for r in replies)  # the backend sees the client itself
    assert {r.backend for r in replies} | set(seen) == backends and sum(seen.values()) == 150, seen
    (service,) = snap["services"]
    assert service["new_flows"] == 180 and service["return_packets"] == 0
    verdicts = snap["verdicts"]
    assert verdicts["dsr"] == service["packets"] >= 3 * 180
    assert (verdicts["return_nat"], verdicts["redirect"], verdicts["nat_pass"], verdicts["drop"]) == (0, 0, 0, 0)
