"""Direct server return for an IPv6 VIP (forwarding: dsr): the router encapsulates IPv6-in-IPv6
(bpf/include/encap6.h), the backends decapsulate and answer the clients themselves, from the VIP.

        client ──veth── router ──veth── b0, b1, b2
      2001:2::2   XDP: IPv6-in-IPv6 to the       backends: tools/dsr-backend setup --vip VIP6
                  backend (outer source: the     --decap xdp (this kernel has no ip6_tunnel; the
                  router's address on that link) XDP decap is bpf/dsr_decap.c), VIP6 on lo,
                                                 advmss 1400 on the IPv6 default route

Replies leave the backend from the VIP and reach the client through the router's kernel
forwarding, untouched by the router's programs: no reverse NAT (return_nat stays 0). Each backend
serves the plain HTTP backend on its IPv4 address and on VIP6 itself. Addresses from 2001:2::/48
only (controlplane/lab/topo.py), in the test's own namespaces.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from dsrcheck import ROOT, agent_refusals, assert_direct_replies, dsr_tool

from controlplane.lab.heartbeats import start_heartbeats
from controlplane.lab.mtuhop import BulkServers, bulk_get, bulk_put, with_mtu_hop
from controlplane.lab.procs import read_line
from controlplane.lab.traffic import backends_seen, http_get, wait_until

DSR_PORT = 8010
BULK_PORT = 8011
HB_PORT = 7946
TOKENS = (0x6EED0001, 0x6EED0002, 0x6EED0003)
ALL = {"b0", "b1", "b2"}


def dsr6_service(router, net, port: int = DSR_PORT, heartbeat: bool = True) -> dict:
    health = {"heartbeat": {"port": HB_PORT, "interval_ms": 5, "timeout_ms": 250, "rise": 3}}
    svc = router.service(
        "dsr6",
        vip=str(net.topo.vip6),
        port=port,
        backend_port=port,
        forwarding="dsr",
        **({"health": health} if heartbeat else {}),
    )
    for entry in svc["backends"]:
        i = int(entry["name"][1:])
        entry["address"] = str(net.topo.backend_addr6(i).ip)
        entry["token"] = hex(TOKENS[i])
    return svc


def start_vip_backends(net, port: int) -> None:
    """The HTTP backend in each backend namespace on its IPv4 address and on VIP6 (on lo)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for i, ns in enumerate(net.backends):
        argv = [sys.executable, "-m", "controlplane.lab.backend", "--name", f"b{i}"]
        argv += ["--listen", f"{net.backend_addr(i)}:{port}", "--listen6", str(net.topo.vip6)]
        proc = ns.popen(argv, stdout=subprocess.PIPE, env=env)
        line = read_line(proc, 5.0)
        assert line.startswith(f"listening b{i} "), line


@pytest.fixture
def dsr6_net(net):
    """net with every backend set up for DSR of VIP6 and serving on DSR_PORT."""
    vip6 = str(net.topo.vip6)
    missing = [dsr_tool(ns, "check", "--vip", vip6) for ns in net.backends]
    assert all(d.returncode == 1 and d.stderr.startswith("dsr-backend: decap: neither ip6tnl0") for d in missing), [
        d.stderr for d in missing
    ]
    for ns in net.backends:
        done = dsr_tool(ns, "setup", "--vip", vip6, "--decap", "xdp")
        assert done.returncode == 0, done.stderr
    start_vip_backends(net, DSR_PORT)
    return net


def flows(net, n: int = 60) -> dict:
    return backends_seen(net.client, net.topo.vip6, DSR_PORT, n)


def test_ipv6_backends_answer_dsr_flows_directly_from_the_vip(dsr6_net, router):
    """30 HTTP exchanges and 150 more connections to VIP6: answered from VIP6 by every backend,
    which sees the client's own address; the router encapsulated every client packet (dsr verdict)
    and rewrote no reply (return_nat 0, no return packets), with no drop."""
    net = dsr6_net
    router.deploy([dsr6_service(router, net, heartbeat=False)])
    vip6 = net.topo.vip6

    replies = [http_get(net.client, vip6, DSR_PORT) for _ in range(30)]
    seen = flows(net, 150)
    snap = router.status()

    client6 = str(net.topo.client_addr6.ip)
    assert_direct_replies(replies, seen, snap, vip6, DSR_PORT, client6, ALL)


