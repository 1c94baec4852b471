"""What a DSR service's direct replies must look like, for either family (test_dsr.py, test_dsr6.py):
every reply from the VIP, the backend seeing the client itself, every backend used, and the router
counting each packet as DSR with nothing NATed, returned or dropped."""

from __future__ import annotations


def assert_direct_replies(replies, seen: dict, snap: dict, vip, port: int, client: str, backends: set) -> None:
    """replies: 30 HTTP replies through the VIP; seen: 150 more flows by backend; snap: status."""
    assert {(r.status, r.server_addr) for r in replies} == {(200, f"{vip}:{port}")}
    assert all(r.peer.startswith(f"{client}:") for r in replies)  # the backend sees the client itself
    assert {r.backend for r in replies} | set(seen) == backends and sum(seen.values()) == 150, seen
    (service,) = snap["services"]
    assert service["new_flows"] == 180 and service["return_packets"] == 0
    verdicts = snap["verdicts"]
    assert verdicts["dsr"] == service["packets"] >= 3 * 180
    assert (verdicts["return_nat"], verdicts["redirect"], verdicts["nat_pass"], verdicts["drop"]) == (0, 0, 0, 0)
