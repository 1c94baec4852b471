"""Discovery of IPv6 backends from DNS with a real dnsmasq in the router namespace (127.0.0.1:53
there): edged follows AAAA records, and SRV records whose targets have AAAA records, for an IPv6 VIP,
next to an IPv4 service; an answer naming the router's own address, the VIP or a link-local address
is refused in one line and the last known good set stays.

        client ──veth── router (XDP, edged, dnsmasq on lo) ──veth── b0, b1, b2
        2001:2::2       VIP 2001:2:0:ffff::1                        2001:2:0:{i+1}::2
"""

from __future__ import annotations

from controlplane.discovery import endpoint_name
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.registry import Dnsmasq
from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000
NAME = "web6.disc.test"


def config(router, net, tmp_path, dns: dict) -> dict:
    s = {
        "name": "web6",
        "vip": str(net.topo.vip6),
        "port": PORT,
        "drain_timeout_ms": 60000,
        "discovery": {
            "dns": {"servers": ["127.0.0.1:53"], "timeout_ms": 500, "min_ttl_ms": 100, "max_ttl_ms": 2000, **dns},
            "retry_ms": 200,
        },
    }
    return router.config([router.service("web"), s], node={"api_socket": str(tmp_path / "edged.sock")})


def in_maps(router) -> dict[str, dict]:
    """web6's backend name -> its status entry, as the maps have it."""
    (svc,) = [s for s in router.status()["services"] if s["name"] == "web6"]
    return {b["name"]: b for b in svc["backends"]}


def addr6(net, i: int) -> str:
    return str(net.topo.backend_addr6(i).ip)


def ep(net, i: int) -> str:
    return endpoint_name(addr6(net, i), PORT)


def test_aaaa_records_are_followed_and_no_answer_may_name_the_router_the_vip_or_link_local(net, router, tmp_path):
    vip6 = net.topo.vip6
    dm = Dnsmasq(net.router, tmp_path, ttl_s=1)
    dm.set_hosts([(addr6(net, 0), NAME), (addr6(net, 1), NAME)], reload=False)
    dm.start()
    doc = config(router, net, tmp_path, {"name": NAME, "type": "AAAA", "port": PORT})
    edged = EdgedProc.start(net.router, doc, router.iface)
    conns = []
    try:
        # deployed with what DNS said at start; the IPv4 service beside it serves as ever
        assert set(in_maps(router)) == {ep(net, 0), ep(net, 1)}
        assert set(backends_seen(net.client, net.vip, PORT, 30)) == {"b0", "b1", "b2"}
        conns = open_connections(net.client, vip6, PORT, 20)
        before = [c.request().backend for c in conns]
        assert set(before) == {"b0", "b1"}

        # b2 appears: new flows reach it, connections stay where they are
        mark = len(edged.events)
        dm.set_hosts([(addr6(net, i), NAME) for i in range(3)])
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b2 discovered", after=mark)
        assert ev["change"] == f"+{ep(net, 2)}", ev["text"]
        assert set(backends_seen(net.client, vip6, PORT, 300)) == {"b0", "b1", "b2"}
        assert [c.request().backend for c in conns] == before

        # answers naming what no backend may be: refused, one line each, the last known good set stays
        refused = [
            (str(net.topo.router_backend_addr6(0).ip), "is this node's own (a route of type local)"),
            (str(vip6), "is a VIP"),
            ("fe80::5", "is a link-local address"),
        ]
        for bad, why in refused:
            mark = len(edged.events)
            dm.set_hosts([(addr6(net, i), NAME) for i in range(3)] + [(bad, NAME)])
            ev = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, f"{bad} refused", after=mark)
            assert f"{bad} {why}" in ev["error"] and "\n" not in ev["text"], ev["text"]
            assert "keeping the last known good set (3 backends)" in ev["text"], ev["text"]
            assert set(in_maps(router)) == {ep(net, i) for i in range(3)}
        assert set(backends_seen(net.client, vip6, PORT, 150)) == {"b0", "b1", "b2"}

        # b1 goes: it drains (its connections still answer from it), new flows avoid it
        mark = len(edged.events)
        dm.set_hosts([(addr6(net, 0), NAME), (addr6(net, 2), NAME)])
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b1 gone", after=mark)
        assert ev["change"] == f"-{ep(net, 1)}", ev["text"]
        assert set(backends_seen(net.client, vip6, PORT, 300)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before
    finally:
        close_all(conns)
        edged.stop()
        dm.stop()


def test_srv_targets_with_aaaa_records_give_port_weight_and_standby(net, router, tmp_path):
    """SRV for an IPv6 VIP: targets are resolved by AAAA; priority 0 targets are primaries with the
    record's weight, priority 1 is standby; a target with only an A record fails the answer (the last
    known good set stays)."""
    srv = "_web6._tcp.disc.test"
    hosts = [(f"h{i}.disc.test", addr6(net, i)) for i in range(3)]
    dm = Dnsmasq(net.router, tmp_path, ttl_s=1)
    dm.set_records(
        srv=[(srv, "h0.disc.test", PORT, 0, 3), (srv, "h1.disc.test", PORT, 0, 1), (srv, "h2.disc.test", PORT, 1, 1)],
        host_records=hosts,
    )
    dm.start()
    edged = EdgedProc.start(net.router, config(router, net, tmp_path, {"name": srv}), router.iface)
    try:
        got = in_maps(router)
        assert {n: (b["weight"], b["standby"], b["address"]) for n, b in got.items()} == {
            ep(net, 0): (3, False, addr6(net, 0)),
            ep(net, 1): (1, False, addr6(net, 1)),
            ep(net, 2): (1, True, addr6(net, 2)),
        }
        seen = backends_seen(net.client, net.topo.vip6, PORT, 400)
        assert set(seen) == {"b0", "b1"} and seen["b0"] > seen["b1"], seen  # 3:1, the standby idle

        mark = len(edged.events)
        four = [("h3.disc.test", str(net.backend_addr(1)))]  # an IPv4-only target
        dm.set_records(
            srv=[(srv, "h0.disc.test", PORT, 0, 3), (srv, "h3.disc.test", PORT, 0, 1)], host_records=hosts + four
        )
        dm.restart()
        ev = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, "A-only target", after=mark)
        # dnsmasq without upstream answers REFUSED for a type it holds nothing of: either way, no AAAA
        assert "h3.disc.test. IN AAAA" in ev["error"] or "h3.disc.test. has no AAAA" in ev["error"], ev["text"]
        assert set(in_maps(router)) == {ep(net, i) for i in range(3)}

        mark = len(edged.events)
        dm.set_records(srv=[(srv, "h0.disc.test", PORT, 0, 3), (srv, "h2.disc.test", PORT, 0, 1)], host_records=hosts)
        dm.restart()
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "SRV change", after=mark)
        assert ev["change"] == f"-{ep(net, 1)}, ~{ep(net, 2)}", ev["text"]
        assert set(backends_seen(net.client, net.topo.vip6, PORT, 300)) == {"b0", "b2"}
    finally:
        edged.stop()
        dm.stop()
