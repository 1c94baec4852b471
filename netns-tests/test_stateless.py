"""Connections the router has no conntrack entry for: what a router sees that inherits flows
through ECMP (identical tables fleet-wide, no entries), made here by emptying edge_ct.

        client ──veth── router ──veth── b0
       198.18.0.2    XDP on rt-c   ├──veth── b1      VIP 198.18.255.1:8000
                     tc on rt-bN   └──veth── b2      backends serve HTTP on :8000

A VIP connection whose entry is gone must still get every answer: its packets beyond the
per-CPU budget of new entries are forwarded by their Maglev pick (counted as stateless), and
the backend's replies are reverse-NATed because the Maglev slot of (client, VIP) names the
sender (return_stateless). Only the connection's own packets through the ingress give it its
entry back, within the budget: replies make none (a backend could fill conntrack with them). A connection to a
backend's own address (a client talking to it directly, the router's own probes) is no VIP
connection: its replies leave with the backend's address, entry or not.
"""

from __future__ import annotations

import json
import subprocess
import tempfile

from test_ipv6 import service6

from controlplane import abi
from controlplane.lab.router import Router
from controlplane.lab.traffic import close_all, open_connections

PORT = 8000  # conftest.BACKEND_PORT, also the VIP port
N_CONNS = 300  # well over the 64 entries a second each CPU may create for packets that are no SYN
TIMEOUT_S = 5.0  # per request: a packet dropped as untracked costs at least one retransmission


def empty_conntrack(router: Router, name: str = abi.MAP_CT) -> int:
    """Delete every entry of edge_ct (or name: edge_ct6) through bpftool (one batch); returns how many
    there were."""
    path = router.pin_path / name
    done = subprocess.run(
        ["bpftool", "-j", "map", "dump", "pinned", str(path)], capture_output=True, text=True, timeout=10.0, check=True
    )
    keys = [entry["key"] for entry in json.loads(done.stdout)]
    if not keys:
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".bpftool") as batch:
        for key in keys:
            batch.write(f"map delete pinned {path} key {' '.join(key)}\n")
        batch.flush()
        subprocess.run(
            ["bpftool", "batch", "file", batch.name], capture_output=True, text=True, timeout=30.0, check=True
        )
    return len(keys)


def conntrack_entries(router: Router) -> int:
    done = subprocess.run(
        ["bpftool", "-j", "map", "dump", "pinned", str(router.pin_path / abi.MAP_CT)],
        capture_output=True,
        text=True,
        timeout=10.0,
        check=True,
    )
    return len(json.loads(done.stdout))


def delta(after: dict, before: dict, kind: str, name: str) -> int:
    return after[kind].get(name, 0) - before[kind].get(name, 0)


def test_connections_keep_their_answers_after_conntrack_is_emptied(net, router):
    """300 long-lived connections through the VIP, one request each; edge_ct is emptied; one more
    request on each is answered by the backend it had, with no packet dropped as untracked
    (before this was built, every packet beyond the budget was, and its connection waited for
    retransmissions). Packets were forwarded statelessly and replies reverse-NATed by Maglev,
    and afterwards conntrack knows some of the connections again (the budget's entries: the
    return path makes none)."""
    router.deploy([router.service("web")])
    conns = open_connections(net.client, net.vip, PORT, N_CONNS)
    try:
        for conn in conns:
            conn.sock.settimeout(TIMEOUT_S)
        first = [c.request().backend for c in conns]
        assert empty_conntrack(router) == N_CONNS
        before = router.counters()
        again = [c.request().backend for c in conns]
        after = router.counters()
        entries = conntrack_entries(router)
    finally:
        close_all(conns)

    assert set(first) == {"b0", "b1", "b2"}, first
    assert again == first
    assert delta(after, before, "drops", "untracked") == 0
    assert delta(after, before, "verdicts", "stateless") > 0
    assert delta(after, before, "verdicts", "return_stateless") > 0
    assert 0 < entries <= N_CONNS


def test_direct_connections_to_a_backend_are_not_rewritten_without_conntrack(net, router):
    """30 connections from the client straight to b0's address and 30 from the router namespace
    (as edged's probes go), opened after deploy, so the router saw their SYN-ACKs; edge_ct is
    emptied and each asks again. Every answer comes from b0's own address: about half of these
    tuples hash to b0's Maglev slot as if they were VIP connections (with three backends one
    in three; 60 tuples all missing it: (2/3)**60, about 3e-11), so a return path that judged
    them by the table alone would have rewritten them, and the client's socket, talking to
    b0's address, would never see the answer."""
    router.deploy([router.service("web")])
    b0 = net.topo.backend_addr(0).ip
    conns = open_connections(net.client, b0, PORT, 30) + open_connections(net.router, b0, PORT, 30)
    try:
        for conn in conns:
            conn.sock.settimeout(TIMEOUT_S)
        first = [(c.request().backend, c.server_addr) for c in conns]
        empty_conntrack(router)
        before = router.counters()
        again = [(c.request().backend, c.server_addr) for c in conns]
        after = router.counters()
    finally:
        close_all(conns)

    assert set(first) == {("b0", f"{b0}:{PORT}")}, first
    assert again == first
    assert delta(after, before, "verdicts", "return_stateless") == 0


def test_ipv6_connections_keep_their_answers_and_direct_ones_their_address_without_conntrack(net, router):
    """The two tests above for IPv6 (state6.h), on one deploy: 300 IPv6 connections through the
    VIP and 20 straight to b0's IPv6 address (10 from the client, 10 from the router namespace, as
    edged's probes go); edge_ct6 is emptied and each asks again. The VIP connections get their
    answers from the backends they had, with no packet dropped as untracked (before state6.h
    every packet beyond the budget was, and the backends' replies left with their own addresses,
    which the client's sockets ignore: requests timed out); the direct ones from b0's address."""
    router.deploy([service6(router, net)])
    b0 = net.topo.backend_addr6(0).ip
    conns = open_connections(net.client, net.topo.vip6, PORT, N_CONNS)
    direct = open_connections(net.client, b0, PORT, 10) + open_connections(net.router, b0, PORT, 10)
    try:
        for conn in conns + direct:
            conn.sock.settimeout(TIMEOUT_S)
        first = [c.request().backend for c in conns]
        first_direct = [(c.request().backend, c.server_addr) for c in direct]
        assert empty_conntrack(router, abi.MAP_CT6) == N_CONNS
        before = router.counters()
        again = [c.request().backend for c in conns]
        again_direct = [(c.request().backend, c.server_addr) for c in direct]
        after = router.counters()
    finally:
        close_all(conns + direct)

    assert set(first) == {"b0", "b1", "b2"}, first
    assert again == first
    assert delta(after, before, "drops", "untracked") == 0
    assert delta(after, before, "verdicts", "stateless") > 0
    assert delta(after, before, "verdicts", "return_stateless") > 0
    assert {b for b, _ in first_direct} == {"b0"} and len({a for _, a in first_direct}) == 1, first_direct
    assert again_direct == first_direct
