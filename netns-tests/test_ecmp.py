"""VIP announcement over BGP and a router loss behind ECMP, with real daemons: BIRD in the
upstream (multipath routes, L4 hashing) and in every edge router (run by its edged), the XDP
data path on every router, shared backends. Each test builds its own fleet and removes it.

        client ── upstream (bird, ECMP) ─┬─ r0 (XDP, edged + bird) ─┐
                                         ├─ r1                     ─┼─ sw ─┬─ b0, b1, b2
                                         └─ r2                     ─┘

The routers share one config (static weights), so their Maglev tables are identical: a flow the
upstream moves to another router finds the same backend there, although that router has no
conntrack entry for it (conntrack is per node). `edgectl drain-node` withdraws a router and
stays in force across a restart of its edged.
"""

from __future__ import annotations

import json
import signal

import pytest

from controlplane.errors import NotRunning
from controlplane.lab.ecmp import Fleet
from controlplane.lab.fleet import FleetTopo
from controlplane.lab.traffic import wait_until

N_CONNS = 200


@pytest.mark.parametrize("mode", ["link", "silent"])
def test_losing_a_router_keeps_connections_on_their_backends(mode, record_property):
    """200 long-lived connections spread over 3 routers; r0 is lost (link: its link goes down and
    its edged and bird are killed; silent: the link stays up but carries nothing, then they are
    killed, so only BFD can tell). The upstream withdraws r0, and every connection answers again
    from the backend it had: >= 99 % (goal), none broken."""
    with Fleet.start(FleetTopo(routers=3, backends=3)) as fleet:
        result = fleet.lose_router(0, mode=mode, n_conns=N_CONNS)
    record_property("router_loss", json.dumps(result.as_dict()))
    print(json.dumps(result.as_dict(), indent=1))
    assert result.per_router_before[0] > 0, "r0 carried no connection: the loss would prove nothing"
    assert sum(result.per_router_before) == N_CONNS
    assert result.failed == []
    assert result.kept_ratio >= 0.99, result.as_dict()


def test_drain_node_undeploy_and_stop_withdraw():
    """`edgectl drain-node` on r1 takes r1 out of the upstream's route and `undrain-node` brings it
    back; `edgectl undeploy` under r0's edged (edged says NOT_SERVING) withdraws r0; SIGTERM to r1's
    edged withdraws r1 (a graceful stop), and the upstream has no route to the VIP left."""
    with Fleet.start(FleetTopo(routers=2, backends=2)) as fleet:
        net = fleet.net
        out = fleet.edgectl(1, "drain-node")
        assert (out.returncode, out.stdout, out.stderr) == (0, f"{net.vip}: withdrawn (node drained)\n", "")
        net.wait_next_hops({0}, 10.0)
        out = fleet.edgectl(1, "undrain-node")
        assert (out.returncode, out.stdout) == (0, f"{net.vip}: announced\n")
        net.wait_next_hops({0, 1}, 30.0)

        out = fleet.edgectl(0, "undeploy", "--iface", net.router_iface(0), api=False)
        assert out.returncode == 0, out.stderr
        net.wait_next_hops({1}, 10.0)
        fleet.edgeds[0].wait_for(
            lambda e: e["kind"] == "bgp" and "(not serving: " in e["text"], 30.0, "r0's withdraw event"
        )

        fleet.edgeds[1].signal(signal.SIGTERM)
        net.wait_next_hops(set(), 10.0)
        assert fleet.edgeds[1].proc.wait(timeout=20) == 0
        stopped = [e["text"] for e in fleet.edgeds[1].events if e["kind"] == "bgp"]
        assert stopped[-1] == f"bgp: withdrew {net.vip} (edged stopping)"


def test_every_backend_down_withdraws_the_vip():
    """Every backend stops answering probes: both routers withdraw the VIP, and the upstream has
    no route to it left."""
    probe = {"probe": {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50, "fall": 2}}
    with Fleet.start(FleetTopo(routers=2, backends=2), service_extra={"health": probe}) as fleet:
        for server in fleet.net.servers:
            server.stop()
        fleet.net.wait_next_hops(set(), 20.0)
        for edged in fleet.edgeds:
            edged.wait_for(
                lambda e: e["kind"] == "bgp" and "(no usable backend)" in e["text"], 10.0, "the withdraw event"
            )


def test_drain_node_and_backend_drains_outlive_an_edged_restart():
    """On r1: `drain-node` (r1 withdrawn), b1 drained and b0's weight pinned at 7. r1's edged
    restarts: its first announcement decision keeps r1 withdrawn (the upstream still routes the
    VIP to r0 only), `edgectl status` says the node is drained, b1 still owns no slot and b0 keeps
    weight 7; `undrain-node` then announces r1 again."""
    with Fleet.start(FleetTopo(routers=2, backends=2)) as fleet:
        net = fleet.net
        for args in (("drain", "web", "b1"), ("weight", "web", "b0", "7"), ("drain-node",)):
            out = fleet.edgectl(1, *args)
            assert out.returncode == 0, (args, out.stderr)
        net.wait_next_hops({0}, 10.0)

        edged = fleet.restart(1)

        def decided():
            """The restarted edged's first announcement decision: an announcement (the drain was
            lost), or its status saying the VIP is withdrawn because the node is drained."""
            if any(e["kind"] == "bgp" and "announced" in e["text"] for e in edged.events):
                return "announced"
            try:
                with fleet.client(1) as c:
                    snap = c.status()
            except NotRunning:  # deployed, API socket not up yet
                return None
            if (snap.get("bgp") or {}).get("withdrawn", {}).get(str(net.vip)) == "node drained":
                return snap
            return None

        snap = wait_until(decided, 30.0, "r1's first announcement decision after the restart")
        assert snap != "announced", "the restarted edged announced the VIP: drain-node was lost"
        assert snap["node_drained"], snap.get("node_drained")
        assert net.vip_next_hops() == {net.topo.router_up_addr(0).ip}
        backends = {b["name"]: b for b in snap["services"][0]["backends"]}
        assert backends["b1"]["slots"] == 0 and backends["b1"]["edged"]["drained"] is True
        assert backends["b0"]["weight"] == 7 and backends["b0"]["edged"]["override"] == 7
        out = fleet.edgectl(1, "status")
        assert "node drained" in out.stdout, out.stdout

        out = fleet.edgectl(1, "undrain-node")
        assert (out.returncode, out.stdout) == (0, f"{net.vip}: announced\n")
        net.wait_next_hops({0, 1}, 30.0)
        with fleet.client(1) as c:
            assert not c.status()["node_drained"]
