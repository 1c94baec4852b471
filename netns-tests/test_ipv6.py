"""IPv6 VIPs with IPv6 backends, forwarded through the router next to IPv4 VIPs on the same node and
interfaces: NAT to the backends and back (ingress6.h, return6.h), affinity across a weight change,
passive detection when a backend's server dies, and both families at once.

        client ──veth── router ──veth── b0      IPv4 VIP 198.18.255.1, IPv6 VIP 2001:2:0:ffff::1
     198.18.0.2      XDP on rt-c   ├──veth── b1  (on no interface); backends 198.18.{i+1}.2 and
     2001:2::2       tc on rt-bN   └──veth── b2  2001:2:0:{i+1}::2 serve HTTP and UDP on :8000

The client only ever talks to the VIPs; a reply that did not come back from the VIP (the return
path rewrites the backend's source back to it) would not reach the client's socket. Addresses
from 2001:2::/48 only (controlplane/lab/topo.py), in the test's own namespaces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

from controlplane import deploy, loader
from controlplane.lab.daemon import EdgedProc, env_with_package
from controlplane.lab.router import Router
from controlplane.lab.topo import Net
from controlplane.lab.traffic import backends_seen, close_all, http_get, open_connections, udp_answers, wait_until

PORT = 8000  # conftest.BACKEND_PORT, also the VIPs' port
ALL = {"b0", "b1", "b2"}
PASSIVE = {"syn_timeout_ms": 50, "consecutive": 3, "ejection_ms": 2000, "max_ejected_percent": 50}


def service6(router: Router, net: Net, name: str = "web6", weights=None, **extra) -> dict:
    """A service on the IPv6 VIP with the backends' IPv6 addresses."""
    svc = router.service(name, vip=str(net.topo.vip6), weights=weights, **extra)
    for entry in svc["backends"]:
        entry["address"] = str(net.topo.backend_addr6(int(entry["name"][1:])).ip)
    return svc


def by_name(snap: dict) -> dict:
    return {s["name"]: s for s in snap["services"]}


def test_ipv6_http_and_udp_through_the_vip_next_to_ipv4(net, router):
    """An IPv4 and an IPv6 service deployed at once: 30 IPv6 connections checked one by one answer
    from the IPv6 VIP with the client's own address as the backend's peer, from every backend (a
    backend missed with p ~ 2e-5); 300 more reach all three without error; 30 UDP datagrams are
    answered from the VIP; IPv4 through its VIP works alongside. Status shows both services, the
    IPv6 one with its VIP and IPv6 backends, and counts exactly the IPv6 flows."""
    router.deploy([router.service("web"), service6(router, net), service6(router, net, "dns6", protocol="udp")])
    vip6, client6 = net.topo.vip6, str(net.topo.client_addr6.ip)

    replies = [http_get(net.client, vip6, PORT) for _ in range(30)]
    seen = backends_seen(net.client, vip6, PORT, 300)
    answers = udp_answers(net.client, vip6, PORT, 30)
    replies4 = [http_get(net.client, net.vip, PORT) for _ in range(30)]

    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{vip6}:{PORT}")}
    assert all(r.peer.startswith(f"{client6}:") for r in replies)  # NAT keeps the client's address
    assert {r.backend for r in replies} == ALL
    assert sum(seen.values()) == 300 and set(seen) == ALL, seen
    assert {src for _, src in answers} == {f"{vip6}:{PORT}"} and {n for n, _ in answers} == ALL
    assert {(r.status, r.server_addr) for r in replies4} == {(200, f"{net.vip}:{PORT}")}

    snap = router.status()
    services = by_name(snap)
    web6, dns6, web = services["web6"], services["dns6"], services["web"]
    assert (web6["vip"], web6["port"], web6["protocol"]) == (str(vip6), PORT, "tcp")
    assert [b["address"] for b in web6["backends"]] == [str(net.topo.backend_addr6(i).ip) for i in range(3)]
    assert web6["new_flows"] == 330 and web["new_flows"] == 30
    assert web6["return_packets"] >= 2 * 330 and web6["packets"] >= 3 * 330
    assert (dns6["packets"], dns6["return_packets"], dns6["new_flows"]) == (30, 30, 30)
    assert snap["verdicts"]["drop"] == 0 and set(snap["drops"].values()) == {0}
    assert snap["conntrack_entries"] == 30 + 330 + 30  # edge_ct's and edge_ct6's


