"""The XDP fast path of replies (edge_reply on the backend-facing interfaces) and how it hands
everything it does not handle to the tc program.

        client ──veth── router ──veth── b0
       198.18.0.2    XDP on rt-c   ├──veth── b1      VIP 198.18.255.1, backends on :8000
                     XDP + tc on rt-bN └──veth── b2

`return_xdp` counts the replies edge_reply sent; `return_nat` counts every reverse-NATed reply
(XDP and tc), so the split shows which program carried them.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
from ipaddress import IPv4Address

from scapy.layers.inet import IP, UDP

from controlplane import abi
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.topo import backend_role
from controlplane.lab.traffic import close_all, http_get, open_connections, udp_answers

PORT = 8000


def _xdp_on(net, i: int) -> str | None:
    """Name of the XDP program on the router's interface towards backend i, if any."""
    (link,) = json.loads(net.router.run(["ip", "-j", "-d", "link", "show", "dev", net.backend_iface(i)]).stdout)
    prog = (link.get("xdp") or {}).get("prog") or {}
    return prog.get("name")


def test_udp_replies_take_the_xdp_path_once_the_next_hop_is_known(net, router):
    """The first batch may meet an unresolved neighbour (tc resolves it); every reply of the
    second batch is rewritten and redirected by XDP, and the client sees the VIP as source."""
    router.deploy([router.service("dns", protocol="udp")])
    snap = router.status()
    assert snap["reply_xdp_ifaces"] == [net.backend_iface(i) for i in range(3)]

    first = udp_answers(net.client, net.vip, PORT, 30)
    before = router.status()["verdicts"]
    second = udp_answers(net.client, net.vip, PORT, 30)
    after = router.status()["verdicts"]

    assert {src for _, src in first + second} == {f"{net.vip}:{PORT}"}
    assert after["return_xdp"] - before["return_xdp"] == 30
    assert after["return_nat"] - before["return_nat"] == 30
    assert after["return_redirect"] == before["return_redirect"]  # tc redirected none of them
    assert after["drop"] == 0


def test_tcp_replies_after_the_first_answer_take_the_xdp_path(net, router):
    """A connection's SYN-ACK, its first reply payload (a wire sample is pending) and its FIN go
    to tc; the answers to later requests on a keep-alive connection go through XDP. 10
    connections with 5 requests each: at least 4 x 10 XDP replies, all answered from the VIP."""
    router.deploy([router.service("web")])

    conns = open_connections(net.client, net.vip, PORT, 10)
    try:
        replies = [c.request() for _ in range(5) for c in conns]
    finally:
        close_all(conns)

    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.vip}:{PORT}")}
    snap = router.status()
    (service,) = snap["services"]
    verdicts = snap["verdicts"]
    assert verdicts["return_nat"] == service["return_packets"]
    assert verdicts["return_redirect"] >= 10  # the SYN-ACKs at least
    assert verdicts["return_xdp"] >= 4 * 10
    assert verdicts["drop"] == 0


def test_partial_checksums_are_left_to_tc(net, router):
    """Backends that leave their L4 checksums to the (virtual) NIC (tx checksumming on: the
    frames carry CHECKSUM_PARTIAL) are still answered from the VIP with correct checksums:
    edge_reply sees the partial form and passes them to tc, whose helpers know it."""
    for i in range(3):
        net.backends[i].run(["ethtool", "-K", net.backend_peer_iface(i), "tx", "on"])
    router.deploy([router.service("web"), router.service("dns", protocol="udp")])

    replies = [http_get(net.client, net.vip, PORT) for _ in range(15)]
    answers = udp_answers(net.client, net.vip, PORT, 15)

    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.vip}:{PORT}")}
    assert {src for _, src in answers} == {f"{net.vip}:{PORT}"}
    verdicts = router.status()["verdicts"]
    assert verdicts["return_xdp"] == 0
    assert verdicts["return_nat"] >= 2 * 15 + 15


def _reply_from_backend(net, i: int, client_port: int, payload: bytes) -> None:
    """Backend i sends one UDP datagram from its service port to the client's client_port, as an
    answer on that flow (a raw IP socket: the backend's server owns the port; scapy fills in
    full checksums)."""
    packet = (
        IP(src=str(net.backend_addr(i)), dst=str(net.topo.client_addr.ip))
        / UDP(sport=PORT, dport=client_port)
        / payload
    )
    with net.backends[i].enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    with sock:
        sock.sendto(bytes(packet), (str(net.topo.client_addr.ip), 0))


