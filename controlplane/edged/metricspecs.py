"""Every metric family edged exports, declared once: name as scraped (counters end in _total),
kind, help text and labels. metrics.py fills them at scrape time; refdoc writes docs/metrics.md
from this list, and a test holds it to a real scrape."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

BE = ("service", "backend")


@dataclass(frozen=True)
class Spec:
    """One metric family: name as scraped (counters end in _total), kind, help, labels."""

    name: str
    kind: str
    doc: str
    labels: tuple[str, ...] = ()

    def family(self) -> Metric:
        labels = list(self.labels)
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.doc, labels=labels)
        if self.kind == "gauge":
            return GaugeMetricFamily(self.name, self.doc, labels=labels)
        if self.kind == "histogram":
            return HistogramMetricFamily(self.name, self.doc, labels=labels)
        if self.kind == "info":
            return InfoMetricFamily(self.name.removesuffix("_info"), self.doc, labels=labels)
        raise ValueError(f"unknown metric kind {self.kind!r}")


METRICS = (
    # from the maps, read at scrape time
    Spec("edge_packets_total", "counter", "Client-to-backend packets forwarded", BE),
    Spec("edge_bytes_total", "counter", "L3 bytes of the forwarded client-to-backend packets", BE),
    Spec("edge_new_flows_total", "counter", "Flows (conntrack misses) that were sent to this backend", BE),
    Spec("edge_return_packets_total", "counter", "Backend-to-client packets reverse-NATed", BE),
    Spec("edge_failovers_total", "counter", "New flows this backend took because their Maglev pick was unusable", BE),
    Spec(
        "edge_drops_total",
        "counter",
        'Packets the data path dropped, by service and reason (service "": before a service was known)',
        ("service", "reason"),
    ),
    Spec(
        "edge_verdicts_total",
        "counter",
        'Packets by the data path\'s verdict, by service (service "": no service known)',
        ("service", "verdict"),
    ),
    Spec("edge_backend_up", "gauge", "1 when the data path considers the backend usable for new flows", BE),
    Spec(
        "edge_backend_probe_down",
        "gauge",
        "1 while the backend's probes keep it out of new flows (probe.fall failed in a row), any weight policy",
        BE,
    ),
    Spec("edge_backend_weight", "gauge", "Weight the backend's slots in the active Maglev table were built with", BE),
    Spec("edge_backend_config_weight", "gauge", "Weight the config gives the backend", BE),
    Spec(
        "edge_backend_heartbeat_age_seconds",
        "gauge",
        "Time since the backend's last valid heartbeat (absent without heartbeats)",
        BE,
    ),
    # wire signals of real connections (edge_wire: log2 buckets of microseconds, in seconds)
    Spec(
        "edge_backend_handshake_seconds",
        "histogram",
        "Handshake RTT of client connections: SYN forwarded to SYN-ACK seen by the return path",
        BE,
    ),
    Spec(
        "edge_backend_first_byte_seconds",
        "histogram",
        "A connection's first request packet to the backend's first reply byte (about time to first token)",
        BE,
    ),
    Spec(
        "edge_backend_active_flows",
        "gauge",
        "Connections begun with a SYN and not yet ended by FIN or RST (LRU evictions not counted)",
        BE,
    ),
    # what edged measured, in the snapshot (absent when unknown)
    Spec(
        "edge_backend_rtt_smoothed_seconds",
        "gauge",
        "Smoothed probe RTT (weighed with weights.jump_pct 0; else the steady RTT, shown in the reason)",
        BE,
    ),
    Spec("edge_backend_queue_waiting", "gauge", "Requests waiting in the backend's queue, as it reports", BE),
    Spec("edge_backend_queue_running", "gauge", "Requests the backend is running, as it reports", BE),
    Spec("edge_backend_kv_cache_usage_ratio", "gauge", "KV-cache use the backend reports, 0..1", BE),
    Spec("edge_backend_hung", "gauge", "1 when work is outstanding and the engine makes no progress", BE),
    Spec(
        "edge_backend_probe_interval_seconds",
        "gauge",
        "Interval of the backend's health probes now: probe.interval_ms, or probe.relaxed_interval_ms "
        "while real traffic measures it (adaptive probing)",
        BE,
    ),
    Spec(
        "edge_backend_probe_relaxed",
        "gauge",
        "1 while the backend's health probes run at the relaxed interval (adaptive probing)",
        BE,
    ),
    # kept by Observer
    Spec("edge_backend_rtt_seconds", "histogram", "RTT of successful probes", BE),
    Spec("edge_probes_total", "counter", "Probes of the backend, by result", BE + ("result",)),
    Spec(
        "edge_sla_windows_total",
        "counter",
        "Probe windows judged against the service's sla.p99_rtt_ms (windows with a successful probe)",
        ("service",),
    ),
    Spec(
        "edge_sla_violations_total",
        "counter",
        "Probe windows whose p99 RTT was over the service's sla.p99_rtt_ms",
        ("service",),
    ),
    Spec("edge_weight_pushes_total", "counter", "Maglev table rebuilds with new computed weights", ("service",)),
    # discovery (services with a discovery section, from the snapshot)
    Spec(
        "edge_discovery_failures_total",
        "counter",
        "Answers of the service's discovery source that failed (down, timeout, garbage, empty)",
        ("service", "source"),
    ),
    Spec(
        "edge_discovery_age_seconds",
        "gauge",
        "Age of the discovered set (0 while a watch is up); absent before the first good answer",
        ("service", "source"),
    ),
    Spec("edge_discovery_backends", "gauge", "Backends in the last known good discovered set", ("service", "source")),
    # the fleet (node.fleet, from the snapshot)
    Spec("edge_fleet_connected", "gauge", "1 while this node reaches the fleet's etcd; 0: it keeps its last snapshot"),
    Spec("edge_fleet_leader", "gauge", "1 while this node is the fleet's leader"),
    Spec("edge_fleet_snapshot_version", "gauge", "Version of the fleet snapshot this node applied (0: none yet)"),
    Spec("edge_fleet_faults_total", "counter", "Fleet sessions that ended in a fault (etcd lost, a call failed)"),
    Spec(
        "edge_fleet_refused_total",
        "counter",
        "Documents read from the fleet's etcd prefix and refused (garbage, not from the leader, unsafe weights)",
    ),
    # the prober's budget (node.probe_budget, from the snapshot)
    Spec(
        "edge_probe_budget_per_second",
        "gauge",
        "Probes a second edged starts at most now: node.probe_budget, lower while probes take over half of its loop (0: no budget)",
    ),
    Spec("edge_probe_demand_per_second", "gauge", "Probes and scrapes a second the configured intervals ask for now"),
    Spec(
        "edge_probe_shortfall_ratio",
        "gauge",
        "Share of the asked-for probes not run for the budget (0: none); every interval is stretched by 1 / (1 - this)",
    ),
    # the BGP speaker (node.bgp, from the snapshot)
    Spec(
        "edge_bgp_speaker_up",
        "gauge",
        "1 while bird runs and announces what edged decided; 0: it failed "
        "(everything withdrawn) and edged is restarting or retrying it",
    ),
    Spec("edge_bgp_speaker_restarts_total", "counter", "Times edged started bird again after it died"),
    # of the exporter itself
    Spec(
        "edge_conntrack_entries",
        "gauge",
        "Connections the data path tracks (edge_ct), counted by walking the table at most every 30 s",
    ),
    Spec("edge_conntrack_capacity", "gauge", "Entries edge_ct holds before its LRU evicts (node.ct_size)"),
    Spec(
        "edge_half_open_entries",
        "gauge",
        "TCP connections between the SYN and the client's ACK (edge_half_open, edge_half_open6; not in "
        "edge_conntrack_entries), counted with it",
    ),
    Spec(
        "edge_scrape_walk_complete",
        "gauge",
        "1 when this scrape's walk of the maps read them all; 0: it stopped at its deadline "
        "and the series of what it did not reach are absent (edgectl status says what it cut)",
    ),
    Spec("edge_info", "info", "edged's version, interface and data-path ABI", ("version", "iface", "abi")),
    Spec("edge_scrape_errors_total", "counter", "Scrapes that could not read the data path's maps"),
    Spec(
        "edge_datapath_up",
        "gauge",
        "1 while edged finds its data path whole (XDP and return path attached, maps pinned), else 0",
    ),
    Spec("edge_map_errors_total", "counter", "Failed reads or writes of a map by edged's loops", ("map",)),
)
