"""A VIP that is also an address of the router (on its `lo`), as BGP speakers, health checks and
IPVS habits set it up: connections through it must be answered.

        client ──veth── router ──veth── b0..b2      VIP 198.18.255.1/32 on the router's lo

The reverse-NATed replies carry the VIP, a local address of the router, as their source. Had
they gone through the kernel's forwarding path, it would drop them as martians and every TCP
connection would hang; the tc return path redirects them to the client-facing interface itself.
"""

from __future__ import annotations

from collections import Counter

import pytest

from controlplane.lab.router import link_mac
from controlplane.lab.traffic import backends_seen, http_get, udp_answers, udp_refused

NUD_PERMANENT, NUD_VALID = 0x80, 0xDE  # NUD_VALID: permanent, noarp, reachable, probe, stale, delay

PORT = 8000  # conftest.BACKEND_PORT
VIP_PORTS = [PORT, 80]  # the backends' port, or another one: the reply's source port is rewritten too
VOID_PORT = 8002  # no backend listens here


def put_vip_on_lo(net) -> None:
    with net.router.iproute() as ipr:
        ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=str(net.vip), prefixlen=32)


def nat_verdicts(router, new_flows: int) -> dict:
    """The router's verdicts, once the one service has had new_flows flows: each counted, at least
    two replies each reverse-NATed on the return path, nothing dropped."""
    snap = router.status()
    (service,) = snap["services"]
    assert service["new_flows"] == new_flows
    verdicts = snap["verdicts"]
    assert verdicts["return_nat"] == service["return_packets"] >= 2 * new_flows
    assert verdicts["drop"] == 0
    return verdicts


@pytest.mark.parametrize("vip_port", VIP_PORTS)
def test_tcp_and_http_through_a_vip_on_lo_are_answered(net, router, vip_port):
    """20 HTTP connections one by one, then 100 counted: all answered from the VIP by every backend,
    and every reply left through the tc redirect (none through the kernel's forwarding path)."""
    put_vip_on_lo(net)
    router.deploy([router.service("web", port=vip_port)])

    replies = [http_get(net.client, net.vip, vip_port) for _ in range(20)]
    seen = backends_seen(net.client, net.vip, vip_port, 100)

    client = str(net.topo.client_addr.ip)
    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.vip}:{vip_port}")}
    assert all(r.peer.startswith(f"{client}:") for r in replies)
    assert sum(seen.values()) == 100 and set(seen) == {"b0", "b1", "b2"}, seen

    verdicts = nat_verdicts(router, 120)
    assert verdicts["return_redirect"] == verdicts["return_nat"]


def client_neighbour_states(net) -> list[int]:
    """NUD states of the router's neighbour entries for the client (none: [])."""
    with net.router.iproute() as ipr:
        index = ipr.link_lookup(ifname=net.router_client_iface)[0]
        return [
            n["state"]
            for n in ipr.get_neighbours(ifindex=index)
            if n.get_attr("NDA_DST") == str(net.topo.client_addr.ip)
        ]


def test_replies_to_a_client_the_router_has_no_neighbour_entry_for_are_answered(net, router):
    """The client knows the router's MAC for good (so it never asks, and the router never learns
    the client's from an ARP request) and the router's entry for the client is gone: the first
    reply finds no neighbour. The stack would drop it as a martian (the VIP is local);
    bpf_redirect_neigh resolves the client on the way out, and every connection is answered."""
    put_vip_on_lo(net)
    router.deploy([router.service("web")])
    mac = link_mac(net.router, net.router_client_iface)
    with net.client.iproute() as ipr:
        index = ipr.link_lookup(ifname=net.client_iface)[0]
        ipr.neigh("replace", dst=str(net.topo.router_client_addr.ip), lladdr=mac, ifindex=index, state=NUD_PERMANENT)
    with net.router.iproute() as ipr:
        index = ipr.link_lookup(ifname=net.router_client_iface)[0]
        for n in ipr.get_neighbours(ifindex=index):
            if n.get_attr("NDA_DST") == str(net.topo.client_addr.ip):
                ipr.neigh("del", dst=str(net.topo.client_addr.ip), ifindex=index)
    assert not any(state & NUD_VALID for state in client_neighbour_states(net))

    replies = [http_get(net.client, net.vip, PORT) for _ in range(5)]

    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.vip}:{PORT}")}
    assert any(state & NUD_VALID for state in client_neighbour_states(net))  # resolved by the redirect
    verdicts = router.status()["verdicts"]
    assert verdicts["return_redirect"] == verdicts["return_nat"] > 0


