"""Discovery from DNS with a real dnsmasq in the router namespace (127.0.0.1:53 there): edged
follows A and SRV records by their TTL, keeps the last known good set while the server refuses
or is gone, and long-lived connections keep their backends through every change that does not
remove their backend; a removed backend drains.

        client ──veth── router (XDP, edged, dnsmasq on lo) ──veth── b0, b1, b2
"""

from __future__ import annotations

import time

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.registry import Dnsmasq
from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000
NAME = "web.disc.test"


def config(router, tmp_path, dns: dict, **service) -> dict:
    s = {
        "name": "web",
        "vip": str(router.net.vip),
        "port": PORT,
        "drain_timeout_ms": 60000,
        "discovery": {
            "dns": {"servers": ["127.0.0.1:53"], "timeout_ms": 500, "min_ttl_ms": 100, "max_ttl_ms": 2000, **dns},
            "retry_ms": 200,
        },
        **service,
    }
    return router.config([s], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"})


def in_maps(router) -> dict[str, dict]:
    """Backend name -> its status entry, as the maps have it."""
    (svc,) = router.status()["services"]
    return {b["name"]: b for b in svc["backends"]}


def ep(net, i: int) -> str:
    return f"{net.backend_addr(i)}-{PORT}"


def test_a_records_are_followed_and_a_failing_server_keeps_the_last_known_good_set(net, router, tmp_path):
    addr = [str(net.backend_addr(i)) for i in range(3)]
    dm = Dnsmasq(net.router, tmp_path, ttl_s=1)
    dm.set_hosts([(addr[0], NAME), (addr[1], NAME)], reload=False)
    dm.start()
    edged = EdgedProc.start(
        net.router, config(router, tmp_path, {"name": NAME, "type": "A", "port": PORT}), router.iface
    )
    conns = []
    try:
        # deployed with what DNS said at start
        assert set(in_maps(router)) == {ep(net, 0), ep(net, 1)}
        conns = open_connections(net.client, net.vip, PORT, 20)
        before = [c.request().backend for c in conns]
        assert set(before) == {"b0", "b1"}

        # b2 appears: new flows reach it, connections stay where they are
        mark = len(edged.events)
        dm.set_hosts([(a, NAME) for a in addr])
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b2 discovered", after=mark)
        assert ev["change"] == f"+{ep(net, 2)}", ev["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b1", "b2"}
        assert [c.request().backend for c in conns] == before

        # b1 goes: it drains (its connections still answer from it), new flows avoid it
        mark = len(edged.events)
        t0 = time.time()
        dm.set_hosts([(addr[0], NAME), (addr[2], NAME)])
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b1 gone", after=mark)
        print(f"\nfigure: DNS change (TTL 1 s) -> in the maps: {(ev['t'] - t0) * 1000:.1f} ms")
        assert ev["change"] == f"-{ep(net, 1)}", ev["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before
        on_b1 = [c for c, b in zip(conns, before) if b == "b1"]
        close_all(on_b1)  # drained out; the rest stay open through the failures below
        conns = [c for c, b in zip(conns, before) if b != "b1"]
        before = [b for b in before if b != "b1"]

        # the server refuses: the last known good set stays, counted and told once
        mark = len(edged.events)
        dm.set_hosts([], reload=False)
        dm.set_records(refused=["disc.test"])
        dm.restart()
        failed = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, "REFUSED seen", after=mark)
        assert (
            "no server answered" in failed["error"] and "keeping the last known good set (2 backends)" in failed["text"]
        ), failed["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 200)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before

        # the server is gone: still the last known good set
        mark = len(edged.events)
        t0 = time.time()
        dm.stop()
        failed = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, "server gone", after=mark)
        print(f"figure: DNS server killed -> failure noticed: {(failed['t'] - t0) * 1000:.1f} ms")
        assert failed["failures"] >= 2
        assert set(backends_seen(net.client, net.vip, PORT, 200)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before
        status = router.edgectl("status", "--socket", tmp_path / "edged.sock")
        assert "discovery: dns stale, 2 backends, data " in status.stdout, status.stdout + status.stderr

        # back, with b0 only: the change goes through, b2 drains
        mark = len(edged.events)
        dm.set_records()
        dm.set_hosts([(addr[0], NAME)], reload=False)
        dm.start()
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b2 gone", after=mark)
        assert ev["change"] == f"-{ep(net, 2)}", ev["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 200)) == {"b0"}
        assert [c.request().backend for c in conns] == before
    finally:
        close_all(conns)
        edged.stop()
        dm.stop()


def test_srv_records_give_port_weight_and_standby(net, router, tmp_path):
    """SRV: priority 0 targets are primaries with the record's weight; priority 1 is standby."""
    addr = [str(net.backend_addr(i)) for i in range(3)]
    srv = "_web._tcp.disc.test"
    hosts = [(f"h{i}.disc.test", addr[i]) for i in range(3)]
    dm = Dnsmasq(net.router, tmp_path, ttl_s=1)
    dm.set_records(
        srv=[(srv, "h0.disc.test", PORT, 0, 3), (srv, "h1.disc.test", PORT, 0, 1), (srv, "h2.disc.test", PORT, 1, 1)],
        host_records=hosts,
    )
    dm.start()
    edged = EdgedProc.start(net.router, config(router, tmp_path, {"name": srv}), router.iface)
    try:
        got = in_maps(router)
        assert {n: (b["weight"], b["standby"]) for n, b in got.items()} == {
            ep(net, 0): (3, False),
            ep(net, 1): (1, False),
            ep(net, 2): (1, True),
        }
        seen = backends_seen(net.client, net.vip, PORT, 400)
        assert set(seen) == {"b0", "b1"} and seen["b0"] > seen["b1"], seen  # 3:1, the standby idle

        mark = len(edged.events)
        dm.set_records(srv=[(srv, "h0.disc.test", PORT, 0, 3), (srv, "h2.disc.test", PORT, 0, 1)], host_records=hosts)
        dm.restart()
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "SRV change", after=mark)
        assert ev["change"] == f"-{ep(net, 1)}, ~{ep(net, 2)}", ev["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b2"}
    finally:
        edged.stop()
        dm.stop()
