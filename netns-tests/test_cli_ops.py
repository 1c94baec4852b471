"""edgectl's operator commands on a real router: conntrack lists the connections the data
path tracks (bounded, filtered; IPv4 and IPv6 ones), diff says what a changed config would change, and status
finds a router pinned under a custom node.pin_dir through the node's config.

        client ──veth── router (XDP) ──veth── b0, b1, b2
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from controlplane.lab.traffic import close_all, open_connections

PORT = 8000


def ctl_json(router, *args: object) -> object:
    done = router.edgectl(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_conntrack_lists_each_connection_with_its_backend_bounded_and_filtered(net, router):
    router.deploy([router.service("web")])
    conns = open_connections(net.client, net.vip, PORT, 12)
    try:
        owners = {conn.local_addr: conn.request().backend for conn in conns}
        listed = ctl_json(router, "conntrack")
        mine = {e["client"]: e["backend"] for e in listed["entries"] if e["client"] in owners}
        assert listed["complete"] and mine == owners
        assert {e["service"] for e in listed["entries"]} == {"web"}
        assert all(e["vip"] == f"{net.vip}:{PORT}" and e["protocol"] == "tcp" for e in listed["entries"])

        b0 = ctl_json(router, "conntrack", "--service", "web", "--backend", "b0")["entries"]
        assert {e["client"] for e in b0} >= {c for c, b in owners.items() if b == "b0"}
        assert {e["backend"] for e in b0} <= {"b0"}

        two = ctl_json(router, "conntrack", "--limit", "2")
        assert len(two["entries"]) == 2 and not two["complete"]
        table = router.edgectl("conntrack", "--limit", "2")
        assert table.returncode == 0 and "there are more" in table.stdout.splitlines()[-1]
        unknown = router.edgectl("conntrack", "--service", "nope")
        assert unknown.returncode == 1 and "nope" in unknown.stderr
    finally:
        close_all(conns)
        router.undeploy()


def _v6(router, net) -> dict:
    svc = router.service("web6", vip=str(net.topo.vip6))
    for entry in svc["backends"]:
        entry["address"] = str(net.topo.backend_addr6(int(entry["name"][1:])).ip)
    return svc


def test_conntrack_lists_ipv6_connections_beside_ipv4_ones(net, router):
    """An IPv4 and an IPv6 service, 10 connections each: `conntrack --json` lists all 20 with their
    backends, IPv6 endpoints as [ADDR]:PORT; --service web6 --backend B filters IPv6 ones; the
    table shows the IPv6 VIP. Before, edge_ct6 was not read: the IPv6 connections were missing."""
    router.deploy([router.service("web"), _v6(router, net)])
    vip6 = net.topo.vip6
    conns4 = open_connections(net.client, net.vip, PORT, 10)
    conns6 = open_connections(net.client, vip6, PORT, 10)
    try:
        owners = {c.local_addr: c.request().backend for c in conns4}
        owners6 = {
            "[{}]:{}".format(*c.local_addr.rsplit(":", 1)): c.request().backend for c in conns6
        }  # local_addr is ADDR:PORT, also for IPv6
        listed = ctl_json(router, "conntrack")
        got = {e["client"]: (e["service"], e["backend"], e["vip"]) for e in listed["entries"]}
        assert listed["complete"] and len(listed["entries"]) == 20, listed
        assert got == {
            **{c: ("web", b, f"{net.vip}:{PORT}") for c, b in owners.items()},
            **{c: ("web6", b, f"[{vip6}]:{PORT}") for c, b in owners6.items()},
        }
        some = next(iter(set(owners6.values())))
        only = ctl_json(router, "conntrack", "--service", "web6", "--backend", some)["entries"]
        assert {e["client"] for e in only} == {c for c, b in owners6.items() if b == some}
        table = router.edgectl("conntrack")
        assert table.returncode == 0 and f"[{vip6}]:{PORT}" in table.stdout, table.stdout
        assert table.stdout.splitlines()[-1] == "20 entries", table.stdout
    finally:
        close_all(conns4 + conns6)
        router.undeploy()


def test_diff_and_dry_run_say_what_a_config_would_change_and_change_nothing(net, router, tmp_path):
    service = router.service("web")
    router.deploy([service])
    try:
        path = tmp_path / "edge.yaml"
        path.write_text(yaml.safe_dump(router.config([service])))
        same = ctl_json(router, "diff", "--config", path)
        assert not same["changed"], same
        service["backends"][1]["weight"] = 5
        del service["backends"][2]
        path.write_text(yaml.safe_dump(router.config([service])))
        before = router.status()
        for argv in (("diff", "--config", path), ("deploy", "--dry-run", "--config", path, "--iface", router.iface)):
            d = ctl_json(router, *argv)
            assert d["changed"] and d["weights"] == ["web/b1 1 -> 5"] and d["removed_backends"] == ["web/b2"]
        assert [b["weight"] for b in router.status()["services"][0]["backends"]] == [
            b["weight"] for b in before["services"][0]["backends"]
        ]  # nothing was applied
    finally:
        router.undeploy()


def test_status_finds_a_router_under_a_custom_pin_dir_through_the_nodes_config(net, router, tmp_path):
    """With a custom node.pin_dir, status said "nothing deployed" while the router forwarded."""
    pin_dir = Path(f"/sys/fs/bpf/edge-test-{net.prefix}")
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(router.config([router.service("web")], node={"pin_dir": str(pin_dir)})))
    done = router.edgectl("-q", "deploy", "--iface", router.iface, "--config", path)
    try:
        assert done.returncode == 0, done.stderr
        (snap,) = ctl_json(router, "status", "--config", path, "--maps")
        assert snap["iface"] == router.iface and snap["pin_path"].startswith(str(pin_dir))
        env_status = router.net.router.run(
            ["env", f"EDGE_CONFIG={path}", *router_python(router), "status", "--json", "--maps"], check=False
        )
        assert env_status.returncode == 0 and json.loads(env_status.stdout)[0]["iface"] == router.iface
    finally:
        router.edgectl("-q", "undeploy", "--iface", router.iface, "--config", path)
        if pin_dir.exists():
            shutil.rmtree(pin_dir, ignore_errors=True)


def router_python(router) -> list[str]:
    """`python -m controlplane` with this checkout importable (what router.edgectl runs)."""
    import sys

    from controlplane.lab.router import PACKAGE_ROOT

    return [
        "env",
        f"PYTHONPATH={PACKAGE_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        sys.executable,
        "-m",
        "controlplane",
    ]


def test_an_operator_drain_outlives_reloads_under_edged(net, router, tmp_path):
    """A reload (static policy) wrote the configured weights and edged never pushed the drain
    again: the drained backend took new flows until undrained."""
    from controlplane.lab.daemon import EdgedProc

    sock = str(tmp_path / "edged.sock")
    doc = router.config([router.service("web")], node={"api_socket": sock, "metrics_listen": "127.0.0.1:9470"})
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(doc))
    with EdgedProc.start(net.router, doc, router.iface) as edged:
        edged.wait_for(lambda e: e["kind"] == "api", 10.0, "the API to listen")
        assert router.edgectl("drain", "web", "b1", "--socket", sock).returncode == 0
        doc["services"][0]["backends"][0]["weight"] = 3
        path.write_text(yaml.safe_dump(doc))
        for _ in range(2):  # a change, then the same file again
            done = router.edgectl("reload", "--config", path, "--socket", sock)
            assert done.returncode == 0, done.stderr
            (snap,) = ctl_json(router, "status", "--socket", sock)
            assert {b["name"]: b["weight"] for b in snap["services"][0]["backends"]} == {"b0": 3, "b1": 0, "b2": 1}
        conns = open_connections(net.client, net.vip, PORT, 12)
        try:
            assert "b1" not in {conn.request().backend for conn in conns}
        finally:
            close_all(conns)