def test_ipv6_replies_take_the_xdp_fast_path(net, router):
    """IPv6 alone: 10 keep-alive connections with 5 requests each are answered from the VIP. A
    connection's SYN-ACK, its first reply payload (a wire sample is pending, wire6.h) and its FIN
    go to tc, as IPv4's do; the answers to its later requests through edge_reply (XDP, reply6.h):
    return_xdp counts at least 4 x 10, and return_nat (tc's and XDP's, as status adds them) counts
    every reply."""
    router.deploy([service6(router, net)])
    conns = open_connections(net.client, net.topo.vip6, PORT, 10)
    try:
        replies = [c.request() for _ in range(5) for c in conns]
    finally:
        close_all(conns)
    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{net.topo.vip6}:{PORT}")}
    verdicts = router.counters()["verdicts"]
    assert verdicts["return_xdp"] >= 4 * 10, verdicts
    snap = router.status()
    assert snap["verdicts"]["return_nat"] == by_name(snap)["web6"]["return_packets"] > verdicts["return_xdp"]


def test_ipv6_flows_feed_wire_signals(net, router):
    """30 IPv6 HTTP exchanges, each on a connection of its own that the client closes: per backend
    status shows one handshake and one first-byte sample per new flow (wire6.h; the response's
    first segment goes to tc while its sample is pending, not through edge_reply), with their
    medians; 6 connections held open count as active, and none once they are closed."""
    router.deploy([service6(router, net)])
    vip6 = net.topo.vip6
    assert {http_get(net.client, vip6, PORT).status for _ in range(30)} == {200}

    def backends() -> dict:
        return {b["name"]: b for b in by_name(router.status())["web6"]["backends"]}

    b = wait_until(
        lambda: (s := backends()) and sum(x["wire"]["first_bytes"] for x in s.values()) == 30 and s,
        10.0,
        "30 first-byte samples",
        observe=lambda: {n: x["wire"] for n, x in backends().items()},
    )
    assert sum(x["new_flows"] for x in b.values()) == 30
    for name, x in b.items():
        w = x["wire"]
        assert w["handshakes"] == w["first_bytes"] == x["new_flows"], (name, w)
        if x["new_flows"]:
            assert w["handshake_p50_s"] > 0 and w["first_byte_p50_s"] > 0, (name, w)
        assert w["active"] == 0, (name, w)

    conns = open_connections(net.client, vip6, PORT, 6)
    try:
        wait_until(
            lambda: sum(x["wire"]["active"] for x in backends().values()) == 6,
            10.0,
            "6 active IPv6 flows",
            observe=lambda: {n: x["wire"] for n, x in backends().items()},
        )
    finally:
        close_all(conns)
    wait_until(lambda: sum(x["wire"]["active"] for x in backends().values()) == 0, 10.0, "no active flows")


def test_ipv6_connections_keep_their_backend_across_a_weight_change(net, router):
    """60 keep-alive IPv6 connections opened under 1:1:1 answer from the same backend after a
    redeploy with 1:0:1 (b1 drains: a change that moves every slot b1 had); 300 new flows after
    it never reach b1."""
    router.deploy([service6(router, net, weights=[1, 1, 1])])
    conns = open_connections(net.client, net.topo.vip6, PORT, 60)
    try:
        before = [conn.request().backend for conn in conns]
        assert set(before) == ALL

        router.deploy([service6(router, net, weights=[1, 0, 1])])

        after = [conn.request().backend for conn in conns]
        seen = backends_seen(net.client, net.topo.vip6, PORT, 300)
    finally:
        close_all(conns)
    moved = [(i, b, a) for i, (b, a) in enumerate(zip(before, after)) if b != a]
    assert moved == [], f"{len(moved)} of 60 connections changed backend: {moved[:10]}"
    assert set(seen) == {"b0", "b2"} and sum(seen.values()) == 300, seen


