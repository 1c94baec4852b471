"""controlplane.agent.dsr.problems: the first thing a backend lacks for direct server return, as
one line, in the order the setup makes them (pure: a State in)."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv6Address

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


VIP6 = IPv6Address("2001:2:0:ffff::1")
READY6 = replace(READY, lo_addrs=frozenset({VIP6}), arp_ignore=0, arp_announce=0, rp_filter_all=1, advmss=1400)


def test_a_ready_ipv6_backend_has_no_problem_and_needs_no_arp_or_rp_filter():
    """IPv6-in-IPv6 (encap6.h): the VIP on lo and an advmss 100 below the link MTU; neither the ARP
    sysctls nor rp_filter matter (neighbour discovery does not answer for lo's addresses on a link)."""
    assert problems(READY6, VIP6) is None
    assert wanted_advmss(1500, 6) == 1400


@pytest.mark.parametrize(
    "change, line",
    [
        (
            {"decap_up": False},
            "decap: neither ip6tnl0 up (modprobe ip6_tunnel; ip link set ip6tnl0 up) nor dsr_decap "
            "attached to the IPv6 default route's device",
        ),
        ({"lo_addrs": frozenset({VIP})}, f"vip: {VIP6} is not on lo (ip addr add {VIP6}/128 dev lo)"),
        ({"advmss": 1440}, "advmss: the IPv6 default route's is 1440; want at most 1400 (link MTU 1500 - 100)"),
    ],
)
def test_each_missing_piece_of_an_ipv6_backend_is_named_in_one_line(change, line):
    got = problems(replace(READY6, **change), VIP6)
    assert got is not None and got.startswith(line) and "\n" not in got
