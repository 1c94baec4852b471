"""controlplane.config: defaults, a full round trip, files and YAML, and garbage in; the valid
document and the editing helpers test_config_errors.py (every one-line error) builds on.
"""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

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
from controlplane.tests.configstage import DELETE, TLS, edited, valid_doc

REPO = Path(__file__).resolve().parents[2]
EDGE_YAML = REPO / "edge" / "edge.yaml"
TEST_NET = IPv4Network("198.18.0.0/15")

# Every section dataclass; its fields are the YAML keys of that section.
SECTIONS = (Config, Node, ApiTls, Service, Backend, Health, Heartbeat, Passive, Probe, MetricsScrape, Weights)


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
                new_flows="least_loaded",  # new_flows auto: load scrapes, no BGP, no fleet
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
                new_flows="maglev",  # new_flows auto without load scrapes
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
                new_flows="maglev",  # new_flows auto without load scrapes
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
    missing = [
        f"{cls.__name__}.{f.name}" for cls in SECTIONS for f in dataclasses.fields(cls) if not f.metadata.get("help")
    ]
    assert missing == []


def test_config_is_frozen():
    config = parse_config(valid_doc())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.services[0].backends[0].port = 1  # type: ignore[misc]


def test_config_error_is_an_edge_error_and_one_line():
    error = ConfigError("first\n  second\r\nthird")
    assert isinstance(error, EdgeError)
    assert str(error) == "first second third"


# ---- files and YAML ----

LINE_2_DUPLICATE = "version: 1\nversion: 1\n"

YAML_CASES = [
    (
        "syntax error",
        "version: 1\nservices:\n  - name: chat\n    vip: a: b\n",
        " line 4: mapping values are not allowed here",
    ),
    ("duplicate key", LINE_2_DUPLICATE, " line 2: duplicate key 'version'"),
    (
        "tab indentation",
        "version: 1\nservices:\n\t- name: x\n",
        " line 3: found character '\\t' that cannot start any token",
    ),
    ("unclosed list", "version: 1\nservices: [\n", " line 3: expected the node content, but found '<stream end>'"),
    (
        "two documents",
        "version: 1\n---\nversion: 1\n",
        " line 2: expected a single document in the stream, but found another document",
    ),
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
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner)
        | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6) | st.integers() | st.none(), inner, max_size=5)
    ),
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
        "version: 1\n",
        "services:\n",
        "  - ",
        "    ",
        "name: chat\n",
        "vip: 198.18.255.1\n",
        "port: 8000\n",
        "backends:\n",
        "{",
        "}",
        "[",
        "]",
        ": ",
        ", ",
        "- ",
        "&a ",
        "*a",
        "<<: *a\n",
        "!!binary ",
        "!!set ",
        "!!python/name:os.system ",
        "'",
        '"',
        "\t",
        "\n",
        "---\n",
        "...\n",
        "? ",
        "|\n",
        "0x",
        "1" * 5000,
        "2024-13-45",
        "~",
        "yes",
        ".nan",
        "\x00",
        "\ufeff",
        "%YAML 1.1\n",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_yaml_bits | st.text(max_size=5), max_size=25).map("".join))
def test_garbage_yaml_files_only_raise_config_error(tmp_path, text):
    path = tmp_path / "edge.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _parses_or_config_error(lambda: load_config(path))


def _preset(node: dict | None = None, **service: Any) -> str:
    """new_flows as parse_config resolves it for one service with load scrapes (unless service says)."""
    svc = {
        "name": "chat",
        "vip": "198.18.255.1",
        "port": 8000,
        "health": {"metrics": {}},
        "backends": [{"name": "b0", "address": "198.18.1.2", "port": 8000}],
        **service,
    }
    doc = {"version": 1, "services": [{k: v for k, v in svc.items() if v is not DELETE}]}
    if node:
        doc["node"] = node
    return parse_config(doc).services[0].new_flows


BGP = {"bgp": {"local_as": 65001, "peers": [{"address": "198.18.0.1", "remote_as": 65000}]}}
FLEET = {"fleet": {"etcd": ["127.0.0.1:2379"], "name": "n1"}}


def test_new_flows_auto_is_least_loaded_for_a_scraped_service_on_a_lone_router_else_maglev():
    assert _preset() == "least_loaded"  # load scrapes, no BGP, no fleet: no other router shares the VIP
    assert _preset(BGP) == "maglev"  # announced: ECMP may spread its flows over routers that must agree
    assert _preset(FLEET) == "maglev"
    assert _preset(health=DELETE) == "maglev"  # no scrapes, no slots
    assert _preset(health={"probe": {}}) == "maglev"
    assert _preset(new_flows="auto") == "least_loaded"
    for explicit in ("maglev", "two_choices", "least_loaded"):  # an explicit value stays
        assert _preset(new_flows=explicit) == explicit
        assert _preset(BGP, new_flows=explicit) == explicit
