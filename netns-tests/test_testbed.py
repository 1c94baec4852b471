"""The testbed itself, with real traffic and no router program: plain kernel forwarding.

        client ──veth── router ──veth── b0
                           ├────veth── b1
                           └────veth── b2

Proves that what later tests build on works (addresses, routes, offloads, backends, traffic
helpers, Ns.enter) and that a Net removes exactly what it made, also when a test fails.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from collections import Counter

import pytest
from packets import ping, udp_query
from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from controlplane.lab.procs import read_line, terminate
from controlplane.lab.topo import Net, Topo, check_ifname
from controlplane.lab.traffic import (
    backends_seen,
    close_all,
    http_get,
    open_connections,
)

PORT = 8000  # conftest.BACKEND_PORT


def leftovers(prefix: str) -> list[str]:
    """Namespaces and root-namespace interfaces whose name starts with prefix."""
    names = [name for name in netns.listnetns() if name.startswith(f"{prefix}-")]
    with IPRoute() as ipr:
        names += [link.get("ifname") for link in ipr.get_links() if link.get("ifname", "").startswith(f"{prefix}-")]
    return names


def thread_netns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


# Pure description: no kernel involved.


def test_topo_address_plan_follows_the_roles():
    topo = Topo()
    assert topo.backends == 3
    assert str(topo.client_addr) == "198.18.0.2/24"
    assert str(topo.router_client_addr) == "198.18.0.1/24"
    assert [str(topo.backend_addr(i)) for i in range(3)] == ["198.18.1.2/24", "198.18.2.2/24", "198.18.3.2/24"]
    assert [str(topo.router_backend_addr(i)) for i in range(3)] == ["198.18.1.1/24", "198.18.2.1/24", "198.18.3.1/24"]
    assert str(topo.vip) == "198.18.255.1"
    assert str(topo.vip_route) == "198.18.255.0/24"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backends": 0}, "backends: 0 is not in 1..254"),
        ({"backends": 255}, "backends: 255 is not in 1..254"),
        ({"vip": "198.20.0.1"}, "not in 198.18.0.0/15"),
        ({"vip": "198.18.2.9"}, "overlaps link network 198.18.2.0/24"),
    ],
    ids=["no backends", "too many backends", "vip outside the test range", "vip on a link"],
)
def test_topo_rejects_impossible_plans(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Topo(**kwargs)


def test_interface_names_are_checked_and_follow_the_scheme():
    with pytest.raises(ValueError, match="longer than 15"):
        check_ifname("abcde-rt-b1234567")
    net = Net(Topo(backends=254), prefix="e3f9a")  # the longest names the plan can make
    assert net.router_client_iface == "e3f9a-rt-c"
    assert net.client_iface == "e3f9a-c-rt"
    assert net.backend_iface(253) == "e3f9a-rt-b253"
    assert net.backend_peer_iface(0) == "e3f9a-b0-rt"
    assert [ns.name for ns in (net.client, net.router, net.backends[0])] == ["e3f9a-c", "e3f9a-rt", "e3f9a-b0"]
    with pytest.raises(ValueError, match="prefix"):
        Net(Topo(), prefix="toolong")


def test_close_ignores_only_already_gone_errors():
    net = Net(Topo(), prefix="t0000")  # never built: only the undo list is exercised
    ran = []
    net._push("first step", lambda: ran.append("first"))
    net._push("a refused step", lambda: (_ for _ in ()).throw(OSError(errno.EPERM, "not allowed")))
    net._push("a gone link", lambda: (_ for _ in ()).throw(NetlinkError(errno.ENODEV)))
    net._push("a gone file", lambda: (_ for _ in ()).throw(FileNotFoundError(errno.ENOENT, "gone")))

    with pytest.raises(OSError, match="not allowed") as raised:
        net.close()

    assert ran == ["first"]  # steps after the failing one still ran
    assert raised.value.errno == errno.EPERM
    net.close()  # idempotent: nothing left to undo


# Real namespaces and traffic.


def test_client_reaches_each_backend_through_the_router(net):
    for i in range(3):
        reply = http_get(net.client, net.backend_addr(i), PORT)

        assert reply.status == 200
        assert reply.backend == f"b{i}"
        assert reply.server_addr == f"{net.backend_addr(i)}:{PORT}"
        assert reply.peer.startswith("198.18.0.2:")  # forwarded, not NATed


def test_ping_crosses_the_router(net):
    assert ping(net.client, net.topo.router_client_addr.ip) > 0
    for i in range(3):
        assert ping(net.client, net.backend_addr(i)) > 0
        assert ping(net.backends[i], net.topo.client_addr.ip) > 0


def test_udp_echo_answers_with_the_backend_name(net):
    for i in range(3):
        reply = udp_query(net.client, net.backend_addr(i), PORT)

        assert reply.backend == f"b{i}"
        assert reply.server_addr == f"{net.backend_addr(i)}:{PORT}"


def test_long_lived_connections_stay_usable(net):
    """300 concurrent keep-alive connections (100 per backend) answer 3 rounds, with new flows between."""
    conns = []
    try:
        for i in range(3):
            conns += open_connections(net.client, net.backend_addr(i), PORT, 100)
        first = [conn.request() for conn in conns]
        for _ in range(2):
            assert backends_seen(net.client, net.backend_addr(0), PORT, 100) == Counter(b0=100)
            again = [conn.request() for conn in conns]
            assert [(r.backend, r.peer) for r in again] == [(r.backend, r.peer) for r in first]
        assert Counter(r.backend for r in first) == Counter(b0=100, b1=100, b2=100)
        # each its own source port towards its backend (the kernel may reuse a port
        # towards another destination)
        assert len({(r.backend, r.peer) for r in first}) == 300
    finally:
        close_all(conns)


def test_one_connection_carries_many_requests(net):
    with open_connections(net.client, net.backend_addr(1), PORT, 1)[0] as conn:
        replies = [conn.request() for _ in range(500)]

    assert {(r.status, r.backend, r.peer) for r in replies} == {(200, "b1", conn.local_addr)}


def test_backends_seen_counts_3000_new_flows(net):
    seen = backends_seen(net.client, net.backend_addr(2), PORT, 3000)

    assert seen == Counter(b2=3000)


def test_vip_is_on_no_interface_and_goes_to_the_router(net):
    for ns in net.namespaces.values():
        with ns.iproute() as ipr:
            assert str(net.vip) not in [a.get("address") for a in ipr.get_addr()], ns.name
    with net.client.iproute() as ipr:
        route = ipr.route("get", dst=str(net.vip))[0]
    assert route.get("gateway") == str(net.topo.router_client_addr.ip)
    # Without a router program nothing claims the VIP: the router has no route for it.
    with pytest.raises(OSError) as refused:
        http_get(net.client, net.vip, PORT, timeout_s=1.0)
    assert refused.value.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)


def test_offloads_and_sysctls_are_set(net):
    ends = [(net.client, net.client_iface)] + [(net.backends[i], net.backend_peer_iface(i)) for i in range(3)]
    for ns, ifname in ends:
        features = ns.offloads(ifname)
        assert (features["tx-checksumming"], features["generic-receive-offload"]) == ("off", "on"), ifname
    assert net.router.sysctl("net.ipv4.ip_forward") == "1"
    for ifname in [net.router_client_iface] + [net.backend_iface(i) for i in range(3)]:
        assert net.router.sysctl(f"net.ipv4.conf.{ifname}.rp_filter") == "0"
        assert net.router.sysctl(f"net.ipv6.conf.{ifname}.accept_dad") == "0"
    assert net.client.sysctl(f"net.ipv6.conf.{net.client_iface}.accept_dad") == "0"
    assert set(net.link_states().values()) == {"UP"}


def test_enter_keeps_sockets_in_the_namespace_and_restores_the_thread(net):
    home = thread_netns()
    with net.client.enter():
        assert thread_netns() != home
        inside = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    outside = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with inside, outside:
        assert thread_netns() == home
        inside.bind((str(net.topo.client_addr.ip), 0))  # only the client namespace has this address
        with pytest.raises(OSError) as not_here:
            outside.bind((str(net.topo.client_addr.ip), 0))
        assert not_here.value.errno == errno.EADDRNOTAVAIL

    with pytest.raises(RuntimeError):
        with net.router.enter():
            raise RuntimeError("inside")
    assert thread_netns() == home


def test_backend_exits_cleanly_on_sigterm_with_open_connections(net):
    server = net.servers[0]
    conns = open_connections(net.client, server.address, PORT, 5)
    try:
        server.stop()
    finally:
        close_all(conns)

    assert server.proc.returncode == 0


def test_close_removes_namespaces_links_and_processes():
    net = Net(Topo(backends=2))
    try:
        net.build()
        servers = net.start_backends(port=PORT)
        assert len(leftovers(net.prefix)) == 4  # c, rt, b0, b1; no veth in the root namespace
    finally:
        net.close()

    assert leftovers(net.prefix) == []
    assert [s.proc.returncode for s in servers] == [0, 0]


def test_close_removes_everything_when_the_test_body_raises():
    net = Net(Topo(backends=2))
    with pytest.raises(ZeroDivisionError):
        with net:
            net.build()
            net.start_backends(port=PORT)
            assert http_get(net.client, net.backend_addr(1), PORT).backend == "b1"
            raise ZeroDivisionError("the test body fails")

    assert leftovers(net.prefix) == []
    assert all(s.proc.returncode is not None for s in net.servers)


def test_a_failed_build_leaves_nothing_behind(monkeypatch):
    def broken_offloads(self):
        raise RuntimeError("ethtool exploded")  # after namespaces and veths exist

    monkeypatch.setattr(Net, "_set_offloads", broken_offloads)
    net = Net(Topo(backends=2))

    with pytest.raises(RuntimeError, match="ethtool exploded"):
        net.build()

    assert leftovers(net.prefix) == []


def test_terminate_kills_a_process_that_ignores_sigterm(net):
    stubborn = (
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); signal.pause()"
    )
    proc = net.client.popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)
    assert read_line(proc, timeout_s=5.0) == "ready"

    terminate(proc, timeout_s=0.2)

    assert proc.returncode == -signal.SIGKILL
