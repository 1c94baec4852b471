"""edge-heartbeat beside the testbed backends, against the deployed router: a backend gets new
flows exactly while its agent's health check passes, with no control-plane round trip.

        client ──veth── router ──veth── b0   backend :8000, agent 198.18.1.2 → 198.18.1.1:7946
                           ├────veth── b1   backend :8000, agent 198.18.2.2 → 198.18.2.1:7946
                           └────veth── b2   backend :8000, agent 198.18.3.2 → 198.18.3.1:7946

Each agent sends every 1 ms while GET http://<backend>:8000/v2/health/ready answers 2xx (the
testbed backend answers 200 on any path); the router calls a backend down after 5 ms of
silence and up again after 3 heartbeats in a row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

from controlplane.lab.heartbeats import PACKAGE_ROOT, Agent, start_all
from controlplane.lab.procs import read_line
from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Server, backend_role
from controlplane.lab.traffic import backends_seen, wait_until

PORT = 8000  # conftest.BACKEND_PORT
TOKENS = [0x5EED0000 + i for i in range(3)]
HEARTBEAT = {"port": 7946, "interval_ms": 1, "timeout_ms": 5, "rise": 3}
STATUS_TIMEOUT_S = 120.0  # every `edgectl status` compiles the data path first (seconds each)
FLOWS = 300


def heartbeat_service(router: Router, existing_flows: str = "keep", **heartbeat: int) -> dict:
    """One service over b0..b2, each backend with its own token, down without heartbeats;
    heartbeat: settings that differ from HEARTBEAT.

    existing_flows: keep by default, because on a busy host a Python sender sometimes wakes
    4+ ms late: with a 5 ms timeout that is a down-and-rising blip of a few ms, and `reselect`
    would move a connection in flight to another backend, which resets it.
    """
    service = router.service("chat", existing_flows=existing_flows, health={"heartbeat": {**HEARTBEAT, **heartbeat}})
    for entry, token in zip(service["backends"], TOKENS):
        entry["token"] = hex(token)
    return service


def states(router: Router) -> dict[str, str]:
    """{backend name: state} as `edgectl status --json` reports it."""
    [service] = router.status()["services"]
    return {b["name"]: b["state"] for b in service["backends"]}


def wait_state(router: Router, want: dict[str, str]) -> None:
    wait_until(
        lambda: all(states(router).get(name) == state for name, state in want.items()),
        STATUS_TIMEOUT_S,
        f"backend states {want}",
        observe=lambda: states(router),
    )


def kill_backend(net: Net, i: int) -> None:
    """SIGKILL backend i's server by its pid, like a crashed inference server."""
    server = net.servers[i]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=5)


def restart_backend(net: Net, i: int) -> Server:
    """A new server process for backend i on the same address and port (the Net stops it on close)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    name, addr = backend_role(i), net.backend_addr(i)
    proc = net.backends[i].popen(
        [sys.executable, "-m", "controlplane.lab.backend", "--name", name, "--listen", f"{addr}:{PORT}"],
        stdout=subprocess.PIPE,
        env=env,
    )
    line = read_line(proc, timeout_s=10.0)
    assert line.startswith(f"listening {name} "), line
    net.servers[i] = Server(name, net.backends[i], addr, PORT, proc)
    return net.servers[i]


def seen(net: Net) -> Counter:
    return backends_seen(net.client, net.vip, PORT, FLOWS)


def stop_all(agents: list[Agent]) -> list[int | None]:
    """Stop every agent; their exit codes."""
    return [agent.stop() for agent in agents]


def outputs(agents: list[Agent]) -> dict[str, list[str]]:
    """The last lines of every agent, for assertion messages."""
    return {f"b{agent.backend}": agent.lines()[-5:] for agent in agents}


def test_a_backend_serves_exactly_while_its_agents_check_passes(net, router):
    router.deploy([heartbeat_service(router)])
    agents = start_all(net, TOKENS, check="http", interval_ms=1)
    try:
        # (a) every agent's check passes: all three backends come up and take new flows.
        for agent in agents:
            agent.wait_line("ready: http 200", timeout_s=10.0)
        wait_state(router, {"b0": "up", "b1": "up", "b2": "up"})
        first = seen(net)
        assert set(first) == {"b0", "b1", "b2"}, first  # no errors; 300 flows reach all three
        counters = router.counters()
        assert counters["verdicts"]["heartbeat"] > 0
        assert counters["drops"].get("spoofed_heartbeat", 0) == 0  # right address, port, token

        # (b) b1's server dies: its agent stops at once, the router calls b1 down, flows avoid it.
        kill_backend(net, 1)
        assert agents[1].wait_line("not ready", timeout_s=5.0).startswith("not ready: http: ")
        wait_state(router, {"b1": "down", "b0": "up", "b2": "up"})
        without = seen(net)
        assert set(without) == {"b0", "b2"}, without  # none to b1, none lost

        # (c) b1's server is back: the agent resumes and b1 takes new flows again after rise.
        restart_backend(net, 1)
        agents[1].wait_line("ready: http 200", timeout_s=10.0, n=2)
        wait_state(router, {"b0": "up", "b1": "up", "b2": "up"})
        again = seen(net)
        assert set(again) == {"b0", "b1", "b2"}, again
        assert [agent.running for agent in agents] == [True, True, True]
    finally:
        codes = stop_all(agents)
    assert codes == [0, 0, 0], outputs(agents)  # SIGTERM: a clean exit


def test_an_agent_without_a_check_keeps_a_dead_server_in_service_until_it_stops(net, router):
    """--check none is an agent that outlives its server: the router cannot tell, flows to b2
    are refused, until the agent itself dies (SIGKILL) and its heartbeats end.

    reselect here: a refused connection leaves no TIME_WAIT, so the client soon reuses its
    5-tuple, and under `keep` the router's conntrack entry would send that new SYN to b2 again.
    The longer timeout keeps reselect from moving flows on a late heartbeat (see heartbeat_service).
    """
    router.deploy([heartbeat_service(router, existing_flows="reselect", timeout_ms=50)])
    agents = start_all(net, TOKENS, check="none", interval_ms=1)
    try:
        wait_state(router, {"b0": "up", "b1": "up", "b2": "up"})
        kill_backend(net, 2)

        while_alive = seen(net)
        assert "b2" not in while_alive and set(while_alive) - {"b0", "b1"}, while_alive  # some fail
        assert agents[2].running and agents[2].count("not ready") == 0

        agents[2].kill()
        wait_state(router, {"b2": "down"})
        after = seen(net)
        assert set(after) == {"b0", "b1"}, after
    finally:
        codes = stop_all(agents)
    assert codes == [0, 0, -signal.SIGKILL], outputs(agents)
