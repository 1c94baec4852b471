"""The runs of `tools/bench-failover --vs-haproxy` (root): a testbed of its own per run (lab.topo:
client, router, three lab HTTP backends), either edged on the router (passive detection plus
probes) or HAProxy in the router namespace on the VIP (checks plus observe layer4); the same
paced generator of real TCP connections from the client, one GET each; b0's server SIGKILLed a
third into the run. Everything a run starts (namespaces, edged, haproxy, servers) is stopped by
pid and removed when it returns or raises. The pure part is tools/_vs_haproxy.py.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from _vs_haproxy import PORT, Conn, analyse, edge_service, haproxy_config
from controlplane.drill.run import realtime
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.procs import stop_process
from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Topo
from controlplane.lab.traffic import _error_key, _reply, _request, _take_response, backends_seen, wait_until

ALL = {"b0", "b1", "b2"}
KILL_AT = 1 / 3  # of the duration
FLOW_TIMEOUT_S = 1.0
LEAD_NS = 50_000_000
# The generator's SCHED_FIFO priority (bench-failover --realtime), or None: normal priority (the
# default), because on a small busy host a SCHED_FIFO generator delays the killed server's exit.
REALTIME_PRIORITY: int | None = None


class _Open:
    """The connections in flight of one generator run."""

    def __init__(self, sel: selectors.BaseSelector):
        self.sel, self.flows, self.done = sel, {}, []  # fd -> (sock, buf, start_ns)

    def start(self, target: tuple, now: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        err = sock.connect_ex(target)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self.done.append(Conn(now, time.monotonic_ns(), _error_key(err)))
            return
        self.flows[sock.fileno()] = (sock, bytearray(), now)
        self.sel.register(sock, selectors.EVENT_WRITE)

    def finish(self, fd: int, outcome: str) -> None:
        sock, _, start = self.flows.pop(fd)
        self.sel.unregister(fd)
        sock.close()
        self.done.append(Conn(start, time.monotonic_ns(), outcome))

    def ready(self, fd: int, events: int, request: bytes) -> None:
        sock, buf, _ = self.flows[fd]
        try:
            if events & selectors.EVENT_WRITE:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    return self.finish(fd, _error_key(err))
                sock.send(request)
                self.sel.modify(sock, selectors.EVENT_READ)
                return None
            chunk = sock.recv(65536)
        except OSError as e:
            return self.finish(fd, _error_key(e.errno or 0))
        if not chunk:
            return self.finish(fd, "error:closed")
        buf += chunk
        try:
            got = _take_response(buf)
        except ValueError:
            return self.finish(fd, "error:bad-reply")
        if got is not None:
            backend = _reply(*got, "").backend
            self.finish(fd, backend if backend is not None else "error:bad-reply")
        return None

    def expire(self, now: int) -> None:
        for fd, (_, _, start) in list(self.flows.items()):
            if now - start > FLOW_TIMEOUT_S * 1e9:
                self.finish(fd, "error:timeout")


def generate(net: Net, rate: int, duration_s: float, server) -> tuple[list[Conn], int, int | None]:
    """Connection k is started at t0 + k/rate from the client; server is SIGKILLed at t0 + KILL_AT x
    the duration, from the same thread, after its time is taken. Returns every connection, that
    time, and when the server was seen gone (reaped, polled every loop), or None."""
    n, period = int(rate * duration_s), 1e9 / rate
    target, request = (str(net.vip), PORT), _request(net.vip, PORT)
    kill_ns, exit_ns = 0, None
    paced = realtime(REALTIME_PRIORITY) if REALTIME_PRIORITY else contextlib.nullcontext()
    with net.client.enter(), selectors.DefaultSelector() as sel, paced:
        flows = _Open(sel)
        t0 = time.monotonic_ns() + LEAD_NS
        kill_due, k = t0 + int(duration_s * KILL_AT * 1e9), 0
        deadline = t0 + int((duration_s + 5 * FLOW_TIMEOUT_S) * 1e9)
        try:
            while (k < n or flows.flows) and time.monotonic_ns() < deadline:
                now = time.monotonic_ns()
                if not kill_ns and now >= kill_due:
                    kill_ns = time.monotonic_ns()
                    server.proc.kill()  # SIGKILL, by its pid
                elif kill_ns and exit_ns is None and server.proc.poll() is not None:
                    exit_ns = time.monotonic_ns()
                while k < n and t0 + int(k * period) <= now:
                    flows.start(target, time.monotonic_ns())
                    k += 1
                wait_ns = max(0, min(t0 + int(k * period), kill_due if not kill_ns else deadline) - now)
                for key, events in sel.select(timeout=min(wait_ns, 1_000_000) / 1e9):
                    flows.ready(key.fd, events, request)
                flows.expire(time.monotonic_ns())
        finally:
            for fd in list(flows.flows):
                flows.finish(fd, "error:deadline")
    return flows.done, kill_ns, exit_ns


def _warm(net: Net) -> None:
    wait_until(
        lambda: set(backends_seen(net.client, net.vip, PORT, 30, flow_timeout_s=1.0)) == ALL,
        60.0,
        "flows on every backend",
    )


def run_edge(rate: int, duration_s: float, policy: str, progress: Callable[[str], None]) -> dict:
    """One run of this router: edged with passive detection plus probes."""
    net = Net(Topo(backends=3))
    router = Router(net)
    edged = None
    try:
        net.build()
        servers = net.start_backends(port=PORT)
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
            doc = router.config(
                [edge_service(str(net.vip), [str(s.address) for s in servers], policy)],
                node={"api_socket": str(Path(tmp) / "edged.sock"), "metrics_listen": "127.0.0.1:9470"},
            )
            progress(f"testbed {net.prefix}: edged ({policy}), passive detection plus probes")
            edged = EdgedProc.start(net.router, doc, router.iface)
            _warm(net)
            conns, kill_ns, exit_ns = generate(net, rate, duration_s, servers[0])
            servers[0].proc.wait(timeout=5.0)
            return analyse(conns, kill_ns, exit_ns)
    finally:
        try:
            if edged is not None:
                edged.stop()
            router.undeploy(check=False)
        finally:
            net.close()


def run_haproxy(rate: int, duration_s: float, progress: Callable[[str], None]) -> dict:
    """One run of HAProxy on the VIP (an address of the router's lo) with checks and observe layer4."""
    net = Net(Topo(backends=3))
    proc = None
    try:
        net.build()
        servers = net.start_backends(port=PORT)
        with net.router.iproute() as ipr:
            ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=str(net.vip), prefixlen=32)
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
            cfg = Path(tmp) / "haproxy.cfg"
            cfg.write_text(haproxy_config(str(net.vip), [str(s.address) for s in servers]))
            progress(f"testbed {net.prefix}: haproxy, checks plus observe layer4")
            with open(Path(tmp) / "haproxy.log", "w") as log:
                proc = net.router.popen(["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
            _warm(net)
            conns, kill_ns, exit_ns = generate(net, rate, duration_s, servers[0])
            servers[0].proc.wait(timeout=5.0)
            if proc.poll() is not None:
                raise RuntimeError(
                    f"haproxy exited {proc.returncode}: {(Path(tmp) / 'haproxy.log').read_text()[-300:]}"
                )
            return analyse(conns, kill_ns, exit_ns)
    finally:
        try:
            if proc is not None:
                stop_process(proc)
        finally:
            net.close()
