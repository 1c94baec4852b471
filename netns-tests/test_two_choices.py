"""Power of two choices (new_flows: two_choices): a new connection takes, of its Maglev slot's
backend and a second slot's, the one with fewer open connections per weight, from the data
path's own count (edge_inflight: a TCP connection counts from its SYN to its first FIN or RST).

        client ──veth── router (XDP, tc) ──veth── b0  holds the connections the test keeps open
                                          └──veth── b1

Two backends of equal weight. The test opens 60 connections, keeps those on b0 open (about 30)
and closes b1's, then makes 200 short connections one after another. With Maglev alone each
lands on b0 with probability 1/2 (about 100 of 200). With two choices only a flow whose two
candidates are both b0 goes there (probability 1/4, about 50): b0 has more open connections
than b1 while the test holds them. 75 lies more than 3.5 standard deviations from both.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from conftest import built_net, require_privileges, undeployed_after

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.topo import Net
from controlplane.lab.traffic import close_all, connect, open_connections, wait_until

PORT = 8000
HELD = 60  # connections opened first; b0's stay open
SHORT = 200  # short connections afterwards, one at a time
SPLIT = 75  # b0's share of SHORT: about 50 with two choices, about 100 without
EVICT = 1600  # connections held at once, over conntrack's 1024 entries: the LRU evicts open ones
LEAST_B0 = 5  # least_loaded compares both backends: b0 gets none (a few for a close not yet seen)


@pytest.fixture(scope="module")
def p2c_net() -> Iterator[Net]:
    require_privileges()
    with built_net(backends=2) as net:  # its backends on BACKEND_PORT, which is PORT
        yield net


@pytest.fixture
def router(p2c_net: Net):
    with undeployed_after(p2c_net) as router:
        yield router


def active(router) -> dict[str, int]:
    return {b["name"]: b["wire"]["active"] for b in router.status()["services"][0]["backends"]}


def hold_on_b0(net: Net, router) -> list:
    """The connections of HELD new ones that landed on b0, open; the others closed."""
    conns = open_connections(net.client, net.vip, PORT, HELD, timeout_s=5.0)
    held, other = [], []
    try:
        for c in conns:
            (held if c.request().backend == "b0" else other).append(c)
    except BaseException:
        close_all(conns)
        raise
    close_all(other)
    wait_until(
        lambda: active(router) == {"b0": len(held), "b1": 0},
        10.0,
        f"{len(held)} open connections on b0, none on b1",
        observe=lambda: active(router),
    )
    return held


def short_connections(net: Net, n: int) -> dict[str, int]:
    """n connections one after another, one request each, closed by the client: backend -> count."""
    seen: dict[str, int] = {}
    for _ in range(n):
        with connect(net.client, net.vip, PORT, timeout_s=5.0) as conn:
            name = conn.request().backend
        seen[name] = seen.get(name, 0) + 1
    return seen


@pytest.mark.parametrize("new_flows", ["two_choices", "least_loaded", "maglev"])
def test_new_connections_go_away_from_the_backend_holding_open_ones(p2c_net, router, new_flows):
    """two_choices: b0, holding about 30 open connections, gets fewer than SPLIT of SHORT
    (least_loaded: at most LEAST_B0, since b1 is always a candidate); the
    held connections stay on b0 (established flows never move). maglev (the control: the test
    tells the two apart): b0 gets its Maglev share, more than SPLIT."""
    net = p2c_net
    router.deploy([{**router.service("chat"), "new_flows": new_flows}])
    held = hold_on_b0(net, router)
    try:
        assert len(held) >= 15, f"only {len(held)} of {HELD} connections on b0"
        seen = short_connections(net, SHORT)
        assert sum(seen.values()) == SHORT and set(seen) <= {"b0", "b1"}, seen
        if new_flows == "two_choices":
            assert seen.get("b0", 0) < SPLIT, seen
        elif new_flows == "least_loaded":  # both backends are candidates: b1, with none open, every time
            assert seen.get("b0", 0) <= LEAST_B0, seen
        else:
            assert seen.get("b0", 0) > SPLIT, seen
        assert {c.request().backend for c in held} == {"b0"}
    finally:
        close_all(held)
    wait_until(lambda: active(router) == {"b0": 0, "b1": 0}, 10.0, "no open connections after closing")


def open_counts(router) -> dict[str, int]:
    return {b["name"]: b["wire"]["open"] for b in router.status()["services"][0]["backends"]}


def test_counts_of_connections_the_lru_evicted_while_open_return_to_zero(p2c_net, router, tmp_path):
    """conntrack of 1024 entries (the least) and EVICT connections held at once: the LRU evicts
    entries of open connections, whose close the data path never counts. Once all are closed,
    every backend's open count returns to 0: edged holds the counts to conntrack's open entries
    (edged/openfix.py) and says so in an open-fix event. Without that the evicted connections
    stay counted for good."""
    net = p2c_net
    node = {"api_socket": str(tmp_path / "edged.sock"), "ct_size": 1024}
    doc = router.config([{**router.service("chat"), "new_flows": "two_choices"}], node)
    edged = EdgedProc.start(net.router, doc, router.iface)
    try:
        conns = open_connections(net.client, net.vip, PORT, EVICT, timeout_s=5.0)
        close_all(conns)
        wait_until(
            lambda: open_counts(router) == {"b0": 0, "b1": 0},
            60.0,
            "every open count back to 0 after closing",
            observe=lambda: open_counts(router),
        )
        assert any(e["kind"] == "open-fix" for e in edged.events), "no open-fix event: nothing was evicted open?"
    finally:
        edged.stop()
