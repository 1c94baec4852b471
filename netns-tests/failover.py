"""What the failover tests (test_failover.py, test_passive_ejection.py) share: the service "web"
on b0..b2 with heartbeats on, the heartbeat agents a test starts (all stopped when it ends), new
flows and the backends they reach, status read under traffic, a server killed and a link taken
down. Starts nothing by itself; the tests and their fixtures own the nets and deployments.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator

import hb

from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Ns
from controlplane.lab.traffic import Conn, backends_seen, connect, wait_until

PORT = 8000  # conftest.BACKEND_PORT
TOKENS = {i: 0x5EED0000 + i for i in range(3)}
ALL = {"b0", "b1", "b2"}
# Heartbeats leave every ~1 ms (agent processes, or threads sharing the GIL with the test's
# traffic); 250 ms of silence is far beyond any scheduling stall, and short next to a test.
TIMEOUT_MS = 250
SLOW_TIMEOUT_MS = 60_000  # for tests that send heartbeats one at a time, with status calls between
RISE = 3
PASSIVE = {"syn_timeout_ms": 50, "consecutive": 3, "ejection_ms": 2000, "max_ejected_percent": 50}
STANDBY_VIP = "198.18.255.2"  # in the client's route to the router, like net.vip
FRESH_PORT = 8001  # backends also serve here (fresh_endpoints); no deployment uses it before
SAMPLE = 30  # flows per readiness poll: one of 3 equal backends is missed with p = (2/3)**30 < 1e-5


def service(
    router: Router,
    *,
    timeout_ms: int = TIMEOUT_MS,
    rise: int = RISE,
    passive: dict | None = None,
    existing_flows: str = "reselect",
    standby: tuple[int, ...] = (),
    vip: str | None = None,
    backend_port: int = PORT,
) -> dict:
    """The service "web" (VIP port PORT) on b0..b2, heartbeats on (each backend with its token)."""
    health: dict = {"heartbeat": {"port": hb.HB_PORT, "interval_ms": 1, "timeout_ms": timeout_ms, "rise": rise}}
    if passive:
        health["passive"] = dict(passive)
    svc = router.service(
        "web", standby=standby, existing_flows=existing_flows, health=health, vip=vip, backend_port=backend_port
    )
    for entry in svc["backends"]:
        entry["token"] = hex(TOKENS[int(entry["name"][1:])])
    return svc


@contextmanager
def heartbeat_agents() -> Iterator[Callable[..., object]]:
    """start(net, i, ...) starts backend i's heartbeats; every one started is stopped on leaving."""
    started = []

    def start(net: Net, i: int, interval_ms: float = 1, service_port: int = PORT):
        agent = hb.start_heartbeats(net, i, token=TOKENS[i], interval_ms=interval_ms, service_port=service_port)
        started.append(agent)
        return agent

    yield start
    errors = []
    for agent in started:
        try:
            agent.stop()
        except Exception as e:  # stop the others anyway; report the first
            errors.append(e)
    if errors:
        raise errors[0]


def flows(net: Net, n: int, *, vip: str | None = None, flow_timeout_s: float = 1.0) -> Counter:
    """Backend names (or "error:<why>") over n new connections from the client to the VIP."""
    return backends_seen(net.client, vip or net.vip, PORT, n, flow_timeout_s=flow_timeout_s)


def wait_flows_reach(net: Net, want: set[str], *, vip: str | None = None, timeout_s: float = 5.0) -> None:
    """Poll until SAMPLE new flows all succeed and reach exactly the backends in want."""
    last: dict = {}

    def reached() -> bool:
        last["seen"] = flows(net, SAMPLE, vip=vip, flow_timeout_s=0.5)
        return set(last["seen"]) == want

    wait_until(reached, timeout_s, f"{SAMPLE} new flows reach exactly {sorted(want)}", observe=lambda: last.get("seen"))


def attempt_is_dropped(net: Net, router: Router) -> bool:
    """One connection attempt to the VIP fails and the router counts a no_backend drop for it."""
    before = router.counters()["drops"]["no_backend"]
    try:
        connect(net.client, net.vip, PORT, timeout_s=0.3).close()
        return False
    except OSError:
        return router.counters()["drops"]["no_backend"] > before


def answer(conn: Conn) -> str:
    """The backend that answers one more request on conn, or "error:<exception>"."""
    try:
        return conn.request().backend
    except OSError as e:
        return f"error:{type(e).__name__}"


def backends(snap: dict) -> dict[str, dict]:
    """{name: backend} of the one service in an `edgectl status --json` snapshot."""
    return {b["name"]: b for b in snap["services"][0]["backends"]}


def status_under_traffic(router: Router, net: Net, timeout_s: float = 60.0) -> tuple[dict, Counter]:
    """router.status() taken while new flows keep arriving (10 every ~20 ms), and the flows'
    outcomes. A passive ejection lasts 2 s and status takes 3 s or more: refused flows re-eject a
    dead backend as soon as its ejection ends (for twice as long), so it is still ejected when
    status reads the maps."""
    seen: Counter = Counter()
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(max_workers=1) as pool:
        snap = pool.submit(router.status)
        for _ in range(int(timeout_s / 0.02)):
            seen.update(flows(net, 10, flow_timeout_s=0.5))
            if futures.wait([snap], timeout=0.02).done or time.monotonic() > deadline:
                break
        return snap.result(timeout=max(0.0, deadline - time.monotonic())), seen


def kill_server(net: Net, i: int) -> None:
    """SIGKILL backend i's HTTP server (by its pid); its host and heartbeats live on."""
    proc = net.servers[i].proc
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5.0)


@contextmanager
def link_down(net: Net, ns: Ns, ifname: str) -> Iterator[None]:
    """ifname in ns is administratively down inside the block; up again (both veth ends) after."""
    with ns.iproute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=index, state="down")
    try:
        yield
    finally:
        with ns.iproute() as ipr:
            ipr.link("set", index=index, state="up")
        wait_until(
            lambda: set(net.link_states().values()) == {"UP"}, 5.0, "every veth end UP again", observe=net.link_states
        )
