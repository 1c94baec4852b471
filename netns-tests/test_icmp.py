"""ICMP errors about VIP flows (bpf/include/icmp.h): path MTU discovery through the VIP.

        client ──veth── hop ──veth── router ──veth── b0, b1, b2
                 MTU 1400 on the hop's side towards the client (controlplane/lab/mtuhop.py)

The client announces a full MSS; the backends' 1500-byte segments reach the hop, which sends
"fragmentation needed" to their source, the VIP. Only when the router hands that error to the
backend owning the flow (translated: outer destination, quoted source address and port, every
checksum: the backend's kernel drops an ICMP message with a wrong checksum) does the backend
lower its path MTU and the response get through. The other way, a backend's own ICMP error about a
client's packet reaches the client as the VIP's (tc's return path).
"""

from __future__ import annotations

from controlplane.lab.mtuhop import BulkServers, bulk_get, with_mtu_hop
from controlplane.lab.traffic import udp_refused

BULK_PORT = 8001
SIZE = 200_000
TRANSFERS = 6
VOID_PORT = 8002  # no backend listens here


def test_large_responses_through_the_vip_complete_behind_a_lower_mtu_hop(net, router):
    """6 responses of 200 KB through the VIP all complete (the issue saw 0 of 6 before), and the
    router counted the hop's errors as translated to backends, none dropped."""
    router.deploy([router.service("bulk", port=BULK_PORT, backend_port=BULK_PORT)])
    with with_mtu_hop(net, mtu=1400), BulkServers(net, BULK_PORT, SIZE):
        got = [bulk_get(net.client, str(net.vip), BULK_PORT) for _ in range(TRANSFERS)]
        counters = router.counters()

    assert got == [SIZE] * TRANSFERS
    assert counters["verdicts"]["icmp_to_backend"] >= 1
    assert {name: n for name, n in counters["drops"].items() if name.startswith("icmp")} == {
        "icmp_malformed": 0,
        "icmp_nested": 0,
        "icmp_no_flow": 0,
    }


def test_a_backends_port_unreachable_reaches_the_client_as_the_vips(net, router):
    """A UDP service on a port no backend listens on: each backend's kernel answers "port
    unreachable" quoting client -> backend:port; the return path gives it the VIP back (outer
    source, quoted destination and port), so the client's connected socket sees ECONNREFUSED."""
    router.deploy([router.service("void", protocol="udp", port=VOID_PORT, backend_port=VOID_PORT)])

    refused = [udp_refused(net.client, str(net.vip), VOID_PORT) for _ in range(3)]

    assert refused == [True] * 3
    assert router.counters()["verdicts"]["icmp_return"] == 3
