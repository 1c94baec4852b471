"""tools/_probe_traffic.py, the pure part of `tools/bench-probe --traffic`: the address and
service plan, /proc CPU arithmetic and the verdict. No root."""

from __future__ import annotations

import sys
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import _probe_traffic as pt  # noqa: E402
from controlplane.abi import MAX_PER_SERVICE  # noqa: E402
from controlplane.lab.topo import TEST_RANGE, Topo  # noqa: E402


def test_a_thousand_backend_addresses_are_distinct_test_range_hosts_clear_of_the_lab_networks():
    addrs = [pt.backend_address(i) for i in range(1000)]
    lab = Topo(backends=1).link_networks() + [Topo().vip_route]

    assert len(set(addrs)) == 1000
    assert all(a in TEST_RANGE for a in addrs)
    assert not any(a in net for a in addrs for net in lab)
    assert all(0 < int(a) % 256 < 255 for a in addrs)  # never a .0 or .255
    assert addrs[0] == IPv4Address("198.19.0.1") and addrs[999] == IPv4Address("198.19.3.250")


def test_the_route_to_the_backends_is_the_smallest_network_holding_them_all():
    assert pt.backend_route(1000) == IPv4Network("198.19.0.0/22")
    assert pt.backend_route(250) == IPv4Network("198.19.0.0/24")
    assert pt.backend_route(1) == IPv4Network("198.19.0.0/31")
    assert all(pt.backend_address(i) in pt.backend_route(777) for i in range(777))


def test_the_plan_puts_every_backend_in_one_service_of_at_most_63_on_its_own_vip():
    services = pt.plan(1000)

    assert len(services) == 16  # ceil(1000 / 63)
    assert sorted(i for s in services for i in s.backends) == list(range(1000))
    assert all(len(s.backends) < MAX_PER_SERVICE for s in services)
    assert max(len(s.backends) for s in services) - min(len(s.backends) for s in services) <= 1
    assert [s.vip for s in services] == [IPv4Address("198.18.255.1") + k for k in range(16)]
    assert all(s.vip in Topo().vip_route for s in services)
    assert len({s.name for s in services}) == 16


def test_the_plan_refuses_what_a_service_cannot_hold():
    with pytest.raises(ValueError):
        pt.plan(10, per_service=65)
    with pytest.raises(ValueError):
        pt.plan(0)


def test_cpu_comes_from_utime_and_stime_of_proc_stat_even_with_a_paren_in_the_name():
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    text = "4242 (py (edged) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 350 150 0 0 20 0 3 0 1\n"

    assert pt.stat_user_sys(text) == (350, 150)
    assert pt.stat_ticks(text) == 500
    # 250 ticks at 100 Hz over 10 s: 2.5 s of CPU, 25 % of one core
    assert pt.cpu_pct(1000, 1250, 10.0, 100) == pytest.approx(25.0)
    with pytest.raises(ValueError):
        pt.cpu_pct(0, 1, 0.0, 100)


def test_the_verdict_is_met_at_or_below_ten_percent():
    assert pt.verdict(10.0).startswith("met")
    assert pt.verdict(10.1).startswith("NOT met")
    assert pt.rate(100, 700, 2.0) == 300.0 and pt.rate(1, 2, 0.0) == 0.0