def test_a_full_size_ipv6_transfer_fits_through_the_encapsulation(dsr6_net, router):
    """The client -> backend direction is the encapsulated one: clients send segments only as large
    as the backend's advertised MSS (tools/dsr-backend: advmss = 1500 - 100 on the IPv6 default
    route), so with the 40 bytes of the outer IPv6 header they still fit its 1500-byte link. 256 KB
    uploads arrive whole, none dropped as too big; 300 KB downloads (straight from the backend)
    complete too."""
    net = dsr6_net
    router.deploy([dsr6_service(router, net, port=BULK_PORT, heartbeat=False)])
    vip6 = str(net.topo.vip6)
    with BulkServers(net, BULK_PORT, 300_000, any_address=True, ipv6=True):
        got = [bulk_get(net.client, vip6, BULK_PORT) for _ in range(3)]
    with BulkServers(net, BULK_PORT, 0, any_address=True, upload=True, ipv6=True):
        uploads = [bulk_put(net.client, vip6, BULK_PORT, 256_000) for _ in range(3)]
    counters = router.counters()
    assert got == [300_000] * 3
    assert uploads == [256_000] * 3
    assert counters["drops"]["dsr_too_big"] == 0 and counters["verdicts"]["dsr"] > 3 * 256_000 // 1500


def test_large_ipv6_dsr_responses_complete_behind_a_lower_mtu_hop(dsr6_net, router):
    """A 1400-byte-MTU IPv6 hop between client and router: a backend's full-size segments (straight
    from the backend, through the router's forwarding) reach the hop, which sends "packet too big"
    to their source, VIP6. The router sends that error in IPv6-in-IPv6, unchanged, to the backend
    that owns the flow (edge_ct6), whose socket is VIP6's and lowers its path MTU: every 200 KB
    response completes (translated as for NAT, the error matched no socket and each stalled)."""
    net = dsr6_net
    router.deploy([dsr6_service(router, net, port=BULK_PORT, heartbeat=False)])
    vip6 = str(net.topo.vip6)
    with with_mtu_hop(net, mtu=1400), BulkServers(net, BULK_PORT, 200_000, any_address=True, ipv6=True):
        got = [bulk_get(net.client, vip6, BULK_PORT) for _ in range(6)]
        counters = router.counters()

    assert got == [200_000] * 6
    verdicts, drops = counters["verdicts"], counters["drops"]
    assert verdicts["icmp_to_backend"] >= 1 and verdicts["dsr"] >= verdicts["icmp_to_backend"]
    assert verdicts["redirect"] == 0 and verdicts["nat_pass"] == 0, verdicts
    assert {name: n for name, n in drops.items() if name.startswith(("icmp", "dsr"))} == {
        "icmp_malformed": 0,
        "icmp_nested": 0,
        "icmp_no_flow": 0,
        "dsr_too_big": 0,
    }


def test_ipv6_dsr_flows_fail_over_by_heartbeat_and_the_agent_checks_the_setup(dsr6_net, router):
    """With heartbeats over IPv6 on, a backend whose agent is killed (by its pid) gets no new DSR
    flows; the agents start with --dsr-vip VIP6 because each backend is set up (one that is not:
    test_the_agent_refuses_...)."""
    net = dsr6_net
    router.deploy([dsr6_service(router, net)])
    agents = []
    try:
        for i in range(3):
            agents.append(
                start_heartbeats(
                    net,
                    i,
                    token=TOKENS[i],
                    hb_port=HB_PORT,
                    interval_ms=5,
                    service_port=DSR_PORT,
                    dsr_vip=str(net.topo.vip6),
                    family=6,
                )
            )
        wait_until(lambda: set(flows(net, 30)) == ALL, 10.0, "flows reach every backend")
        agents[0].kill()
        wait_until(lambda: set(flows(net, 30)) == {"b1", "b2"}, 10.0, "flows avoid b0")
        after = flows(net, 150)
        snap = router.status()
    finally:
        for agent in agents:
            agent.stop()
    assert set(after) == {"b1", "b2"} and sum(after.values()) == 150, after
    states = {b["name"]: b["state"] for b in snap["services"][0]["backends"]}
    assert states == {"b0": "down", "b1": "up", "b2": "up"}, states


def test_the_agent_refuses_to_start_on_a_backend_not_set_up_for_ipv6_dsr(net):
    """edge-heartbeat --dsr-vip VIP6 on a backend without the setup: exit 1, one line naming what is
    missing (the decap first); after tools/dsr-backend setup it is only the VIP on lo that is not."""
    vip6 = str(net.topo.vip6)
    first, second = agent_refusals(net, TOKENS[0], vip6, 128, family=6)

    assert first.returncode == 1 and first.stderr.startswith("edge-heartbeat: decap: neither ip6tnl0"), first.stderr
    assert (
        second.returncode == 1
        and second.stderr == f"edge-heartbeat: vip: {vip6} is not on lo (ip addr add {vip6}/128 dev lo)\n"
    ), second.stderr
