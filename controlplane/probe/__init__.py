"""The probe engine: TCP connect, HTTP GET and gRPC health probes of every backend, and
scrapes of their Prometheus metrics, on the caller's asyncio loop (Prober, whose docstring
has the whole contract). Decides nothing about weights (weights.py) and touches no map.

metrics (the engines' metrics pages, pure), http (the HTTP/1.1 response reader, shared with
the heartbeat agent), checks (the check kinds), engine (targets, timer wheel, epoll).
"""

from controlplane.probe.checks import METRICS_RESPONSE_MAX, PROBE_RESPONSE_MAX, USER_AGENT
from controlplane.probe.engine import RECV_SIZE, TICK_S, Prober, Target
from controlplane.probe.metrics import SIGNALS, MetricsError, load_from, parse_metrics
from controlplane.signals import Load, Sample, Window

__all__ = [
    "Load", "METRICS_RESPONSE_MAX", "MetricsError", "PROBE_RESPONSE_MAX", "Prober", "RECV_SIZE",
    "SIGNALS", "Sample", "TICK_S", "Target", "USER_AGENT", "Window", "load_from", "parse_metrics",
]