@pytest.mark.parametrize("vip_port", VIP_PORTS)
def test_udp_through_a_vip_on_lo_is_answered(net, router, vip_port):
    """30 UDP sockets, one datagram each: 30 answers from the VIP."""
    put_vip_on_lo(net)
    router.deploy([router.service("dns", protocol="udp", port=vip_port)])

    answers = udp_answers(net.client, net.vip, vip_port, 30)

    assert {src for _, src in answers} == {f"{net.vip}:{vip_port}"}
    assert set(Counter(name for name, _ in answers)) == {"b0", "b1", "b2"}
    (service,) = router.status()["services"]
    assert (service["packets"], service["return_packets"]) == (30, 30)


def test_a_backends_port_unreachable_reaches_the_client_through_a_vip_on_lo(net, router):
    """A UDP service no backend listens on: each backend's "port unreachable" gets the VIP back on
    the return path (icmp.h, icmp_return). Its source is then a local address of the router, so the
    stack would drop it as a martian: it must leave the way replies do, redirected to the client."""
    put_vip_on_lo(net)
    router.deploy([router.service("void", protocol="udp", port=VOID_PORT, backend_port=VOID_PORT)])

    refused = [udp_refused(net.client, net.vip, VOID_PORT) for _ in range(3)]

    assert refused == [True] * 3
    assert router.counters()["verdicts"]["icmp_return"] == 3


# ---------------------------------------------------------------- IPv6: the VIP 2001:2:0:ffff::1/128 on lo


def put_vip6_on_lo(net) -> None:
    with net.router.iproute() as ipr:
        ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=str(net.topo.vip6), prefixlen=128)


def service6(router, net, name: str, **extra) -> dict:
    """A service on the IPv6 VIP with the backends' IPv6 addresses."""
    svc = router.service(name, vip=str(net.topo.vip6), **extra)
    for entry in svc["backends"]:
        entry["address"] = str(net.topo.backend_addr6(int(entry["name"][1:])).ip)
    return svc


def test_http_through_an_ipv6_vip_on_lo_is_answered(net, router):
    """The IPv6 VIP on the router's lo: 20 HTTP connections one by one, then 100 counted, all
    answered from the VIP by every backend; the replies leave by XDP (reply6.h) or tc's redirect,
    none through the kernel's forwarding path (which would not forward a local source)."""
    put_vip6_on_lo(net)
    router.deploy([service6(router, net, "web6")])
    vip6 = net.topo.vip6

    replies = [http_get(net.client, vip6, PORT) for _ in range(20)]
    seen = backends_seen(net.client, vip6, PORT, 100)

    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{vip6}:{PORT}")}
    assert sum(seen.values()) == 100 and set(seen) == {"b0", "b1", "b2"}, seen
    verdicts = nat_verdicts(router, 120)
    assert verdicts["return_redirect"] + verdicts["return_xdp"] == verdicts["return_nat"]


def test_a_backends_ipv6_port_unreachable_reaches_the_client_through_a_vip_on_lo(net, router):
    """A UDP service on the IPv6 VIP (on lo) no backend listens on: each backend's ICMPv6 port
    unreachable gets the VIP back on the return path (icmp6.h) and leaves redirected, as replies do."""
    put_vip6_on_lo(net)
    router.deploy([service6(router, net, "void6", protocol="udp", port=VOID_PORT, backend_port=VOID_PORT)])

    refused = [udp_refused(net.client, net.topo.vip6, VOID_PORT) for _ in range(3)]

    assert refused == [True] * 3
    assert router.counters()["verdicts"]["icmp_return"] == 3