def test_ipv6_backend_whose_server_dies_is_ejected_by_passive_detection(net, router):
    """b0's IPv6 server is killed (its host lives on, so SYNs to it are refused with RSTs, which
    the IPv6 return path notes); after 3 (`consecutive`) b0 is ejected for 2 s, and new IPv6 flows
    made in the first second of that all go to b1 and b2."""
    router.deploy([service6(router, net, health={"passive": dict(PASSIVE)})])
    assert set(backends_seen(net.client, net.topo.vip6, PORT, 30)) == ALL
    proc = net.servers[0].proc
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5.0)

    refused: Counter = Counter()
    batch_started = [0.0]

    def ejected() -> bool:
        batch_started[0] = time.monotonic()
        refused.update(backends_seen(net.client, net.topo.vip6, PORT, 10, flow_timeout_s=0.5))
        return router.counters()["verdicts"]["ejection"] >= 1

    wait_until(ejected, 5.0, "an ejection", observe=lambda: refused)
    seen: Counter = Counter()
    while sum(seen.values()) < 100 and time.monotonic() - batch_started[0] < 1.0:
        seen.update(backends_seen(net.client, net.topo.vip6, PORT, 20))

    assert refused["error:refused"] >= PASSIVE["consecutive"], refused
    assert set(seen) == {"b1", "b2"} and sum(seen.values()) >= 40, seen
    b0 = next(b for b in by_name(router.status())["web6"]["backends"] if b["name"] == "b0")
    assert b0["health"]["ejections"] >= 1


def test_deploy_refuses_an_ipv6_vip_while_ipv6_forwarding_is_off(net, router):
    """Without net.ipv6.conf.all.forwarding the FIB lookups of IPv6 fail: deploy says so in one line
    naming the service's VIP, and deploys once it is on."""
    net.router.sysctl("net.ipv6.conf.all.forwarding", 0)
    try:
        done = router.deploy([router.service("web"), service6(router, net)], check=False)
    finally:
        net.router.sysctl("net.ipv6.conf.all.forwarding", 1)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "edgectl: services[1].vip: an IPv6 VIP needs net.ipv6.conf.all.forwarding=1 (the data path's FIB "
        "lookups); set it and deploy again"
    ]
    router.deploy([router.service("web"), service6(router, net)])
    assert http_get(net.client, net.topo.vip6, PORT).status == 200


def test_ipv4_and_ipv6_vips_at_once_under_concurrent_traffic(net, router):
    """Both families' flows interleaved: 200 IPv4 and 200 IPv6 new connections alternate in
    batches of 20, every one answered by a backend, each family's counters exactly its own."""
    router.deploy([router.service("web"), service6(router, net)])
    seen4: Counter = Counter()
    seen6: Counter = Counter()
    for _ in range(10):
        seen4.update(backends_seen(net.client, net.vip, PORT, 20))
        seen6.update(backends_seen(net.client, net.topo.vip6, PORT, 20))
    assert set(seen4) == ALL and sum(seen4.values()) == 200, seen4
    assert set(seen6) == ALL and sum(seen6.values()) == 200, seen6
    services = by_name(router.status())
    assert (services["web"]["new_flows"], services["web6"]["new_flows"]) == (200, 200)


def test_neighbour_discovery_to_the_router_passes_untouched(net, router):
    """With the router deployed, the client's and the backends' IPv6 neighbour discovery towards the
    router keeps working (ICMPv6 passes the XDP and tc programs): a ping of the router's address on
    each link is answered."""
    router.deploy([service6(router, net)])
    # a fresh neighbour entry: flush, then ping (solicitation, advertisement, echo)
    net.client.run(["ip", "-6", "neigh", "flush", "all"])
    done = net.client.run(["ping", "-6", "-c", "1", "-W", "2", str(net.topo.router_client_addr6.ip)], check=False)
    assert done.returncode == 0, done.stdout
    for i in range(3):
        ns = net.backends[i]
        ns.run(["ip", "-6", "neigh", "flush", "all"])
        done = ns.run(["ping", "-6", "-c", "1", "-W", "2", str(net.topo.router_backend_addr6(i).ip)], check=False)
        assert done.returncode == 0, done.stdout
    wait_until(lambda: router.counters()["verdicts"]["pass"] > 0, 2.0, "passed packets")


def test_edged_probes_ipv6_backends(net, router, tmp_path):
    """edged with an IPv4 and an IPv6 service, probes on: it deploys both, probes the IPv6
    backends over IPv6 (each has passing probes and an RTT in status), and the IPv6 VIP answers."""
    probe = {"probe": {"kind": "tcp", "interval_ms": 100, "timeout_ms": 100}}
    doc = router.config(
        [router.service("web", health=probe), service6(router, net, health=probe)],
        node={"api_socket": str(tmp_path / "edged.sock")},
    )
    edged = EdgedProc.start(net.router, doc, router.iface)
    try:

        def probed() -> bool:
            backends = by_name(router.status())["web6"]["backends"]
            return all(b["probe"]["probes_ok"] > 0 and b["probe"]["rtt_p50_us"] > 0 for b in backends)

        wait_until(probed, 30.0, "every IPv6 backend probed")
        seen = backends_seen(net.client, net.topo.vip6, PORT, 60)
    finally:
        edged.stop()
    assert set(seen) == ALL and sum(seen.values()) == 60, seen


