"""Failover in the data path: heartbeats, link loss, standbys, spoofing, rise (passive ejection:
test_passive_ejection.py; the service and helpers both use: failover.py).

        client ──veth── router ──veth── b0
                           ├────veth── b1
                           └────veth── b2

Heartbeats are real UDP datagrams from each backend's namespace (hb.py). Every edgectl call
compiles the data path (3 s on an idle machine, far more on a busy one), so the tests that only
stop heartbeats or links share one net and one deployment (`shared`), which redeploys only for
another config, in file order. Each test starts
the heartbeats it needs and stops them all in teardown. Some tests pin down bugs found here
(reused client ports, a clock race between CPUs) so they stay fixed.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator

import hb
import pytest
from failover import (
    ALL,
    FRESH_PORT,
    PORT,
    SLOW_TIMEOUT_MS,
    STANDBY_VIP,
    TIMEOUT_MS,
    TOKENS,
    answer,
    attempt_is_dropped,
    backends,
    flows,
    heartbeat_agents,
    link_down,
    service,
    wait_flows_reach,
)

from controlplane.lab.router import Router
from controlplane.lab.topo import Net
from controlplane.lab.traffic import Conn, close_all, open_connections, wait_until


class Deployment:
    """The shared router's deployment: deploys only when a test wants another config, or fresh
    state (fresh: undeploy first; health is kept per backend address and port across redeploys)."""

    def __init__(self, router: Router):
        self.router = router
        self.doc: dict | None = None

    def ensure(self, services: list[dict], fresh: bool = False) -> Router:
        doc = Router.config(services)
        if fresh and self.doc is not None:
            self.doc = None
            self.router.undeploy()
        if doc != self.doc:
            self.doc = None  # unknown until deploy succeeds
            self.router.deploy(services)
            self.doc = doc
        return self.router


@pytest.fixture(scope="module")
def shared(shared_router: Router) -> Deployment:
    """The deployment of shared_net's router (undeployed after the module by shared_router)."""
    return Deployment(shared_router)


@pytest.fixture(scope="module")
def fresh_endpoints(shared_net: Net) -> int:
    """A second set of backend servers, on FRESH_PORT: endpoints whose health state is new."""
    shared_net.start_backends(port=FRESH_PORT)
    return FRESH_PORT


@pytest.fixture
def heartbeats() -> Iterator[Callable[..., object]]:
    """start(net, i, ...) starts backend i's heartbeats; every one started is stopped in teardown."""
    with heartbeat_agents() as start:
        yield start


# ------------------------------------------------------------------ heartbeats and links


def test_new_flows_avoid_a_backend_whose_heartbeats_stop(shared_net, shared, heartbeats):
    """b0 has sent no heartbeat since deploy: none of 300 new flows reach it. Once it heartbeats it
    takes its share; once it stops, none of the next 300 reach it and none fail. Each flow whose
    Maglev slot is b0's counts as a failover of the backend that took it: b0 owns a third of the
    slots (3 equal weights), so the 600 flows made while b0 was down give about 200 (sd ~12)."""
    net = shared_net
    router = shared.ensure([service(shared.router)], fresh=True)
    heartbeats(net, 1)
    heartbeats(net, 2)
    wait_flows_reach(net, {"b1", "b2"})

    never_heard = flows(net, 300)

    b0 = heartbeats(net, 0)
    wait_flows_reach(net, ALL)
    b0.stop()
    wait_flows_reach(net, {"b1", "b2"})

    after_stop = flows(net, 300)
    snap = router.status()

    assert set(never_heard) == {"b1", "b2"}, never_heard  # and so no errors
    assert set(after_stop) == {"b1", "b2"}, after_stop
    by_name = backends(snap)
    assert by_name["b0"]["state"] == "down"
    assert by_name["b0"]["failovers"] == 0  # nothing fails over onto a dead backend
    failovers = snap["services"][0]["failovers"]
    assert failovers == sum(b["failovers"] for b in by_name.values())
    assert 150 <= failovers <= snap["services"][0]["new_flows"] - by_name["b0"]["new_flows"], failovers


def test_new_flows_avoid_a_backend_whose_link_goes_down(shared_net, shared, heartbeats):
    """The router's veth to b0 goes down: b0's heartbeats stop arriving, so none of 300 new flows
    go there and none fail; with the link back, b0 rises and takes flows again."""
    net = shared_net
    shared.ensure([service(shared.router)])
    for i in range(3):
        heartbeats(net, i)
    wait_flows_reach(net, ALL)

    with link_down(net, net.router, net.backend_iface(0)):
        wait_flows_reach(net, {"b1", "b2"})
        seen = flows(net, 300)

    assert set(seen) == {"b1", "b2"}, seen
    wait_flows_reach(net, ALL)


