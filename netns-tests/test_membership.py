"""Membership changes through `edgectl deploy` with real traffic: replacing a backend and
renaming a service on its VIP never black-hole new flows, and connections whose backend
stays keep it; a second writer is refused while edged holds the router.

        client ──veth── router ──veth── b0, b1, b2
"""

from __future__ import annotations

from controlplane.testbed.router import Router
from controlplane.testbed.traffic import backends_seen, close_all, open_connections

PORT = 8000


def owners_after(conns) -> list:
    return [conn.request().backend for conn in conns]


def test_replacing_a_backend_leaves_the_new_one_serving(net, router: Router):
    """b1 out and b2 in, in one redeploy: every new flow is answered, by b0 or b2 only
    (before the fix half the table pointed at b2's cleared id: no_backend drops)."""
    router.deploy([router.service("web", backends=[0, 1])])
    conns = open_connections(net.client, net.vip, PORT, 20)
    try:
        before = owners_after(conns)
        router.deploy([router.service("web", backends=[0, 2])])
        kept = [k for k, b in enumerate(before) if b == "b0"]
        assert kept and [conns[k].request().backend for k in kept] == ["b0"] * len(kept)
    finally:
        close_all(conns)
    seen = backends_seen(net.client, net.vip, PORT, 300)
    assert set(seen) == {"b0", "b2"}, seen
    assert router.status()["drops"]["no_backend"] == 0


def test_renaming_a_service_on_its_vip_keeps_the_vip_and_its_connections(net, router: Router):
    """web -> web-v2 on the same VIP: the VIP keeps answering and every connection keeps its
    backend (the service keeps its ids); before the fix the VIP entry was deleted."""
    router.deploy([router.service("web")])
    conns = open_connections(net.client, net.vip, PORT, 20)
    try:
        before = owners_after(conns)
        router.deploy([router.service("web-v2")])
        assert owners_after(conns) == before
    finally:
        close_all(conns)
    seen = backends_seen(net.client, net.vip, PORT, 300)
    assert sum(n for b, n in seen.items() if not b.startswith("error")) == 300, seen
    assert [s["name"] for s in router.status()["services"]] == ["web-v2"]
