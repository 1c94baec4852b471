"""The data path's own state cannot be filled from outside: SYN floods from spoofed sources and
replies forged by (or in the name of) a backend, against real connections through the VIP.

        client ──veth── router ──veth── b0
      real sockets,   rt-c (XDP)  ├──veth── b1      ct_size 1024 (the smallest the config allows)
      and crafted frames          └──veth── b2      VIP 198.18.255.1:8000
      from 198.18.0.77, floods from 198.19.0.0/16 (routed nowhere: nothing answers them)

Each test is an attack proven on the code before this file: a client that learns a backend's
real address from a retransmitted SYN-ACK once its own entry is flooded out of conntrack; a SYN
flood that evicts idle established connections, which a later weight change then breaks; a
backend that fills conntrack with replies the stateless reverse NAT took for VIP connections.
"""

from __future__ import annotations

import random
import time
from ipaddress import IPv4Address, IPv6Address

from abuse import CRAFTED_SRC, answer, crafted_neighbour, crafter, handled, syn_acks, two_syn_acks
from packets import Capture, send_frames
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from controlplane import abi
from controlplane.lab.router import link_mac
from controlplane.lab.traffic import backends_seen, close_all, open_connections, wait_until

PORT = 8000  # conftest.BACKEND_PORT
CT_SIZE = 1024
NODE = {"ct_size": CT_SIZE}
SEND_CHUNK = 10_000  # packets.MAX_SEND


def spoofed_syns(net, router, n: int, seed: int) -> list[bytes]:
    """n valid SYNs (right checksums) to the VIP from n distinct spoofed sources in 198.19.0.0/16."""
    rng = random.Random(seed)
    eth = Ether(dst=router.mac(), src=link_mac(net.client, net.client_iface))
    base = int(IPv4Address("198.19.0.0"))
    return [
        bytes(
            eth
            / IP(src=str(IPv4Address(base + 1 + k)), dst=str(net.vip), ttl=64)
            / TCP(sport=rng.randrange(1024, 65536), dport=PORT, flags="S", seq=rng.getrandbits(32))
        )
        for k in range(n)
    ]


def flood(net, router, frames: list[bytes]) -> None:
    before = router.counters()
    for i in range(0, len(frames), SEND_CHUNK):
        send_frames(net.client, net.client_iface, frames[i : i + SEND_CHUNK])
    handled(router, before, len(frames))


def test_a_flooded_out_entry_does_not_reveal_the_backend_address(net, router):
    """One SYN from CRAFTED_SRC, its SYN-ACK never acknowledged (the client's kernel drops what is
    not for its address); then 4 x ct_size valid SYNs from spoofed sources, so the SYN's entry is
    evicted before the backend retransmits its SYN-ACK a second later. Every SYN-ACK reaching
    the client's link (the first and at least one retransmission) has the VIP as its source:
    on the code before, the retransmission found no entry, was taken for a direct connection
    and left with the backend's own address."""
    router.deploy([router.service("web")], node=NODE)
    syn = crafter(net, router)(TCP(sport=31000, dport=PORT, flags="S", seq=424242))
    syns = spoofed_syns(net, router, 4 * CT_SIZE, seed=1)
    with crafted_neighbour(net), Capture([(net.client, net.client_iface)]) as capture:
        send_frames(net.client, net.client_iface, [syn])

        def seen() -> list[tuple[str, int]]:
            return syn_acks(capture, net.client_iface, 31000)

        wait_until(lambda: seen() or None, 2.0, "the first SYN-ACK", observe=seen)
        flood(net, router, syns)
        got = two_syn_acks(capture, net.client_iface, 31000, "the SYN-ACK's retransmission")

    assert set(got) == {(str(net.vip), PORT)}, got


