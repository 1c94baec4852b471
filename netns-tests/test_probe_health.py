"""Probes decide health under every weight policy (static and latency_inverse alike): a backend
whose server is killed fails its probes and is down for new flows, status says so and why; from
the moment passive detection caught it no client flow is spent on it as a trial, however long its
probes take to call it down; when its server is back, its probes bring it back.

        client ──veth── router (XDP, edged) ──veth── b0, b1, b2 (lab HTTP backends)
"""

from __future__ import annotations

import threading

import pytest
from test_readmission import restart, start_and_kill_b0  # the lab backend killed, started again

from controlplane.lab.traffic import backends_seen, wait_until

PORT = 8000  # conftest.BACKEND_PORT
# Ejection far shorter than the probes take to call b0 down (3 x 200 ms): the ejection ends while
# its probes fail but before they reach fall, which is when the old code spent a trial flow.
PASSIVE = {"syn_timeout_ms": 50, "consecutive": 1, "ejection_ms": 200, "max_ejected_percent": 50}
PROBE = {
    "kind": "tcp",
    "interval_ms": 200,
    "timeout_ms": 50,
    "fall": 3,
    "rise": 2,
    "relaxed_interval_ms": 200,
}  # never relaxed: the probes' pace does not depend on the traffic
POLICIES = {"static": {"policy": "static"}, "latency_inverse": {"policy": "latency_inverse", "slow_start_ms": 500}}


def backend(router, name: str) -> dict:
    """One backend of the only service, as `edgectl status --json` shows it."""
    (svc,) = router.status()["services"]
    return next(b for b in svc["backends"] if b["name"] == name)


class Flows:
    """Rounds of 10 new connections from the client, one after another on a thread of its own
    until the with block ends; failed: the rounds where one failed or reached b0."""

    def __init__(self, net):
        self.net, self.rounds, self.failed = net, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-health-flows", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.rounds < 10_000:  # bounded: ~10 s of rounds at most
            seen = backends_seen(self.net.client, self.net.vip, PORT, 10, flow_timeout_s=1.0)
            if set(seen) - {"b1", "b2"}:
                self.failed.append(dict(seen))
            self.rounds += 1

    def __enter__(self) -> "Flows":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30.0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_killed_server_is_down_for_new_flows_with_no_trial_and_returns_with_its_server(net, router, tmp_path, policy):
    """b0's server is killed; refused SYNs eject it (detection). From then on: every new
    connection succeeds and b0 gets none (its new_flows counter stands still) while its ejection
    ends and its probes fail, until status calls it down with the probes as the reason (old code:
    under static it stayed up, and under either policy the ejection's end let a trial flow through,
    refused). Its server comes back: its probes bring it back and new flows reach it."""
    service = router.service("web")
    service["health"] = {"passive": PASSIVE, "probe": PROBE}
    service["weights"] = POLICIES[policy]
    edged, b0 = start_and_kill_b0(net, router, tmp_path, service)
    try:

        def ejected() -> bool:
            backends_seen(net.client, net.vip, PORT, 30, flow_timeout_s=1.0)  # a refused SYN ejects b0
            return backend(router, "b0")["health"]["state"] in ("ejected", "probation")

        wait_until(
            ejected, 20.0, "b0 ejected by passive detection", observe=lambda: backend(router, "b0")["health"]["state"]
        )
        spent = backend(router, "b0")["new_flows"]

        with Flows(net) as flows:  # new connections all along, while the ejection ends and probes fail
            wait_until(lambda: flows.rounds >= 2, 10.0, "new flows sent after the detection")

            def down() -> bool:
                b = backend(router, "b0")
                return b["state"] == "down" and b["health"]["state"] != "ejected"

            wait_until(
                down,
                20.0,
                "b0 down by its probes, its ejection over",
                observe=lambda: (backend(router, "b0")["state"], flows.failed),
            )
            rounds = flows.rounds
            wait_until(lambda: flows.rounds >= rounds + 2, 10.0, "new flows sent after b0 is down")
        assert flows.rounds and not flows.failed, flows.failed
        seen = backends_seen(net.client, net.vip, PORT, 60, flow_timeout_s=1.0)
        assert set(seen) == {"b1", "b2"}, seen
        b = backend(router, "b0")
        assert b["new_flows"] == spent, "a client flow went to b0 as a trial while its probes failed"
        assert "failed probes" in b["probe"]["reason"], b["probe"]

        restart(net, b0)
        wait_until(
            lambda: "b0" in backends_seen(net.client, net.vip, PORT, 60, flow_timeout_s=1.0),
            20.0,
            "new flows on b0 again",
            observe=lambda: backend(router, "b0")["state"],
        )
        assert backend(router, "b0")["state"] == "up"
    finally:
        edged.stop()
