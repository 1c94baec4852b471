"""Direct server return (forwarding: dsr): the router encapsulates (IPIP, bpf/include/encap.h),
the backends decapsulate and answer the clients themselves, from the VIP.

        client ──veth── router ──veth── b0, b1, b2
                  XDP: IPIP to the backend       backends: tools/dsr-backend setup --decap xdp
                  (outer source: the router's    (this kernel has no ipip module; the XDP decap
                  address on that link)          is bpf/dsr_decap.c), VIP on lo, advmss 1440

Replies leave the backend from the VIP and reach the client through the router's kernel
forwarding, untouched by the router's programs: no reverse NAT (return_nat stays 0). Each backend
serves the plain HTTP backend on 0.0.0.0:DSR_PORT, so it answers on the VIP too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hb
import pytest
from dsrcheck import agent_refusals, assert_direct_replies, dsr_tool

from controlplane.lab.heartbeats import start_heartbeats
from controlplane.lab.mtuhop import BulkServers, bulk_get, bulk_put, with_mtu_hop
from controlplane.lab.procs import read_line
from controlplane.lab.traffic import backends_seen, http_get, wait_until

DSR_PORT = 8010
BULK_PORT = 8011
TOKENS = (0x5EED0001, 0x5EED0002, 0x5EED0003)
ALL = {"b0", "b1", "b2"}


def dsr_service(router, port: int = DSR_PORT, heartbeat: bool = True) -> dict:
    health = {"heartbeat": {"port": hb.HB_PORT, "interval_ms": 1, "timeout_ms": 250, "rise": 3}}
    svc = router.service(
        "dsr", port=port, backend_port=port, forwarding="dsr", **({"health": health} if heartbeat else {})
    )
    for entry in svc["backends"]:
        entry["token"] = hex(TOKENS[int(entry["name"][1:])])
    return svc


def start_any_address_backends(net, port: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for i, ns in enumerate(net.backends):
        proc = ns.popen(
            [sys.executable, "-m", "controlplane.lab.backend", "--name", f"b{i}", "--listen", f"0.0.0.0:{port}"],
            stdout=subprocess.PIPE,
            env=env,
        )
        line = read_line(proc, 5.0)
        assert line.startswith(f"listening b{i} "), line


@pytest.fixture
def dsr_net(net):
    """net with every backend set up for DSR of the VIP and serving on DSR_PORT."""
    missing = [dsr_tool(ns, "check", "--vip", str(net.vip)) for ns in net.backends]
    assert all(done.returncode == 1 and done.stderr.startswith("dsr-backend: decap: ") for done in missing), missing
    for ns in net.backends:
        done = dsr_tool(ns, "setup", "--vip", str(net.vip), "--decap", "xdp")
        assert done.returncode == 0, done.stderr
    start_any_address_backends(net, DSR_PORT)
    return net


def flows(net, n: int = 60) -> dict:
    return backends_seen(net.client, net.vip, DSR_PORT, n)


def test_backends_answer_dsr_flows_directly_from_the_vip(dsr_net, router):
    net = dsr_net
    router.deploy([dsr_service(router, heartbeat=False)])

    replies = [http_get(net.client, net.vip, DSR_PORT) for _ in range(30)]
    seen = flows(net, 150)
    snap = router.status()

    client = str(net.topo.client_addr.ip)
    assert_direct_replies(replies, seen, snap, net.vip, DSR_PORT, client, ALL)


def test_a_full_size_transfer_fits_through_the_encapsulation(dsr_net, router):
    """The client -> backend direction is the encapsulated one: clients send segments only as large
    as the backend's advertised MSS (tools/dsr-backend: advmss = 1500 - 60), so with the 20 bytes of
    IPIP they still fit its 1500-byte link. 256 KB uploads arrive whole, none dropped as too big;
    300 KB downloads (straight from the backend) complete too."""
    net = dsr_net
    router.deploy([dsr_service(router, port=BULK_PORT, heartbeat=False)])
    with BulkServers(net, BULK_PORT, 300_000, any_address=True):
        got = [bulk_get(net.client, str(net.vip), BULK_PORT) for _ in range(3)]
    with BulkServers(net, BULK_PORT, 0, any_address=True, upload=True):
        uploads = [bulk_put(net.client, str(net.vip), BULK_PORT, 256_000) for _ in range(3)]
    counters = router.counters()
    assert got == [300_000] * 3
    assert uploads == [256_000] * 3
    assert counters["drops"]["dsr_too_big"] == 0


def test_large_dsr_responses_complete_behind_a_lower_mtu_hop(dsr_net, router):
    """A 1400-byte-MTU hop between client and router: a backend's full-size segments (straight from
    the backend, through the router's forwarding) reach the hop, which sends "fragmentation needed"
    to their source, the VIP. The router sends that error in IPIP, unchanged, to the backend that
    owns the flow (conntrack), whose socket is the VIP's and lowers its path MTU: every 200 KB
    response completes (a response whose error reached another backend, or none, would stall)."""
    net = dsr_net
    router.deploy([dsr_service(router, port=BULK_PORT, heartbeat=False)])
    with with_mtu_hop(net, mtu=1400), BulkServers(net, BULK_PORT, 200_000, any_address=True):
        got = [bulk_get(net.client, str(net.vip), BULK_PORT) for _ in range(6)]
        counters = router.counters()

    assert got == [200_000] * 6
    verdicts, drops = counters["verdicts"], counters["drops"]
    assert verdicts["icmp_to_backend"] >= 1 and verdicts["dsr"] >= verdicts["icmp_to_backend"]
    assert {name: n for name, n in drops.items() if name.startswith(("icmp", "dsr"))} == {
        "icmp_malformed": 0,
        "icmp_nested": 0,
        "icmp_no_flow": 0,
        "dsr_too_big": 0,
    }


def test_dsr_flows_fail_over_by_heartbeat_and_the_agent_checks_the_setup(dsr_net, router):
    """With heartbeats on, a backend whose heartbeats stop gets no new DSR flows; the agents start
    with --dsr-vip because each backend is set up (a backend that is not: see dsr_net)."""
    net = dsr_net
    router.deploy([dsr_service(router)])
    agents = [
        start_heartbeats(net, i, token=TOKENS[i], hb_port=hb.HB_PORT, service_port=DSR_PORT, dsr_vip=str(net.vip))
        for i in range(3)
    ]
    try:
        wait_until(lambda: set(flows(net, 30)) == ALL, 10.0, "flows reach every backend")
        agents[0].stop()
        wait_until(lambda: set(flows(net, 30)) == {"b1", "b2"}, 10.0, "flows avoid b0")
        after = flows(net, 150)
    finally:
        for agent in agents:
            agent.stop()
    assert set(after) == {"b1", "b2"} and sum(after.values()) == 150, after


def test_the_agent_refuses_to_start_on_a_backend_not_set_up_for_dsr(net):
    """edge-heartbeat --dsr-vip on a backend without the setup: exit 1, one line naming what is
    missing (the decap first); after tools/dsr-backend setup it is only the VIP on lo that is not."""
    first, second = agent_refusals(net, TOKENS[0], str(net.vip), 32)

    assert first.returncode == 1 and first.stderr.startswith("edge-heartbeat: decap: "), first.stderr
    assert (
        second.returncode == 1
        and second.stderr == f"edge-heartbeat: vip: {net.vip} is not on lo (ip addr add {net.vip}/32 dev lo)\n"
    ), second.stderr