def test_a_syn_flood_does_not_evict_established_connections(net, router):
    """ct_size 1024. 40 idle keep-alive connections over the three backends; 30,720 valid SYNs
    from spoofed sources (three rounds of 10 x ct_size: the kernel's LRU evicted the 40 entries,
    all at once, during the third round on the code before); then b1 is drained (weight 0),
    which changes the Maglev table. Every connection is still answered by its first backend (on
    the code before, b1's connections, 11 of 40, had lost their entries, the new table sent them
    elsewhere and they were reset), and new connections still work."""
    router.deploy([router.service("web")], node=NODE)
    conns = open_connections(net.client, net.vip, PORT, 40)
    try:
        first = [c.request().backend for c in conns]
        for seed in (2, 3, 4):
            flood(net, router, spoofed_syns(net, router, 10 * CT_SIZE, seed=seed))
        router.deploy([router.service("web", weights=[1, 0, 1])], node=NODE)
        again = [answer(c) for c in conns]
        fresh = backends_seen(net.client, net.vip, PORT, 30, flow_timeout_s=2.0)
    finally:
        close_all(conns)

    assert "b1" in first, first  # 40 random ports all missing b1: (2/3)**40, about 1e-7
    assert again == first
    assert set(fresh) == {"b0", "b2"}, fresh


def test_a_backend_cannot_fill_conntrack_through_the_reply_path(net, router):
    """40 connections; then b0's namespace sends 4 x ct_size ACKs from b0's service endpoint to
    CRAFTED_SRC on as many ports, about a third of which the Maglev table gives to b0 (so they
    are reverse-NATed as replies of connections the router has no entry for). They make no
    conntrack entry: the table still holds the 40 connections and nothing else (on the code
    before, every one of them that was reverse-NATed made one), and after b1 is drained each
    connection is answered by its first backend."""
    router.deploy([router.service("web")], node=NODE)
    conns = open_connections(net.client, net.vip, PORT, 40)
    try:
        first = [c.request().backend for c in conns]
        entries = router.status()["conntrack_entries"]
        b0 = net.backends[0]
        iface = net.backend_peer_iface(0)
        eth = Ether(dst=router.mac(net.backend_iface(0)), src=link_mac(b0, iface))
        ip = IP(src=str(net.backend_addr(0)), dst=str(CRAFTED_SRC), ttl=64)
        forged = [
            bytes(eth / ip / TCP(sport=PORT, dport=20000 + k, flags="A", seq=5000, ack=7000))
            for k in range(4 * CT_SIZE)
        ]
        before = router.counters()
        with crafted_neighbour(net):
            send_frames(b0, iface, forged)
            wait_until(
                lambda: (
                    router.counters()["verdicts"]["return_stateless"]
                    > before["verdicts"]["return_stateless"] + CT_SIZE // 4
                ),
                5.0,
                "forged replies reverse-NATed",
            )
        after_entries = router.status()["conntrack_entries"]
        router.deploy([router.service("web", weights=[1, 0, 1])], node=NODE)
        again = [answer(c) for c in conns]
    finally:
        close_all(conns)

    assert entries == 40, entries
    assert after_entries == entries, after_entries
    assert again == first


def test_a_syn_ack_from_a_backend_the_connection_left_does_not_reveal_its_address(net, router):
    """One SYN from CRAFTED_SRC reaches backend X (seen on the backends' links); X is drained and
    the client sends the same SYN again, which the router now gives to another backend Y. X
    retransmits its SYN-ACK (about 1, 3 and 7 s after the SYN): it answers a connection the
    router's entry gives to Y, so it is no reply of this router's, and it must not leave with
    X's address (on the code before, every such SYN-ACK went out un-NATed). Every SYN-ACK that
    reaches the client's link has the VIP as its source; X's are dropped as other_backend."""
    router.deploy([router.service("web")], node=NODE)
    syn = crafter(net, router)(TCP(sport=31001, dport=PORT, flags="S", seq=515151))
    links = [(net.backends[i], net.backend_peer_iface(i)) for i in range(3)]
    with crafted_neighbour(net), Capture([(net.client, net.client_iface)]) as client, Capture(links) as backends:
        send_frames(net.client, net.client_iface, [syn])

        def reached() -> list[int]:
            got = backends.take()
            return [
                i
                for i, (_, ifname) in enumerate(links)
                if any(TCP in IP(f[14:]) and IP(f[14:])[TCP].sport == 31001 for f in got[ifname])
            ]

        [x] = wait_until(lambda: reached() or None, 2.0, "the SYN at a backend", observe=reached)
        weights = [0 if i == x else 1 for i in range(3)]
        router.deploy([router.service("web", weights=weights)], node=NODE)
        send_frames(net.client, net.client_iface, [syn])
        wait_until(lambda: len(reached()) == 2 or None, 2.0, "the SYN at another backend", observe=reached)

        def syn_acks() -> list[tuple[str, int]]:
            out = []
            for frame in client.take()[net.client_iface]:
                ip = IP(frame[14:])
                if ip.dst == str(CRAFTED_SRC) and TCP in ip and ip[TCP].dport == 31001 and ip[TCP].flags == "SA":
                    out.append((ip.src, ip[TCP].sport))
            return out

        before = len(syn_acks())
        # X retransmits 1, 3, 7, 15 and 31 s after its first SYN-ACK: 16 s hold one of them
        # wherever they start (the redeploy takes seconds); Y answers and retransmits meanwhile
        time.sleep(16)
        got = syn_acks()
        dropped = router.counters()["drops"].get("other_backend", 0)

    assert len(got) > before, got
    assert dropped > 0  # X's retransmissions came, and went no further
    assert set(got) == {(str(net.vip), PORT)}, got


