"""Weights: new flows split by the configured weights, and a weight change moves no connection.

        client ──veth── router ──veth── b0
                    (XDP, rt-c)  ├──veth── b1
                                 └──veth── b2

Shares are measured with real connections (one GET each), so the tolerances are statistical:
each docstring gives the binomial standard deviation behind its bound.
"""

from __future__ import annotations

from collections import Counter

from controlplane.lab.traffic import backends_seen, close_all, open_connections

PORT = 8000  # conftest.BACKEND_PORT, also the VIP port


def shares_pct(seen: Counter) -> dict[str, float]:
    total = sum(seen.values())
    return {f"b{i}": 100.0 * seen[f"b{i}"] / total for i in range(3)}


def assert_no_errors(seen: Counter, n: int) -> None:
    errors = {k: v for k, v in seen.items() if k.startswith("error:")}
    assert errors == {}, f"{errors} in {seen}"
    assert sum(seen.values()) == n


def assert_shares_near(seen: Counter, want_pct: dict[str, float], points: float) -> None:
    got = shares_pct(seen)
    off = {name: round(got[name] - want, 2) for name, want in want_pct.items()}
    assert all(abs(d) <= points for d in off.values()), f"shares {got} vs {want_pct}: off by {off} points"


def test_new_flows_split_by_weights_1_2_1(net, router):
    """4,000 new flows over weights 1:2:1 land 25/50/25 % within 3 points, with no error.

    At n = 4000 the standard deviation of a 50 % share is sqrt(0.25/4000) = 0.79 points and of a
    25 % share 0.68, so 3 points is over 3.8 deviations: a correct router fails < 1 in 5,000 runs.
    The router's own per-backend new-flow counters tell the same split (all 4,000 are new flows).
    """
    router.deploy([router.service("web", weights=[1, 2, 1])])

    seen = backends_seen(net.client, net.vip, PORT, 4000)

    assert_no_errors(seen, 4000)
    assert_shares_near(seen, {"b0": 25.0, "b1": 50.0, "b2": 25.0}, points=3.0)
    (service,) = router.status()["services"]
    assert {b["name"]: b["new_flows"] for b in service["backends"]} == dict(seen)
    assert [b["weight"] for b in service["backends"]] == [1, 2, 1]


def test_connections_keep_their_backend_across_a_weight_change(net, router):
    """200 keep-alive connections opened under 1:2:1 answer from the same backend after a
    redeploy with 4:1:1 (no backend removed); 3,000 new flows after it follow 4:1:1 within 5 points.

    The change moves many table slots (b1's share falls from 50 % to 17 %, b0's rises from 25 %
    to 67 %), so without conntrack about a third of the 200 connections would land elsewhere.
    Under 4:1:1 at n = 3000 the deviation of the 66.7 % share is 0.86 points: 5 points is 5.8.
    """
    router.deploy([router.service("web", weights=[1, 2, 1])])
    conns = open_connections(net.client, net.vip, PORT, 200)
    try:
        before = [conn.request().backend for conn in conns]
        assert set(before) == {"b0", "b1", "b2"}

        router.deploy([router.service("web", weights=[4, 1, 1])])

        after = [conn.request().backend for conn in conns]
        moved = [(i, b, a) for i, (b, a) in enumerate(zip(before, after)) if b != a]
        assert moved == [], f"{len(moved)} of 200 connections changed backend (index, before, after): {moved[:10]}"
        seen = backends_seen(net.client, net.vip, PORT, 3000)
    finally:
        close_all(conns)

    assert_no_errors(seen, 3000)
    assert_shares_near(seen, {"b0": 400 / 6, "b1": 100 / 6, "b2": 100 / 6}, points=5.0)
    (service,) = router.status()["services"]
    assert [b["weight"] for b in service["backends"]] == [4, 1, 1]
    # 200 connections, then 3,000: the old connections were no new flows after the change.
    assert service["new_flows"] == 3200
