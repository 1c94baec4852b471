"""controlplane.agent.dsr.problems: the first thing a backend lacks for direct server return, as
one line, in the order the setup makes them (pure: a State in)."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address

import pytest

from controlplane.agent.dsr import State, problems, wanted_advmss

VIP = IPv4Address("198.18.255.1")
READY = State(
    decap_up=True,
    lo_addrs=frozenset({VIP}),
    arp_ignore=1,
    arp_announce=2,
    rp_filter_all=0,
    rp_filter_decap=0,
    link_mtu=1500,
    advmss=1440,
)


def test_a_ready_backend_has_no_problem():
    assert problems(READY, VIP) is None
    assert problems(replace(READY, link_mtu=None, advmss=None), VIP) is None  # no default route: nothing to clamp
    assert wanted_advmss(9000) == 8940


@pytest.mark.parametrize(
    "change, line",
    [
        ({"decap_up": False}, "decap: neither tunl0 up"),
        ({"lo_addrs": frozenset()}, "vip: 198.18.255.1 is not on lo (ip addr add 198.18.255.1/32 dev lo)"),
        ({"arp_ignore": 0}, "arp: net.ipv4.conf.all.arp_ignore is 0 and arp_announce 2; want 1 and 2"),
        ({"arp_announce": 0}, "arp: "),
        ({"rp_filter_decap": 1}, "rp_filter: net.ipv4.conf.all and tunl0.rp_filter must be 0"),
        ({"rp_filter_all": 2}, "rp_filter: "),
        ({"advmss": None}, "advmss: the default route's is unset; want at most 1440 (link MTU 1500 - 60)"),
        ({"advmss": 1460}, "advmss: the default route's is 1460"),
        ({"decap_up": False, "lo_addrs": frozenset()}, "decap: "),  # the first missing, in setup's order
    ],
)
def test_each_missing_piece_is_named_in_one_line(change, line):
    got = problems(replace(READY, **change), VIP)
    assert got is not None and got.startswith(line) and "\n" not in got
