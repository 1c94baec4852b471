"""Drop reasons per service: two VIPs, one of which drops every new connection (its only backend
drains: no_backend). `edgectl status` (through edged and read from the pins) and edged's metrics
name that service's reason, and only its; the other service forwards and counts no drop.

        client ──veth── router (XDP, edged, :9471) ──veth── b0, b1 (web, 198.18.255.1)
                                                   └──veth── b2     (api, 198.18.255.2, weight 0)
"""

from __future__ import annotations

import json
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.traffic import backends_seen, connect, wait_until

PORT = 8000
API_VIP = "198.18.255.2"  # in the testbed's VIP route (a /24 around net.vip)
METRICS = "127.0.0.1:9471"
ATTEMPTS = 3  # connections to api, each dropped at its SYN


def config(router, sock: str) -> dict:
    web = router.service("web", backends=[0, 1])
    api = router.service("api", backends=[2], weights=[0], vip=API_VIP)  # weight 0: no new flows
    return router.config([web, api], node={"api_socket": sock, "metrics_listen": METRICS})


def refused(net) -> int:
    """Tries ATTEMPTS connections to api's VIP; how many got no answer (their SYNs dropped)."""
    lost = 0
    for _ in range(ATTEMPTS):
        try:
            connect(net.client, API_VIP, PORT, timeout_s=0.5).close()
        except (socket.timeout, TimeoutError):
            lost += 1
    return lost


def scrape(net) -> list:
    with net.router.enter():
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def value(samples: list, name: str, **labels) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def by_name(snap: dict) -> dict[str, dict]:
    return {s["name"]: s for s in snap["services"]}


def test_status_and_metrics_name_the_drop_reason_of_the_service_that_dropped(net, router, tmp_path):
    sock = str(tmp_path / "edged.sock")
    edged = EdgedProc.start(net.router, config(router, sock), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 10.0, "the API to listen")
        seen = backends_seen(net.client, net.vip, PORT, 20)
        assert seen["b0"] + seen["b1"] == 20, seen
        assert refused(net) == ATTEMPTS  # each SYN (and any retransmission) dropped

        done = router.edgectl("status", "--json", "--socket", sock)
        assert done.returncode == 0, done.stderr
        (through_edged,) = json.loads(done.stdout)
        from_pins = router.status()
        for snap in (through_edged, from_pins):
            svc = by_name(snap)
            assert svc["api"]["drops"]["no_backend"] >= ATTEMPTS
            assert svc["api"]["verdicts"]["drop"] == svc["api"]["drops"]["no_backend"]
            assert sum(svc["web"]["drops"].values()) == 0 and svc["web"]["verdicts"]["drop"] == 0
            assert svc["web"]["verdicts"]["redirect"] >= 20 * 3  # a SYN, a request, an ACK at least
            assert snap["no_service"]["drops"]["no_backend"] == 0
            assert snap["drops"]["no_backend"] == svc["api"]["drops"]["no_backend"]  # the node's: all of it

        text = router.edgectl("status", "--socket", sock)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        web_at = next(i for i, line in enumerate(lines) if line.strip().startswith("service web"))
        api_at = next(i for i, line in enumerate(lines) if line.strip().startswith("service api"))
        assert lines[web_at + 1].strip() == "drops: none", lines[web_at : web_at + 2]
        assert lines[api_at + 1].strip().startswith("drops: no_backend "), lines[api_at : api_at + 2]

        samples = wait_until(
            lambda: (
                (s := scrape(net))
                and value(s, "edge_drops_total", service="api", reason="no_backend") >= ATTEMPTS
                and s
            ),
            5.0,
            "api's drops in a scrape",
        )
        assert value(samples, "edge_drops_total", service="web", reason="no_backend") == 0
        assert value(samples, "edge_drops_total", service="", reason="no_backend") == 0
        assert value(samples, "edge_verdicts_total", service="web", verdict="drop") == 0
        assert value(samples, "edge_verdicts_total", service="api", verdict="drop") >= ATTEMPTS
        assert value(samples, "edge_verdicts_total", service="web", verdict="redirect") >= 20 * 3
    finally:
        edged.stop()