def test_udp_replies_that_start_like_a_heartbeat_are_left_to_tc(net, router):
    """edge_reply leaves a UDP datagram whose payload starts with the heartbeat magic to tc,
    which tells heartbeats apart (by port, then payload); tc reverse-NATs it like any reply.
    The same datagram without the magic goes through XDP."""
    router.deploy([router.service("dns", protocol="udp")])
    udp_answers(net.client, net.vip, PORT, 10)  # next hops known: later replies can take XDP
    with net.client.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.settimeout(2.0)
        sock.sendto(b"who", (str(net.vip), PORT))
        name, _ = sock.recvfrom(2048)
        i = [backend_role(j) for j in range(3)].index(name.decode())
        client_port = sock.getsockname()[1]
        got = {}
        for label, payload in (
            ("magic", struct.pack("!I", abi.HB_MAGIC) + b"not a heartbeat"),
            ("plain", b"an ordinary answer"),
        ):
            before = router.status()["verdicts"]
            _reply_from_backend(net, i, client_port, payload)
            data, src = sock.recvfrom(2048)
            after = router.status()["verdicts"]
            got[label] = (
                data == payload,
                f"{src[0]}:{src[1]}",
                {k: after[k] - before[k] for k in ("return_xdp", "return_redirect", "return_nat")},
            )

    vip = f"{net.vip}:{PORT}"
    assert got["magic"] == (True, vip, {"return_xdp": 0, "return_redirect": 1, "return_nat": 1})
    assert got["plain"] == (True, vip, {"return_xdp": 1, "return_redirect": 0, "return_nat": 1})


def test_reply_xdp_off_leaves_replies_to_tc_and_undeploy_removes_it(net, router):
    router.deploy([router.service("dns", protocol="udp")], node={"reply_xdp": "off"})
    assert router.status()["reply_xdp_ifaces"] == []
    answers = udp_answers(net.client, net.vip, PORT, 10)
    assert {src for _, src in answers} == {f"{net.vip}:{PORT}"}
    assert router.status()["verdicts"]["return_xdp"] == 0

    router.deploy([router.service("dns", protocol="udp")])  # auto again: attached on update
    assert router.status()["reply_xdp_ifaces"] == [net.backend_iface(i) for i in range(3)]
    assert [_xdp_on(net, i) for i in range(3)] == [abi.PROG_REPLY] * 3

    router.undeploy()
    assert [_xdp_on(net, i) for i in range(3)] == [None] * 3


def _answers_from_ports(net, vip: IPv4Address, ports: range) -> list[str]:
    """One datagram to vip:PORT from each client port in ports; where each answer came from."""
    socks: list[socket.socket] = []
    try:
        with net.client.enter():
            for port in ports:
                socks.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                socks[-1].bind((str(net.topo.client_addr.ip), port))
        for sock in socks:
            sock.settimeout(2.0)
            sock.sendto(b"who", (str(vip), PORT))
        return [f"{src[0]}:{src[1]}" for _, src in (sock.recvfrom(2048) for sock in socks)]
    finally:
        for sock in socks:
            sock.close()


def test_replies_follow_a_vip_that_edged_moves(net, router, tmp_path):
    """edge_reply works from per-CPU copies of reverse-NAT entries, and edged changes the maps
    in place under the same programs: after a reload moves the service to another VIP, the
    replies on the same client ports (whose old conntrack entries are still there) come from
    the new VIP, through XDP."""
    vip2 = net.vip + 1

    def doc(vip: IPv4Address) -> dict:
        service = router.service("dns", protocol="udp", vip=str(vip))
        service["weights"] = {"policy": "static"}
        return router.config(
            [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"}
        )

    ports = range(41000, 41030)
    edged = EdgedProc.start(net.router, doc(net.vip), router.iface)
    try:
        for _ in range(3):  # next hops known, and every backend's entry copied where its replies run
            assert set(_answers_from_ports(net, net.vip, ports)) == {f"{net.vip}:{PORT}"}
        edged.rewrite_config(doc(vip2))
        mark = len(edged.events)
        edged.signal(signal.SIGHUP)
        done = edged.wait_for(lambda e: e["kind"] in ("reload", "reload-rejected"), 60.0, "reload", after=mark)
        assert done["kind"] == "reload", done["text"]
        before = router.status()["verdicts"]
        got = _answers_from_ports(net, vip2, ports)
        after = router.status()["verdicts"]
    finally:
        edged.stop()
    assert set(got) == {f"{vip2}:{PORT}"}
    assert after["return_xdp"] - before["return_xdp"] == len(ports)
