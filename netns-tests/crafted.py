"""Sending crafted frames at the router and waiting until it has handled them, for the table-driven
corpus tests (test_malformed.py, test_icmp_malformed.py): the counter deltas, what reached each
backend, and one good HTTP request through the VIP afterwards.

Each case's frame is sent COPIES times out of the client's veth while every backend's interface is
captured; `settle` waits until the router has visibly handled all copies as the case expects (all
dropped, all forwarded to a backend, or all passed to the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from packets import Capture, send_frames

from controlplane.lab.traffic import http_get, wait_until

COPIES = 5  # each crafted frame is sent this many times


def deltas(before: dict, after: dict) -> dict:
    """What the router counted between two `Router.counters()` readings."""
    v0, v1 = before["verdicts"], after["verdicts"]
    return {
        "drops": {k: after["drops"][k] - n for k, n in before["drops"].items()},
        "drop": v1["drop"] - v0["drop"],
        "pass": v1["pass"] - v0["pass"],
        "nat": v1["redirect"] + v1["nat_pass"] - v0["redirect"] - v0["nat_pass"],
        "icmp": v1["icmp_to_backend"] - v0["icmp_to_backend"],
    }


@dataclass
class Settled:
    got: dict  # counter deltas once the copies were handled
    reply: object  # the good HTTP request's answer (controlplane.lab.traffic.Reply)
    arrived: dict[str, list[bytes]]  # backend interface -> crafted frames captured there
    ends: list[str]  # every backend interface, b0's first

    def counts(self) -> dict[str, int]:
        return {ifname: len(self.arrived.get(ifname, [])) for ifname in self.ends}


def settle(
    net,
    router,
    frame: bytes,
    *,
    crafted: Callable[[list[bytes]], list[bytes]],
    outcome: str,
    to_b0: bool = False,
    port: int = 8000,
) -> Settled:
    """Send `frame` COPIES times; outcome is "drop", "forward" (to one backend) or "pass" (to the
    kernel; `to_b0` when the kernel delivers it to b0). Then one HTTP request through the VIP."""
    ends = [(net.backends[i], net.backend_peer_iface(i)) for i in range(3)]
    before = router.counters()
    with Capture(ends) as capture:
        send_frames(net.client, net.client_iface, [frame] * COPIES)

        def handled() -> dict | None:
            now = deltas(before, router.counters())
            arrived = sum(len(crafted(f)) for f in capture.take().values())
            if outcome == "drop":
                return now if now["drop"] >= COPIES else None
            if outcome == "forward" or to_b0:
                return now if arrived >= COPIES else None
            return now if now["pass"] >= COPIES else None

        got = wait_until(
            handled,
            2.0,
            f"{outcome}: {COPIES} copies handled",
            observe=lambda: (
                deltas(before, router.counters()),
                {i: len(crafted(f)) for i, f in capture.take().items()},
            ),
        )
        reply = http_get(net.client, net.vip, port)
        arrived = {ifname: crafted(frames) for ifname, frames in capture.take().items()}
    return Settled(got, reply, arrived, [ifname for _, ifname in ends])