@dataclass(frozen=True)
class Spoof:
    """A heartbeat the router must reject: sent from namespace `sender` with the source address of
    role `source` (forged when it is not the sender's) to the router's address on `to`'s link."""

    description: str
    sender: str
    source: str
    to: str
    token: int


SPOOFS = [
    Spoof("client, b0's token, to the router's client-side address", "c", "c", "c", TOKENS[0]),
    Spoof("client forging b0's address and token", "c", "b0", "c", TOKENS[0]),
    Spoof("b1 with b0's token", "b1", "b1", "b1", TOKENS[0]),
    Spoof("b1 forging b0's address and token (wrong interface)", "b1", "b0", "b0", TOKENS[0]),
    Spoof("b0's own address with a wrong token", "b0", "b0", "b0", TOKENS[0] ^ 0xFFFF),
]
SPOOF_SEQ = 0xBAD00000  # spoofed heartbeats carry seq SPOOF_SEQ + k; real ones count from 0
PER_SPOOF = 20


def test_spoofed_heartbeats_do_not_revive_a_dead_backend(shared_net, shared):
    """No backend sends real heartbeats here, so all are down and the heartbeat counter must not
    move. Each spoof sends PER_SPOOF heartbeats; each one is dropped as spoofed_heartbeat, and b0
    stays down: connections still find no backend, and b0 never took a spoofed seq."""
    net = shared_net
    router = shared.ensure([service(shared.router)])
    wait_until(lambda: attempt_is_dropped(net, router), 5.0, "a connection dropped with no_backend")

    def addr_of(role):
        return net.topo.client_addr.ip if role == "c" else net.backend_addr(int(role[1:]))

    def router_addr_on(role):
        return net.topo.router_client_addr.ip if role == "c" else net.topo.router_backend_addr(int(role[1:])).ip

    def spoofed() -> int:
        return router.counters()["drops"]["spoofed_heartbeat"]

    for case in SPOOFS:
        before = router.counters()
        ns = net.namespaces[case.sender]
        with hb.hb_socket(ns, addr_of(case.source), forge=case.source != case.sender) as sock:
            for k in range(PER_SPOOF):
                hb.send(sock, router_addr_on(case.to), SPOOF_SEQ + k, case.token)
        want = before["drops"]["spoofed_heartbeat"] + PER_SPOOF
        wait_until(lambda want=want: spoofed() >= want, 2.0, f"{case.description}: {want} spoofed", observe=spoofed)
        after = router.counters()

        assert after["drops"]["spoofed_heartbeat"] == want, case.description
        assert after["verdicts"]["heartbeat"] == before["verdicts"]["heartbeat"], case.description

    assert attempt_is_dropped(net, router)
    b0 = backends(router.status())["b0"]
    assert b0["state"] == "down"
    assert b0["health"]["heartbeat_seq"] < SPOOF_SEQ


def test_with_every_backend_down_connections_fail_until_one_returns(shared_net, shared, heartbeats):
    """All heartbeats stop: 20 new connections time out, each SYN dropped with no_backend (at least
    20 drops; retransmitted SYNs add more) and the data path stays attached. When b1 heartbeats
    again, all of 200 new flows reach it."""
    net = shared_net
    router = shared.ensure([service(shared.router)])
    senders = [heartbeats(net, i) for i in range(3)]
    wait_flows_reach(net, ALL)
    for sender in senders:
        sender.stop()
    wait_until(lambda: attempt_is_dropped(net, router), 5.0, "a connection dropped with no_backend")

    before = router.counters()["drops"]["no_backend"]
    seen = flows(net, 20, flow_timeout_s=0.5)
    dropped = router.counters()["drops"]["no_backend"] - before

    assert seen == Counter({"error:timeout": 20})
    assert dropped >= 20
    assert router.iface_state(router.iface).xdp_prog_id is not None
    heartbeats(net, 1)
    wait_flows_reach(net, {"b1"})
    assert flows(net, 200) == Counter(b1=200)


# ------------------------------------------------------------------ existing flows


