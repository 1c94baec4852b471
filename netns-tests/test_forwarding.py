"""Forwarding through the VIP with the router deployed: NAT to the backends and back, and the counters.

        client ──veth── router ──veth── b0
       198.18.0.2    XDP on rt-c   ├──veth── b1      VIP 198.18.255.1 (on no interface)
                     tc on rt-bN   └──veth── b2      backends serve HTTP and UDP on :8000

The client only ever talks to the VIP; a reply that did not come back from the VIP (the tc
return path rewrites the backend's source back to it) would not reach the client's socket.
A fresh deploy starts with zeroed maps and only these tests send to the VIP, so the service
counters are compared with exact numbers, without a "before" snapshot.
"""

from __future__ import annotations

from collections import Counter

from controlplane.lab.traffic import backends_seen, http_get, udp_answers

PORT = 8000  # conftest.BACKEND_PORT, also the VIP port


def assert_counters_match_flows(snap: dict, service: dict, flows: Counter, min_packets: int, min_returns: int) -> None:
    """Service and backend counters agree with the flows each backend answered; verdicts account for every packet."""
    n = sum(flows.values())
    assert service["new_flows"] == n
    assert {b["name"]: b["new_flows"] for b in service["backends"]} == {f"b{i}": flows[f"b{i}"] for i in range(3)}
    assert service["packets"] == sum(b["packets"] for b in service["backends"]) >= min_packets
    assert service["return_packets"] == sum(b["return_packets"] for b in service["backends"]) >= min_returns
    assert service["bytes"] >= 28 * service["packets"]  # at least an IPv4 + UDP header each
    verdicts = snap["verdicts"]
    # Every VIP packet is NATed: redirected, or (first packets, before the router's neighbour
    # entry for the backend exists) handed to the stack after the rewrite.
    assert verdicts["redirect"] + verdicts["nat_pass"] == service["packets"]
    assert verdicts["redirect"] > 0
    assert verdicts["return_nat"] == service["return_packets"]
    assert verdicts["drop"] == 0
    assert set(snap["drops"].values()) == {0}


def test_http_through_the_vip_is_answered_from_the_vip_by_every_backend(net, router):
    """330 new connections: 30 checked one by one, then 300 counted with backends_seen.

    With three equal backends the chance that 30 flows miss one is 3 * (2/3)**30, about 2e-5.
    Each connection is a conntrack miss exactly once (the client closes first, so its port stays
    in TIME_WAIT and no 5-tuple repeats): new_flows is 330, split as the answers were. Each
    connection sends at least SYN, ACK and the request (>= 3 packets) and gets at least SYN-ACK
    and the response back through the reverse NAT (>= 2).
    """
    router.deploy([router.service("web")])

    replies = [http_get(net.client, net.vip, PORT) for _ in range(30)]
    seen = backends_seen(net.client, net.vip, PORT, 300)

    client = str(net.topo.client_addr.ip)
    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.vip}:{PORT}")}
    assert all(r.peer.startswith(f"{client}:") for r in replies)  # NAT keeps the client's address
    assert {r.backend for r in replies} == {"b0", "b1", "b2"}
    assert sum(seen.values()) == 300 and set(seen) == {"b0", "b1", "b2"}, seen

    snap = router.status()
    flows = Counter(r.backend for r in replies) + seen
    (service,) = snap["services"]
    assert (service["name"], service["vip"], service["port"], service["protocol"]) == ("web", str(net.vip), PORT, "tcp")
    assert_counters_match_flows(snap, service, flows, min_packets=3 * 330, min_returns=2 * 330)
    assert snap["conntrack_entries"] == 330
    assert snap["xdp"]["attached"] and snap["xdp"]["mode"] == "native"


def test_udp_through_the_vip_is_answered_from_the_vip_by_every_backend(net, router):
    """30 UDP sockets open at once (so 30 distinct source ports, 30 flows), one datagram each.

    Each datagram is one packet and one new flow; each answer is one reverse-NATed packet. The
    TCP service on the same VIP and port sees none of it. 30 flows miss a backend with p ~ 2e-5.
    """
    router.deploy([router.service("web"), router.service("dns", protocol="udp")])

    answers = udp_answers(net.client, net.vip, PORT, 30)

    assert {src for _, src in answers} == {f"{net.vip}:{PORT}"}
    flows = Counter(name for name, _ in answers)
    assert set(flows) == {"b0", "b1", "b2"}

    snap = router.status()
    web, dns = snap["services"]
    assert (dns["name"], dns["protocol"]) == ("dns", "udp")
    assert (web["packets"], web["new_flows"], web["return_packets"]) == (0, 0, 0)
    assert (dns["packets"], dns["return_packets"]) == (30, 30)
    assert_counters_match_flows(snap, dns, flows, min_packets=30, min_returns=30)
