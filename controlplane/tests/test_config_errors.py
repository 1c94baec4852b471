"""controlplane.config's one-line errors: a table of cases, each editing one spot of the valid
document of test_config.py (by its path, written the way the error names it) and expecting the
exact message; and the documents that are no mapping at all.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from controlplane.config import parse_config
from controlplane.tests.configstage import DELETE, TLS, edited, error_of, valid_doc


class Case(NamedTuple):
    description: str
    edits: dict
    message: str


SERVICE_KEYS = "name, vip, port, protocol, existing_flows, forwarding, new_flows, health, weights, sla, drain_timeout_ms, discovery, backends"
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
        "api_socket, api_group, api_listen, api_tls, metrics_listen, probe_budget, iface, xdp_mode, reply_xdp, answer_ping, "
        "bgp, fleet)",
    ),
    Case("fleet without etcd", {"node.fleet": {"name": "edge-1"}}, "node.fleet.etcd: missing"),
    Case(
        "fleet bad name",
        {"node.fleet": {"etcd": ["127.0.0.1:2379"], "name": "Edge 1"}},
        "node.fleet.name: 'Edge 1' is not a name (1 to 31 of a-z 0-9 _ . -, starting with a letter or digit)",
    ),
    Case(
        "fleet stale_ms not above report_ms",
        {"node.fleet": {"etcd": ["127.0.0.1:2379"], "name": "edge-1", "stale_ms": 500}},
        "node.fleet.stale_ms: 500 must be greater than report_ms (1000)",
    ),
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
    Case(
        "xdp_mode offload",
        {"node.xdp_mode": "offload"},
        "node.xdp_mode: expected one of native, generic, got 'offload'",
    ),
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
    Case(
        "service name upper case", {"services[0].name": "Chat"}, f"services[0].name: 'Chat' is not a name {NAME_RULE}"
    ),
    Case(
        "service name 33 chars",
        {"services[0].name": "a" * 33},
        f"services[0].name: '{'a' * 33}' is not a name {NAME_RULE}",
    ),
    Case(
        "service name starts with dash", {"services[0].name": "-x"}, f"services[0].name: '-x' is not a name {NAME_RULE}"
    ),
    Case(
        "service name trailing newline",
        {"services[0].name": "x\n"},
        f"services[0].name: 'x\\n' is not a name {NAME_RULE}",
    ),
    Case("service name an integer", {"services[0].name": 7}, "services[0].name: expected a string, got 7"),
    Case("duplicate service name", {"services[1].name": "chat"}, "services[1].name: duplicate name 'chat'"),
    Case("vip missing", {"services[0].vip": DELETE}, "services[0].vip: missing"),
    Case(
        "vip not an address",
        {"services[0].vip": "198.18.255.300"},
        "services[0].vip: '198.18.255.300' is not an IPv4 or IPv6 address",
    ),
    Case(
        "vip with prefix length",
        {"services[0].vip": "198.18.255.1/32"},
        "services[0].vip: '198.18.255.1/32' is not an IPv4 or IPv6 address",
    ),
    Case(
        "vip IPv6 with IPv4 backends",
        {"services[0].vip": "2001:2::1"},
        "services[0].backends[0].address: 198.18.1.2 is IPv4 but the VIP 2001:2::1 is IPv6 "
        "(a service's VIP and backends are one family)",
    ),
    Case("vip IPv6 link-local", {"services[0].vip": "fe80::1"}, "services[0].vip: fe80::1 is a link-local address"),
    Case("vip IPv6 loopback", {"services[0].vip": "::1"}, "services[0].vip: ::1 is a loopback address"),
    Case("vip IPv6 multicast", {"services[0].vip": "ff02::1"}, "services[0].vip: ff02::1 is a multicast address"),
    Case(
        "vip an integer",
        {"services[0].vip": 3323134721},
        "services[0].vip: expected an IPv4 or IPv6 address, got 3323134721",
    ),
    Case("vip unspecified", {"services[0].vip": "0.0.0.0"}, "services[0].vip: 0.0.0.0 is the unspecified address"),
    Case("vip loopback", {"services[0].vip": "127.0.0.1"}, "services[0].vip: 127.0.0.1 is a loopback address"),
    Case("vip multicast", {"services[0].vip": "224.0.0.1"}, "services[0].vip: 224.0.0.1 is a multicast address"),
    Case(
        "vip broadcast",
        {"services[0].vip": "255.255.255.255"},
        "services[0].vip: 255.255.255.255 is a reserved address",
    ),
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
    Case(
        "protocol sctp", {"services[0].protocol": "sctp"}, "services[0].protocol: expected one of tcp, udp, got 'sctp'"
    ),
    Case(
        "protocol upper case",
        {"services[0].protocol": "TCP"},
        "services[0].protocol: expected one of tcp, udp, got 'TCP'",
    ),
    Case(
        "existing_flows drop",
        {"services[0].existing_flows": "drop"},
        "services[0].existing_flows: expected one of reselect, keep, got 'drop'",
    ),
    # backends
    Case("backends missing", {"services[0].backends": DELETE}, f"services[0].backends: {NO_BACKENDS}"),
    Case("backends empty", {"services[0].backends": []}, f"services[0].backends: {NO_BACKENDS}"),
    Case("backends null", {"services[0].backends": None}, "services[0].backends: expected a list, got null"),
    Case(
        "backend a string", {"services[0].backends[0]": "b0"}, "services[0].backends[0]: expected a mapping, got 'b0'"
    ),
    Case(
        "backend unknown key",
        {"services[0].backends[1].bogus": 1},
        f"services[0].backends[1].bogus: unknown key (allowed: {BACKEND_KEYS})",
    ),
    Case("backend name missing", {"services[0].backends[0].name": DELETE}, "services[0].backends[0].name: missing"),
    Case(
        "backend name invalid",
        {"services[0].backends[0].name": "B 0"},
        f"services[0].backends[0].name: 'B 0' is not a name {NAME_RULE}",
    ),
    Case(
        "duplicate backend name",
        {"services[0].backends[1].name": "b0"},
        "services[0].backends[1].name: duplicate name 'b0'",
    ),
    Case(
        "backend address missing",
        {"services[0].backends[0].address": DELETE},
        "services[0].backends[0].address: missing",
    ),
    Case(
        "backend address invalid",
        {"services[0].backends[0].address": "h100-a.example"},
        "services[0].backends[0].address: 'h100-a.example' is not an IPv4 or IPv6 address",
    ),
    Case(
        "backend address IPv6",
        {"services[0].backends[0].address": "2001:db8::2"},
        "services[0].backends[0].address: 2001:db8::2 is IPv6 but the VIP 198.18.255.1 is IPv4 "
        "(a service's VIP and backends are one family)",
    ),
    Case(
        "backend address:port used twice",
        {"services[0].backends[1].address": "198.18.1.2"},
        "services[0].backends[1].address: 198.18.1.2:8000 is already used by services[0].backends[0]",
    ),
    Case("backend port missing", {"services[0].backends[0].port": DELETE}, "services[0].backends[0].port: missing"),
    Case(
        "backend port 70000",
        {"services[1].backends[0].port": 70000},
        "services[1].backends[0].port: 70000 is not a port",
    ),
    Case(
        "backend port yes",
        {"services[1].backends[0].port": True},
        "services[1].backends[0].port: expected an integer, got true",
    ),
    Case(
        "weight -1",
        {"services[0].backends[0].weight": -1},
        "services[0].backends[0].weight: -1 is out of range 0..65535",
    ),
    Case(
        "weight 65536",
        {"services[0].backends[0].weight": 65536},
        "services[0].backends[0].weight: 65536 is out of range 0..65535",
    ),
    Case(
        "weight true",
        {"services[0].backends[0].weight": True},
        "services[0].backends[0].weight: expected an integer, got true",
    ),
    Case(
        "weight 1.5",
        {"services[0].backends[0].weight": 1.5},
        "services[0].backends[0].weight: expected an integer, got 1.5",
    ),
    Case(
        "standby 'yes'",
        {"services[0].backends[0].standby": "yes"},
        "services[0].backends[0].standby: expected true or false, got 'yes'",
    ),
    Case(
        "standby 1",
        {"services[0].backends[0].standby": 1},
        "services[0].backends[0].standby: expected true or false, got 1",
    ),
    Case(
        "token not a number",
        {"services[0].backends[0].token": "0xzz"},
        "services[0].backends[0].token: '0xzz' is not an integer (e.g. 0x5eed0001)",
    ),
    Case(
        "token 0",
        {"services[0].backends[0].token": 0},
        "services[0].backends[0].token: 0 is not a token (it is what an unset field holds); use a random 128-bit value",
    ),
    Case(
        "token shared by two backends",
        {"services[0].backends[1].token": "0x5eed0001"},
        "services[0].backends[1].token: the same as services[0].backends[0].token; each backend needs its own "
        "(one backend's token must not make heartbeats for another)",
    ),
    Case(
        "token negative",
        {"services[0].backends[0].token": -1},
        "services[0].backends[0].token: -1 is out of range 0..2**128-1",
    ),
    Case(
        "token 2**128",
        {"services[0].backends[0].token": 2**128},
        "services[0].backends[0].token: a 129-bit integer is out of range 0..2**128-1",
    ),
    Case(
        "token string over 128 bits",
        {"services[0].backends[0].token": "0x100000000000000000000000000000000"},
        "services[0].backends[0].token: '0x100000000000000000000000000000000' is out of range 0..2**128-1",
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
    Case(
        "heartbeat null",
        {"services[0].health.heartbeat": None},
        "services[0].health.heartbeat: expected a mapping, got null",
    ),
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
        "smoothing, decay_ms, spike_filter, steady_window, jump_pct, rtt_offset_ms, load_aware, load_model, hung_ms, slow_start_ms, wire)",
    ),
    Case(
        "weights policy random",
        {"services[0].weights.policy": "random"},
        "services[0].weights.policy: expected one of static, latency_inverse, got 'random'",
    ),
    Case("weights floor 0", {"services[0].weights.floor": 0}, "services[0].weights.floor: 0 is out of range 1..65535"),
    Case(
        "weights max_ratio 0",
        {"services[0].weights.max_ratio": 0},
        "services[0].weights.max_ratio: 0 is out of range 1..65535",
    ),
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


def _many_backends(n: int) -> list[dict]:
    return [{"name": f"b{i}", "address": f"198.18.{1 + i // 250}.{2 + i % 250}", "port": 9100} for i in range(n)]


def test_service_with_more_backends_than_the_data_path_scans_is_rejected():
    doc = edited(valid_doc(), {"services[1].backends": _many_backends(1025), "node.max_backends": 2000})
    assert error_of(doc) == "services[1].backends: 1025 backends; at most 1024 per service"


def test_a_thousand_backends_behind_one_vip_are_accepted():
    doc = edited(valid_doc(), {"services[1].backends": _many_backends(1024), "node.max_backends": 2000})
    assert len(parse_config(doc).services[1].backends) == 1024


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


def _ipv6_service(**extra) -> dict:
    service = {
        "name": "chat6",
        "vip": "2001:2::100",
        "port": 443,
        "backends": [
            {"name": "a", "address": "2001:2:0:1::2", "port": 8000},
            {"name": "b", "address": "2001:2:0:1::3", "port": 8000},
        ],
    }
    service.update(extra)
    return service


def test_ipv6_service_next_to_ipv4_services_is_accepted():
    doc = valid_doc()
    doc["services"].append(_ipv6_service(health={"passive": {}}))
    service = parse_config(doc).services[-1]
    assert (str(service.vip), service.vip.version) == ("2001:2::100", 6)
    assert [str(b.address) for b in service.backends] == ["2001:2:0:1::2", "2001:2:0:1::3"]


def test_ipv6_service_with_an_ipv4_backend_is_one_line_naming_it():
    doc = valid_doc()
    service = _ipv6_service()
    service["backends"][1]["address"] = "198.18.1.9"
    doc["services"].append(service)
    assert error_of(doc) == (
        f"services[{len(doc['services']) - 1}].backends[1].address: 198.18.1.9 is IPv4 but the VIP 2001:2::100 "
        "is IPv6 (a service's VIP and backends are one family)"
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"forwarding": "dsr", "health": {"passive": {}}},
            "health.passive: not with forwarding dsr (the router sees no replies)",
        ),
    ],
)
def test_ipv6_service_refuses_what_its_data_path_lacks(extra, message):
    doc = valid_doc()
    doc["services"].append(_ipv6_service(**extra))
    assert error_of(doc) == f"services[{len(doc['services']) - 1}].{message}"


def test_ipv6_service_with_dsr_is_accepted():
    """forwarding: dsr for an IPv6 VIP (encap6.h): refused before ("dsr is not supported for IPv6 VIPs yet")."""
    doc = valid_doc()
    doc["services"].append(_ipv6_service(forwarding="dsr", port=8000))
    assert parse_config(doc).services[-1].forwarding == "dsr"


def test_ipv6_service_with_heartbeats_is_accepted_and_wants_tokens():
    """Heartbeats of IPv6 backends (heartbeat6.h): refused before ("not supported for IPv6 VIPs yet")."""
    doc = valid_doc()
    doc["services"].append(_ipv6_service(health={"heartbeat": {"port": 7946}}))
    assert error_of(doc).endswith(
        "backends[0].token: required when services[3].health.heartbeat is set "
        "(heartbeats without the backend's token are rejected)"
    )
    for i, backend in enumerate(doc["services"][-1]["backends"]):
        backend["token"] = hex(0x6EED0000 + i)
    assert parse_config(doc).services[-1].health.heartbeat.port == 7946