@pytest.mark.parametrize(
    "mode, moved_conns_answer",
    [("reselect", False), ("keep", True)],
    ids=["reselect moves them and they fail", "keep leaves them on b0"],
)
def test_existing_flows_of_a_silent_backend_move_or_stay(shared_net, shared, heartbeats, mode, moved_conns_answer):
    """30 keep-alive connections (about 10 on each backend), then b0's heartbeats stop (its server
    still runs) for longer than twice the timeout, the grace live flows get (status shows the
    age). reselect: b0's connections move to a backend that does not know them, which answers
    with RST; keep: they stay on b0 and keep answering. Others answer as before."""
    net = shared_net
    router = shared.ensure([service(shared.router, existing_flows=mode)])
    b0 = heartbeats(net, 0)
    for i in (1, 2):
        heartbeats(net, i)
    wait_flows_reach(net, ALL)

    conns = open_connections(net.client, net.vip, PORT, 30)
    try:
        first = [conn.request().backend for conn in conns]
        b0.stop()
        wait_flows_reach(net, {"b1", "b2"})  # new flows leave b0 after one timeout; live flows after two
        age = {}

        def silent_long_enough() -> bool:
            age["s"] = backends(router.status())["b0"]["health"]["heartbeat_age_s"]
            return age["s"] is not None and age["s"] > 2 * TIMEOUT_MS / 1000

        wait_until(silent_long_enough, 5.0, "status: b0 silent for twice the timeout", observe=lambda: age)
        silent_s = age["s"]
        again = [answer(conn) for conn in conns]
    finally:
        close_all(conns)

    assert "b0" in first, first
    assert silent_s > 2 * TIMEOUT_MS / 1000, silent_s
    for was, now in zip(first, again):
        if was != "b0" or moved_conns_answer:
            assert now == was, (mode, first, again)
        else:
            assert now == "error:ConnectionResetError", (mode, first, again)


REUSED_PORTS = range(20000, 20030)  # below the ephemeral range: no other flow of the module uses them


def request_from(net: Net, port: int, vip: str | None = None) -> str:
    """One GET on a new connection from client port `port`, closed with RST (no TIME_WAIT, so
    the port can connect again at once); the backend's name or "error:<exception>"."""
    vip = vip or str(net.vip)
    with net.client.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.bind((str(net.topo.client_addr.ip), port))
        sock.connect((vip, PORT))
        return Conn(sock, vip, PORT).request().backend
    except OSError as e:
        return f"error:{type(e).__name__}"
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def test_a_new_connection_on_a_reused_client_port_avoids_a_down_backend(shared_net, shared, heartbeats):
    """existing_flows keep, timeout 1 s. 30 connections from fixed client ports, about 10 of them
    on b0, each closed with RST; b0's heartbeats stop; once new flows avoid b0 (1 s), 30 new
    connections from the same ports, made within the next second, where live flows would still
    keep b0. Each starts with a SYN, so each is a new flow and none may reach b0."""
    net = shared_net
    shared.ensure([service(shared.router, existing_flows="keep", timeout_ms=1000)])
    b0 = heartbeats(net, 0)
    for i in (1, 2):
        heartbeats(net, i)
    wait_flows_reach(net, ALL)

    first = [request_from(net, port) for port in REUSED_PORTS]
    if "b0" not in first or any(b.startswith("error:") for b in first):
        pytest.fail(f"setup: wanted answers, some from b0, got {first}")  # not the expected failure
    b0.stop()
    wait_flows_reach(net, {"b1", "b2"})
    again = [request_from(net, port) for port in REUSED_PORTS]

    assert "b0" not in again, list(zip(first, again))


# ------------------------------------------------------------------ standby and rise


def test_a_standby_gets_new_flows_only_while_every_primary_is_down(shared_net, shared, heartbeats):
    """b0, b1 primaries, b2 standby, all heartbeating: 300 new flows, none on b2. Both primaries
    silent: all 300 on b2. b0 back: all 300 on b0 (b1 is still down), none on b2. The service
    moves to a VIP of its own: earlier tests' conntrack entries to b2 would otherwise take new
    connections that reuse their client ports to b2 (the bug
    test_a_new_connection_on_a_reused_client_port_avoids_a_standby shows). Each counted flow has
    2 s, so a SYN the kernel retransmits (after 1 s) still counts by where it went: a full run with
    two workers saw one of 300 time out at 1 s once."""
    net = shared_net
    vip = STANDBY_VIP
    shared.ensure([service(shared.router, standby=(2,), vip=vip)])
    primaries = [heartbeats(net, i) for i in (0, 1)]
    heartbeats(net, 2)
    wait_flows_reach(net, {"b0", "b1"}, vip=vip)

    all_up = flows(net, 300, vip=vip, flow_timeout_s=2.0)
    for sender in primaries:
        sender.stop()
    wait_flows_reach(net, {"b2"}, vip=vip)
    primaries_down = flows(net, 300, vip=vip, flow_timeout_s=2.0)
    heartbeats(net, 0)
    wait_flows_reach(net, {"b0"}, vip=vip)
    one_back = flows(net, 300, vip=vip, flow_timeout_s=2.0)

    assert set(all_up) == {"b0", "b1"}, all_up
    assert primaries_down == Counter(b2=300)
    assert one_back == Counter(b0=300)


