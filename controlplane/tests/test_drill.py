"""The failover drill's pure parts, without privileges: plan checks, the testbed config, the
frames it sends and the analysis of what the capture saw (controlplane/drill/)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane import drill
from controlplane.config import parse_config
from controlplane.lab.topo import Net, Topo

MS = 1_000_000
REPO = Path(__file__).resolve().parents[2]


def config(**service) -> object:
    svc = {
        "name": "chat",
        "vip": "198.18.255.1",
        "port": 8000,
        "health": {"heartbeat": {"interval_ms": 1, "timeout_ms": 5}},
        "backends": [
            {"name": "a", "address": "10.0.0.2", "port": 9000, "token": "0x5eed0001"},
            {"name": "b", "address": "10.0.1.2", "port": 9000, "token": "0x5eed0002", "weight": 2},
            {"name": "spare", "address": "10.0.2.2", "port": 9000, "token": "0x5eed0003", "standby": True},
        ],
    }
    svc.update(service)
    svc = {k: v for k, v in svc.items() if v is not None}
    return parse_config({"version": 1, "node": {"maglev_m": 1009, "pin_dir": "/sys/fs/bpf/other"}, "services": [svc]})


@pytest.mark.parametrize(
    "plan, message",
    [
        (drill.Plan("nope", "heartbeat"), "--backend: no backend 'nope' in service chat"),
        (drill.Plan("spare", "kill"), "--backend: spare is standby"),
        (drill.Plan("a", "unplug"), "--mode: 'unplug' is not one of heartbeat, link, kill"),
        (drill.Plan("a", "link", rate=50_000, duration_s=2), "100000 flows; at most 50000"),
        (drill.Plan("a", "link", service="embed"), "--service: no service 'embed'"),
    ],
    ids=["unknown backend", "standby", "unknown mode", "too many flows", "unknown service"],
)
def test_plans_that_cannot_work_are_refused_before_anything_is_built(plan, message):
    with pytest.raises(drill.DrillError, match=message):
        drill.check_plan(config(), plan)


def test_heartbeat_mode_needs_heartbeats():
    with pytest.raises(drill.DrillError, match="no health.heartbeat section"):
        drill.check_plan(config(health=None), drill.Plan("a", "heartbeat"))


def test_testbed_config_keeps_names_weights_tokens_and_health_but_takes_the_testbeds_addresses():
    cfg = config()
    net = Net(Topo(backends=3), prefix="e3f9a")  # a description only: nothing is built
    doc = drill.testbed_document(cfg, cfg.services[0], net)
    svc = doc["services"][0]
    assert [
        (b["name"], b["address"], b["port"], b["weight"], b["token"], b.get("standby", False)) for b in svc["backends"]
    ] == [
        ("a", "198.18.1.2", 9000, 1, "0x5eed0001", False),
        ("b", "198.18.2.2", 9000, 2, "0x5eed0002", False),
        ("spare", "198.18.3.2", 9000, 1, "0x5eed0003", True),
    ]
    assert svc["health"] == {
        "heartbeat": {"port": 7946, "interval_ms": 1, "timeout_ms": 5, "rise": 3},
        "panic_percent": 0,
    }
    assert doc["node"]["maglev_m"] == 1009 and "pin_dir" not in doc["node"]
    assert parse_config(doc).services[0].backends[2].standby  # what is deployed is a valid config


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
def test_frames_differ_only_in_source_port_and_keep_valid_checksums(protocol):
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether

    frames = drill.build_frames(
        protocol, "02:00:00:00:00:01", "02:00:00:00:00:02", "198.18.0.2", "198.18.255.1", 8000, 3000
    )
    l4 = TCP if protocol == "tcp" else UDP
    for k in (0, 1, 1234, 2999):
        pkt = Ether(frames[k])
        assert pkt[l4].sport == drill.FIRST_SPORT + k
        got = pkt[l4].chksum
        del pkt[l4].chksum, pkt[IP].chksum
        assert Ether(bytes(pkt))[l4].chksum == got


def test_down_windows_last_from_timeout_after_a_gap_until_rise_heartbeats():
    beats = [0, 1, 2, 10, 11, 12, 13]  # ms; a gap of 8 ms
    assert drill.down_windows([t * MS for t in beats], 5 * MS, rise=3) == [(7 * MS, 12 * MS)]
    assert drill.down_windows([t * MS for t in beats], 5 * MS, rise=10) == [(7 * MS, None)]


def synthetic(mode: str, switch_ms: float = 5.0, rate: int = 2000, n: int = 2000, seed: int = 7):
    """Flows as a router would treat them: backend 0 of 3 dies at t0 = 300 ms (in link mode its flows
    vanish from then on) and the router stops giving it flows at t0 + switch_ms."""
    rng = random.Random(seed)
    t0 = 300 * MS
    flows = []
    for k in range(n):
        sent = int(k * 1e9 / rate)
        home = rng.randrange(3)
        backend, arrived = home, sent + 20_000
        if home == 0 and sent + 20_000 > t0 + switch_ms * MS:
            backend = 1 + rng.randrange(2)
        elif home == 0 and mode == "link" and sent >= t0:
            backend, arrived = None, None
        flows.append(drill.Flow(drill.FIRST_SPORT + k, sent, backend, arrived))
    return flows, t0


@pytest.mark.parametrize("mode", ["heartbeat", "link"])
def test_analysis_finds_the_switch_within_its_resolution(mode):
    flows, t0 = synthetic(mode)
    health = drill.HealthSeen(timeout_ms=5, rise=3, takes_new=(True, True, True))
    r = drill.analyse(flows, ["a", "b", "c"], 0, mode, t0, t0, health)

    # The switch (5 ms) came after the last flow the dead backend got, and the estimate is about
    # half a spacing later; how far the next flow for it would have been is chance.
    assert r["detected"]
    assert r["last_to_dead_ms"] <= 5.0 < r["failover_ms"] + 2 * r["spacing_ms"]
    assert r["detection_ms"] == pytest.approx(r["last_to_dead_ms"] + r["spacing_ms"] / 2, abs=0.002)
    assert r["failover_ms"] >= r["last_to_dead_ms"]
    assert r["after_detection"] == 0 and r["late"] == 0
    assert r["lost_unexplained"] == 0
    assert r["lost"] == r["lost_dead_run"] == (r["dead_run"] if mode == "link" else 0)


def test_a_backend_that_keeps_getting_flows_is_not_detected_and_late_flows_are_counted():
    flows, t0 = synthetic("heartbeat", switch_ms=10_000)
    r = drill.analyse(flows, ["a", "b", "c"], 0, "heartbeat", t0, t0, drill.HealthSeen(timeout_ms=5))
    assert not r["detected"] and r["detection_ms"] is None
    assert r["late"] > 100  # everything the dead backend got after 6 ms


def test_flows_lost_while_every_other_backend_missed_heartbeats_are_explained():
    flows, t0 = synthetic("heartbeat")
    flows[100] = drill.Flow(flows[100].sport, flows[100].sent_ns, None, None)  # at 50 ms
    beats = tuple(tuple(t * MS for t in range(0, 1000) if not 44 <= t < 56) for _ in range(3))
    health = drill.HealthSeen(timeout_ms=5, rise=3, beats=beats, takes_new=(True, True, True))
    r = drill.analyse(flows, ["a", "b", "c"], 0, "heartbeat", t0, t0, health)
    assert (r["lost"], r["lost_heartbeat_gaps"], r["lost_unexplained"]) == (1, 1, 0)
    assert r["heartbeat_gaps"]["b"] == {"heartbeats": 988, "max_gap_ms": 13.0, "over_timeout": 1}


# matplotlib is an optional extra: None in sys.modules makes `import matplotlib` raise ImportError,
# as when it is not installed, without touching the venv.
WITHOUT_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; from controlplane.cli import main; sys.exit(main())"


def test_a_plot_without_matplotlib_is_refused_in_one_line_before_the_drill_runs(tmp_path):
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(
        "version: 1\nservices:\n- name: chat\n  vip: 198.18.255.1\n  port: 8000\n  backends:\n"
        "  - {name: a, address: 198.18.1.2, port: 8000}\n  - {name: b, address: 198.18.2.2, port: 8000}\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_MATPLOTLIB,
            "drill",
            "failover",
            "--config",
            str(cfg),
            "--backend",
            "a",
            "--mode",
            "link",
            "--plot",
            str(tmp_path / "out.png"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgectl: --plot needs matplotlib"), done.stderr
    assert "plot extra" in lines[0]
    assert not (tmp_path / "out.png").exists()


def shipped_configs() -> list[Path]:
    """Every example config the project ships (edge/, and any examples/ or docs/ beside it)."""
    found = sorted(REPO.glob("edge/*.yaml"))
    for folder in ("examples", "docs"):
        found += sorted((REPO / folder).rglob("*.yaml"))
    return found


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_example_config_goes_through_the_drills_plan(path):
    from controlplane.config import load_config

    cfg = load_config(path)
    for svc in cfg.services:
        net = Net(Topo(backends=len(svc.backends)), prefix="e3f9a")  # a description only
        doc = drill.testbed_document(cfg, svc, net)
        deployed = parse_config(doc).services[0]  # raised "expected an integer, got null" before
        assert deployed.health == svc.health
        assert [b.name for b in deployed.backends] == [b.name for b in svc.backends]
