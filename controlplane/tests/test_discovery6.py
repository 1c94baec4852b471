"""Discovery of IPv6 backends, pure parts: AAAA and SRV config against the VIP's family, endpoint names
of IPv6 backends, the screen of discovered addresses, etcd values and the effective config.

The source against a real dnsmasq answering AAAA is netns-tests/test_discovery_dns6.py.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

import pytest

from controlplane.config import Backend, parse_backend, parse_config
from controlplane.discovery import endpoint_name
from controlplane.discovery.cache import merge, not_a_backend, screen
from controlplane.discovery.etcd import parse_value
from controlplane.errors import ConfigError

VIP6 = "2001:2:0:ffff::1"


def config(dns: dict, vip: str = VIP6):
    s = {"name": "chat", "vip": vip, "port": 8000, "discovery": {"dns": {"name": "chat.fleet.test.", **dns}}}
    return parse_config({"version": 1, "services": [s]})


def be6(address: str, port: int = 8000) -> Backend:
    return Backend(name=endpoint_name(address, port), address=IPv6Address(address), port=port)


@pytest.mark.parametrize("dns", [{"type": "AAAA", "port": 8000}, {"type": "SRV"}, {}])
def test_an_ipv6_service_discovers_by_aaaa_or_srv(dns):
    (s,) = config(dns).services
    assert s.discovery.dns.type == dns.get("type", "SRV") and s.vip.version == 6


@pytest.mark.parametrize(
    "vip, dns, error",
    [
        (
            VIP6,
            {"type": "A", "port": 8000},
            f"services[0].discovery.dns.type: A gives IPv4 addresses but the VIP {VIP6} is IPv6 (use AAAA)",
        ),
        (
            "198.18.255.1",
            {"type": "AAAA", "port": 8000},
            "services[0].discovery.dns.type: AAAA gives IPv6 addresses but the VIP 198.18.255.1 is IPv4 (use A)",
        ),
        (
            VIP6,
            {"type": "AAAA"},
            "services[0].discovery.dns.port: required when type is AAAA (AAAA records carry no port)",
        ),
    ],
)
def test_a_record_type_of_the_other_family_is_one_line_naming_it(vip, dns, error):
    with pytest.raises(ConfigError) as e:
        config(dns, vip)
    assert str(e.value) == error


@pytest.mark.parametrize(
    "address, port, name",
    [
        ("2001:2:0:1::2", 8000, "2001.2.0.1..2-8000"),
        ("2001:2:0:1:0:0:0:2", 8000, "2001.2.0.1..2-8000"),  # one endpoint, one name, however written
        ("fd00::5", 443, "fd00..5-443"),
        ("198.18.1.2", 8000, "198.18.1.2-8000"),
    ],
)
def test_endpoint_names_of_ipv6_backends_are_valid_backend_names(address, port, name):
    assert endpoint_name(address, port) == name
    b = parse_backend({"name": name, "address": address, "port": port}, "x")
    assert b.name == name


def test_an_ipv6_endpoint_too_long_for_a_name_gets_a_hashed_one_of_its_own():
    a = endpoint_name("2001:2:1234:5678:9abc:def0:1234:5678", 65535)
    b = endpoint_name("2001:2:1234:5678:9abc:def0:1234:5679", 65535)
    assert a != b and a.startswith("v6.") and a.endswith("-65535") and len(a) <= 31
    assert a == endpoint_name(IPv6Address("2001:2:1234:5678:9abc:def0:1234:5678"), 65535)
    parse_backend({"name": a, "address": "2001:2:1234:5678:9abc:def0:1234:5678", "port": 65535}, "x")


def test_no_discovered_ipv6_address_may_be_a_vip_link_local_or_loopback_but_unique_local_may():
    vips = {IPv6Address(VIP6), IPv4Address("198.18.255.1")}
    assert not_a_backend(IPv6Address(VIP6), vips) == f"{VIP6} is a VIP"
    assert not_a_backend(IPv6Address("fe80::1"), vips) == "fe80::1 is link-local"
    assert not_a_backend(IPv6Address("::1"), vips) == "::1 is loopback"
    assert not_a_backend(IPv6Address("::ffff:198.18.1.2"), vips) == "::ffff:c612:102 is an IPv4-mapped address"
    assert not_a_backend(IPv6Address("fec0::1"), vips) == "fec0::1 is site-local (deprecated)"
    assert not_a_backend(IPv6Address("fd12:3456::2"), vips) is None  # unique-local: IPv6's private range
    assert not_a_backend(IPv6Address("2001:2:0:1::2"), vips) is None
    bad = Backend(name="x", address=IPv6Address(VIP6), port=8000)
    assert screen((be6("2001:2:0:1::2"), bad), vips) == f"x: {VIP6} is a VIP"


def test_an_etcd_value_with_an_ipv6_address_becomes_a_backend_named_after_its_endpoint():
    b = parse_value(b"/edge/chat/a", b'{"address": "2001:2:0:1:0::2", "port": 8000, "weight": 2}')
    assert b == Backend(name="2001.2.0.1..2-8000", address=IPv6Address("2001:2:0:1::2"), port=8000, weight=2)
    with pytest.raises(ConfigError, match=r"etcd /edge/chat/a.address: fe80::1 is a link-local address"):
        parse_value(b"/edge/chat/a", b'{"address": "fe80::1", "port": 8000}')


def test_merge_takes_ipv6_backends_for_an_ipv6_service_and_refuses_ipv4_ones():
    cfg = config({"type": "AAAA", "port": 8000})
    out = merge(cfg, {"chat": (be6("2001:2:0:1::2"), be6("2001:2:0:2::2"))})
    assert [str(b.address) for b in out.services[0].backends] == ["2001:2:0:1::2", "2001:2:0:2::2"]
    four = Backend(name="198.18.1.2-8000", address=IPv4Address("198.18.1.2"), port=8000)
    with pytest.raises(ConfigError, match="is IPv4 but the VIP 2001:2:0:ffff::1 is IPv6"):
        merge(cfg, {"chat": (four,)})


def test_the_dns_source_of_an_ipv6_service_looks_up_srv_targets_by_aaaa():
    from controlplane.discovery.dns import DnsSource
    from controlplane.discovery.supervisor import make_source

    six = make_source(config({"type": "SRV"}).services[0])
    four = make_source(config({"type": "SRV"}, vip="198.18.255.1").services[0])
    assert isinstance(six, DnsSource) and (six.address_type, four.address_type) == ("AAAA", "A")


def test_discovered_ipv6_backends_of_a_service_with_a_secret_get_derived_tokens():
    """derive_token read every address as IPv4: an IPv6 service with token_secret_file raised
    AddressValueError for each answer, so it never got a backend."""
    from controlplane.discovery.cache import Cached, with_tokens
    from controlplane.discovery.tokens import derive_token

    secret = b"0123456789abcdef-secret"
    c = Cached("chat", "dns", watched=False, secret=secret)
    (b,) = with_tokens(c, (be6("2001:2:0:1::2"),))
    assert b.token == derive_token(secret, "2001:2:0:1::2", 8000) != derive_token(secret, "2001:2:0:1::3", 8000)
    assert derive_token(secret, "198.18.1.2", 8000) == derive_token(secret, IPv4Address("198.18.1.2"), 8000)


def test_an_answer_mixing_families_is_refused_by_the_config_check_not_a_type_error():
    """Sorting an answer of IPv4 and IPv6 backends raised TypeError ('not of the same version'):
    the failure said so instead of naming the backend of the wrong family."""
    from controlplane.discovery import Answer
    from controlplane.discovery.cache import Cached, offer

    cfg = config({"type": "AAAA", "port": 8000})
    four = Backend(name="198.18.1.2-8000", address=IPv4Address("198.18.1.2"), port=8000)
    c = Cached("chat", "etcd", watched=True)
    v = offer(c, Answer((be6("2001:2:0:1::2"), four)), now_s=1, fits=lambda bs: merge(cfg, {"chat": bs}))
    assert v.failed and "answer rejected" in c.error and "is IPv4 but the VIP 2001:2:0:ffff::1 is IPv6" in c.error
