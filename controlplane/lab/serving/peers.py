"""The peers of tools/bench-serving, on one lab topology: this router (edged, static equal weights
or its default steering) and Debian's HAProxy in TCP mode (roundrobin, leastconn), run by pid in
the router namespace; their config, start, stop and CPU time. The configs are pure (haproxy_config,
edge_service); the runners need root and a built Net."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Optional

from controlplane.lab.procs import terminate
from controlplane.lab.topo import Ns

PROBE = {"kind": "http", "path": "/health", "interval_ms": 100, "timeout_ms": 80}
METRICS = {"path": "/metrics", "interval_ms": 100}
HAPROXY_CHECK_MS = 500  # an HTTP check of /health, as operators configure one
VARIANTS = {  # edge peers that are the default steering with these weights settings
    "default_queue": {"load_model": "queue"},  # the default before capacity shares
}


def edge_service(base: dict, steering: str) -> dict:
    """A lab Router.service() dict with health and weights for one edge peer: "static" (equal
    weights; probes only take a dead backend out), "default" (latency_inverse with the default
    weight settings, probes and load scrapes) or "two_choices" (default, and each new connection
    takes the less loaded of two Maglev candidates: new_flows two_choices), "least_loaded" (default,
    and the least loaded of up to 8: new_flows least_loaded) or "least_loaded_static" (least_loaded
    on static weights, probed every HAPROXY_CHECK_MS as HAProxy checks: no scrapes, no weight pushes)
    or one of VARIANTS (default with some weights settings changed: "default_queue" is the default
    as it was before capacity shares) or "maglev" (default with new_flows maglev: the default
    before new_flows auto made it least_loaded for a service like this one)."""
    if steering == "static":
        return {**base, "health": {"probe": dict(PROBE)}, "weights": {"policy": "static"}}
    if steering == "least_loaded_static":  # static weights, probed as HAProxy checks (no scrapes, no pushes)
        probe = {**PROBE, "interval_ms": HAPROXY_CHECK_MS}
        return {**base, "health": {"probe": probe}, "weights": {"policy": "static"}, "new_flows": "least_loaded"}
    if steering in VARIANTS:  # the default with some weights settings changed (a comparison)
        d = edge_service(base, "default")
        return {**d, "weights": {**d["weights"], **VARIANTS[steering]}}
    if steering in ("two_choices", "least_loaded", "maglev"):
        return {**edge_service(base, "default"), "new_flows": steering}
    if steering == "default":
        return {
            **base,
            "health": {"probe": dict(PROBE), "metrics": dict(METRICS)},
            "weights": {"policy": "latency_inverse"},
        }
    raise ValueError(
        f"steering: {steering!r} is not static, default, default_queue, maglev, two_choices, least_loaded(_static)"
    )


def haproxy_config(bind: str, port: int, balance: str, servers: list[tuple[str, str, int]]) -> str:
    """haproxy.cfg for one TCP-mode frontend on bind:port balancing over servers (name, address, port)."""
    if balance not in ("roundrobin", "leastconn"):
        raise ValueError(f"balance: {balance!r} is not roundrobin or leastconn")
    lines = [
        "global",
        "    maxconn 4096",
        "    nbthread 1",
        "",
        "defaults",
        "    mode tcp",
        "    timeout connect 2s",
        "    timeout client 60s",
        "    timeout server 60s",
        "",
        "frontend serving",
        f"    bind {bind}:{port}",
        "    default_backend fleet",
        "",
        "backend fleet",
        f"    balance {balance}",
        "    option httpchk GET /health",
    ]
    lines += [f"    server {name} {addr}:{p} check inter {HAPROXY_CHECK_MS}" for name, addr, p in servers]
    return "\n".join(lines) + "\n"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of pid and of its live descendants (a prober in a child
    process of edged's counts as edged's), from /proc/PID/stat."""
    ticks, children = 0, _children()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone since
            continue
        ticks += int(fields[11]) + int(fields[12])
        todo += children.get(p, [])
    return ticks / os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(ppid, []).append(int(d))
    return out


class HAProxy:
    """One haproxy -db (foreground) in ns, by pid; its config in a temporary file removed at stop."""

    def __init__(self, ns: Ns, cfg: str):
        exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
        fd, self.path = tempfile.mkstemp(prefix="bench-serving-", suffix=".cfg")
        with os.fdopen(fd, "w") as f:
            f.write(cfg)
        check = ns.run([exe, "-c", "-f", self.path], capture_output=True, text=True, check=False)
        if check.returncode != 0:
            os.unlink(self.path)
            raise RuntimeError(f"haproxy -c: {(check.stdout + check.stderr).strip().splitlines()[-1:]}")
        self.proc: Optional[subprocess.Popen] = ns.popen(
            [exe, "-db", "-f", self.path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_listening(self, ns: Ns, addr: str, port: int, timeout_s: float = 10.0) -> None:
        """Until a TCP connection from ns to addr:port is accepted."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited {self.proc.returncode}: {self.proc.stderr.read()[-300:]!r}")
            with ns.enter():
                s = socket.socket()
            try:
                s.settimeout(0.5)
                s.connect((addr, port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"haproxy: {addr}:{port} not accepting within {timeout_s} s") from None
                time.sleep(0.1)
            finally:
                s.close()

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None
        if os.path.exists(self.path):
            os.unlink(self.path)
