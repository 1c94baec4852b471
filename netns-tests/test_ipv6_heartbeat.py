"""Heartbeats of IPv6 backends (heartbeat6.h): edge-heartbeat sends over IPv6 from each backend's
IPv6 address to the router's on its link, the return path (return6.h) stamps the backend's health,
and failover by heartbeat stays in the kernel as for IPv4 (test_failover.py).

        client ──veth── router ──veth── b0      IPv6 VIP 2001:2:0:ffff::1 on port 8000,
     2001:2::2       XDP on rt-c   ├──veth── b1  backends 2001:2:0:{i+1}::2, each with an agent
                     tc on rt-bN   └──veth── b2  (edge-heartbeat, --check none) sending to
                                                  [2001:2:0:{i+1}::1]:7946

Addresses from 2001:2::/48 only (controlplane/lab/topo.py), in the test's own namespaces; agents
are stopped (by pid) in teardown.
"""

from __future__ import annotations

import socket
from collections import Counter

from controlplane import abi
from controlplane.agent.wire import clock_ns
from controlplane.lab.heartbeats import start_heartbeats
from controlplane.lab.router import Router
from controlplane.lab.topo import Net
from controlplane.lab.traffic import backends_seen, wait_until

PORT = 8000  # conftest.BACKEND_PORT, also the VIP's port
HB_PORT = 7946
TOKENS = {i: 0x6EED0000 + i for i in range(3)}
ALL = {"b0", "b1", "b2"}
INTERVAL_MS = 5
TIMEOUT_MS = 250  # 50 intervals: far beyond a scheduling stall, short next to the test
SAMPLE = 30  # flows per poll: one of 3 equal backends is missed with p = (2/3)**30 < 1e-5
IPV6_TRANSPARENT = 75  # linux/in6.h: bind to an address the host does not have


def service6(router: Router, net: Net) -> dict:
    """web6 on the IPv6 VIP, b0..b2 by their IPv6 addresses, judged by heartbeats."""
    health = {"heartbeat": {"port": HB_PORT, "interval_ms": INTERVAL_MS, "timeout_ms": TIMEOUT_MS, "rise": 3}}
    svc = router.service("web6", vip=str(net.topo.vip6), health=health)
    for entry in svc["backends"]:
        i = int(entry["name"][1:])
        entry["address"] = str(net.topo.backend_addr6(i).ip)
        entry["token"] = hex(TOKENS[i])
    return svc


def wait_flows_reach(net: Net, want: set[str], timeout_s: float = 10.0) -> None:
    last: dict = {}

    def reached() -> bool:
        last["seen"] = backends_seen(net.client, net.topo.vip6, PORT, SAMPLE, flow_timeout_s=0.5)
        return set(last["seen"]) == want

    wait_until(reached, timeout_s, f"{SAMPLE} new flows reach exactly {sorted(want)}", observe=lambda: last.get("seen"))


def web6_backends(snap: dict) -> dict[str, dict]:
    return {b["name"]: b for s in snap["services"] if s["name"] == "web6" for b in s["backends"]}


def test_new_flows_leave_an_ipv6_backend_whose_agent_is_killed(net, router):
    """Agents on b0..b2 heartbeat over IPv6: new flows reach all three. b1's agent is killed (by its
    pid, as if it crashed): new flows stop reaching b1 (within the 250 ms timeout plus a poll) and
    300 more all succeed on b0 and b2. Status shows b1 down and the others up, the node counted
    heartbeats, and no heartbeat was rejected."""
    router.deploy([service6(router, net)])
    agents = []
    try:
        for i in range(3):
            agents.append(start_heartbeats(net, i, token=TOKENS[i], hb_port=HB_PORT, interval_ms=INTERVAL_MS, family=6))
        wait_flows_reach(net, ALL)
        agents[1].kill()
        wait_flows_reach(net, {"b0", "b2"})
        after = backends_seen(net.client, net.topo.vip6, PORT, 300)
        snap = router.status()
    finally:
        for agent in agents:
            agent.stop()
    assert set(after) == {"b0", "b2"} and sum(after.values()) == 300, after
    states = {name: b["state"] for name, b in web6_backends(snap).items()}
    assert states == {"b0": "up", "b1": "down", "b2": "up"}, states
    assert snap["verdicts"]["heartbeat"] > 0
    assert snap["drops"]["spoofed_heartbeat"] == 0 and snap["drops"]["replayed_heartbeat"] == 0


def _heartbeats_from_client(net: Net, source: str, n: int) -> None:
    """n heartbeats with b0's token and service port from the client namespace to the router's
    client-side IPv6 address, from source (bound transparently: it need not be the client's)."""
    with net.client.enter():
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
        sock.bind((source, 0))
        epoch = clock_ns() // 1_000_000_000
        for seq in range(1, n + 1):
            sock.sendto(abi.heartbeat(PORT, seq, TOKENS[0], epoch), (str(net.topo.router_client_addr6.ip), HB_PORT))
    finally:
        sock.close()


def test_ipv6_heartbeats_from_the_client_side_are_dropped_and_revive_nothing(net, router):
    """No agent runs, so every backend is down. Heartbeats with b0's valid token arrive on the
    client's side: from the client's own address (unregistered) and from b0's address (forged:
    registered, but on b0's link). The IPv6 ingress drops each as spoofed_heartbeat, none is
    counted as taken, and b0 stays down: a client cannot keep a dead backend alive."""
    router.deploy([service6(router, net)])
    before = router.counters()
    _heartbeats_from_client(net, str(net.topo.client_addr6.ip), 5)
    _heartbeats_from_client(net, str(net.topo.backend_addr6(0).ip), 5)

    def counted() -> bool:
        return router.counters()["drops"]["spoofed_heartbeat"] >= before["drops"]["spoofed_heartbeat"] + 10

    wait_until(counted, 5.0, "10 spoofed heartbeats counted", observe=lambda: router.counters()["drops"])
    after = router.counters()
    seen: Counter = backends_seen(net.client, net.topo.vip6, PORT, 5, flow_timeout_s=0.3)
    assert after["drops"]["spoofed_heartbeat"] == before["drops"]["spoofed_heartbeat"] + 10
    assert after["verdicts"]["heartbeat"] == before["verdicts"]["heartbeat"]
    assert web6_backends(router.status())["b0"]["state"] == "down"
    assert set(seen) == {"error:timeout"}, seen  # every backend down: no flow gets through
