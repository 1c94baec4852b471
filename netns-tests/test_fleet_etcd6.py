"""The fleet over a real etcd with an IPv6 service (controlplane/lab/fleet_etcd.py with
ipv6=True): two edge routers, each with its data path and edged in one fleet, serve "web" on the
IPv4 VIP and "web6" on the IPv6 VIP over the same two backends, probed over each family. A backend
that stops answering (SIGSTOP) gets weight 0 in both services on every node, with the same Maglev
table on every node for web6 as for web; the IPv6 VIP answers through either router.

        client ── upstream ─┬─ r0 (XDP, edged) ─┬─ sw (etcd 198.18.64.250) ─┬─ b0
        2001:2::2           └─ r1               ─┘                          └─ b1
"""

from __future__ import annotations

import json

from controlplane.lab import fleet6
from controlplane.lab.fleet_etcd import EtcdFleet


def test_an_ipv6_service_shares_weights_and_table_across_the_fleet(record_property):
    with EtcdFleet(routers=2, probe_ms=50, lease_ttl_s=2, ipv6=True) as fleet:
        firsts = [fleet.applied(i, lambda e: e["tables"].get("web6"), timeout_s=60.0) for i in range(2)]
        assert all(f["tables"].get("web") for f in firsts)
        for i in range(2):
            r = fleet.get_through6(i)
            assert (r.status, r.server_addr) == (200, f"{fleet6.VIP6}:8000"), r
        figures = fleet.weight_change(1, service="web6")
        record_property("fleet_propagation6", json.dumps(figures))
        print("fleet propagation (web6):", json.dumps(figures))
        assert figures["nodes"] == 2
        assert figures["same_weights"] and figures["same_table"] and figures["same_table_after_return"], figures
        assert figures["weights"]["b1"] == 0 and figures["weights"]["b0"] > 0
        backends6 = fleet.backends(0, "web6")
        assert {n: b["address"] for n, b in backends6.items()} == {
            f"b{j}": str(fleet6.backend_addr6(j).ip) for j in range(2)
        }
