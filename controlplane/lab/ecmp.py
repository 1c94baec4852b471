"""Losing an edge router behind ECMP, measured: the fleet (fleet.py) with a real edged and bird on
every router, long-lived connections spread over them, one router killed, and what happened to
its flows. Used by netns-tests/test_ecmp.py (which asserts the behaviour) and tools/bench-ecmp
(which prints the figures).

    with Fleet.start(FleetTopo(routers=3)) as fleet:
        result = fleet.lose_router(0, mode="link", n_conns=200)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from controlplane.api.client import Client
from controlplane.lab import fleet6
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.fleet import FleetNet, FleetTopo
from controlplane.lab.router import Router
from controlplane.lab.traffic import close_all, http_get, open_connections

PORT = 8000
MODES = ("link", "silent", "freeze", "stop")
ASKERS = 64  # connections asked at once after the loss (a thread each)
# link:   the router's upstream link goes down and its edged (with its bird) is SIGKILLed
# silent: the link stays up but nothing crosses it any more (a node that lost power behind a
#         switch), then edged and bird are SIGKILLed: their FIN never arrives, only BFD (or the
#         hold timer) tells the upstream
# freeze: edged and bird are SIGSTOPped, links stay up, the data path still forwards: only BFD
#         (or the hold timer) can tell the upstream
# stop:   edged gets SIGTERM: the graceful withdraw (drain the node, then stop)


@dataclass
class RouterLoss:
    """What one router loss did; times in seconds from the moment of the loss."""

    mode: str
    routers: int
    connections: int
    per_router_before: list[int]  # connections each router carried before the loss
    withdraw_s: float  # until the upstream's kernel no longer routes the VIP to the lost router
    kept_backend: int = 0  # connections that answered afterwards from the backend they had
    changed_backend: int = 0  # answered, from another backend
    failed: list[str] = field(default_factory=list)  # connections that did not answer: why
    new_attempts: int = 0  # new connections tried from the loss on (each with a short timeout)
    new_failures: int = 0
    new_failing_until_s: float = 0.0  # the last new connection that failed (its SYN was lost) started then
    all_answered_s: float = 0.0  # the last connection that answered afterwards did then (all are asked at once)

    @property
    def kept_ratio(self) -> float:
        return self.kept_backend / self.connections if self.connections else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "kept_ratio": round(self.kept_ratio, 4)}


class _RouterNet:
    """What lab.router.Router needs of a net: the namespace it runs edgectl in."""

    def __init__(self, ns):
        self.router = ns


class Fleet:
    """A built FleetNet with backends, the upstream's bird and one edged per router."""

    def __init__(self, net: FleetNet, bfd: bool = True, bfd_interval_ms: int = 100, service_extra: dict | None = None):
        self.net = net
        self.bfd, self.bfd_interval_ms = bfd, bfd_interval_ms
        self.service_extra = dict(service_extra or {})
        self.edgeds: list[EdgedProc | None] = [None] * net.topo.routers
        self.frozen: list[int] = []

    @classmethod
    def start(
        cls,
        topo: FleetTopo = FleetTopo(),
        bfd: bool = True,
        bfd_interval_ms: int = 100,
        service_extra: dict | None = None,
    ) -> "Fleet":
        """Builds the net, starts backends, the upstream's bird and every edged, and returns once
        the upstream routes the VIP to every router. service_extra: more keys of the service."""
        net = FleetNet(topo).build()
        fleet = cls(net, bfd, bfd_interval_ms, service_extra)
        try:
            net.start_backends(PORT)
            net.start_upstream_bird(bfd_interval_ms=bfd_interval_ms)
            for i in range(topo.routers):  # each compiles its data path: start them all, then wait
                fleet.edgeds[i] = EdgedProc.start(
                    net.router(i), fleet.config(i), net.router_iface(i), wait_deployed=False
                )
            for e in fleet.edgeds:
                e.wait_for(
                    lambda ev: ev["kind"] == "bgp" and "announced" in ev["text"], 180.0, "edged to announce the VIP"
                )
            net.wait_next_hops(set(range(topo.routers)), 60.0)
        except BaseException:
            fleet.close()
            raise
        return fleet

    def config(self, i: int) -> dict:
        """Router i's edged config: the service "web" on the VIP, and "web6" on the IPv6 VIP when the
        fleet has IPv6."""
        services = [self.net.service("web", PORT, **self.service_extra)]
        if self.net.topo.ipv6:
            services.append(self.net.service6("web6", PORT, **self.service_extra))
        return self.net.edged_config(i, services, self.bfd_interval_ms, self.bfd)

    def edgectl(self, i: int, *args: str, api: bool = True):
        """`edgectl ARGS` in router i's namespace; api: add `--socket` of router i's edged."""
        sock = ("--socket", self.net.edged_config(i, [])["node"]["api_socket"]) if api else ()
        return Router(_RouterNet(self.net.router(i)), self.net.router_iface(i)).edgectl(*args, *sock)

    def restart(self, i: int) -> EdgedProc:
        """Stops router i's edged (SIGTERM, by pid) and starts it again on the same config; returns
        once the new one has deployed (adopted the pinned data path)."""
        self.edgeds[i].stop()
        self.edgeds[i] = EdgedProc.start(self.net.router(i), self.config(i), self.net.router_iface(i))
        return self.edgeds[i]

    def client(self, i: int) -> Client:
        return Client(self.net.edged_config(i, [])["node"]["api_socket"])

    def new_flows(self, i: int) -> int:
        with self.client(i) as c:
            return sum(s["new_flows"] for s in c.status()["services"])

    def lose_router(
        self,
        victim: int = 0,
        mode: str = "link",
        n_conns: int = 200,
        new_timeout_s: float = 0.5,
        settle_s: float = 3.0,
        answer_timeout_s: float = 5.0,
        ipv6: bool = False,
    ) -> RouterLoss:
        """Opens n_conns connections, loses router `victim` the `mode` way, waits for the upstream
        to withdraw it, then asks every connection once more, ASKERS at a time, each waiting up to
        answer_timeout_s. Meanwhile new connections are tried every 10 ms (each with
        new_timeout_s) until settle_s after the withdraw. ipv6: the connections go to the IPv6
        VIP (a fleet with FleetTopo(ipv6=True))."""
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        net, n = self.net, self.net.topo.routers
        vip = fleet6.VIP6 if ipv6 else net.vip
        wait_next_hops = net.wait_next_hops6 if ipv6 else net.wait_next_hops
        flows0 = [self.new_flows(i) for i in range(n)]
        conns = open_connections(net.client, vip, PORT, n_conns, timeout_s=5.0)
        try:
            before = [c.request().backend for c in conns]
            per_router = [self.new_flows(i) - flows0[i] for i in range(n)]
            stop = threading.Event()
            attempts: list[tuple[float, bool]] = []
            prober = threading.Thread(target=self._try_new, args=(attempts, stop, new_timeout_s, vip), daemon=True)
            t0 = time.monotonic()
            prober.start()
            self._lose(victim, mode)
            withdrawn = wait_next_hops(set(range(n)) - {victim}, 30.0)
            result = RouterLoss(mode, n, n_conns, per_router, withdrawn - t0)

            def ask(conn_had: tuple) -> tuple[str, str | None, float]:
                conn, had = conn_had
                conn.sock.settimeout(answer_timeout_s)  # a request sent into the dead router is retransmitted
                try:
                    return had, conn.request().backend, time.monotonic()
                except OSError as e:
                    return had, f"{conn.local_addr} (was {had}): {type(e).__name__}: {e}", -1.0

            with ThreadPoolExecutor(max_workers=ASKERS) as pool:
                for had, got, at in pool.map(ask, zip(conns, before)):
                    if at < 0:
                        result.failed.append(got)
                        continue
                    result.all_answered_s = max(result.all_answered_s, at - t0)
                    if got == had:
                        result.kept_backend += 1
                    else:
                        result.changed_backend += 1
            deadline = withdrawn + settle_s
            while time.monotonic() < deadline:
                time.sleep(0.05)  # new connections keep being tried until then
            stop.set()
            prober.join(10.0)
        finally:
            close_all(conns)
        result.new_attempts = len(attempts)
        fails = [t for t, ok in attempts if not ok]
        result.new_failures = len(fails)
        result.new_failing_until_s = max(fails) - t0 if fails else 0.0
        return result

    def _try_new(self, attempts: list, stop: threading.Event, timeout_s: float, vip) -> None:
        """A new connection every 10 ms (each on a worker, so a lost SYN delays no other) until
        stop; bounded: at most 1500 attempts."""

        def attempt(t: float) -> None:
            try:
                http_get(self.net.client, vip, PORT, timeout_s=timeout_s)
                attempts.append((t, True))
            except OSError:
                attempts.append((t, False))

        with ThreadPoolExecutor(max_workers=max(4, int(timeout_s / 0.01) + 4)) as pool:
            for _ in range(1500):
                if stop.is_set():
                    return
                pool.submit(attempt, time.monotonic())
                time.sleep(0.01)  # pacing: the attempts sample time, they are not a load test

    def _lose(self, victim: int, mode: str) -> None:
        edged = self.edgeds[victim]
        if mode == "link":
            self.net.link_down(victim)
            edged.signal(signal.SIGKILL)  # bird dies with it (PR_SET_PDEATHSIG)
        elif mode == "silent":
            self.net.blackhole(victim)
            edged.signal(signal.SIGKILL)
        elif mode == "freeze":
            for pid in self.speaker_pids(victim) + [edged.proc.pid]:  # pids this fleet started
                os.kill(pid, signal.SIGSTOP)
            self.frozen.append(victim)
        else:
            edged.signal(signal.SIGTERM)

    def speaker_pids(self, i: int) -> list[int]:
        """The bird edged i started, from its 'bgp' event."""
        for e in self.edgeds[i].events:
            if e["kind"] == "bgp" and "(pid " in e["text"]:
                return [int(e["text"].split("(pid ", 1)[1].split(")", 1)[0])]
        return []

    def close(self) -> None:
        try:
            for i in self.frozen:
                for pid in self.speaker_pids(i) + [self.edgeds[i].proc.pid]:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            for e in self.edgeds:
                if e is not None:
                    e.stop()
            for i in range(self.net.topo.routers):
                Router(_RouterNet(self.net.router(i)), self.net.router_iface(i)).undeploy(check=False)
        finally:
            self.net.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
