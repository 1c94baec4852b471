"""The drill's run: builds a testbed for one service of a config (lab.topo), starts backend
servers and heartbeat agents, deploys the router, sends the paced flows while a thread silences one
backend, and hands what the capture saw to the report. Reads the router only through
`edgectl status --json`; never touches maps or bpf/. Needs root: failover(cfg, Plan(...)).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Sequence

from controlplane.config import Config, Service
from controlplane.deploy import Progress, quiet
from controlplane.drill.capture import PROTO, Capture
from controlplane.drill.frames import build_frames
from controlplane.drill.plan import (
    GRACE_S,
    LEAD_S,
    RT_PRIORITY,
    SILENCE_AT,
    UP_TIMEOUT_S,
    DrillError,
    Plan,
    check_plan,
    testbed_document,
    testbed_topo,
)
from controlplane.drill.report import build_report

if TYPE_CHECKING:
    from controlplane.lab.topo import Net

PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30  # include/uapi/linux/prctl.h


@contextmanager
def realtime(priority: int) -> Iterator[bool]:
    """Run the calling thread SCHED_FIFO at priority with 1 ns timer slack; yield whether that worked.

    On a busy host a normal thread misses its deadlines by milliseconds, which the drill would
    report as the router's doing. The policy and slack are restored on exit.
    """
    old_policy, old_param = os.sched_getscheduler(0), os.sched_getparam(0)
    libc = ctypes.CDLL(None, use_errno=True)
    old_slack = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        ok = True
    except OSError:
        ok = False
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    try:
        yield ok
    finally:
        if old_slack > 0:
            libc.prctl(PR_SET_TIMERSLACK, old_slack, 0, 0, 0)
        if ok:
            os.sched_setscheduler(0, old_policy, old_param)


def send_paced(
    sock: socket.socket, frames: Sequence[bytes], rate: int, start_ns: int, spin_ns: int = 100_000
) -> list[int]:
    """Send frame k at start_ns + k/rate (monotonic ns) and return when each actually left.

    spin_ns: sleep until this close to a deadline, then spin (a sleep may overshoot by that much).
    """
    period = 1_000_000_000 / rate
    sent = [0] * len(frames)
    for k, frame in enumerate(frames):
        due = start_ns + int(k * period)
        while True:
            left = due - time.monotonic_ns()
            if left <= 0:
                break
            if left > spin_ns:
                time.sleep((left - spin_ns) / 1e9)
        sent[k] = time.monotonic_ns()  # before send(): XDP and the backend may see it before send() returns
        sock.send(frame)
    return sent


class Silencer:
    """Silences one backend at a given time from a thread of its own; records when."""

    def __init__(self, net: "Net", dead: int, mode: str, agents: list, servers: list):
        self.net, self.dead, self.mode = net, dead, mode
        self.agents, self.servers = agents, servers
        self.started_ns = 0
        self.done_ns = 0
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def at(self, when_ns: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(when_ns,), name="edge-drill-silence", daemon=True)
        self._thread.start()

    def _run(self, when_ns: int) -> None:
        ipr = None
        try:
            if self.mode == "link":
                # pyroute2's IPRoute is used in the thread that made it; made now, not at the moment.
                ipr = self.net.backends[self.dead].iproute()
                index = ipr.link_lookup(ifname=self.net.backend_peer_iface(self.dead))[0]
            left = when_ns - time.monotonic_ns()
            if left > 0:
                time.sleep(left / 1e9)
            self.started_ns = time.monotonic_ns()
            if self.mode == "heartbeat":
                self.agents[self.dead].stop()
            elif self.mode == "link":
                ipr.link("set", index=index, state="down")
            else:
                proc = self.servers[self.dead].proc
                proc.kill()
                proc.wait(timeout=5.0)
            self.done_ns = time.monotonic_ns()
        except BaseException as e:  # reported by join() in the main thread
            self.error = e
        finally:
            if ipr is not None:
                ipr.close()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise DrillError(f"silencing ({self.mode}) did not finish within {timeout_s}s")
        if self.error is not None:
            raise DrillError(f"silencing ({self.mode}) failed: {self.error}") from self.error


def _wait_all_up(router, svc_name: str, names: list[str], timeout_s: float) -> dict:
    from controlplane.lab.traffic import wait_until

    last: dict = {}

    def states() -> dict:
        snap = router.status()
        svc = next(s for s in snap["services"] if s["name"] == svc_name)
        last.clear()
        last.update({b["name"]: b["state"] for b in svc["backends"]})
        return last

    def all_up() -> bool:
        return set(states()) == set(names) and all(v == "up" for v in last.values())

    wait_until(all_up, timeout_s, "every backend up in edgectl status", observe=lambda: dict(last), interval_s=0.1)
    return dict(last)


def _check_agents(agents: list, names: list[str]) -> None:
    for name, agent in zip(names, agents):
        if not agent.running:
            said = agent.lines()
            raise DrillError(f"heartbeat agent of {name} (pid {agent.pid}) exited: {said[-1] if said else 'no output'}")


def failover(cfg: Config, plan: Plan, progress: Progress = quiet) -> dict:
    """Run one drill in a testbed of its own and return its report (report.build_report).

    Agents send from SCHED_FIFO threads, with a tcp check of their server, none in kill mode (so
    that heartbeats go on while the server is dead).

    Everything it builds (namespaces, processes, the router) is gone again when it returns or raises.
    """
    svc, dead = check_plan(cfg, plan)
    if os.geteuid() != 0:
        raise DrillError("the drill needs root (network namespaces, XDP)")
    with _sigterm_unwinds():
        return _failover(cfg, plan, svc, dead, progress)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Make SIGTERM unwind like Ctrl-C (so the testbed is removed) while the drill runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, _frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _failover(cfg: Config, plan: Plan, svc: Service, dead: int, progress: Progress) -> dict:
    from controlplane.lab.router import EdgectlError, Router, link_mac
    from controlplane.lab.topo import Net

    hb = svc.health.heartbeat if svc.health else None
    names = [b.name for b in svc.backends]
    port = svc.backends[0].port
    net = Net(testbed_topo(svc))
    router = Router(net)
    agents: list = []
    deployed = False
    capture = silencer = None
    switch = sys.getswitchinterval()
    try:
        progress(
            f"testbed {net.prefix}: client, router, {len(names)} backends; VIP {net.vip}:{svc.port}/{svc.protocol}"
        )
        net.build()
        servers = net.start_backends(port=port)
        if hb is not None:
            from controlplane.lab.heartbeats import start_heartbeats

            for i, b in enumerate(svc.backends):
                agents.append(
                    start_heartbeats(
                        net,
                        i,
                        token=b.token,
                        hb_port=hb.port,
                        interval_ms=hb.interval_ms,
                        check="none" if plan.mode == "kill" else "tcp",
                        service_port=port,
                        rt_priority=RT_PRIORITY,
                    )
                )
        progress(f"deploying service {svc.name} on {net.router_client_iface}")
        deployed = True  # from here on undeploy (it says so and exits 0 when nothing got deployed)
        router.deploy_document(testbed_document(cfg, svc, net))
        try:
            _wait_all_up(router, svc.name, names, UP_TIMEOUT_S)
        finally:
            _check_agents(agents, names)

        frames = build_frames(
            svc.protocol,
            link_mac(net.client, net.client_iface),
            router.mac(),
            net.topo.client_addr.ip,
            net.vip,
            svc.port,
            plan.n_flows,
        )
        beats_per_s = 1000 / hb.interval_ms if hb else 0
        max_frames = 8 * plan.n_flows + int(2 * len(names) * beats_per_s * (plan.duration_s + 10))
        capture = Capture(
            net, PROTO[svc.protocol], port, hb.port if hb else None, max_frames, deadline_s=plan.duration_s + 30.0
        )
        capture.wait_ready()
        silencer = Silencer(net, dead, plan.mode, agents, servers)
        with net.client.enter():
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
        with sock:
            sock.bind((net.client_iface, 0))
            progress(
                f"{plan.n_flows} new flows at {plan.rate}/s for {plan.duration_s:g}s; "
                f"silencing {plan.backend} ({plan.mode}) at {plan.duration_s * SILENCE_AT:.3f}s"
            )
            sys.setswitchinterval(0.0005)  # the silencing thread must not wait 5 ms for the sender
            with realtime(RT_PRIORITY) as rt:  # first: a busy host may keep a normal thread off the CPU
                start_ns = time.monotonic_ns() + int(LEAD_S * 1e9)
                silencer.at(start_ns + int(plan.duration_s * SILENCE_AT * 1e9))  # inherits SCHED_FIFO
                sent = send_paced(sock, frames, plan.rate, start_ns, spin_ns=50_000 if rt else 200_000)
            sys.setswitchinterval(switch)
        if not rt:
            progress("could not send from a SCHED_FIFO thread; the send times may wander")
        silencer.join(timeout_s=10.0)
        time.sleep(GRACE_S)  # the last flows are still on their way to the backends
        captured = capture.finish()
        snap = router.status()
        return build_report(svc, plan, net, dead, start_ns, sent, captured, silencer, snap)
    except (EdgectlError, TimeoutError, RuntimeError) as e:  # the testbed's failures, as one line
        raise DrillError(f"testbed {net.prefix}: {e}") from e
    finally:
        sys.setswitchinterval(switch)
        if capture is not None:
            capture.close()
        for agent in agents:
            agent.stop()
        try:
            if deployed:
                router.undeploy(check=False)
        finally:
            net.close()
