"""Fleet operator marks (etcd PREFIX/operator/SERVICE/BACKEND) outlive nothing they were set for:
the leader deletes the marks of backends no node runs any more (a "fleet-operator" event each),
so a backend removed and later added again under the same name starts undrained. One edged, the
fleet's only node and so its leader, with a real etcd on the router namespace's loopback.

        client ──veth── router (XDP, edged r0, etcd on lo) ──veth── b0, b1, b2
"""

from __future__ import annotations

import json
import signal
import sys
import time

from controlplane.lab.daemon import EdgedProc, env_with_package
from controlplane.lab.registry import Etcd

PORT = 8000
FLEET = "/edge/fleet/"


def doc(router, tmp_path, backends) -> dict:
    service = router.service(
        "web",
        backends=backends,
        health={"probe": {"kind": "http", "path": "/health", "interval_ms": 100, "timeout_ms": 50}},
    )
    service["weights"] = {"policy": "latency_inverse"}
    return router.config(
        [service],
        node={
            "api_socket": str(tmp_path / "edged.sock"),
            "metrics_listen": "127.0.0.1:9470",
            "fleet": {
                "etcd": ["127.0.0.1:2379"],
                "name": "r0",
                "lease_ttl_s": 2,
                "report_ms": 200,
                "stale_ms": 1000,
                "timeout_ms": 1000,
                "retry_ms": 200,
            },
        },
    )


def fleet_marks(net) -> list[tuple[str, str, bool, object]]:
    """`edgectl fleet status --json`'s operator marks as (service, backend, drain, weight)."""
    out = net.router.run(
        [sys.executable, "-m", "controlplane", "fleet", "status", "--etcd", "127.0.0.1:2379", "--json"],
        env=env_with_package(),
    )
    return sorted((m["service"], m["backend"], m["drain"], m["weight"]) for m in json.loads(out.stdout)["operator"])


def edged_backends(router, tmp_path) -> dict[str, dict]:
    """edged's view of web's backends (edgectl status over its API), by name."""
    out = router.edgectl("status", "--json", "--socket", tmp_path / "edged.sock")
    assert out.returncode == 0, out.stderr
    (snap,) = json.loads(out.stdout)
    (svc,) = snap["services"]
    return {b["name"]: b for b in svc["backends"]}


def reload(edged: EdgedProc, config: dict) -> dict:
    edged.rewrite_config(config)
    mark = len(edged.events)
    edged.signal(signal.SIGHUP)
    done = edged.wait_for(lambda e: e["kind"] in ("reload-rejected", "reload"), 60.0, "reload answer", after=mark)
    assert done["kind"] == "reload", done["text"]
    return done


def test_the_leader_deletes_marks_of_backends_nobody_runs_and_a_readded_backend_is_not_drained(net, router, tmp_path):
    (tmp_path / "etcd").mkdir()
    etcd = Etcd(net.router, tmp_path / "etcd").start()
    try:
        mark = {"node": "r9", "t": time.time()}
        etcd.put(f"{FLEET}operator/web/ghost", {**mark, "drain": True})  # a backend no config has
        etcd.put(f"{FLEET}operator/old/b0", {**mark, "drain": False, "weight": 3})  # a service gone
        etcd.put(f"{FLEET}operator/web/b1", {**mark, "drain": True})  # a backend that runs: stays
        edged = EdgedProc.start(net.router, doc(router, tmp_path, [0, 1, 2]), router.iface)
        try:
            first = edged.wait_for(lambda e: e["kind"] == "fleet-operator", 60.0, "a stale mark deleted")
            second = edged.wait_for(
                lambda e: e["kind"] == "fleet-operator",
                60.0,
                "the other stale mark deleted",
                after=edged.events.index(first) + 1,
            )
            assert {(e["service"], e["backend"]) for e in (first, second)} == {("web", "ghost"), ("old", "b0")}
            assert fleet_marks(net) == [("web", "b1", True, None)]
            assert edged.events and not any(
                e["kind"] == "fleet-operator" and e["backend"] == "b1" for e in edged.events
            )

            # b2 drained fleet-wide, removed by a reload, added again by the next one
            out = router.edgectl("drain", "web", "b2", "--socket", tmp_path / "edged.sock")
            assert out.returncode == 0, out.stderr
            assert ("web", "b2", True, None) in fleet_marks(net)
            reload(edged, doc(router, tmp_path, [0, 1]))  # b2 drains out (idle: retired within seconds)
            gone = edged.wait_for(
                lambda e: e["kind"] == "fleet-operator" and e["backend"] == "b2",
                60.0,
                "b2's mark deleted once no node runs b2",
            )
            assert "web/b2" in gone["text"] and "drained" in gone["text"], gone["text"]
            assert fleet_marks(net) == [("web", "b1", True, None)]

            reload(edged, doc(router, tmp_path, [0, 1, 2]))
            view = edged_backends(router, tmp_path)["b2"]["edged"]
            assert not view.get("fleet_drained") and view.get("state") != "drained", view
            assert edged_backends(router, tmp_path)["b1"]["edged"]["fleet_drained"]  # b1's mark still holds
        finally:
            edged.stop()
    finally:
        etcd.stop()


def test_marks_of_a_discovered_service_wait_while_its_source_has_said_nothing(net, router, tmp_path):
    """A service whose discovery source has not answered since edged started (nothing cached) has
    no known backends: the leader must not take its marks for stale (a drain set for a discovered
    backend would silently end). Marks of a service no config has still go."""
    (tmp_path / "etcd").mkdir()
    etcd = Etcd(net.router, tmp_path / "etcd").start()
    try:
        mark = {"node": "r9", "t": time.time()}
        discovered = f"{net.backend_addr(1)}-{PORT}"
        etcd.put(f"{FLEET}operator/web/{discovered}", {**mark, "drain": True})
        etcd.put(f"{FLEET}operator/old/b0", {**mark, "drain": True})  # a service gone: deleted
        config = doc(router, tmp_path, [0])
        config["services"][0]["discovery"] = {  # nothing listens there: the source never answers
            "etcd": {"endpoints": ["127.0.0.1:23791"], "prefix": "/edge/services/web/", "timeout_ms": 500},
            "retry_ms": 200,
        }
        edged = EdgedProc.start(net.router, config, router.iface)
        try:
            gone = edged.wait_for(lambda e: e["kind"] == "fleet-operator", 60.0, "the gone service's mark deleted")
            assert (gone["service"], gone["backend"]) == ("old", "b0"), gone
            time.sleep(3.0)  # three more stale_ms (1 s) of sweeps
            assert fleet_marks(net) == [("web", discovered, True, None)]
            assert not any(e["kind"] == "fleet-operator" and e["service"] == "web" for e in edged.events)
        finally:
            edged.stop()
    finally:
        etcd.stop()
