"""edge/edge.yaml, the config a node gets: it loads, and it shows every key config.py declares.

The key list comes from walking config.py's dataclasses (dataclasses.fields, from
Config down), so a key added there without a line here fails this test.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import yaml

from controlplane.config import Config, load_config
from controlplane.refdoc import section_class

EDGE_YAML = Path(__file__).resolve().parents[2] / "edge" / "edge.yaml"


def declared_keys(cls: type = Config, prefix: str = "") -> set[str]:
    """Every key path config.py declares, e.g. services[].health.probe.kind."""
    hints = typing.get_type_hints(cls)
    keys = set()
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        keys.add(path)
        section = section_class(hints[f.name])
        if section is not None:
            is_list = typing.get_origin(hints[f.name]) is tuple
            keys |= declared_keys(section, f"{path}[]." if is_list else f"{path}.")
    return keys


def present_keys(doc, prefix: str = "") -> set[str]:
    """Every key path in a loaded YAML document, list items merged under []."""
    keys = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            path = f"{prefix}{key}"
            keys.add(path)
            if isinstance(value, list):
                for item in value:
                    keys |= present_keys(item, f"{path}[].")
            else:
                keys |= present_keys(value, f"{path}.")
    return keys


def test_edge_yaml_loads():
    config = load_config(EDGE_YAML)
    assert config.services and config.node.iface == "eth0"


def test_edge_yaml_shows_every_key_config_py_declares():
    """A key may be shown commented out (an option that needs files of the operator's, such as
    TLS): `  # key: value` lines count once uncommented, and the uncommented file must still load."""
    text = EDGE_YAML.read_text()
    shown = present_keys(yaml.safe_load(text))
    shown |= present_keys(yaml.safe_load(re.sub(r"^(\s*)# ([a-z_]+:)", r"\1\2", text, flags=re.M)))
    missing = sorted(declared_keys() - shown)
    assert not missing, f"edge/edge.yaml lacks {', '.join(missing)}: add each with a comment"


def test_the_walk_finds_nested_and_listed_sections():
    keys = declared_keys()
    assert {
        "version",
        "node.iface",
        "services[].backends[].token",
        "services[].health.probe.kind",
        "services[].sla.p99_rtt_ms",
        "services[].weights.slow_start_ms",
    } <= keys
