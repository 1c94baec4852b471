"""Membership changes through `edgectl deploy` with real traffic: replacing a backend and
renaming a service on its VIP never black-hole new flows, and connections whose backend
stays keep it; a second writer is refused while edged holds the router.

        client ──veth── router ──veth── b0, b1, b2
"""

from __future__ import annotations

import signal
import time

from controlplane.edged.changes import LEAVING_IDLE_S
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.router import Router
from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000


def owners_after(conns) -> list:
    return [conn.request().backend for conn in conns]


def test_replacing_a_backend_leaves_the_new_one_serving(net, router: Router):
    """b1 out and b2 in, in one redeploy: every new flow is answered, by b0 or b2 only
    (before the fix half the table pointed at b2's cleared id: no_backend drops)."""
    router.deploy([router.service("web", backends=[0, 1])])
    conns = open_connections(net.client, net.vip, PORT, 20)
    try:
        before = owners_after(conns)
        router.deploy([router.service("web", backends=[0, 2])])
        kept = [k for k, b in enumerate(before) if b == "b0"]
        assert kept and [conns[k].request().backend for k in kept] == ["b0"] * len(kept)
    finally:
        close_all(conns)
    seen = backends_seen(net.client, net.vip, PORT, 300)
    assert set(seen) == {"b0", "b2"}, seen
    assert router.status()["drops"]["no_backend"] == 0


def test_renaming_a_service_on_its_vip_keeps_the_vip_and_its_connections(net, router: Router):
    """web -> web-v2 on the same VIP: the VIP keeps answering and every connection keeps its
    backend (the service keeps its ids); before the fix the VIP entry was deleted."""
    router.deploy([router.service("web")])
    conns = open_connections(net.client, net.vip, PORT, 20)
    try:
        before = owners_after(conns)
        router.deploy([router.service("web-v2")])
        assert owners_after(conns) == before
    finally:
        close_all(conns)
    seen = backends_seen(net.client, net.vip, PORT, 300)
    assert sum(n for b, n in seen.items() if not b.startswith("error")) == 300, seen
    assert [s["name"] for s in router.status()["services"]] == ["web-v2"]


def test_an_update_that_cannot_fit_fails_in_one_line_with_traffic_flowing(net, router: Router):
    """At node.max_backends 1, replacing the only backend has no free id: the redeploy is
    refused in one line, connections keep b0 and new flows are served by b0 (before the fix the
    new backend took b0's id, which was then cleared: every flow black-holed)."""
    node = {"max_backends": 1, "max_services": 1}
    router.deploy([router.service("web", backends=[0])], node=node)
    conns = open_connections(net.client, net.vip, PORT, 10)
    try:
        done = router.deploy([router.service("web", backends=[1])], node=node, check=False)
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "max_backends" in lines[0], done.stderr
        assert owners_after(conns) == ["b0"] * 10
    finally:
        close_all(conns)
    assert backends_seen(net.client, net.vip, PORT, 200) == {"b0": 200}
    assert [b["name"] for b in router.status()["services"][0]["backends"]] == ["b0"]


def edged_doc(router, tmp_path, name="web", backends=(0, 1), drain_timeout_ms=0) -> dict:
    service = router.service(name, backends=list(backends), drain_timeout_ms=drain_timeout_ms)
    service["weights"] = {"policy": "static"}
    return router.config(
        [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"}
    )


def test_edged_renames_on_the_vip_and_drains_until_the_connections_end(net, router: Router, tmp_path):
    """A reload renames web -> web-v2 on the same VIP and swaps b1 for b2, drain_timeout_ms 0:
    the VIP answers throughout, b0's connections keep b0, b1's keep answering from b1 for as
    long as they carry traffic (0 means until they end; before, they were cut within a second),
    and b1 goes once they are closed and idle."""
    edged = EdgedProc.start(net.router, edged_doc(router, tmp_path), router.iface)
    conns = []
    try:
        conns = open_connections(net.client, net.vip, PORT, 20)
        before = owners_after(conns)
        assert set(before) == {"b0", "b1"}
        edged.rewrite_config(edged_doc(router, tmp_path, name="web-v2", backends=(0, 2)))
        mark = len(edged.events)
        edged.signal(signal.SIGHUP)
        done = edged.wait_for(lambda e: e["kind"] in ("reload", "reload-rejected"), 60.0, "reload", after=mark)
        assert done["kind"] == "reload", done["text"]
        assert "web-v2/b1" in done["draining_backends"]
        # traffic on every connection for longer than the idle time and several status ticks
        deadline = time.monotonic() + 2 * LEAVING_IDLE_S
        rounds = 0
        while time.monotonic() < deadline and rounds < 10_000:
            assert owners_after(conns) == before
            rounds += 1
        assert not [e for e in edged.events[mark:] if e["kind"] == "removed"]
        seen = backends_seen(net.client, net.vip, PORT, 300)
        assert set(seen) == {"b0", "b2"}, seen
        close_all(conns)
        removed = edged.wait_for(lambda e: e["kind"] == "removed", 30.0, "b1 removed once idle", after=mark)
        assert (removed["service"], removed["backend"], removed["why"]) == ("web-v2", "b1", "idle")
        assert set(backends_seen(net.client, net.vip, PORT, 300)) == {"b0", "b2"}
    finally:
        close_all(conns)
        edged.stop()


def test_edgectl_deploy_is_refused_while_edged_owns_the_router(net, router: Router, tmp_path):
    """A second writer never races edged: deploy fails in one line naming edged's pid and the
    router keeps serving; once edged is gone, deploy works again."""
    edged = EdgedProc.start(net.router, edged_doc(router, tmp_path), router.iface)
    try:
        done = router.deploy([router.service("web", backends=[2])], check=False)
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert f"pid {edged.proc.pid}" in lines[0] and "controlplane.edged" in lines[0], lines[0]
        assert set(backends_seen(net.client, net.vip, PORT, 200)) == {"b0", "b1"}
    finally:
        edged.stop()
    router.deploy([router.service("web", backends=[2])])  # edged gone: the lock went with it
    assert set(backends_seen(net.client, net.vip, PORT, 100)) == {"b2"}
