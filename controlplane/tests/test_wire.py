"""controlplane.wiresignals (windows, quantiles, freshness of the data path's wire signals) and the
weight policy's RTT input from it (weights.rtt_input). Pure: no root, no kernel."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from controlplane import abi, weights, wiresignals
from controlplane.config import parse_config
from controlplane.maps.records import WireStats

MS = 1_000_000
N = abi.WIRE_BUCKETS


def hist(**at: int) -> tuple[int, ...]:
    """Buckets with counts at b<i>=n."""
    out = [0] * N
    for k, n in at.items():
        out[int(k[1:])] = n
    return tuple(out)


def test_buckets_are_powers_of_two_microseconds_with_open_ends():
    assert wiresignals.bucket_bounds_s(0) == (0.0, 2e-6)
    assert wiresignals.bucket_bounds_s(10) == (1024e-6, 2048e-6)
    assert wiresignals.bucket_bounds_s(N - 1) == (2.0 ** (N - 1) / 1e6, math.inf)
    assert len(wiresignals.upper_bounds_s()) == N - 1


def test_quantile_interpolates_inside_the_bucket():
    # 10 samples in [1024, 2048) us: the median is the middle of the bucket
    assert wiresignals.quantile(hist(b10=10), 0.5) == pytest.approx(1536e-6)
    # 90 fast, 10 slow: p50 is fast, p99 in the slow bucket
    h = hist(b5=90, b14=10)
    assert 32e-6 <= wiresignals.quantile(h, 0.5) < 64e-6
    assert 2**14 * 1e-6 <= wiresignals.quantile(h, 0.99) < 2**15 * 1e-6
    assert wiresignals.quantile(hist(), 0.5) is None
    assert wiresignals.quantile(hist(**{f"b{N - 1}": 3}), 0.5) == 2.0 ** (N - 1) / 1e6  # open-ended: its low end


@given(st.lists(st.integers(0, 1000), min_size=N, max_size=N), st.floats(0, 1))
def test_a_quantile_lies_in_the_bucket_holding_its_rank(counts, q):
    got = wiresignals.quantile(counts, q)
    if sum(counts) == 0:
        assert got is None
        return
    assert 0 <= got <= 2.0 ** (N - 1) / 1e6
    assert wiresignals.quantile(counts, 0.0) <= got <= wiresignals.quantile(counts, 1.0)


def stats(hs: tuple = hist(), fb: tuple = hist(), opened: int = 0, closed: int = 0) -> WireStats:
    return WireStats(handshake=hs, first_byte=fb, opened=opened, closed=closed)


def test_the_window_is_the_difference_of_the_newest_and_the_oldest_snapshot_in_it():
    w = wiresignals.Windows(window_ns=2000 * MS, min_samples=5)
    w.observe(0, {"b0": stats(hist(b5=100), opened=10)})
    w.observe(1000 * MS, {"b0": stats(hist(b5=100, b14=3), opened=13, closed=2)})
    s = w.signals()["b0"]
    assert (s.handshakes, s.window_s, s.active, s.fresh) == (3, 1.0, 11, False)  # 3 < 5 samples
    w.observe(2000 * MS, {"b0": stats(hist(b5=100, b14=10), opened=20, closed=20)})
    s = w.signals()["b0"]
    assert (s.handshakes, s.fresh, s.active) == (10, True, 0)
    assert 2**14 * 1e-6 <= s.handshake_p50_s < 2**15 * 1e-6  # the old fast samples are out
    # past the window the first snapshot goes: only what came after 1000 ms counts
    w.observe(3000 * MS, {"b0": stats(hist(b5=100, b14=10), opened=20, closed=20)})
    assert w.signals()["b0"].handshakes == 7


def test_a_backend_without_traffic_goes_stale_and_a_forgotten_one_goes():
    w = wiresignals.Windows(window_ns=1000 * MS, min_samples=1)
    w.observe(0, {"b0": stats(hist(b5=1)), "b1": stats()})
    w.observe(500 * MS, {"b0": stats(hist(b5=2)), "b1": stats()})
    assert wiresignals.fresh_keys(w.signals()) == {"b0"}
    w.observe(1600 * MS, {"b0": stats(hist(b5=2))})
    assert wiresignals.fresh_keys(w.signals()) == set()
    assert set(w.signals()) == {"b0"}


def test_counts_going_back_are_a_new_map_not_negative_samples():
    new = stats(hist(b3=2), opened=1)
    assert wiresignals.difference(new, stats(hist(b3=5), opened=9)) == new
    assert wiresignals.difference(stats(hist(b3=5), opened=3), stats(hist(b3=2), opened=1)) == stats(
        hist(b3=3), opened=2
    )


def test_summary_is_plain_data_even_without_a_signal():
    assert wiresignals.summary(None)["handshake_p50_s"] is None
    s = wiresignals.signal(stats(hist(b10=5), hist(b20=5)), 2.0, 4, 5)
    d = wiresignals.summary(s)
    assert d["fresh"] and d["active"] == 4 and d["first_byte_p50_s"] > 1.0


# ---- the weight policy's RTT input


def test_rtt_input_is_the_wire_for_tcp_probes_and_the_larger_for_http():
    tr = weights.Tracker(rtt_s=0.002, wire_rtt_s=0.0005)
    assert weights.rtt_input(tr, "tcp") == 0.0005
    assert weights.rtt_input(tr, None) == 0.0005
    assert weights.rtt_input(tr, "http") == 0.002  # the probe also sees the server's own time
    assert weights.rtt_input(weights.Tracker(rtt_s=0.002, wire_rtt_s=0.03), "grpc") == 0.03
    assert weights.rtt_input(weights.Tracker(rtt_s=0.002), "tcp") == 0.002  # stale wire: the probe
    assert weights.rtt_input(weights.Tracker(wire_rtt_s=0.01), "http") == 0.01  # no probe sample yet


def service(kind: str = "tcp"):
    return parse_config(
        {
            "version": 1,
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "health": {"probe": {"kind": kind, "interval_ms": 30000, "timeout_ms": 1000}},
                    "weights": {"policy": "latency_inverse", "slow_start_ms": 0},
                    "backends": [
                        {"name": "b0", "address": "198.18.1.2", "port": 8000},
                        {"name": "b1", "address": "198.18.2.2", "port": 8000},
                    ],
                }
            ],
        }
    ).services[0]


def test_a_fresh_wire_signal_moves_weight_the_old_probe_did_not_see():
    s = service()
    trs = {"b0": weights.Tracker(rtt_s=0.0001), "b1": weights.Tracker(rtt_s=0.0001)}
    even = weights.decide(s, trs, None, 0).weights
    assert even["b0"] == even["b1"]
    trs["b0"].wire_rtt_s, trs["b1"].wire_rtt_s = 0.0001, 0.025  # b1's path got 25 ms slower
    d = weights.decide(s, trs, even, 1)
    assert d.push and d.weights["b1"] < d.weights["b0"] / 10
    assert "wire rtt 25.00 ms" in d.reasons["b1"]


def test_config_defaults_and_checks_of_weights_wire():
    w = service().weights.wire
    assert (w.enabled, w.window_ms, w.min_samples, w.interval_ms) == (True, 2000, 5, 250)
    with pytest.raises(Exception, match=r"services\[0\]\.weights\.wire\.interval_ms"):
        parse_config(
            {
                "version": 1,
                "services": [
                    {
                        "name": "chat",
                        "vip": "198.18.255.1",
                        "port": 8000,
                        "weights": {"wire": {"interval_ms": 3000, "window_ms": 2000}},
                        "backends": [{"name": "b0", "address": "198.18.1.2", "port": 8000}],
                    }
                ],
            }
        )
