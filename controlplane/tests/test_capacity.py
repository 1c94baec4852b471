"""The capacity defaults (maglev_m, max_services, max_backends, ct_size) are declared once, in
config.py's Node: the loader's Params take them from there, the C side gets every size as a -D
flag (maps.h has no defaults of its own and refuses to compile without one), and edge/edge.yaml
shows the same values."""

from __future__ import annotations

import re
from dataclasses import asdict, fields
from pathlib import Path

from controlplane import loader
from controlplane.config import Node, load_config

REPO = Path(__file__).resolve().parents[2]
MAPS_H = REPO / "bpf" / "include" / "maps.h"
SIZES = ("maglev_m", "max_services", "max_backends", "ct_size")
DEFINE_OF = {
    "maglev_m": "EDGE_MAGLEV_M",
    "max_services": "EDGE_MAX_SERVICES",
    "max_backends": "EDGE_MAX_BACKENDS",
    "ct_size": "EDGE_CT_SIZE",
}
REQUIRED = re.compile(r"^#ifndef\s+(EDGE_\w+)\s*\n#error\b", re.M)
DEFAULTED = re.compile(r"^#ifndef\s+(EDGE_\w+)\s*\n#define\s+\1\b", re.M)


def test_the_loader_params_are_the_config_defaults():
    assert [f.name for f in fields(loader.Params)] == list(SIZES)
    assert asdict(loader.Params()) == {k: getattr(Node(), k) for k in SIZES}
    assert loader.Params.of(Node(maglev_m=1009, ct_size=4096)) == loader.Params(1009, 16, 1024, 4096)


def test_maps_h_takes_every_size_from_the_loader_and_has_no_default_of_its_own():
    text = MAPS_H.read_text()
    assert set(DEFINE_OF.values()) <= set(REQUIRED.findall(text))
    assert not set(DEFINE_OF.values()) & set(DEFAULTED.findall(text))
    flags = loader.cflags(Path("/sys/fs/bpf/x"), loader.Params(1009, 2, 3, 4096))
    assert {f"-D{DEFINE_OF[k]}={v}" for k, v in zip(SIZES, (1009, 2, 3, 4096))} <= set(flags)
    assert set(REQUIRED.findall(text)) <= {f[2:].split("=")[0] for f in flags if f.startswith("-D")}


def test_edge_yaml_shows_the_default_sizes():
    node = load_config(REPO / "edge" / "edge.yaml").node
    assert {k: getattr(node, k) for k in SIZES} == {k: getattr(Node(), k) for k in SIZES}