def test_a_new_connection_on_a_reused_client_port_avoids_a_standby(shared_net, shared, heartbeats):
    """The standby service of the test above. Only b2 (standby) heartbeats: 30 connections from
    fixed client ports all go to b2, each closed with RST. b0 and b1 heartbeat again: 30 new
    connections from the same ports are new flows while primaries are usable, so none may reach b2."""
    net = shared_net
    vip = STANDBY_VIP
    shared.ensure([service(shared.router, standby=(2,), vip=vip)])
    heartbeats(net, 2)
    wait_flows_reach(net, {"b2"}, vip=vip)

    first = [request_from(net, port, vip) for port in REUSED_PORTS]
    if set(first) != {"b2"}:
        pytest.fail(f"setup: wanted every answer from b2, got {first}")  # not the expected failure
    for i in (0, 1):
        heartbeats(net, i)
    wait_flows_reach(net, {"b0", "b1"}, vip=vip)
    again = [request_from(net, port, vip) for port in REUSED_PORTS]

    assert "b2" not in again, again


def test_a_recovered_backend_returns_only_after_rise_heartbeats(shared_net, shared, fresh_endpoints):
    """rise 3, heartbeats sent one at a time. The timeout (60 s) is far longer than the status calls
    (3-8 s each) between them, so no gap restarts the count. The backends serve on a port of their
    own here, so their health starts empty (it is kept per address and port across redeploys).
    b1 and b2 get 3 heartbeats each (up), b0 gets 2: "rising", and none of 60 new flows reach it;
    its 3rd (with a 4th for b1 and b2, which keeps them up) makes it "up" and it takes flows
    again: 8, then 11 heartbeats more than before."""
    net = shared_net
    router = shared.ensure([service(shared.router, timeout_ms=SLOW_TIMEOUT_MS, backend_port=fresh_endpoints)])
    socks = [hb.hb_socket(net.backends[i], net.backend_addr(i)) for i in range(3)]
    try:

        def beat(i: int, seq: int) -> None:
            hb.send(socks[i], net.topo.router_backend_addr(i).ip, seq, TOKENS[i], service_port=fresh_endpoints)

        def count() -> int:
            return router.counters()["verdicts"]["heartbeat"]

        start = count()

        def wait_heartbeats(n: int) -> None:
            wait_until(lambda: count() >= start + n, 2.0, f"{n} heartbeats consumed", observe=count)

        for seq in range(3):
            beat(1, seq)
            beat(2, seq)
        beat(0, 0)
        beat(0, 1)
        wait_heartbeats(8)
        rising = backends(router.status())
        before_rise = flows(net, 60)
        beat(0, 2)
        beat(1, 3)
        beat(2, 3)
        wait_heartbeats(11)
        risen = backends(router.status())
        after_rise = flows(net, 60)
    finally:
        for sock in socks:
            sock.close()

    assert {n: b["state"] for n, b in rising.items()} == {"b0": "rising", "b1": "up", "b2": "up"}
    assert rising["b0"]["health"]["rise_count"] == 2
    assert set(before_rise) == {"b1", "b2"}, before_rise
    assert {n: b["state"] for n, b in risen.items()} == {"b0": "up", "b1": "up", "b2": "up"}
    assert risen["b0"]["health"]["rise_count"] == 3
    assert set(after_rise) == ALL, after_rise


def test_established_connections_to_a_heartbeating_backend_never_move(shared_net, shared, fresh_endpoints, heartbeats):
    """Every backend heartbeats every 50 us (the more often, the likelier the race above) under the
    60 s timeout of the rise test, so no real silence can make one unusable. 6 keep-alive
    connections make 2000 requests each; each answer must come from the backend that answered the
    connection's first. Seen on a 2-CPU VM: 4 to 6 of the 6 reset within 2000 requests. Reuses
    the rise test's deployment, so it comes after it (its heartbeats spoil the fresh endpoints)."""
    net = shared_net
    shared.ensure([service(shared.router, timeout_ms=SLOW_TIMEOUT_MS, backend_port=fresh_endpoints)])
    for i in range(3):
        heartbeats(net, i, interval_ms=0.05, service_port=fresh_endpoints)
    wait_flows_reach(net, ALL)

    conns = open_connections(net.client, net.vip, PORT, 6)
    try:
        first = [answer(conn) for conn in conns]
        moved = {k: f"first request: {b}" for k, b in enumerate(first) if b.startswith("error:")}
        for k, conn in enumerate(conns):
            if k in moved:
                continue
            for n in range(2000):
                backend = answer(conn)
                if backend != first[k]:
                    moved[k] = f"{first[k]} -> {backend} at request {n}"
                    break
    finally:
        close_all(conns)

    assert moved == {}, moved