def ipv6_loaded(router: Router) -> bool:
    pinned = loader.open_pinned(router.pin_path)
    try:
        return deploy.ipv6_loaded(pinned)
    finally:
        pinned.close()


def test_a_reload_adding_the_first_ipv6_service_loads_the_ipv6_programs_and_ipv4_flows_survive(net, router, tmp_path):
    """edged deployed for an IPv4 service leaves edge_tails' IPv6 slots empty (their verification
    costs about 1.3 s a deploy): an IPv6 packet to the VIP passes to the stack. A reload adding an
    IPv6 service compiles the IPv6 programs in a child and puts them into those slots: the IPv6
    VIP then answers from every backend, while 30 IPv4 connections opened before keep their
    backends through it and new IPv4 connections made during it all answer. Before, the reload
    was refused (restart edged)."""
    sock = str(tmp_path / "edged.sock")
    v4 = router.config([router.service("web")], node={"api_socket": sock})
    edged = EdgedProc.start(net.router, v4, router.iface)
    conns = open_connections(net.client, net.vip, PORT, 30)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
        assert ipv6_loaded(router) is False
        before = [c.request().backend for c in conns]
        assert set(before) == ALL

        both = router.config([router.service("web"), service6(router, net)], node={"api_socket": sock})
        edged.rewrite_config(both)
        reload = net.router.popen(
            [sys.executable, "-m", "controlplane", "reload", "--socket", sock],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_with_package(),
        )
        during: Counter = Counter()
        try:
            for _ in range(100):  # new IPv4 flows while the reload compiles and loads (bounded)
                during.update(backends_seen(net.client, net.vip, PORT, 5))
                if reload.poll() is not None:
                    break
            out, err = reload.communicate(timeout=120)
        finally:
            if reload.poll() is None:
                reload.kill()
                reload.wait()
        assert reload.returncode == 0, (out, err)
        assert ipv6_loaded(router) is True
        assert during and not [k for k in during if k.startswith("error")], during
        assert [c.request().backend for c in conns] == before
        seen = backends_seen(net.client, net.topo.vip6, PORT, 60)
        assert set(seen) == ALL and sum(seen.values()) == 60, seen
        loaded = [e["text"] for e in edged.events if e["kind"] == "progress" and "IPv6 programs loaded" in e["text"]]
        assert loaded, [e["text"] for e in edged.events]
        print(f"\nfigure: {loaded[0]} (reload), {sum(during.values())} IPv4 flows answered meanwhile")
    finally:
        close_all(conns)
        edged.stop()


def test_an_operator_drain_of_an_ipv6_backend_keeps_its_connections_and_takes_no_new_flows(net, router, tmp_path):
    """Under edged, `edgectl drain web6 b1`: 30 IPv6 connections opened before keep their backends
    (b1's too), 150 new IPv6 flows avoid b1; `undrain` gives b1 new flows again."""
    sock = str(tmp_path / "edged.sock")
    doc = router.config([service6(router, net)], node={"api_socket": sock})
    edged = EdgedProc.start(net.router, doc, router.iface)
    conns = []
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 30.0, "edged to serve its API")
        conns = open_connections(net.client, net.topo.vip6, PORT, 30)
        before = [c.request().backend for c in conns]
        assert set(before) == ALL
        done = router.edgectl("drain", "web6", "b1", "--socket", sock)
        assert done.returncode == 0, done.stderr
        seen = backends_seen(net.client, net.topo.vip6, PORT, 150)
        assert set(seen) == {"b0", "b2"} and sum(seen.values()) == 150, seen
        assert [c.request().backend for c in conns] == before
        done = router.edgectl("undrain", "web6", "b1", "--socket", sock)
        assert done.returncode == 0, done.stderr
        seen = backends_seen(net.client, net.topo.vip6, PORT, 150)
        assert set(seen) == ALL and sum(seen.values()) == 150, seen
    finally:
        close_all(conns)
        edged.stop()
