"""Readmission after a passive ejection needs evidence. With probes configured, a passing probe
is that evidence: edged ends the backend's probation and no client flow is spent as a trial.
(Without probes or heartbeats, one trial flow is: test_health_abuse.)

        client ──veth── router (XDP, edged) ──veth── b0, b1, b2 (lab HTTP backends)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.procs import read_line
from controlplane.lab.topo import Server
from controlplane.lab.traffic import backends_seen, wait_until

PORT = 8000  # conftest.BACKEND_PORT
ALL = {"b0", "b1", "b2"}
PASSIVE = {"syn_timeout_ms": 50, "consecutive": 3, "ejection_ms": 300, "max_ejected_percent": 50}
PROBE = {"kind": "tcp", "interval_ms": 50, "timeout_ms": 40, "window": 10}


def backend_of(router, backend: str) -> dict:
    """One backend's row of `edgectl status --json`."""
    (svc,) = router.status()["services"]
    return next(b for b in svc["backends"] if b["name"] == backend)


def state_of(router, backend: str) -> str:
    """The data path's state of one backend, as `edgectl status --json` reads it from the maps."""
    return backend_of(router, backend)["health"]["state"]


def takes_new_flows(router, backend: str) -> bool:
    """Readmitted by the data path and back in the Maglev table: under the static policy a
    backend its probes called down has weight 0 until they call it up again (rise passes in a
    row), a step that may come after the readmission's on a loaded host."""
    b = backend_of(router, backend)
    return b["health"]["state"] == "up" and b["slots"] > 0


def start_and_kill_b0(net, router, tmp_path, service: dict) -> tuple[EdgedProc, Server]:
    """edged serving service, once flows reach every backend; then b0's server killed. The caller
    stops the edged returned."""
    doc = router.config(
        [service], node={"api_socket": str(tmp_path / "edged.sock"), "metrics_listen": "127.0.0.1:9470"}
    )
    edged = EdgedProc.start(net.router, doc, router.iface)
    try:
        wait_until(
            lambda: set(backends_seen(net.client, net.vip, PORT, 30, flow_timeout_s=1.0)) == ALL,
            10.0,
            "flows on every backend",
        )
        b0 = net.servers[0]
        b0.proc.kill()
        b0.proc.wait(timeout=5.0)
    except BaseException:
        edged.stop()
        raise
    return edged, b0


def restart(net, server: Server) -> None:
    """The lab's HTTP backend again on server's namespace, address and port (torn down with net)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = server.ns.popen(
        [
            sys.executable,
            "-m",
            "controlplane.lab.backend",
            "--name",
            server.name,
            "--listen",
            f"{server.address}:{server.port}",
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    line = read_line(proc, 5.0)
    assert line.startswith(f"listening {server.name} "), line


def test_a_passing_probe_ends_the_probation_of_an_ejected_backend(net, router, tmp_path):
    """b0's server is killed and a burst of new flows ejects it (refused SYNs). Its server comes
    back. With no client traffic at all from then on, edged's next passing probe of b0 ends the
    probation once the ejection is over: the data path calls b0 up again (on the old code it
    stayed on probation until a client's flow was spent as a trial), and new flows reach it."""
    service = router.service("web")
    service["health"] = {"passive": PASSIVE, "probe": PROBE}
    service["weights"] = {"policy": "static"}  # probes change no weight: only the data path judges
    edged, b0 = start_and_kill_b0(net, router, tmp_path, service)
    try:

        def ejected() -> bool:
            backends_seen(net.client, net.vip, PORT, 30, flow_timeout_s=1.0)  # refused SYNs eject b0
            return state_of(router, "b0") in ("ejected", "probation")

        wait_until(ejected, 20.0, "b0 ejected by passive detection", observe=lambda: state_of(router, "b0"))
        restart(net, b0)
        # From here no client sends anything: only edged's probes reach b0.
        wait_until(
            lambda: state_of(router, "b0") == "up",
            15.0,
            "b0 up again without a client flow",
            observe=lambda: state_of(router, "b0"),
        )
        event = edged.wait_for(
            lambda e: e["kind"] == "state" and e.get("new") == "readmitted", 5.0, "the readmission event"
        )
        assert event["backend"] == "b0", event
        wait_until(
            lambda: takes_new_flows(router, "b0"),
            15.0,
            "b0 back in the table (its probes call it up)",
            observe=lambda: backend_of(router, "b0"),
        )

        seen = backends_seen(net.client, net.vip, PORT, 60, flow_timeout_s=1.0)
        assert set(seen) == ALL, seen  # every flow answered, b0 among them
    finally:
        edged.stop()
