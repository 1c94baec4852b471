"""Heartbeat agents for a testbed Net: edge-heartbeat (controlplane.agent) run inside
backend namespaces, sending from the backend's address to the router's address on that
backend's link, the way an agent beside an inference server would.

    agents = start_all(net, tokens=[0x5EED0000 + i for i in range(3)], check="http")
    agents[1].wait_line("ready", timeout_s=5)   # b1's server passed its first check
    agents[1].kill()                            # b1's heartbeats end, as if its agent crashed

Processes start through Ns.popen, so the Net terminates whatever is still running on
close(); an Agent stops or kills only its own process, by its pid. Owns no topology and
knows nothing of the router's config or maps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from controlplane.lab.procs import stop_process, terminate
from controlplane.lab.traffic import wait_until

if TYPE_CHECKING:
    from controlplane.lab.topo import Net

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HB_PORT = 7946  # config.Heartbeat.port's default
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0  # the agent needs ~0.1 s (its checker's at most ~1.2 s); more on a starved host


class Agent:
    """One edge-heartbeat process in a backend namespace; a thread keeps its output lines."""

    def __init__(self, backend: int, proc: subprocess.Popen, token_dir: Optional[str] = None):
        self.backend = backend
        self.proc = proc
        self.token_dir = token_dir  # holds the token file; removed once the agent is stopped
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"agent-b{backend}", daemon=True)
        self._reader.start()

    def __repr__(self) -> str:
        return f"Agent(b{self.backend}, pid={self.pid}, running={self.running})"

    def _read(self) -> None:
        # Ends at EOF: once the agent and its checker process (which ends with it) have exited.
        for raw in self.proc.stdout:
            with self._lock:
                self._lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def lines(self) -> list[str]:
        """Everything the agent printed so far (stdout and stderr), one entry per line."""
        with self._lock:
            return list(self._lines)

    def count(self, prefix: str) -> int:
        """How many lines start with prefix ("ready", "not ready", ...)."""
        return sum(line.startswith(prefix) for line in self.lines())

    def wait_line(self, prefix: str, timeout_s: float, n: int = 1) -> str:
        """Wait until at least n lines start with prefix; return the n-th."""
        wait_until(
            lambda: self.count(prefix) >= n, timeout_s, f"b{self.backend} agent: {n} x {prefix!r}", observe=self.lines
        )
        return [line for line in self.lines() if line.startswith(prefix)][n - 1]

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> Optional[int]:
        """SIGTERM (SIGKILL after timeout_s) and wait; return the exit code. Idempotent."""
        stop_process(self.proc, timeout_s)
        self._close(timeout_s)
        return self.proc.returncode

    def kill(self, timeout_s: float = 3.0) -> Optional[int]:
        """SIGKILL and wait, like an agent that crashed; return the exit code."""
        if self.running:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)
        self._close(timeout_s)
        return self.proc.returncode

    def _close(self, timeout_s: float) -> None:
        self._reader.join(timeout=timeout_s)
        terminate(self.proc, timeout_s)  # the process is gone already: this closes the pipes
        if self.token_dir is not None:
            shutil.rmtree(self.token_dir, ignore_errors=True)
            self.token_dir = None


def write_token_file(token: int) -> tuple[str, str]:
    """(directory, file): a new private directory holding token in a file only its owner reads."""
    directory = tempfile.mkdtemp(prefix="edge-agent-token-")
    path = os.path.join(directory, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{token:#x}\n")
    return directory, path


def agent_argv(
    net: "Net",
    i: int,
    *,
    token_file: str,
    hb_port: int = DEFAULT_HB_PORT,
    interval_ms: float = 1,
    check: str = "none",
    service_port: int = 8000,
    check_url: Optional[str] = None,
    check_interval_ms: Optional[float] = None,
    check_timeout_ms: Optional[float] = None,
    rt_priority: int = 0,
    dsr_vip: Optional[str] = None,
    family: int = 4,
) -> list[str]:
    """The command line of backend i's agent (see start_heartbeats); family 6: over IPv6, from the
    backend's IPv6 address to the router's on its link."""
    if family == 6:
        router, source = f"[{net.topo.router_backend_addr6(i).ip}]:{hb_port}", str(net.topo.backend_addr6(i).ip)
    else:
        router, source = f"{net.topo.router_backend_addr(i).ip}:{hb_port}", str(net.backend_addr(i))
    argv = [
        sys.executable,
        "-m",
        "controlplane.agent",
        "--router",
        router,
        "--source",
        source,
        "--service-port",
        str(service_port),
        "--token-file",
        token_file,
        "--interval-ms",
        f"{interval_ms:g}",
        "--check",
        check,
    ]
    if check_url is not None:
        argv += ["--check-url", check_url]
    if check_interval_ms is not None:
        argv += ["--check-interval-ms", f"{check_interval_ms:g}"]
    if check_timeout_ms is not None:
        argv += ["--check-timeout-ms", f"{check_timeout_ms:g}"]
    if rt_priority:
        argv += ["--rt-priority", str(rt_priority)]
    if dsr_vip is not None:
        argv += ["--dsr-vip", dsr_vip]
    return argv


def _spawn(net: "Net", i: int, *, token: int, **kw) -> Agent:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    directory, path = write_token_file(token)
    try:
        proc = net.backends[i].popen(
            agent_argv(net, i, token_file=path, **kw), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return Agent(i, proc, directory)


def _started(agent: Agent, timeout_s: float) -> Agent:
    """agent, once its first line says `sending to`; raise if it says anything else or exits."""
    wait_until(lambda: agent.lines() or not agent.running, timeout_s, f"b{agent.backend} agent's first line")
    wait_until(lambda: agent.lines(), 1.0, f"b{agent.backend} agent's output before it exited")
    first = agent.lines()[0]
    if not first.startswith("sending to "):
        agent.stop()
        raise RuntimeError(f"b{agent.backend} agent (pid {agent.pid}): expected 'sending to ...', got {first!r}")
    return agent


def start_heartbeats(
    net: "Net",
    i: int,
    *,
    token: int,
    hb_port: int = DEFAULT_HB_PORT,
    interval_ms: float = 1,
    check: str = "none",
    service_port: int = 8000,
    check_url: Optional[str] = None,
    timeout_s: float = START_TIMEOUT_S,
    **kw,
) -> Agent:
    """Start backend i's agent and return it once it said `sending to ...`.

    token: backend i's token in the router config. check: none (always send), tcp or http;
    check_url defaults to http://<backend i's address>:<service_port>/v2/health/ready (the
    testbed backend answers 200 on any path). kw: check_interval_ms, check_timeout_ms,
    rt_priority, dsr_vip, family (6: heartbeats over IPv6), passed on to the agent.
    """
    agent = _spawn(
        net,
        i,
        token=token,
        hb_port=hb_port,
        interval_ms=interval_ms,
        check=check,
        service_port=service_port,
        check_url=check_url,
        **kw,
    )
    return _started(agent, timeout_s)


def start_all(net: "Net", tokens: Sequence[int], *, timeout_s: float = START_TIMEOUT_S, **kw) -> list[Agent]:
    """One agent per backend, tokens[i] for backend i, all started before any is waited for."""
    agents: list[Agent] = []
    try:
        for i, token in enumerate(tokens):
            agents.append(_spawn(net, i, token=token, **kw))
        deadline = time.monotonic() + timeout_s
        return [_started(agent, max(0.1, deadline - time.monotonic())) for agent in agents]
    except BaseException:
        for agent in agents:
            agent.stop()
        raise
