"""Discovery of IPv6 backends from a real etcd in the router namespace (127.0.0.1:2379 there), for
an IPv6 VIP: keys with IPv6 addresses become backends named after their endpoint, a new key is
applied from the watch, an address no backend may have (the router's own, the VIP, one of the
other family) is refused while the set stays, and a removed key drains its backend.

        client ──veth── router (XDP, edged, etcd on lo) ──veth── b0, b1, b2
"""

from __future__ import annotations

from controlplane.discovery import endpoint_name
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.registry import Etcd
from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000
PREFIX = "/edge/services/web6/"


def test_etcd_keys_with_ipv6_addresses_are_watched_and_screened(net, router, tmp_path):
    vip6 = net.topo.vip6
    etcd = Etcd(net.router, tmp_path).start()
    addr = [str(net.topo.backend_addr6(i).ip) for i in range(3)]
    ep = [endpoint_name(a, PORT) for a in addr]
    for i in (0, 1):
        etcd.put(f"{PREFIX}b{i}", {"address": addr[i], "port": PORT})
    s = {
        "name": "web6",
        "vip": str(vip6),
        "port": PORT,
        "drain_timeout_ms": 60000,
        "discovery": {"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": PREFIX, "timeout_ms": 1000}, "retry_ms": 200},
    }
    doc = router.config([s], node={"api_socket": str(tmp_path / "edged.sock")})
    edged = EdgedProc.start(net.router, doc, router.iface)
    conns = []
    try:
        (svc,) = router.status()["services"]
        assert {b["name"]: b["address"] for b in svc["backends"]} == {ep[0]: addr[0], ep[1]: addr[1]}
        conns = open_connections(net.client, vip6, PORT, 20)
        before = [c.request().backend for c in conns]
        assert set(before) == {"b0", "b1"}

        mark = len(edged.events)
        etcd.put(f"{PREFIX}b2", {"address": addr[2], "port": PORT, "weight": 2})
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b2 from the watch", after=mark)
        assert ev["change"] == f"+{ep[2]}", ev["text"]
        assert set(backends_seen(net.client, vip6, PORT, 300)) == {"b0", "b1", "b2"}

        refused = [
            (str(net.topo.router_backend_addr6(0).ip), "route of type local"),
            (str(vip6), "is a VIP"),
            (str(net.backend_addr(0)), "is IPv4 but the VIP"),
        ]
        for bad, why in refused:
            mark = len(edged.events)
            etcd.put(f"{PREFIX}bad", {"address": bad, "port": PORT})
            failed = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, f"{bad} refused", after=mark)
            assert "answer rejected" in failed["error"] and why in failed["error"], failed["text"]
            etcd.delete(f"{PREFIX}bad")
            edged.wait_for(lambda e: e["kind"] == "discovery-recovered", 10.0, f"{bad} gone", after=mark)

        mark = len(edged.events)
        etcd.delete(f"{PREFIX}b1")
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b1 gone", after=mark)
        assert ev["change"] == f"-{ep[1]}", ev["text"]
        assert set(backends_seen(net.client, vip6, PORT, 300)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before  # b1's connections drain
    finally:
        close_all(conns)
        edged.stop()
        etcd.stop()
