"""The config tests' stage (test_config*.py): a valid document with every section (valid_doc),
edits of it by path (edited, DELETE), and the one-line error a document gets (error_of).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from controlplane.config import parse_config
from controlplane.errors import ConfigError

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
                    "passive": {
                        "syn_timeout_ms": 200,
                        "consecutive": 3,
                        "ejection_ms": 1000,
                        "max_ejected_percent": 50,
                    },
                    "probe": {
                        "kind": "http",
                        "path": "/v2/health/ready",
                        "interval_ms": 100,
                        "timeout_ms": 50,
                        "window": 10,
                    },
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


def error_of(doc: object) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    return str(caught.value)
