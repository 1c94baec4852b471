"""`edgectl drill failover`, end to end, in each mode: a short drill (1 s at 1000 new flows/s)
through the CLI, then claims about what happened to the flows. Timing targets live in
tools/bench-failover; here only behaviour is asserted.

    client ──veth── router ──veth── h100-a   (silenced a third into the run)
                       ├────veth── h100-b
                       └────veth── h100-c

Each drill builds and removes its own namespaces and router (controlplane/drill/); the test
only checks that nothing with the drill's prefix is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pyroute2 import IPRoute, netns

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
DEAD = "h100-a"
RATE, DURATION_S = 1000, 1.0
# Heartbeats every 5 ms, down after 50 ms: far beyond a scheduling stall of a loaded test machine,
# short next to the run. Ejection outlasts the run, so a killed server is not tried again in it.
HEARTBEAT = {"port": 7946, "interval_ms": 5, "timeout_ms": 50, "rise": 3}
PASSIVE = {"syn_timeout_ms": 200, "consecutive": 3, "ejection_ms": 5000, "max_ejected_percent": 50}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def config() -> dict:
    # Addresses outside the testbed on purpose: the drill replaces them with its own.
    return {
        "version": 1,
        "services": [
            {
                "name": "chat",
                "vip": "198.18.255.1",
                "port": 8000,
                "protocol": "tcp",
                "health": {"heartbeat": HEARTBEAT, "passive": PASSIVE},
                "backends": [
                    {"name": name, "address": f"198.19.{i}.2", "port": 9000, "token": hex(0x5EED0001 + i)}
                    for i, name in enumerate((DEAD, "h100-b", "h100-c"))
                ],
            }
        ],
    }


def drill(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, dict]:
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(yaml.safe_dump(config(), sort_keys=False))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "controlplane",
            "-q",
            "drill",
            "failover",
            "--config",
            str(cfg),
            "--backend",
            DEAD,
            "--mode",
            mode,
            "--rate",
            str(RATE),
            "--duration",
            str(DURATION_S),
            "--json",
            str(tmp_path / "drill.json"),
            "--plot",
            str(tmp_path / "drill.png"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, f"edgectl drill exited {done.returncode}: {done.stderr.strip()}"
    return done, json.loads((tmp_path / "drill.json").read_text())


def leftovers(prefix: str) -> list[str]:
    names = [name for name in netns.listnetns() if name.startswith(f"{prefix}-")]
    with IPRoute() as ipr:
        names += [link.get("ifname") for link in ipr.get_links() if link.get("ifname", "").startswith(f"{prefix}-")]
    return names


def flows_to(report: dict, backend: str | None, after_ms: float = float("-inf")) -> list[dict]:
    return [f for f in report["flows"] if f["backend"] == backend and f["sent_ms"] > after_ms]


@pytest.mark.parametrize("mode", ["heartbeat", "link", "kill"])
def test_drill_moves_new_flows_off_a_silenced_backend(tmp_path, mode):
    done, r = drill(tmp_path, mode)

    assert f"{DEAD} silenced by {mode}" in done.stdout
    assert (tmp_path / "drill.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "drill.png").stat().st_size > 10_000  # a drawn timeline, not an empty canvas
    assert not leftovers(r["testbed"]["prefix"])

    # Every flow was sent, and the testbed's addresses replaced the config's.
    assert len(r["flows"]) == r["traffic"]["flows"] == RATE * DURATION_S
    assert r["testbed"]["addresses"][DEAD].startswith("198.18.")

    # Before t0 the dead backend took its share (about a third); the others get flows after it.
    before = sum(c["before"] for c in r["per_backend"].values())
    assert r["per_backend"][DEAD]["before"] > 0.15 * before
    assert all(r["per_backend"][b]["after"] > 0 for b in ("h100-b", "h100-c"))

    # Detected: after the dead run the dead backend got no new flow at all, for the rest of the run.
    assert r["detected"], r["notes"]
    assert r["after_detection"] == 0
    margin_ms = r["detection_ms"] + 2 * r["spacing_ms"]
    assert not flows_to(r, DEAD, after_ms=margin_ms), "the dead backend got flows sent after detection"
    if mode != "kill":
        assert r["router"]["backends"][DEAD]["state"] == "down"
    assert r["router"]["failovers"] > 0

    # Lost flows are few and explained: on a dead link the flows given to it before detection
    # vanish (at most timeout + the dead backend's share of a spacing or two); in the other modes
    # the dead backend still receives, so only a host stall (every backend missing heartbeats at
    # once) may lose any.
    assert r["lost_unexplained"] == 0, r["lost_flows_ms"]
    if mode == "link":
        assert r["lost_dead_run"] <= RATE * (HEARTBEAT["timeout_ms"] + 10) / 1000
    else:
        assert r["lost_dead_run"] == 0
    assert r["lost_heartbeat_gaps"] <= 0.02 * len(r["flows"])

    if mode == "kill":
        assert r["refused"] > 0  # SYNs reached the dead port before the router ejected it
