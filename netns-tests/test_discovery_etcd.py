"""Discovery from etcd with a real etcd in the router namespace (127.0.0.1:2379 there; the namespace
is the test's own, so the ports are free), data in a temporary directory: backends by key prefix,
changes applied from the watch, garbage and an empty prefix keep the last known good set, and the
watch resumes after etcd restarts while the router forwards to the last known good set meanwhile.

        client ──veth── router (XDP, edged, etcd on lo) ──veth── b0, b1, b2
"""

from __future__ import annotations

import time

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.registry import Etcd
from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000
PREFIX = "/edge/services/web/"


def test_etcd_prefix_is_watched_and_survives_garbage_and_an_etcd_restart(net, router, tmp_path):
    etcd = Etcd(net.router, tmp_path).start()
    addr = [str(net.backend_addr(i)) for i in range(3)]
    ep = [f"{a}-{PORT}" for a in addr]
    for i in (0, 1):
        etcd.put(f"{PREFIX}b{i}", {"address": addr[i], "port": PORT})
    s = {
        "name": "web",
        "vip": str(net.vip),
        "port": PORT,
        "drain_timeout_ms": 60000,
        "discovery": {"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": PREFIX, "timeout_ms": 1000}, "retry_ms": 200},
    }
    doc = router.config([s], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"})
    edged = EdgedProc.start(net.router, doc, router.iface)
    conns = []
    try:
        (svc,) = router.status()["services"]
        assert {b["name"] for b in svc["backends"]} == {ep[0], ep[1]}
        conns = open_connections(net.client, net.vip, PORT, 20)
        before = [c.request().backend for c in conns]
        assert set(before) == {"b0", "b1"}

        # a new key is applied from the watch (b2's interface is new to the return path: a full
        # deploy, which compiles the data path; later changes are a map update)
        mark = len(edged.events)
        t0 = time.time()
        etcd.put(f"{PREFIX}b2", {"address": addr[2], "port": PORT, "weight": 2})
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b2 from the watch", after=mark)
        print(f"\nfigure: etcd put -> in the maps: {(ev['t'] - t0) * 1000:.1f} ms")
        assert ev["change"] == f"+{ep[2]}", ev["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b1", "b2"}
        assert [c.request().backend for c in conns] == before

        # garbage under the prefix: counted, the set stays; removing it lets changes through again
        mark = len(edged.events)
        etcd.put(f"{PREFIX}junk", "not json")
        failed = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, "garbage refused", after=mark)
        assert f"etcd {PREFIX}junk: not JSON" in failed["error"], failed["text"]
        etcd.delete(f"{PREFIX}junk")
        edged.wait_for(lambda e: e["kind"] == "discovery-recovered", 10.0, "garbage gone", after=mark)

        # an address no backend may have: the router's own, a VIP, link-local, 100.64/10; each is
        # refused (the set stays), and the source answers again once the key is gone
        for bad in (str(net.topo.router_backend_addr(0).ip), str(net.vip), "169.254.1.1", "100.64.0.1"):
            mark = len(edged.events)
            etcd.put(f"{PREFIX}bad", {"address": bad, "port": PORT})
            failed = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 10.0, f"{bad} refused", after=mark)
            assert "answer rejected" in failed["error"] and bad in failed["error"], failed["text"]
            etcd.delete(f"{PREFIX}bad")
            edged.wait_for(lambda e: e["kind"] == "discovery-recovered", 10.0, f"{bad} gone", after=mark)
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b1", "b2"}

        # a removed key drains its backend
        mark = len(edged.events)
        etcd.delete(f"{PREFIX}b1")
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b1 gone", after=mark)
        assert ev["change"] == f"-{ep[1]}", ev["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before  # b1's connections drain
        close_all([c for c, b in zip(conns, before) if b == "b1"])
        conns = [c for c, b in zip(conns, before) if b != "b1"]
        before = [b for b in before if b != "b1"]

        # etcd stops: the router keeps forwarding to the last known good set
        mark = len(edged.events)
        t_down = time.time()
        etcd.stop()
        failed = edged.wait_for(lambda e: e["kind"] == "discovery-failed", 15.0, "etcd down", after=mark)
        print(f"figure: etcd stopped -> failure noticed: {(failed['t'] - t_down) * 1000:.1f} ms")
        assert "keeping the last known good set (2 backends)" in failed["text"], failed["text"]
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b2"}
        assert [c.request().backend for c in conns] == before
        status = router.edgectl("status", "--socket", tmp_path / "edged.sock")
        assert "discovery: etcd stale, 2 backends" in status.stdout, status.stdout + status.stderr

        # etcd is back (same data): the watch resumes and the next change is applied
        etcd.start()
        edged.wait_for(lambda e: e["kind"] == "discovery-recovered", 20.0, "watch resumed", after=mark)
        mark = len(edged.events)
        t0 = time.time()
        etcd.put(f"{PREFIX}b1", {"address": addr[1], "port": PORT})
        ev = edged.wait_for(lambda e: e["kind"] == "discovery", 10.0, "b1 back", after=mark)
        print(f"figure: etcd put after a restart -> in the maps: {(ev['t'] - t0) * 1000:.1f} ms")
        assert ev["change"] == f"+{ep[1]}", ev["text"]

        # an empty prefix is a failure (allow_empty is false): the set stays
        mark = len(edged.events)
        etcd.delete_prefix(PREFIX)
        failed = edged.wait_for(
            lambda e: e["kind"] == "discovery-failed" and "empty" in e["error"], 10.0, "empty refused", after=mark
        )
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b1", "b2"}
        assert [c.request().backend for c in conns] == before
    finally:
        close_all(conns)
        edged.stop()
        etcd.stop()