def spoofed_syns6(net, router, n: int, seed: int) -> list[bytes]:
    """n valid IPv6 SYNs (right checksums) to the IPv6 VIP from n distinct spoofed sources in
    2001:2:0:77::/64 (inside the lab's 2001:2::/48, routed nowhere: nothing answers them)."""
    rng = random.Random(seed)
    eth = Ether(dst=router.mac(), src=link_mac(net.client, net.client_iface))
    base = int(IPv6Address("2001:2:0:77::"))
    return [
        bytes(
            eth
            / IPv6(src=str(IPv6Address(base + 1 + k)), dst=str(net.topo.vip6), hlim=64)
            / TCP(sport=rng.randrange(1024, 65536), dport=PORT, flags="S", seq=rng.getrandbits(32))
        )
        for k in range(n)
    ]


def service6(net, router, weights=None) -> dict:
    """The service on the IPv6 VIP with the backends' IPv6 addresses."""
    svc = router.service("web6", vip=str(net.topo.vip6), weights=weights)
    for entry in svc["backends"]:
        entry["address"] = str(net.topo.backend_addr6(int(entry["name"][1:])).ip)
    return svc


def test_an_ipv6_syn_flood_does_not_evict_established_connections(net, router):
    """The IPv6 case (state6.h), real traffic: an IPv6 service, 30 idle keep-alive connections to
    its VIP over the three backends; 4,096 valid SYNs from spoofed IPv6 sources (four times
    edge_half_open6 and edge_ct6, 1,024 entries each at ct_size 1024), which wait in
    edge_half_open6 and evict only each other. edge_ct6 still holds exactly the 30 connections
    (read from the pinned map: the Maglev table is unchanged, so a lost entry would not show in
    the answers; IPv4's test above drains a backend to show it, a second deploy this one
    spares), every connection is still answered by its first backend, and new connections to the
    IPv6 VIP still work."""
    router.deploy([service6(net, router)], node=NODE)
    conns = open_connections(net.client, net.topo.vip6, PORT, 30)
    try:
        first = [c.request().backend for c in conns]
        flood(net, router, spoofed_syns6(net, router, 4 * CT_SIZE, seed=5))
        entries = len(router._pinned_dump(abi.MAP_CT6))
        half_open = len(router._pinned_dump(abi.MAP_HALF_OPEN6))
        again = [answer(c) for c in conns]
        fresh = backends_seen(net.client, net.topo.vip6, PORT, 30, flow_timeout_s=2.0)
    finally:
        close_all(conns)

    assert "b1" in first, first  # 30 random ports all missing b1: (2/3)**30, about 5e-6
    assert entries == 30, entries
    assert half_open >= CT_SIZE // 2, half_open  # the flood went there (an LRU holds fewer than its size)
    assert again == first
    assert set(fresh) == {"b0", "b2", "b1"}, fresh
