"""IPv6 VIP announcement over BGP with real daemons (lab/ecmp.py's fleet with IPv6, fleet6.py):
each router's edged runs bird with an IPv4 and an IPv6 session to the upstream's bird; the IPv6
session's ipv6 channel carries the IPv6 VIP (a /128), the IPv4 one the IPv4 VIP. The upstream
routes both over every router (ECMP), and clients reach the IPv6 VIP through that route.

        client ── upstream (bird, ECMP) ─┬─ r0 (XDP, edged + bird) ─┐
        2001:2::2                        └─ r1                     ─┴─ sw ─┬─ b0, b1

A service on the IPv6 VIP with no usable backend (both drained) withdraws that VIP only, as an
IPv4 VIP is withdrawn; drain-node withdraws both families. Losing a router keeps IPv6 connections
on their backends, as test_ecmp shows for IPv4.
"""

from __future__ import annotations

import json

from controlplane.lab import fleet6
from controlplane.lab.ecmp import PORT, Fleet
from controlplane.lab.fleet import FleetTopo
from controlplane.lab.traffic import backends_seen


def test_ipv6_vip_is_announced_over_an_ipv6_session_and_withdrawn_without_a_usable_backend():
    with Fleet.start(FleetTopo(routers=2, backends=2, ipv6=True)) as fleet:
        net = fleet.net
        net.wait_next_hops6({0, 1}, 30.0)
        with fleet.client(0) as c:
            assert sorted(c.status()["bgp"]["announced"]) == sorted([str(net.vip), str(fleet6.VIP6)])
        seen = backends_seen(net.client, fleet6.VIP6, PORT, 60)
        assert set(seen) == {"b0", "b1"} and sum(seen.values()) == 60, seen
        assert fleet.new_flows(0) > 0 and fleet.new_flows(1) > 0  # ECMP spread the IPv6 flows

        # r0: both of web6's backends drained, web6 has no usable backend: the IPv6 VIP alone goes
        mark = len(fleet.edgeds[0].events)
        for b in ("b0", "b1"):
            out = fleet.edgectl(0, "drain", "web6", b)
            assert out.returncode == 0, out.stderr
        ev = fleet.edgeds[0].wait_for(
            lambda e: e["kind"] == "bgp" and "(no usable backend)" in e["text"], 10.0, "the withdraw event", after=mark
        )
        assert ev["text"] == f"bgp: withdrew {fleet6.VIP6} (no usable backend)", ev["text"]
        net.wait_next_hops6({1}, 10.0)
        assert net.vip_next_hops() == {net.topo.router_up_addr(i).ip for i in (0, 1)}
        seen = backends_seen(net.client, fleet6.VIP6, PORT, 40)  # all through r1 now
        assert set(seen) == {"b0", "b1"} and sum(seen.values()) == 40, seen

        for b in ("b0", "b1"):
            assert fleet.edgectl(0, "undrain", "web6", b).returncode == 0
        net.wait_next_hops6({0, 1}, 30.0)

        # drain-node on r1: both families withdrawn from r1
        out = fleet.edgectl(1, "drain-node")
        assert out.returncode == 0, out.stderr
        net.wait_next_hops6({0}, 10.0)
        net.wait_next_hops({0}, 10.0)


def test_losing_a_router_keeps_ipv6_connections_on_their_backends(record_property):
    """As test_ecmp's IPv4 case, over the IPv6 VIP: 200 long-lived IPv6 connections spread over 3
    routers by the upstream's ECMP; r0's link goes down and its edged and bird are killed. The
    upstream withdraws r0 from the IPv6 route, and every connection answers again from the
    backend it had (the routers' Maglev tables are the same; a moved flow gets an edge_ct6 entry
    on its new router from the same pick)."""
    with Fleet.start(FleetTopo(routers=3, backends=3, ipv6=True)) as fleet:
        fleet.net.wait_next_hops6({0, 1, 2}, 30.0)
        result = fleet.lose_router(0, mode="link", n_conns=200, ipv6=True)
    record_property("router_loss6", json.dumps(result.as_dict()))
    print(json.dumps(result.as_dict(), indent=1))
    assert result.per_router_before[0] > 0, "r0 carried no connection: the loss would prove nothing"
    assert sum(result.per_router_before) == 200
    assert result.failed == []
    assert result.kept_ratio >= 0.99, result.as_dict()
