"""The probe budget (node.probe_budget) with a real edged: 300 backends probed every 100 ms ask for
3,000 probes a second against a budget of 300, so every interval runs 10x longer. Every backend is
still probed (at the stretched interval, none left out), and status, the metrics and a
probe-budget event report the shortfall; a reload without a budget ends it. The probes run in
a child process of edged's, which SIGTERM to edged ends too. (On a busy machine
edged may lower the budget further while its loop runs late: the test holds either way.)

        client ──veth── router (XDP + tc, edged, API, :9470) ──veth── b0: 300 addresses 198.19.x.y/32,
                                                                       one server on 0.0.0.0:8000
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.api.client import Client
from controlplane.lab.daemon import EdgedProc
from controlplane.lab.procs import read_line, terminate
from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Topo
from controlplane.lab.traffic import wait_until

N = 300
PER_SERVICE = 60
PORT = 8000
BLOCK = IPv4Network("198.19.0.0/16")  # backend addresses; clear of the lab's 198.18.x link nets
FIRST_VIP = IPv4Address("198.18.255.1")  # the lab's VIP /24
BUDGET = 300  # probes/s; the probes ask for N * 10 = 3,000
PROBE = {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50, "relaxed_interval_ms": 100}  # no traffic adapts it


def address(i: int) -> str:
    return str(BLOCK.network_address + 256 * (i // 250) + i % 250 + 1)


def config(sock: str, budget: int) -> dict:
    services = [
        {
            "name": f"s{k}",
            "vip": str(FIRST_VIP + k),
            "port": PORT,
            "protocol": "tcp",
            "health": {"probe": dict(PROBE)},
            "backends": [
                {"name": f"b{i}", "address": address(i), "port": PORT}
                for i in range(k * PER_SERVICE, (k + 1) * PER_SERVICE)
            ],
        }
        for k in range(N // PER_SERVICE)
    ]
    node = {"api_socket": sock, "metrics_listen": "127.0.0.1:9470", "max_backends": 1024, "probe_budget": budget}
    return Router.config(services, node)


def probes_done(snap: dict) -> dict[str, int]:
    return {
        b["name"]: b["edged"]["probes_ok"] + b["edged"]["probes_failed"]
        for s in snap["services"]
        for b in s["backends"]
    }


def prober_children(pid: int) -> list[int]:
    """The prober's child processes of process pid (probe.child)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as c:
                    if b"controlplane.probe.child" in c.read():
                        out.append(int(child))
    return out


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def scrape(net: Net) -> dict[str, float]:
    with net.router.enter():
        with urllib.request.urlopen("http://127.0.0.1:9470/metrics", timeout=10) as resp:
            text = resp.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


@pytest.fixture
def lab(privileges, tmp_path):
    with Net(Topo(backends=1)) as net:
        net.build()
        with net.backends[0].iproute() as ipr:
            index = ipr.link_lookup(ifname=net.backend_peer_iface(0))[0]
            for i in range(N):
                ipr.addr("add", index=index, address=address(i), prefixlen=32)
        with net.router.iproute() as ipr:
            ipr.route("add", dst=str(BLOCK), gateway=str(net.backend_addr(0)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")])
        )
        server = net.backends[0].popen(
            [sys.executable, "-m", "controlplane.lab.backend", "--name", "@local", "--listen", f"0.0.0.0:{PORT}"],
            stdout=subprocess.PIPE,
            env=env,
        )
        router = Router(net)
        edged = None
        try:
            assert read_line(server, 10.0).startswith("listening @local ")
            sock = str(tmp_path / "edged.sock")
            edged = EdgedProc.start(net.router, config(sock, BUDGET), router.iface)
            edged.wait_for(lambda e: e["kind"] == "api", 10.0, "the API to listen")
            yield net, router, edged, sock
        finally:
            if edged is not None:
                edged.stop()
            router.undeploy(check=False)
            terminate(server)


def test_a_budget_too_small_still_probes_every_backend_and_reports_the_shortfall(lab):
    net, router, edged, sock = lab
    event = edged.wait_for(lambda e: e["kind"] == "probe-budget", 10.0, "a probe-budget event")
    assert event["short"] is True and event["stretch"] == pytest.approx(10.0), event
    assert event["demand_per_s"] == pytest.approx(3000.0) and event["budget_per_s"] == BUDGET, event

    with Client(sock, timeout_s=30.0) as c:
        # every backend probed, at the stretched interval (1 s): none left out
        first = wait_until(
            lambda: (s := c.status()) and min(probes_done(s).values()) >= 2 and s, 20.0, "every backend probed twice"
        )
        assert len(probes_done(first)) == N
        budget = first["probe_budget"]
        # the budget is node.probe_budget, or less while a busy machine makes edged's loop late
        assert budget["short"] is True and budget["configured_per_s"] == BUDGET
        assert budget["demand_per_s"] == pytest.approx(3000.0) and 0 < budget["budget_per_s"] <= BUDGET
        stretch = budget["stretch"]
        assert stretch == pytest.approx(3000.0 / budget["budget_per_s"]) and stretch >= 10 - 1e-9
        assert budget["shortfall_ratio"] == pytest.approx(1 - 1 / stretch)
        views = [b["edged"] for s in first["services"] for b in s["backends"]]
        assert [v["probe_interval_s"] for v in views] == [pytest.approx(0.1 * stretch)] * N
        assert all(v["probes_ok"] >= 1 for v in views)  # they pass: the server answers every address
        # the stretch holds: in 3 more probes of the slowest backend, none got the configured 10 a second
        before = probes_done(first)
        second = wait_until(
            lambda: (s := c.status()) and all(n >= before[k] + 3 for k, n in probes_done(s).items()) and s,
            20.0,
            "3 more probes of every backend",
        )
        grew = [n - before[k] for k, n in probes_done(second).items()]
        # evenly: by the time the last backend had 3 more, none had many more (at the configured
        # rate a backend gets 10 or more probes in a stretched interval)
        assert max(grew) <= 8, sorted(grew)[-10:]

    metrics = scrape(net)
    assert metrics["edge_probe_shortfall_ratio"] >= 0.9 - 1e-9
    assert 0 < metrics["edge_probe_budget_per_second"] <= BUDGET
    assert metrics["edge_probe_demand_per_second"] == pytest.approx(3000.0)
    done = router.edgectl("status", "--socket", sock)
    assert done.returncode == 0, done.stderr
    assert "probes: " in done.stdout and "SHORT by 9" in done.stdout, done.stdout[:2000]

    # a reload without a budget: the configured rate, and the report ends
    after = len(edged.events)
    with Client(sock, timeout_s=60.0) as c:
        c.reload(json.dumps(config(sock, 0)))
        ended = edged.wait_for(lambda e: e["kind"] == "probe-budget", 20.0, "the shortfall's end", after=after)
        assert ended["short"] is False and ended["stretch"] == 1.0, ended
        budget = c.status()["probe_budget"]
    assert budget["short"] is False and budget["shortfall_ratio"] == 0.0 and budget["configured_per_s"] == 0
    assert scrape(net)["edge_probe_shortfall_ratio"] == 0.0

    # the probes ran in one child process of edged's (probe.child); SIGTERM to edged ends it too
    children = prober_children(edged.proc.pid)
    assert len(children) == 1, children
    assert edged.stop() == 0
    wait_until(lambda: not running(children[0]), 5.0, "the prober's child to end with edged")
