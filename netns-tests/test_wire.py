"""Wire signals from real traffic: the data path times each client connection's handshake and its
first request to the first reply byte per backend, and counts open connections; edged weighs
the handshake RTT when its probes are far apart.

        client ──veth── router (XDP, tc) ──veth── b0  answers every request 100 ms late
                                          └──veth── b1  loses the first SYN of every connection

Both backends are the simulated inference server (controlplane.lab.inference). This kernel has
no netem (CONFIG_NET_SCH_NETEM is off), so b1's handshakes are made slow another way: an
nftables set in b1's namespace drops each connection's first SYN, and the client sends it again
after its initial retransmission timeout (1 s). The data path times a handshake from the first
SYN (a retransmission keeps the time), so every b1 handshake takes >= 1 s, as for a backend
whose full SYN queue drops SYNs; b0's are the kernel's, milliseconds at most. b0's server waits
100 ms before each answer. Histogram bucket i holds [2^i, 2^(i+1)) us: 1 s is in bucket 19
([0.52, 1.05) s) or above, 100 ms in bucket 16 ([65.5, 131) ms) or above.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
from conftest import require_privileges, undeployed_after
from prometheus_client.parser import text_string_to_metric_families

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.topo import Net, Topo
from controlplane.lab.traffic import close_all, connect, open_connections, wait_until

PORT = 8000
WAIT_MS = 100  # b0's server waits this long before answering
SLOW_HS_BUCKET = 19  # 2^19 us = 0.52 s <= the client's 1 s SYN retransmission timeout
WAIT_BUCKET = 16  # 2^16 us = 65.5 ms <= 100 ms
PORT6 = 8001  # the IPv6 case's plain backends (controlplane.lab.backend, both families)
# b1's namespace: the first SYN of each (client, port) to the service is dropped, a second one taken
LOSE_FIRST_SYN_TEMPLATE = """
table inet edgetest_wire {{
  set seen {{ type {addr_type} . inet_service; timeout 60s; }}
  chain input {{
    type filter hook input priority 0; policy accept;
    tcp dport {port} tcp flags & (syn | ack) == syn {ip} saddr . tcp sport @seen accept
    tcp dport {port} tcp flags & (syn | ack) == syn add @seen {{ {ip} saddr . tcp sport }} drop
  }}
}}
"""
LOSE_FIRST_SYN = LOSE_FIRST_SYN_TEMPLATE.format(addr_type="ipv4_addr", port=PORT, ip="ip")
LOSE_FIRST_SYN6 = LOSE_FIRST_SYN_TEMPLATE.format(addr_type="ipv6_addr", port=PORT6, ip="ip6")


@pytest.fixture(scope="module")
def wire_net() -> Iterator[Net]:
    require_privileges()
    net = Net(Topo(backends=2))
    try:
        net.build()
        net.start_inference(port=PORT, per_backend=[["--added-latency-ms", str(WAIT_MS)], []])
        yield net
    finally:
        net.close()  # the namespaces go, and b1's qdisc with its veth


@pytest.fixture
def router(wire_net: Net):
    with undeployed_after(wire_net) as router:
        yield router


def slow_handshakes(net: Net, i: int, on: bool, rules: str = LOSE_FIRST_SYN) -> None:
    """Backend i loses the first SYN of every connection (on), or no longer (the table goes)."""
    ns = net.backends[i]
    if on:
        ns.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    else:
        ns.run(["nft", "delete", "table", "inet", "edgetest_wire"], check=False)


def requests(net: Net, n: int, vip=None, port: int = PORT) -> None:
    """n new connections to the VIP (default the IPv4 one) at once (b1's take a second), one request
    each, closed by the client."""

    def one(_):
        with connect(net.client, net.vip if vip is None else vip, port, timeout_s=5.0) as conn:
            conn.request()

    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(one, range(n)))


def by_name(snap: dict) -> dict[str, dict]:
    return {b["name"]: b for b in snap["services"][0]["backends"]}


def lowest(buckets: list[int]) -> int:
    return next(i for i, n in enumerate(buckets) if n)


def test_histograms_reflect_the_path_and_the_server_and_active_flows_count_open_connections(wire_net, router):
    """40 connections: with two backends the chance one gets none is 2 * 2**-40. Each one's SYN
    makes one conntrack entry (a new flow) and its SYN-ACK one handshake sample; its request one
    first-byte sample. Then 6 connections held open, then closed."""
    net = wire_net
    router.deploy([router.service("chat")])
    slow_handshakes(net, 1, True)
    try:
        requests(net, 40)
        b = by_name(
            wait_until(
                lambda: (
                    (s := router.status()) and sum(x["wire"]["first_bytes"] for x in by_name(s).values()) == 40 and s
                ),
                10.0,
                "40 first-byte samples",
            )
        )
        for name in ("b0", "b1"):
            w = b[name]["wire"]
            assert w["handshakes"] == w["first_bytes"] == b[name]["new_flows"] > 0, (name, w)
        fast, slow = b["b0"]["wire"], b["b1"]["wire"]
        # every b1 handshake waits for the client's SYN retransmission; b0's typical one is the kernel's
        assert lowest(slow["handshake_buckets"]) >= SLOW_HS_BUCKET
        assert fast["handshake_p50_s"] < 2**SLOW_HS_BUCKET / 1e6 <= slow["handshake_p50_s"]
        # b0's server waits 100 ms for every answer; b1 answers at once
        assert lowest(fast["first_byte_buckets"]) >= WAIT_BUCKET
        assert slow["first_byte_p50_s"] < 2**WAIT_BUCKET / 1e6 <= fast["first_byte_p50_s"]

        # every connection so far was closed by the client (FIN): none is active
        assert fast["active"] == slow["active"] == 0
        conns = open_connections(net.client, net.vip, PORT, 6, timeout_s=5.0)
        try:
            active = wait_until(
                lambda: sum(x["wire"]["active"] for x in by_name(router.status()).values()) == 6,
                10.0,
                "6 active flows",
                observe=lambda: {n: x["wire"] for n, x in by_name(router.status()).items()},
            )
            assert active
        finally:
            close_all(conns)
        wait_until(
            lambda: sum(x["wire"]["active"] for x in by_name(router.status()).values()) == 0,
            10.0,
            "no active flows after closing",
        )
    finally:
        slow_handshakes(net, 1, False)


def edged_config(router, tmp_path) -> dict:
    service = router.service("chat")
    # probes far apart: whatever moves the weights within the test is the wire signal
    service["health"] = {"probe": {"kind": "tcp", "interval_ms": 60000, "timeout_ms": 1000}}
    service["weights"] = {
        "policy": "latency_inverse",
        "slow_start_ms": 0,
        "wire": {"window_ms": 2000, "min_samples": 5, "interval_ms": 250},
    }
    return router.config(
        [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"}
    )


def edged_status(router, tmp_path) -> dict:
    done = router.edgectl("status", "--json", "--socket", tmp_path / "edged.sock")
    assert done.returncode == 0, done.stderr
    (snap,) = json.loads(done.stdout)
    return snap


def test_edged_moves_weight_off_a_backend_whose_handshakes_got_slow_between_probes(wire_net, router, tmp_path):
    """Probes every 60 s: at most the first one runs during the test. b1's handshakes get slow
    after edged started; real connections show it, and edged takes weight from b1."""
    net = wire_net
    edged = EdgedProc.start(net.router, edged_config(router, tmp_path), router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 10.0, "the API to listen")
        slow_handshakes(net, 1, True)
        # connections until the weights move (a bounded number: 20 per round, 10 rounds at most)
        for _ in range(10):
            requests(net, 20)
            w = edged.latest_weights("chat")
            if w and w["b1"] * 4 < w["b0"]:
                break
        weights = edged.wait_for(
            lambda e: e["kind"] == "weights" and e["weights"]["b1"] * 4 < e["weights"]["b0"], 5.0, "weight moved off b1"
        )["weights"]
        assert weights["b1"] * 4 < weights["b0"]

        b = by_name(edged_status(router, tmp_path))
        assert "wire rtt" in b["b1"]["edged"]["reason"], b["b1"]["edged"]
        assert b["b1"]["edged"]["probes_ok"] + b["b1"]["edged"]["probes_failed"] <= 1
        assert b["b1"]["edged"]["wire"]["handshake_p50_s"] >= 2**SLOW_HS_BUCKET / 1e6

        with net.router.enter():
            with urllib.request.urlopen("http://127.0.0.1:9470/metrics", timeout=5) as resp:
                text = resp.read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert fams["edge_backend_handshake_seconds"].type == "histogram"
        assert fams["edge_backend_first_byte_seconds"].type == "histogram"
        assert fams["edge_backend_active_flows"].type == "gauge"
        counts = {
            s.labels["backend"]: s.value
            for s in fams["edge_backend_handshake_seconds"].samples
            if s.name.endswith("_count")
        }
        assert counts["b1"] > 0 and counts["b0"] > 0
    finally:
        slow_handshakes(net, 1, False)
        assert edged.stop() == 0


def test_edged_moves_weight_off_an_ipv6_backend_whose_handshakes_got_slow_between_probes(wire_net, router, tmp_path):
    """The IPv6 case (wire6.h): a service on the IPv6 VIP whose backends are plain servers on their
    IPv6 addresses (port PORT6), probes every 60 s. b1 loses the first SYN of each IPv6
    connection after edged started; real connections through the IPv6 VIP show it, and edged
    takes weight from b1 for its wire RTT."""
    net = wire_net
    net.start_backends(port=PORT6)  # both families; they stop with the module's net
    service = router.service("chat6", vip=str(net.topo.vip6), port=PORT6, backend_port=PORT6)
    for entry in service["backends"]:
        entry["address"] = str(net.topo.backend_addr6(int(entry["name"][1:])).ip)
    service["health"] = {"probe": {"kind": "tcp", "interval_ms": 60000, "timeout_ms": 1000}}
    service["weights"] = {
        "policy": "latency_inverse",
        "slow_start_ms": 0,
        "wire": {"window_ms": 2000, "min_samples": 5, "interval_ms": 250},
    }
    doc = router.config([service], node={"api_socket": str(tmp_path / "edged.sock")})
    edged = EdgedProc.start(net.router, doc, router.iface)
    try:
        edged.wait_for(lambda e: e["kind"] == "api", 10.0, "the API to listen")
        slow_handshakes(net, 1, True, LOSE_FIRST_SYN6)
        for _ in range(10):  # bounded: 20 connections a round, 10 rounds at most
            requests(net, 20, vip=net.topo.vip6, port=PORT6)
            w = edged.latest_weights("chat6")
            if w and w["b1"] * 4 < w["b0"]:
                break
        weights = edged.wait_for(
            lambda e: (
                e["kind"] == "weights" and e.get("service") == "chat6" and e["weights"]["b1"] * 4 < e["weights"]["b0"]
            ),
            5.0,
            "weight moved off b1",
        )["weights"]
        assert weights["b1"] * 4 < weights["b0"]

        b = by_name(edged_status(router, tmp_path))
        assert "wire rtt" in b["b1"]["edged"]["reason"], b["b1"]["edged"]
        assert b["b1"]["edged"]["probes_ok"] + b["b1"]["edged"]["probes_failed"] <= 1
        assert b["b1"]["edged"]["wire"]["handshake_p50_s"] >= 2**SLOW_HS_BUCKET / 1e6
    finally:
        slow_handshakes(net, 1, False)
        assert edged.stop() == 0
