"""Traffic that is not for a VIP service passes the deployed router untouched (XDP_PASS).

        client ──veth── router ──veth── b0
      198.18.0.2   198.18.0.1  ├──veth── b1      VIP 198.18.255.1: on no interface, and the
                   (XDP, rt-c) └──veth── b2      router's kernel has no route to it

Passed traffic meets the router's kernel as if no XDP program were there: it answers for its
own address, forwards to the backends, and has nothing to say about the VIP beyond ICMP
unreachable. The services deployed are web (TCP VIP:8000) and, where a test adds it, dns (UDP
VIP:8000).
"""

from __future__ import annotations

import errno
import socket

import pytest
from packets import Capture, ping, udp_query

from controlplane.lab.traffic import Conn, http_get, wait_until

PORT = 8000  # conftest.BACKEND_PORT, also the VIP port
OTHER_PORT = 9000  # on the VIP address, but no service


def untouched(snap: dict) -> None:
    """Nothing was NATed, dropped or reverse-NATed, and no flow was tracked."""
    assert {k: snap["verdicts"][k] for k in ("redirect", "nat_pass", "drop", "return_nat")} == {
        "redirect": 0,
        "nat_pass": 0,
        "drop": 0,
        "return_nat": 0,
    }
    assert set(snap["drops"].values()) == {0}
    assert snap["conntrack_entries"] == 0
    for service in snap["services"]:
        assert (service["packets"], service["new_flows"]) == (0, 0), service["name"]


def test_traffic_to_and_through_the_router_passes_untouched(net, router):
    """Ping the router and each backend, HTTP and UDP to each backend's own address, on the
    port that is a TCP and a UDP service on the VIP.

    Each exchange sends at least one packet into the XDP program: >= 1 + 3 * (1 + 3 + 1) = 16
    passes (a ping to the router; per backend a ping, an HTTP connection of >= 3 packets and a
    datagram).
    The backends see the client's own address: nothing was rewritten.
    """
    router.deploy([router.service("web"), router.service("dns", protocol="udp")])
    client = str(net.topo.client_addr.ip)

    assert ping(net.client, net.topo.router_client_addr.ip) > 0
    for i in range(3):
        addr = net.backend_addr(i)
        assert ping(net.client, addr) > 0
        reply = http_get(net.client, addr, PORT)
        assert (reply.status, reply.backend, reply.server_addr) == (200, f"b{i}", f"{addr}:{PORT}")
        assert reply.peer.startswith(f"{client}:")
        assert udp_query(net.client, addr, PORT).server_addr == f"{addr}:{PORT}"

    snap = router.status()
    untouched(snap)
    assert snap["verdicts"]["pass"] >= 1 + 3 * (1 + 3 + 1)


def tcp_connect_error(net, port: int) -> int:
    """errno of a TCP connect from the client to VIP:port that must fail (0 if it succeeded)."""
    with net.client.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(1.0)
        try:
            sock.connect((str(net.vip), port))
        except socket.timeout:
            return errno.ETIMEDOUT
        except OSError as e:
            return e.errno
    return 0


def test_vip_traffic_matching_no_service_is_passed_not_natted(net, router):
    """TCP to VIP:9000, UDP to VIP:9000 and ICMP echo to the VIP: no backend sees them.

    The router's kernel, having no route to the VIP, answers the TCP SYN with ICMP unreachable,
    so the connect fails fast; the router's XDP answers the echo request itself (icmp_echo).
    Nothing to the VIP address is forwarded to any backend (captured on the backends'
    interfaces), and each of the 2 other attempts counts at least one pass.
    """
    router.deploy([router.service("web")])
    backend_ends = [(net.backends[i], net.backend_peer_iface(i)) for i in range(3)]

    with Capture(backend_ends) as capture:
        err = tcp_connect_error(net, OTHER_PORT)
        with pytest.raises(OSError):  # unreachable (ICMP), or a timeout: no backend answers
            udp_query(net.client, net.vip, OTHER_PORT, timeout_s=0.5)
        rtt_s = ping(net.client, net.vip, timeout_s=0.5)
        frames = capture.take()

    assert err in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ETIMEDOUT), errno.errorcode.get(err, err)
    from_client = {
        ifname: [f for f in got if f[26:30] == net.topo.client_addr.ip.packed] for ifname, got in frames.items()
    }
    assert from_client == {ifname: [] for _, ifname in backend_ends}
    snap = router.status()
    untouched(snap)
    assert snap["verdicts"]["pass"] >= 2
    assert rtt_s > 0 and snap["verdicts"]["icmp_echo"] == 1


def connect_from(net, port: int, addr, timeout_s: float = 2.0) -> Conn:
    """A TCP connection from the client's address and a chosen source port to addr:PORT."""
    with net.client.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # The port's earlier connection (to the VIP) sits in TIME_WAIT; a new one to another
        # destination may share the port, as the kernel's own port choice also allows.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((str(net.topo.client_addr.ip), port))
        sock.settimeout(timeout_s)
        sock.connect((str(addr), PORT))
        return Conn(sock, addr, PORT)
    except BaseException:
        sock.close()
        raise


def test_a_direct_connection_to_a_backend_passes_from_a_port_a_vip_flow_used_before(net, router):
    """The client reaches backend X through the VIP from port 45000 and closes; then it connects
    from the same port to X's own address. That connection is not for a VIP, so it must work and
    its replies come back untouched: from X, with no reverse NAT counted."""
    router.deploy([router.service("web")])
    with connect_from(net, 45000, net.vip) as conn:
        via_vip = conn.request()
    # The backend's FIN is reverse-NATed after close() returns; count from when it arrived
    # (the client's side of the VIP connection is then in TIME_WAIT).
    wait_until(
        lambda: net.client.run(["ss", "-Htn", "state", "time-wait", "( sport = :45000 )"]).stdout.strip(),
        timeout_s=5,
        what="the VIP connection from port 45000 to reach TIME_WAIT",
    )
    backend = net.backend_addr(int(via_vip.backend[1:]))
    before = router.counters()["verdicts"]

    with connect_from(net, 45000, backend) as conn:
        direct = conn.request()

    assert (direct.backend, direct.server_addr) == (via_vip.backend, f"{backend}:{PORT}")
    assert router.counters()["verdicts"]["return_nat"] == before["return_nat"]
