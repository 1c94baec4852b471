"""controlplane.config: defaults, a full round trip, every one-line error, and garbage in.

Error cases are a table: each edits one spot of a valid document (by its path,
written the way the error names it) and expects the exact message.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.config import (
    ApiTls,
    Backend,
    Config,
    Health,
    Heartbeat,
    MetricsScrape,
    Node,
    Passive,
    Probe,
    Service,
    Weights,
    load_config,
    parse_config,
)
from controlplane.errors import ConfigError, EdgeError

REPO = Path(__file__).resolve().parents[2]
EDGE_YAML = REPO / "edge" / "edge.yaml"
TEST_NET = IPv4Network("198.18.0.0/15")

# Every section dataclass; its fields are the YAML keys of that section.
SECTIONS = (Config, Node, ApiTls, Service, Backend, Health, Heartbeat, Passive, Probe, MetricsScrape, Weights)
TLS = {"cert": "/etc/edge/api.pem", "key": "/etc/edge/api.key", "client_ca": "/etc/edge/clients-ca.pem"}


def valid_doc() -> dict:
    """Three services: two share a VIP on different ports, one backend address serves two."""
    return {
        "version": 1,
        "node": {"maglev_m": 1009, "max_services": 4, "max_backends": 64},
        "services": [
            {
                "name": "chat",
                "vip": "198.18.255.1",
                "port": 8000,
                "protocol": "tcp",
                "existing_flows": "keep",
                "health": {
                    "heartbeat": {"port": 7946, "interval_ms": 1, "timeout_ms": 5, "rise": 3},
                    "passive": {"syn_timeout_ms": 200, "consecutive": 3, "ejection_ms": 1000, "max_ejected_percent": 50},
                    "probe": {"kind": "http", "path": "/v2/health/ready", "interval_ms": 100, "timeout_ms": 50, "window": 10},
                    "metrics": {"path": "/metrics", "interval_ms": 100, "stale_ms": 2000},
                },
                "weights": {"policy": "latency_inverse", "floor": 1, "max_ratio": 20, "hysteresis_pct": 10},
                "backends": [
                    {"name": "b0", "address": "198.18.1.2", "port": 8000, "token": "0x5eed0001"},
                    {"name": "b1", "address": "198.18.2.2", "port": 8000, "weight": 2, "token": 7},
                    {"name": "spare", "address": "198.18.3.2", "port": 8000, "standby": True, "token": 9},
                ],
            },
            {
                "name": "embed",
                "vip": "198.18.255.1",
                "port": 8001,
                "backends": [{"name": "e0", "address": "198.18.1.2", "port": 8001}],
            },
            {
                "name": "rerank",
                "vip": "198.18.255.2",
                "port": 8000,
                "protocol": "udp",
                "backends": [{"name": "r0", "address": "198.18.4.2", "port": 9000, "weight": 0}],
            },
        ],
    }


DELETE = object()
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def edited(doc: dict, edits: dict[str, Any]) -> dict:
    """A deep copy of doc with each path ("services[0].backends[1].port") set, or removed by DELETE."""
    doc = copy.deepcopy(doc)
    for path, value in edits.items():
        if isinstance(path, str):
            steps = [key if key else int(index) for key, index in _STEP.findall(path)]
        else:
            steps = [path]  # a non-string top-level key
        parent = doc
        for step in steps[:-1]:
            parent = parent[step]
        if value is DELETE:
            del parent[steps[-1]]
        else:
            parent[steps[-1]] = value
    return doc


def expected_full_config() -> Config:
    return Config(
        version=1,
        node=Node(maglev_m=1009, max_services=4, max_backends=64),
        services=(
            Service(
                name="chat",
                vip=IPv4Address("198.18.255.1"),
                port=8000,
                protocol="tcp",
                existing_flows="keep",
                health=Health(
                    heartbeat=Heartbeat(port=7946, interval_ms=1, timeout_ms=5, rise=3),
                    passive=Passive(syn_timeout_ms=200, consecutive=3, ejection_ms=1000, max_ejected_percent=50),
                    probe=Probe(kind="http", path="/v2/health/ready", interval_ms=100, timeout_ms=50, window=10),
                    metrics=MetricsScrape(path="/metrics", interval_ms=100, stale_ms=2000),
                ),
                weights=Weights(policy="latency_inverse", floor=1, max_ratio=20, hysteresis_pct=10),
                backends=(
                    Backend("b0", IPv4Address("198.18.1.2"), 8000, weight=1, standby=False, token=0x5EED0001),
                    Backend("b1", IPv4Address("198.18.2.2"), 8000, weight=2, standby=False, token=7),
                    Backend("spare", IPv4Address("198.18.3.2"), 8000, weight=1, standby=True, token=9),
                ),
            ),
            Service(
                name="embed",
                vip=IPv4Address("198.18.255.1"),
                port=8001,
                protocol="tcp",
                existing_flows="reselect",
                health=None,
                weights=Weights(),
                backends=(Backend("e0", IPv4Address("198.18.1.2"), 8001),),
            ),
            Service(
                name="rerank",
                vip=IPv4Address("198.18.255.2"),
                port=8000,
                protocol="udp",
                existing_flows="reselect",
                health=None,
                weights=Weights(),
                backends=(Backend("r0", IPv4Address("198.18.4.2"), 9000, weight=0),),
            ),
        ),
    )


def to_doc(value: Any) -> Any:
    """A config back into the plain YAML shape; None (absent) fields are left out."""
    if dataclasses.is_dataclass(value):
        return {
            f.name: to_doc(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, tuple):
        return [to_doc(item) for item in value]
    if isinstance(value, IPv4Address):
        return str(value)
    return value


def error_of(doc: object) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    return str(caught.value)


# ---- valid configs ----


def test_full_config_parses_into_the_expected_dataclasses():
    assert parse_config(valid_doc()) == expected_full_config()


def test_config_survives_a_round_trip_through_its_plain_form():
    config = parse_config(valid_doc())
    assert parse_config(to_doc(config)) == config


def test_minimal_config_gets_every_documented_default():
    config = parse_config(
        {
            "version": 1,
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "backends": [{"name": "b0", "address": "198.18.1.2", "port": 8000}],
                }
            ],
        }
    )

    assert config.node == Node(
        maglev_m=65537,
        max_services=16,
        max_backends=1024,
        ct_size=262144,
        pin_dir="/sys/fs/bpf/edge",
        api_socket="/run/edge/edged.sock",
        metrics_listen="127.0.0.1:9470",
        xdp_mode="native",
    )
    (service,) = config.services
    assert (service.protocol, service.existing_flows, service.health) == ("tcp", "reselect", None)
    assert service.weights == Weights(policy="static", floor=1, max_ratio=20, hysteresis_pct=10)
    assert service.backends == (
        Backend(name="b0", address=IPv4Address("198.18.1.2"), port=8000, weight=1, standby=False, token=None),
    )


def test_empty_health_sub_sections_get_their_defaults_and_absent_ones_are_off():
    doc = edited(valid_doc(), {"services[0].health": {"heartbeat": {}, "passive": {}, "probe": {}, "metrics": {}}})
    health = parse_config(doc).services[0].health
    assert health == Health(
        heartbeat=Heartbeat(port=7946, interval_ms=100, timeout_ms=300, rise=3),
        passive=Passive(syn_timeout_ms=200, consecutive=3, ejection_ms=1000, max_ejected_percent=50),
        probe=Probe(kind="tcp", path="/v2/health/ready", interval_ms=100, timeout_ms=50, window=10),
        metrics=MetricsScrape(path="/metrics", interval_ms=100, stale_ms=2000),
    )

    doc = edited(valid_doc(), {"services[0].health": {"probe": {}}})
    health = parse_config(doc).services[0].health
    assert (health.heartbeat, health.passive, health.metrics) == (None, None, None)


@pytest.mark.parametrize(
    "edits",
    [
        {"services[2].vip": "198.18.255.1"},  # same VIP and port as chat, but udp
        {"services[1].port": 8000, "services[1].protocol": "udp"},
        {"services[0].backends[1].address": "198.18.1.2", "services[0].backends[1].port": 8002},
        {"services[0].backends[0].token": "18446744073709551615"},
        {"services[0].backends[0].weight": 0, "services[0].backends[1].weight": 0},  # all draining
        {"node.maglev_m": 1000003, "node.max_services": 3, "node.max_backends": 5},
        {"node.metrics_listen": "[::1]:9470"},
        {"node.metrics_listen": "localhost:1"},
        {"node.api_group": "edge-ops"},
        {"node.api_group": 1000},
        {"node.api_listen": "[::]:9471", "node.api_tls": TLS},
    ],
    ids=lambda edits: ", ".join(f"{path}={value}" for path, value in edits.items()),
)
def test_accepted_edge_cases(edits):
    parse_config(edited(valid_doc(), edits))


def test_tcp_api_settings_parse_and_survive_a_round_trip():
    doc = edited(valid_doc(), {"node.api_group": "edge", "node.api_listen": "127.0.0.1:9471", "node.api_tls": TLS})
    config = parse_config(doc)
    assert (config.node.api_group, config.node.api_listen) == ("edge", "127.0.0.1:9471")
    assert config.node.api_tls == ApiTls(cert=TLS["cert"], key=TLS["key"], client_ca=TLS["client_ca"])
    assert parse_config(to_doc(config)) == config


def test_service_key_is_vip_port_protocol():
    service = parse_config(valid_doc()).services[2]
    assert service.key == (IPv4Address("198.18.255.2"), 8000, "udp")


def test_every_key_has_help_text():
    missing = [f"{cls.__name__}.{f.name}" for cls in SECTIONS for f in dataclasses.fields(cls) if not f.metadata.get("help")]
    assert missing == []


def test_config_is_frozen():
    config = parse_config(valid_doc())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.services[0].backends[0].port = 1  # type: ignore[misc]


def test_config_error_is_an_edge_error_and_one_line():
    error = ConfigError("first\n  second\r\nthird")
    assert isinstance(error, EdgeError)
    assert str(error) == "first second third"


# ---- one-line errors naming the path ----


class Case(NamedTuple):
    description: str
    edits: dict
    message: str


SERVICE_KEYS = "name, vip, port, protocol, existing_flows, health, weights, sla, drain_timeout_ms, discovery, backends"
BACKEND_KEYS = "name, address, port, weight, standby, token"
NO_BACKENDS = "none given (set backends, or discovery to find them at run time)"
NAME_RULE = "(1 to 31 of a-z 0-9 _ . -, starting with a letter or digit)"

ERROR_CASES = [
    # top level
    Case("version missing", {"version": DELETE}, "version: missing"),
    Case("version 2", {"version": 2}, "version: 2 is not supported (expected 1)"),
    Case("version as string", {"version": "1"}, "version: expected an integer, got '1'"),
    Case("version as float", {"version": 1.0}, "version: expected an integer, got 1.0"),
    Case("unknown top-level key", {"bogus": 1}, "bogus: unknown key (allowed: version, node, services)"),
    Case("unknown non-string key", {7: 1}, "7: unknown key (allowed: version, node, services)"),
    Case("services missing", {"services": DELETE}, "services: missing"),
    Case("services empty", {"services": []}, "services: must not be empty"),
    Case("services a mapping", {"services": {"chat": {}}}, "services: expected a list, got a mapping"),
    Case("service not a mapping", {"services[0]": "chat"}, "services[0]: expected a mapping, got 'chat'"),
    # node
    Case("node null", {"node": None}, "node: expected a mapping, got null"),
    Case(
        "node unknown key",
        {"node.maglev": 7},
        "node.maglev: unknown key (allowed: maglev_m, max_services, max_backends, ct_size, pin_dir, "
        "api_socket, api_group, api_listen, api_tls, metrics_listen, iface, xdp_mode, reply_xdp, bgp, fleet)",
    ),
    Case("fleet without etcd", {"node.fleet": {"name": "edge-1"}}, "node.fleet.etcd: missing"),
    Case("fleet bad name", {"node.fleet": {"etcd": ["127.0.0.1:2379"], "name": "Edge 1"}},
         "node.fleet.name: 'Edge 1' is not a name (1 to 31 of a-z 0-9 _ . -, starting with a letter or digit)"),
    Case("fleet stale_ms not above report_ms",
         {"node.fleet": {"etcd": ["127.0.0.1:2379"], "name": "edge-1", "stale_ms": 500}},
         "node.fleet.stale_ms: 500 must be greater than report_ms (1000)"),
    Case("iface not a name", {"node.iface": "eth 0"}, "node.iface: 'eth 0' is not an interface name"),
    Case("maglev_m not prime", {"node.maglev_m": 65536}, "node.maglev_m: 65536 is not prime"),
    Case("maglev_m too small", {"node.maglev_m": 1007}, "node.maglev_m: 1007 is out of range 1009..1000003"),
    Case("maglev_m too large", {"node.maglev_m": 1000033}, "node.maglev_m: 1000033 is out of range 1009..1000003"),
    Case("maglev_m as string", {"node.maglev_m": "65537"}, "node.maglev_m: expected an integer, got '65537'"),
    Case("max_services 0", {"node.max_services": 0}, "node.max_services: 0 is out of range 1..256"),
    Case("max_services 257", {"node.max_services": 257}, "node.max_services: 257 is out of range 1..256"),
    Case("max_backends 65537", {"node.max_backends": 65537}, "node.max_backends: 65537 is out of range 1..65536"),
    Case("ct_size too small", {"node.ct_size": 1023}, "node.ct_size: 1023 is out of range 1024..16777216"),
    Case("pin_dir relative", {"node.pin_dir": "edge"}, "node.pin_dir: expected an absolute path, got 'edge'"),
    Case("api_socket not a string", {"node.api_socket": 1}, "node.api_socket: expected a string, got 1"),
    Case(
        "metrics_listen without port",
        {"node.metrics_listen": "127.0.0.1"},
        "node.metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9470), got '127.0.0.1'",
    ),
    Case(
        "metrics_listen port 70000",
        {"node.metrics_listen": "127.0.0.1:70000"},
        "node.metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9470), got '127.0.0.1:70000'",
    ),
    Case(
        "metrics_listen bare IPv6",
        {"node.metrics_listen": "::1:9470"},
        "node.metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9470), got '::1:9470'",
    ),
    Case(
        "api_listen without api_tls",
        {"node.api_listen": "0.0.0.0:9471"},
        "node.api_listen: TCP is served only with mutual TLS; set node.api_tls (cert, key, client_ca)",
    ),
    Case(
        "api_tls without api_listen",
        {"node.api_tls": TLS},
        "node.api_tls: set, but node.api_listen is not (TLS is for the TCP listener; the unix socket needs none)",
    ),
    Case(
        "api_listen not HOST:PORT",
        {"node.api_listen": "9471", "node.api_tls": TLS},
        "node.api_listen: expected HOST:PORT (e.g. 127.0.0.1:9470), got '9471'",
    ),
    Case(
        "api_tls without client_ca",
        {"node.api_listen": "0.0.0.0:9471", "node.api_tls": {"cert": "/a.pem", "key": "/a.key"}},
        "node.api_tls.client_ca: missing",
    ),
    Case(
        "api_tls relative cert",
        {"node.api_listen": "0.0.0.0:9471", "node.api_tls": {**TLS, "cert": "api.pem"}},
        "node.api_tls.cert: expected an absolute path, got 'api.pem'",
    ),
    Case(
        "api_tls unknown key",
        {"node.api_listen": "0.0.0.0:9471", "node.api_tls": {**TLS, "ca": "/ca.pem"}},
        "node.api_tls.ca: unknown key (allowed: cert, key, client_ca)",
    ),
    Case("api_group not a name", {"node.api_group": "edge ops"}, "node.api_group: 'edge ops' is not a group name"),
    Case("api_group negative", {"node.api_group": -1}, "node.api_group: -1 is not a group id"),
    Case("api_group boolean", {"node.api_group": True}, "node.api_group: expected a string, got true"),
    Case("xdp_mode offload", {"node.xdp_mode": "offload"}, "node.xdp_mode: expected one of native, generic, got 'offload'"),
    Case(
        "more services than max_services",
        {"node.max_services": 2},
        "services: 3 services, more than node.max_services (2)",
    ),
    Case(
        "more backends than max_backends",
        {"node.max_backends": 4},
        "services: 5 backends in all services, more than node.max_backends (4)",
    ),
    # service
    Case("service unknown key", {"services[0].bogus": 1}, f"services[0].bogus: unknown key (allowed: {SERVICE_KEYS})"),
    Case(
        "service key with a space",
        {"services[0].bad key": 1},
        f"services[0].'bad key': unknown key (allowed: {SERVICE_KEYS})",
    ),
    Case("service name missing", {"services[0].name": DELETE}, "services[0].name: missing"),
    Case("service name upper case", {"services[0].name": "Chat"}, f"services[0].name: 'Chat' is not a name {NAME_RULE}"),
    Case("service name 33 chars", {"services[0].name": "a" * 33}, f"services[0].name: '{'a' * 33}' is not a name {NAME_RULE}"),
    Case("service name starts with dash", {"services[0].name": "-x"}, f"services[0].name: '-x' is not a name {NAME_RULE}"),
    Case("service name trailing newline", {"services[0].name": "x\n"}, f"services[0].name: 'x\\n' is not a name {NAME_RULE}"),
    Case("service name an integer", {"services[0].name": 7}, "services[0].name: expected a string, got 7"),
    Case("duplicate service name", {"services[1].name": "chat"}, "services[1].name: duplicate name 'chat'"),
    Case("vip missing", {"services[0].vip": DELETE}, "services[0].vip: missing"),
    Case("vip not an address", {"services[0].vip": "198.18.255.300"}, "services[0].vip: '198.18.255.300' is not an IPv4 address"),
    Case("vip with prefix length", {"services[0].vip": "198.18.255.1/32"}, "services[0].vip: '198.18.255.1/32' is not an IPv4 address"),
    Case("vip IPv6", {"services[0].vip": "2001:db8::1"}, "services[0].vip: IPv6 VIPs are not supported yet"),
    Case("vip an integer", {"services[0].vip": 3323134721}, "services[0].vip: expected an IPv4 address, got 3323134721"),
    Case("vip unspecified", {"services[0].vip": "0.0.0.0"}, "services[0].vip: 0.0.0.0 is the unspecified address"),
    Case("vip loopback", {"services[0].vip": "127.0.0.1"}, "services[0].vip: 127.0.0.1 is a loopback address"),
    Case("vip multicast", {"services[0].vip": "224.0.0.1"}, "services[0].vip: 224.0.0.1 is a multicast address"),
    Case("vip broadcast", {"services[0].vip": "255.255.255.255"}, "services[0].vip: 255.255.255.255 is a reserved address"),
    Case(
        "vip:port/protocol used twice",
        {"services[2].vip": "198.18.255.1", "services[2].protocol": "tcp"},
        "services[2].vip: 198.18.255.1:8000/tcp is already used by services[0]",
    ),
    Case("port missing", {"services[0].port": DELETE}, "services[0].port: missing"),
    Case("port 0", {"services[0].port": 0}, "services[0].port: 0 is not a port"),
    Case("port yes", {"services[0].port": True}, "services[0].port: expected an integer, got true"),
    Case("port float", {"services[0].port": 8000.0}, "services[0].port: expected an integer, got 8000.0"),
    Case("port string", {"services[0].port": "8000"}, "services[0].port: expected an integer, got '8000'"),
    Case("port huge", {"services[0].port": 2**100}, "services[0].port: a 101-bit integer is not a port"),
    Case("protocol sctp", {"services[0].protocol": "sctp"}, "services[0].protocol: expected one of tcp, udp, got 'sctp'"),
    Case("protocol upper case", {"services[0].protocol": "TCP"}, "services[0].protocol: expected one of tcp, udp, got 'TCP'"),
    Case(
        "existing_flows drop",
        {"services[0].existing_flows": "drop"},
        "services[0].existing_flows: expected one of reselect, keep, got 'drop'",
    ),
    # backends
    Case("backends missing", {"services[0].backends": DELETE}, f"services[0].backends: {NO_BACKENDS}"),
    Case("backends empty", {"services[0].backends": []}, f"services[0].backends: {NO_BACKENDS}"),
    Case("backends null", {"services[0].backends": None}, "services[0].backends: expected a list, got null"),
    Case("backend a string", {"services[0].backends[0]": "b0"}, "services[0].backends[0]: expected a mapping, got 'b0'"),
    Case(
        "backend unknown key",
        {"services[0].backends[1].bogus": 1},
        f"services[0].backends[1].bogus: unknown key (allowed: {BACKEND_KEYS})",
    ),
    Case("backend name missing", {"services[0].backends[0].name": DELETE}, "services[0].backends[0].name: missing"),
    Case("backend name invalid", {"services[0].backends[0].name": "B 0"}, f"services[0].backends[0].name: 'B 0' is not a name {NAME_RULE}"),
    Case("duplicate backend name", {"services[0].backends[1].name": "b0"}, "services[0].backends[1].name: duplicate name 'b0'"),
    Case("backend address missing", {"services[0].backends[0].address": DELETE}, "services[0].backends[0].address: missing"),
    Case(
        "backend address invalid",
        {"services[0].backends[0].address": "h100-a.example"},
        "services[0].backends[0].address: 'h100-a.example' is not an IPv4 address",
    ),
    Case(
        "backend address IPv6",
        {"services[0].backends[0].address": "2001:db8::2"},
        "services[0].backends[0].address: IPv6 backends are not supported yet",
    ),
    Case(
        "backend address:port used twice",
        {"services[0].backends[1].address": "198.18.1.2"},
        "services[0].backends[1].address: 198.18.1.2:8000 is already used by services[0].backends[0]",
    ),
    Case("backend port missing", {"services[0].backends[0].port": DELETE}, "services[0].backends[0].port: missing"),
    Case("backend port 70000", {"services[1].backends[0].port": 70000}, "services[1].backends[0].port: 70000 is not a port"),
    Case("backend port yes", {"services[1].backends[0].port": True}, "services[1].backends[0].port: expected an integer, got true"),
    Case("weight -1", {"services[0].backends[0].weight": -1}, "services[0].backends[0].weight: -1 is out of range 0..65535"),
    Case("weight 65536", {"services[0].backends[0].weight": 65536}, "services[0].backends[0].weight: 65536 is out of range 0..65535"),
    Case("weight true", {"services[0].backends[0].weight": True}, "services[0].backends[0].weight: expected an integer, got true"),
    Case("weight 1.5", {"services[0].backends[0].weight": 1.5}, "services[0].backends[0].weight: expected an integer, got 1.5"),
    Case("standby 'yes'", {"services[0].backends[0].standby": "yes"}, "services[0].backends[0].standby: expected true or false, got 'yes'"),
    Case("standby 1", {"services[0].backends[0].standby": 1}, "services[0].backends[0].standby: expected true or false, got 1"),
    Case(
        "token not a number",
        {"services[0].backends[0].token": "0xzz"},
        "services[0].backends[0].token: '0xzz' is not an integer (e.g. 0x5eed0001)",
    ),
    Case("token 0", {"services[0].backends[0].token": 0},
         "services[0].backends[0].token: 0 is not a token (it is what an unset field holds); use a random 64-bit value"),
    Case(
        "token shared by two backends",
        {"services[0].backends[1].token": "0x5eed0001"},
        "services[0].backends[1].token: the same as services[0].backends[0].token; each backend needs its own "
        "(one backend's token must not make heartbeats for another)",
    ),
    Case("token negative", {"services[0].backends[0].token": -1}, "services[0].backends[0].token: -1 is out of range 0..2**64-1"),
    Case(
        "token 2**64",
        {"services[0].backends[0].token": 2**64},
        "services[0].backends[0].token: a 65-bit integer is out of range 0..2**64-1",
    ),
    Case(
        "token string over 64 bits",
        {"services[0].backends[0].token": "0x10000000000000000"},
        "services[0].backends[0].token: '0x10000000000000000' is out of range 0..2**64-1",
    ),
    Case(
        "token float",
        {"services[0].backends[0].token": 1.5},
        "services[0].backends[0].token: expected an integer or a string like '0x5eed0001', got 1.5",
    ),
    Case(
        "token true",
        {"services[0].backends[0].token": True},
        "services[0].backends[0].token: expected an integer or a string like '0x5eed0001', got true",
    ),
    Case(
        "no primary backend",
        {"services[1].backends[0].standby": True},
        "services[1].backends: service 'embed' has no primary backend (all are standby)",
    ),
    # health
    Case("health null", {"services[0].health": None}, "services[0].health: expected a mapping, got null"),
    Case(
        "health unknown section",
        {"services[0].health.active": {}},
        "services[0].health.active: unknown key (allowed: heartbeat, passive, probe, metrics, panic_percent)",
    ),
    Case("heartbeat null", {"services[0].health.heartbeat": None}, "services[0].health.heartbeat: expected a mapping, got null"),
    Case(
        "heartbeat unknown key",
        {"services[0].health.heartbeat.interval": 1},
        "services[0].health.heartbeat.interval: unknown key (allowed: port, interval_ms, timeout_ms, rise)",
    ),
    Case(
        "heartbeat port 0",
        {"services[0].health.heartbeat.port": 0},
        "services[0].health.heartbeat.port: 0 is not a port",
    ),
    Case(
        "heartbeat interval 0",
        {"services[0].health.heartbeat.interval_ms": 0},
        "services[0].health.heartbeat.interval_ms: 0 is out of range 1..3600000",
    ),
    Case(
        "heartbeat timeout equal to interval",
        {"services[0].health.heartbeat.timeout_ms": 1},
        "services[0].health.heartbeat.timeout_ms: 1 must be greater than interval_ms (1)",
    ),
    Case(
        "heartbeat rise 0",
        {"services[0].health.heartbeat.rise": 0},
        "services[0].health.heartbeat.rise: 0 is out of range 1..100",
    ),
    Case(
        "passive percent 101",
        {"services[0].health.passive.max_ejected_percent": 101},
        "services[0].health.passive.max_ejected_percent: 101 is out of range 0..100",
    ),
    Case(
        "passive consecutive 0",
        {"services[0].health.passive.consecutive": 0},
        "services[0].health.passive.consecutive: 0 is out of range 1..1000",
    ),
    Case(
        "passive syn timeout 0",
        {"services[0].health.passive.syn_timeout_ms": 0},
        "services[0].health.passive.syn_timeout_ms: 0 is out of range 1..3600000",
    ),
    Case(
        "probe kind icmp",
        {"services[0].health.probe.kind": "icmp"},
        "services[0].health.probe.kind: expected one of tcp, http, grpc, got 'icmp'",
    ),
    Case(
        "probe path relative",
        {"services[0].health.probe.path": "health"},
        "services[0].health.probe.path: expected a URL path starting with '/', got 'health'",
    ),
    Case(
        "probe path with a space",
        {"services[0].health.probe.path": "/a b"},
        "services[0].health.probe.path: expected a URL path starting with '/', got '/a b'",
    ),
    Case(
        "probe timeout longer than interval",
        {"services[0].health.probe.timeout_ms": 101},
        "services[0].health.probe.timeout_ms: 101 must not be greater than interval_ms (100)",
    ),
    Case(
        "probe window 0",
        {"services[0].health.probe.window": 0},
        "services[0].health.probe.window: 0 is out of range 1..1000",
    ),
    Case(
        "metrics stale not after interval",
        {"services[0].health.metrics.stale_ms": 100},
        "services[0].health.metrics.stale_ms: 100 must be greater than interval_ms (100)",
    ),
    Case(
        "metrics path not a string",
        {"services[0].health.metrics.path": ["/metrics"]},
        "services[0].health.metrics.path: expected a string, got a list",
    ),
    # weights
    Case(
        "smoothing unknown",
        {"services[0].weights.smoothing": "median"},
        "services[0].weights.smoothing: expected one of peak_ewma, ewma, got 'median'",
    ),
    Case("weights null", {"services[0].weights": None}, "services[0].weights: expected a mapping, got null"),
    Case(
        "weights unknown key",
        {"services[0].weights.ewma": 0.5},
        "services[0].weights.ewma: unknown key (allowed: policy, floor, max_ratio, hysteresis_pct, "
        "smoothing, decay_ms, spike_filter, rtt_offset_ms, load_aware, hung_ms, slow_start_ms, wire)",
    ),
    Case(
        "weights policy random",
        {"services[0].weights.policy": "random"},
        "services[0].weights.policy: expected one of static, latency_inverse, got 'random'",
    ),
    Case("weights floor 0", {"services[0].weights.floor": 0}, "services[0].weights.floor: 0 is out of range 1..65535"),
    Case("weights max_ratio 0", {"services[0].weights.max_ratio": 0}, "services[0].weights.max_ratio: 0 is out of range 1..65535"),
    Case(
        "weights hysteresis 101",
        {"services[0].weights.hysteresis_pct": 101},
        "services[0].weights.hysteresis_pct: 101 is out of range 0..100",
    ),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda case: case.description)
def test_invalid_config_is_one_line_naming_the_path(case):
    message = error_of(edited(valid_doc(), case.edits))
    assert message == case.message
    assert "\n" not in message


def test_error_descriptions_are_unique():
    descriptions = [case.description for case in ERROR_CASES]
    assert len(descriptions) == len(set(descriptions))


def test_service_with_more_backends_than_the_data_path_scans_is_rejected():
    backends = [{"name": f"b{i}", "address": "198.18.1.2", "port": 10000 + i} for i in range(65)]
    doc = edited(valid_doc(), {"services[1].backends": backends, "node.max_backends": 2000})
    assert error_of(doc) == "services[1].backends: 65 backends; at most 64 per service"


def test_backend_endpoint_serving_two_services_is_rejected():
    doc = edited(valid_doc(), {"services[1].backends[0].port": 8000})
    assert error_of(doc) == (
        "services[1].backends[0]: 198.18.1.2:8000/tcp already serves services[0]; in NAT mode a backend "
        "endpoint serves one service (its replies say which VIP they belong to)"
    )


def test_heartbeats_need_every_backend_token():
    doc = edited(valid_doc(), {"services[0].backends[2].token": DELETE})
    assert error_of(doc) == (
        "services[0].backends[2].token: required when services[0].health.heartbeat is set "
        "(heartbeats without the backend's token are rejected)"
    )


@pytest.mark.parametrize(
    "doc, message",
    [
        (None, "config: <config> is empty"),
        ([], "config: <config>: expected a mapping at the top level, got a list"),
        ("version: 1", "config: <config>: expected a mapping at the top level, got a string"),
    ],
    ids=["null", "list", "string"],
)
def test_document_that_is_not_a_mapping(doc, message):
    assert error_of(doc) == message


# ---- files and YAML ----

LINE_2_DUPLICATE = "version: 1\nversion: 1\n"

YAML_CASES = [
    ("syntax error", "version: 1\nservices:\n  - name: chat\n    vip: a: b\n", " line 4: mapping values are not allowed here"),
    ("duplicate key", LINE_2_DUPLICATE, " line 2: duplicate key 'version'"),
    ("tab indentation", "version: 1\nservices:\n\t- name: x\n", " line 3: found character '\\t' that cannot start any token"),
    ("unclosed list", "version: 1\nservices: [\n", " line 3: expected the node content, but found '<stream end>'"),
    ("two documents", "version: 1\n---\nversion: 1\n", " line 2: expected a single document in the stream, but found another document"),
    (
        "python tag",
        "version: !!python/object/apply:os.system ['true']\n",
        " line 1: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'",
    ),
    ("control character", "version: 1\nservices: \x00\n", " line 2: unacceptable character #x0000"),
    ("impossible date", "version: 2024-13-45\n", ": month must be in 1..12"),
    ("nested too deeply", "version: " + "[" * 5000 + "]" * 5000 + "\n", ": nested too deeply"),
    ("empty file", "", " is empty"),
    ("only a comment", "# nothing here\n", " is empty"),
    ("top-level list", "- version: 1\n", ": expected a mapping at the top level, got a list"),
]


@pytest.mark.parametrize("text, tail", [case[1:] for case in YAML_CASES], ids=[case[0] for case in YAML_CASES])
def test_bad_yaml_is_one_line_with_file_and_line(tmp_path, text, tail):
    path = tmp_path / "edge.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"config: {path}{tail}"


def test_yaml_yes_is_not_a_port(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_text(
        "version: 1\n"
        "services:\n"
        "  - {name: chat, vip: 198.18.255.1, port: 8000,\n"
        "     backends: [{name: b0, address: 198.18.1.2, port: yes}]}\n"
    )
    with pytest.raises(ConfigError, match=r"^services\[0\]\.backends\[0\]\.port: expected an integer, got true$"):
        load_config(path)


def test_integer_literal_over_python_digit_limit_is_a_config_error(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_text("version: " + "1" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"^config: .*edge\.yaml: "):
        load_config(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"config: cannot read {path}: No such file or directory"


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(str(tmp_path))
    assert str(caught.value) == f"config: {tmp_path} is not a regular file"


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_bytes(b"version: \xff\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"config: cannot read {path}: not UTF-8 (byte 9)"


def test_yaml_file_round_trip_matches_the_document(tmp_path):
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(valid_doc()))
    assert load_config(path) == expected_full_config()


def test_shipped_edge_yaml_loads_with_defaults_and_test_addresses():
    config = load_config(EDGE_YAML)

    # The node section shows the defaults, so it must be them; iface has none, so it shows one.
    assert dataclasses.replace(config.node, iface=None) == Node() and config.node.iface == "eth0"
    addresses = [s.vip for s in config.services] + [b.address for s in config.services for b in s.backends]
    assert addresses and all(address in TEST_NET for address in addresses)


# ---- garbage in: only ever ConfigError ----

_KEYS = sorted({f.name for cls in SECTIONS for f in dataclasses.fields(cls)})
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["198.18.255.1", "2001:db8::1", "0x5eed0001", "tcp", "static", "/x", "a:1", "chat"])
    | st.binary(max_size=4)
)
_garbage = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner)
    | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6) | st.integers() | st.none(), inner, max_size=5),
    max_leaves=30,
)


def _parses_or_config_error(call):
    try:
        result = call()
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert isinstance(result, Config)


@settings(max_examples=400, deadline=None)
@given(_garbage)
def test_garbage_documents_only_raise_config_error(doc):
    _parses_or_config_error(lambda: parse_config(doc))


def _spots(doc: Any, path: str = "") -> list[str]:
    """Every path in doc, written the way edited() takes them."""
    spots = [path] if path else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            spots += _spots(value, f"{path}.{key}" if path else key)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            spots += _spots(value, f"{path}[{i}]")
    return spots


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_spots(valid_doc())), _garbage | st.just(DELETE)), min_size=1, max_size=3))
def test_valid_document_with_garbage_in_it_only_raises_config_error(edits):
    doc = valid_doc()
    for path, value in edits:
        try:
            doc = edited(doc, {path: value})
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed or replaced this spot's parent
    _parses_or_config_error(lambda: parse_config(doc))


_yaml_bits = st.sampled_from(
    [
        "version: 1\n", "services:\n", "  - ", "    ", "name: chat\n", "vip: 198.18.255.1\n", "port: 8000\n",
        "backends:\n", "{", "}", "[", "]", ": ", ", ", "- ", "&a ", "*a", "<<: *a\n", "!!binary ", "!!set ",
        "!!python/name:os.system ", "'", '"', "\t", "\n", "---\n", "...\n", "? ", "|\n", "0x", "1" * 5000,
        "2024-13-45", "~", "yes", ".nan", "\x00", "\ufeff", "%YAML 1.1\n",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_yaml_bits | st.text(max_size=5), max_size=25).map("".join))
def test_garbage_yaml_files_only_raise_config_error(tmp_path, text):
    path = tmp_path / "edge.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _parses_or_config_error(lambda: load_config(path))
