"""The probe engine: TCP connect, HTTP GET and gRPC health probes of every backend, and
scrapes of their Prometheus metrics, on the caller's asyncio loop (Prober, whose docstring
has the whole contract). Decides nothing about weights (weights.py) and touches no map.

metrics (the engines' metrics pages, pure), http (the HTTP/1.1 response reader, shared with
the heartbeat agent), checks (the check kinds), engine (targets, timer wheel, epoll).

The names below load their module on first use: the heartbeat agent imports probe.http
alone and so never loads the engine's dependencies (asyncio, config, numpy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "METRICS_RESPONSE_MAX": "checks",
    "PROBE_RESPONSE_MAX": "checks",
    "USER_AGENT": "checks",
    "RECV_SIZE": "engine",
    "TICK_S": "engine",
    "Prober": "engine",
    "Target": "engine",
    "SIGNALS": "metrics",
    "MetricsError": "metrics",
    "load_from": "metrics",
    "parse_metrics": "metrics",
    "Load": "samples",
    "Sample": "samples",
    "Window": "samples",
}
__all__ = [
    "Load",
    "METRICS_RESPONSE_MAX",
    "MetricsError",
    "PROBE_RESPONSE_MAX",
    "Prober",
    "RECV_SIZE",
    "SIGNALS",
    "Sample",
    "TICK_S",
    "Target",
    "USER_AGENT",
    "Window",
    "load_from",
    "parse_metrics",
]

if TYPE_CHECKING:
    from controlplane.probe.checks import METRICS_RESPONSE_MAX, PROBE_RESPONSE_MAX, USER_AGENT
    from controlplane.probe.engine import RECV_SIZE, TICK_S, Prober, Target
    from controlplane.probe.metrics import SIGNALS, MetricsError, load_from, parse_metrics
    from controlplane.samples import Load, Sample, Window


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    package = "controlplane" if module == "samples" else __name__
    value = getattr(importlib.import_module(f"{package}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
