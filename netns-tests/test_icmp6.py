"""ICMPv6 errors about IPv6 VIP flows (bpf/include/icmp6.h): path MTU discovery through the IPv6 VIP.

        client ──veth── hop ──veth── router ──veth── b0, b1, b2
   2001:2:0:fe::2   MTU 1400 on the hop's side towards the client (controlplane/lab/mtuhop.py)

IPv6 routers never fragment: the hop drops each of the backends' 1500-byte segments and sends
"packet too big" to their source, the VIP. Only when the router hands that error to the backend
owning the flow (translated: outer destination, quoted source address and port, the quoted TCP
and the ICMPv6 checksums: the backend's kernel drops an ICMPv6 message with a wrong checksum)
does the backend lower its path MTU and the response get through. The other way, a backend's
own ICMPv6 error about a client's packet reaches the client as the VIP's (tc's return path).
Echo requests to the IPv6 VIP are answered by the router (real `ping -6`, bounded by -c and -w).
Addresses from 2001:2::/48 only, in the test's own namespaces.
"""

from __future__ import annotations

import re

from controlplane.lab.mtuhop import BulkServers, bulk_get, with_mtu_hop
from controlplane.lab.router import Router
from controlplane.lab.topo import Net
from controlplane.lab.traffic import udp_refused

BULK_PORT = 8001
SIZE = 200_000
TRANSFERS = 6
VOID_PORT = 8002  # no backend listens here
PINGS = 3


def service6(router: Router, net: Net, name: str, **extra) -> dict:
    """A service on the IPv6 VIP with the backends' IPv6 addresses."""
    svc = router.service(name, vip=str(net.topo.vip6), **extra)
    for entry in svc["backends"]:
        entry["address"] = str(net.topo.backend_addr6(int(entry["name"][1:])).ip)
    return svc


def icmp_drops(counters: dict) -> dict:
    return {name: n for name, n in counters["drops"].items() if name.startswith("icmp")}


def test_large_responses_through_the_ipv6_vip_complete_behind_a_lower_mtu_hop(net, router):
    """6 responses of 200 KB through the IPv6 VIP all complete (0 of 6 before icmp6.h: the
    transfers stalled after the handshake), and the router counted the hop's "packet too big"
    errors as translated to backends, none dropped."""
    router.deploy([service6(router, net, "bulk6", port=BULK_PORT, backend_port=BULK_PORT)])
    with with_mtu_hop(net, mtu=1400), BulkServers(net, BULK_PORT, SIZE, ipv6=True):
        got = [bulk_get(net.client, str(net.topo.vip6), BULK_PORT, timeout_s=3.0) for _ in range(TRANSFERS)]
        counters = router.counters()

    assert got == [SIZE] * TRANSFERS
    assert counters["verdicts"]["icmp_to_backend"] >= 1
    assert icmp_drops(counters) == {"icmp_malformed": 0, "icmp_nested": 0, "icmp_no_flow": 0}


def test_a_backends_ipv6_port_unreachable_reaches_the_client_as_the_vips(net, router):
    """A UDP service on the IPv6 VIP whose port no backend listens on: each backend's kernel
    answers "port unreachable" quoting client -> backend:port; the return path gives it the VIP
    back (outer source, quoted destination and port), so the client's connected socket sees
    ECONNREFUSED."""
    router.deploy([service6(router, net, "void6", protocol="udp", port=VOID_PORT, backend_port=VOID_PORT)])

    refused = [udp_refused(net.client, net.topo.vip6, VOID_PORT) for _ in range(3)]

    assert refused == [True] * 3
    assert router.counters()["verdicts"]["icmp_return"] == 3


def test_ping_to_the_ipv6_vip_is_answered_by_the_router(net, router):
    """Every echo request to the IPv6 VIP is answered from the VIP by XDP (icmp6.h, icmp6_echo),
    counted as icmp_echo (0 of 3 answered before: the VIP is no address of the router); with
    node.answer_ping: false they go to the stack again, which does not answer."""
    router.deploy([service6(router, net, "web6")])
    received = ping6(net)
    verdicts = router.counters()["verdicts"]
    router.deploy([service6(router, net, "web6")], node={"answer_ping": False})
    unanswered = ping6(net, 2)

    assert (received, verdicts["icmp_echo"]) == (PINGS, PINGS), verdicts
    assert verdicts["redirect"] == verdicts["nat_pass"] == verdicts["drop"] == 0
    assert unanswered == 0


def ping6(net: Net, count: int = 3) -> int:
    """Echo replies the client's `ping -6` got from the IPv6 VIP (0.2 s apart, 5 s at most)."""
    done = net.client.run(
        ["ping", "-6", "-n", "-c", str(count), "-i", "0.2", "-W", "1", "-w", "5", str(net.topo.vip6)], check=False
    )
    got = re.search(r"(\d+) received", done.stdout)
    assert got, done.stdout + done.stderr
    return int(got.group(1))
