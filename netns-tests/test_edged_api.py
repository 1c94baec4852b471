"""edgectl through edged's gRPC API, and edged's Prometheus endpoint, with a real edged on a
real data path: status, drain and undrain, a weight override, events, reload, and a scrape
parsed with prometheus-client's parser. A drain survives a kill -9 of edged.

        client ──veth── router (XDP, edged, API socket, :9470) ──veth── b0, b1, b2
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.traffic import backends_seen, wait_until

PORT = 8000


def config(router, sock: str) -> dict:
    service = router.service("web")
    service["health"] = {"probe": {"kind": "tcp", "interval_ms": 50, "timeout_ms": 40, "window": 10}}
    service["sla"] = {"p99_rtt_ms": 1000}
    return router.config([service], node={"api_socket": sock, "metrics_listen": "127.0.0.1:9470"})


def start(net, router, sock: str) -> EdgedProc:
    edged = EdgedProc.start(net.router, config(router, sock), router.iface)
    edged.wait_for(lambda e: e["kind"] == "api", 10.0, "the API to listen")
    return edged


def ctl(router, sock: str, *args: object) -> str:
    done = router.edgectl(*args, "--socket", sock)
    assert done.returncode == 0, done.stderr
    return done.stdout


def status(router, sock: str) -> dict:
    (snap,) = json.loads(ctl(router, sock, "status", "--json"))
    return snap


def backends(snap: dict) -> dict[str, dict]:
    return {b["name"]: b for b in snap["services"][0]["backends"]}


def scrape(net) -> dict[str, list]:
    with net.router.enter():
        with urllib.request.urlopen("http://127.0.0.1:9470/metrics", timeout=5) as resp:
            text = resp.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels) -> float:
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_status_drain_weight_events_and_metrics_through_edged(net, router, tmp_path):
    sock = str(tmp_path / "edged.sock")
    edged = start(net, router, sock)
    try:
        assert oct(os.stat(sock).st_mode & 0o777) == "0o660"
        snap = wait_until(
            lambda: (
                (s := status(router, sock)) and all(b["edged"]["probes_ok"] >= 5 for b in backends(s).values()) and s
            ),
            15.0,
            "probes counted",
        )
        b = backends(snap)
        assert b["b0"]["edged"]["rtt_p50_s"] > 0 and b["b0"]["state"] == "up"

        out = ctl(router, sock, "drain", "web", "b1")
        assert "b1" in out
        assert backends(status(router, sock))["b1"]["weight"] == 0
        seen = backends_seen(net.client, net.vip, PORT, 300)
        assert seen["b1"] == 0 and seen["b0"] > 0 and seen["b2"] > 0, seen

        ctl(router, sock, "weight", "web", "b0", "5")
        b = backends(status(router, sock))
        assert (b["b0"]["weight"], b["b1"]["weight"]) == (5, 0), b

        families = scrape(net)
        assert value(families["edge_backend_weight"], "edge_backend_weight", service="web", backend="b0") == 5
        assert value(families["edge_backend_weight"], "edge_backend_weight", service="web", backend="b1") == 0
        assert value(families["edge_new_flows"], "edge_new_flows_total", service="web", backend="b1") == 0
        assert value(families["edge_new_flows"], "edge_new_flows_total", service="web", backend="b0") == seen["b0"]
        assert (
            value(families["edge_backend_rtt_seconds"], "edge_backend_rtt_seconds_count", service="web", backend="b2")
            >= 5
        )
        assert value(families["edge_drops"], "edge_drops_total", service="web", reason="no_backend") == 0
        assert value(families["edge_backend_up"], "edge_backend_up", service="web", backend="b0") == 1

        recent = [
            json.loads(line)
            for line in ctl(
                router,
                sock,
                "events",
                "--recent",
                "50",
                "--count",
                "2",
                "--json",
                "--kind",
                "drain",
                "--kind",
                "override",
            ).splitlines()
        ]
        assert [(e["kind"], e["backend"]) for e in recent] == [("drain", "b1"), ("override", "b0")]

        # the operator's drain outlives edged
        os.kill(edged.proc.pid, signal.SIGKILL)
        edged.proc.wait(timeout=10)
        edged.stop()
        edged = start(net, router, sock)
        b = backends(status(router, sock))
        assert b["b1"]["weight"] == 0 and b["b1"]["edged"]["drained"] is True
        assert b["b0"]["edged"]["override"] == 5

        ctl(router, sock, "undrain", "web", "b1")
        ctl(router, sock, "weight", "web", "b0", "--clear")
        seen = backends_seen(net.client, net.vip, PORT, 300)
        assert seen["b1"] > 0, seen

        # edgectl reload: a bad file is refused in one line naming the field; a good one applies
        bad = config(router, sock)
        bad["services"][0]["backends"][0]["port"] = 0
        edged.rewrite_config(bad)
        done = router.edgectl("reload", "--socket", sock)
        assert done.returncode != 0
        assert done.stderr.strip().count("\n") == 0 and "services[0].backends[0].port: 0 is not a port" in done.stderr
        assert backends(status(router, sock))["b2"]["weight"] == 1  # the running config stays
        good = config(router, sock)
        good["services"][0]["backends"] = good["services"][0]["backends"][:2]
        edged.rewrite_config(good)
        summary = json.loads(ctl(router, sock, "reload", "--json"))
        assert summary["draining_backends"] == ["web/b2"], summary
        seen = backends_seen(net.client, net.vip, PORT, 200)
        assert seen["b2"] == 0 and seen["b0"] > 0 and seen["b1"] > 0, seen
    finally:
        edged.stop()
    # edged gone: status falls back to the pinned maps and still works
    done = router.edgectl("status", "--socket", sock)
    assert done.returncode == 0 and "b1" in done.stdout, done.stderr


def shape(value: object) -> object:
    """The keys of value at every depth (list items merged), without the values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        merged: dict = {}
        for item in value:
            if isinstance(item, dict):
                merged.update(shape(item))
        return [merged] if merged else []
    return None


def differences(a: object, b: object, path: str = "") -> list[str]:
    """Paths where shapes a and b differ in their keys; a value of None (nothing known there,
    e.g. edged's view without edged) matches any value."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [f"{path}.{k}" for k in sorted(a.keys() ^ b.keys())] + [
            d for k in a.keys() & b.keys() for d in differences(a[k], b[k], f"{path}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and a and b:
        return differences(a[0], b[0], f"{path}[]")
    return []


def test_status_json_has_one_shape_with_or_without_edged(net, router, tmp_path):
    sock = str(tmp_path / "edged.sock")
    with start(net, router, sock):
        wait_until(
            lambda: all(b["edged"] and b["edged"]["state"] for b in backends(status(router, sock)).values()),
            20.0,
            "edged's view of every backend",
        )
        from_edged = status(router, sock)
        (from_maps,) = json.loads(ctl(router, sock, "status", "--json", "--maps"))
    assert differences(shape(from_edged), shape(from_maps)) == []
    assert from_maps["edged"] is None and all(b["edged"] is None for b in backends(from_maps).values())
