"""Passive detection in the data path: a backend whose server dies while its heartbeats go on is
ejected after `consecutive` refused flows, and no more than max_ejected_percent of the backends
are ejected at once. Each test builds its own net (it kills servers), on the service of the
failover tests (failover.py).

        client ──veth── router ──veth── b0
                           ├────veth── b1
                           └────veth── b2
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Iterator

import pytest
from failover import (
    ALL,
    PASSIVE,
    backends,
    flows,
    heartbeat_agents,
    kill_server,
    service,
    status_under_traffic,
    wait_flows_reach,
)

from controlplane.lab.traffic import wait_until


@pytest.fixture
def heartbeats() -> Iterator[Callable[..., object]]:
    """start(net, i, ...) starts backend i's heartbeats; every one started is stopped in teardown."""
    with heartbeat_agents() as start:
        yield start


def test_a_backend_whose_server_dies_is_ejected_by_passive_detection(net, router, heartbeats):
    """b0's server is killed; its heartbeats go on. Flows picked for b0 are refused (RST); after 3
    (`consecutive`) b0 is ejected for 2 s. New flows made in the first 1.2 s of that (at least
    100, up to 200; the rest of the 2 s is margin for a slow last batch) all go to b1 and b2,
    none is refused. Status, read under traffic, shows b0 ejected."""
    router.deploy([service(router, passive=PASSIVE)])
    for i in range(3):
        heartbeats(net, i)
    wait_flows_reach(net, ALL)
    kill_server(net, 0)

    refused: Counter = Counter()
    batch_started = [0.0]

    def ejected() -> bool:
        batch_started[0] = time.monotonic()  # the ejection cannot be older than the last batch
        refused.update(flows(net, 10, flow_timeout_s=0.5))
        return router.counters()["verdicts"]["ejection"] >= 1

    wait_until(ejected, 5.0, "an ejection", observe=lambda: refused)
    seen: Counter = Counter()
    while sum(seen.values()) < 200 and time.monotonic() - batch_started[0] < 1.2:
        seen.update(flows(net, 20))
    snap, during_status = status_under_traffic(router, net)

    assert refused["error:refused"] >= PASSIVE["consecutive"], refused
    assert set(seen) - {"error:reset"} == {"b1", "b2"} and sum(seen.values()) >= 100, seen
    # A reset is a flow to healthy b1 or b2 moved by the clock race of test_failover.py's
    # test_established_connections_to_a_heartbeating_backend_never_move, not one that reached b0.
    assert seen["error:reset"] <= 2, seen
    b0 = backends(snap)["b0"]
    assert b0["state"] == "ejected", (b0, during_status)
    assert b0["health"]["ejections"] >= 1
    assert snap["verdicts"]["ejection"] >= 1


def test_passive_ejection_never_takes_out_more_than_max_ejected_percent(net, router, heartbeats):
    """3 backends, max_ejected_percent 50: ejecting a second one would take out 2/3 = 67%, so while
    one of the two killed servers is ejected the other stays "up" by health and keeps getting
    new flows, which are refused; b2 takes the rest."""
    router.deploy([service(router, passive=PASSIVE)])
    for i in range(3):
        heartbeats(net, i)
    wait_flows_reach(net, ALL)
    kill_server(net, 0)
    kill_server(net, 1)

    def ejected() -> bool:
        flows(net, 10, flow_timeout_s=0.5)  # refused where they reach b0 or b1
        return router.counters()["verdicts"]["ejection"] >= 1

    wait_until(ejected, 5.0, "an ejection")
    snap, seen = status_under_traffic(router, net)

    states = {n: b["state"] for n, b in backends(snap).items()}
    health = {n: b["health"] for n, b in backends(snap).items()}
    assert sorted([states["b0"], states["b1"]]) == ["ejected", "up"], (states, health, seen)
    assert states["b2"] == "up"
    assert seen["error:refused"] > 0 and seen["b2"] > 0, seen
