"""edged's Prometheus metrics: a collector that reads the data path's counters
at scrape time, the few things only edged sees (RTT histograms, SLA windows,
probe and push counts, kept by Observer), served by metricsserver.py's endpoint.

It decides nothing and writes no map. The source is duck-typed: anything with
snapshot() -> dict shaped like maps.Maps.snapshot(), each backend optionally
carrying "edged" (what edged measured). metricspecs.METRICS is the list of names.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Iterator, Optional

from prometheus_client import ProcessCollector
from prometheus_client.core import (
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from controlplane import __version__, abi, gcpause, wiresignals
from controlplane.edged.metricspecs import METRICS
from controlplane.errors import EdgeError
from controlplane.samples import Sample, quantile

# 0.1 ms (a probe on the same rack) to 1 s (far beyond any probe timeout worth having).
RTT_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
CT_COUNT_EVERY_S = 30.0  # edge_conntrack_entries: a scrape walks the conntrack table at most this often
LOOP_TIMEOUT_S = 6.0  # LoopSource: longest a scrape waits for edged (its walks end within 5 s)

# ---------------------------------------------------------------- what edged observes


@dataclass
class _BackendStats:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(RTT_BUCKETS_S) + 1))  # last: above all
    rtt_sum_s: float = 0.0
    ok: int = 0
    failed: int = 0
    window: list[Optional[float]] = field(default_factory=list)  # the SLA window being filled
    window_size: int = 0


@dataclass
class _ServiceStats:
    sla: bool = False  # a sample came with an SLA target
    sla_windows: int = 0
    sla_violations: int = 0
    pushes: int = 0


@dataclass(frozen=True)
class Observed:
    """A consistent copy of what Observer holds, for one scrape."""

    rtt: dict[tuple[str, str], tuple[list[int], float]]  # cumulative bucket counts (last is +Inf), sum
    probes: dict[tuple[str, str], tuple[int, int]]  # ok, failed
    sla: dict[str, tuple[int, int]]  # windows, violations
    pushes: dict[str, int]
    map_errors: dict[str, int] = field(default_factory=dict)  # map name -> failures


class Observer:
    """What edged sees between scrapes: RTT histograms, SLA windows, probe and
    push counts. edged calls it from its asyncio loop; scrapes read it from
    the HTTP thread, so every method takes the lock.

    SLA window: `window` consecutive probe samples of one backend (ok or
    failed), not overlapping. A full window is judged by the p99 (nearest
    rank, as `edgectl status` shows it) of its successful RTTs: over the
    service's target, it counts one violation. Failed probes are counted by
    edge_probes_total, not here; a window without a successful probe is not
    judged. A change of window size starts a new window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[tuple[str, str], _BackendStats] = {}
        self._services: dict[str, _ServiceStats] = {}
        self._map_errors: dict[str, int] = {}

    def observe_sample(self, service: str, backend: str, sample: Sample, window: int, sla_p99_s: float | None) -> None:
        """One probe result. window: the service's probe.window (>= 1);
        sla_p99_s: its sla.p99_rtt_ms in seconds, or None without an SLA."""
        if window < 1:
            raise ValueError("window must be at least 1")
        rtt_s = sample.rtt_s if sample.ok else None
        with self._lock:
            b = self._backends.get((service, backend))  # built only when new: once per backend
            if b is None:
                b = self._backends[(service, backend)] = _BackendStats()
            svc = self._services.get(service)
            if svc is None:
                svc = self._services[service] = _ServiceStats()
            if sample.ok:
                b.ok += 1
            else:
                b.failed += 1
            if rtt_s is not None:
                b.buckets[bisect.bisect_left(RTT_BUCKETS_S, rtt_s)] += 1
                b.rtt_sum_s += rtt_s
            if window != b.window_size:
                b.window, b.window_size = [], window
            svc.sla = svc.sla or sla_p99_s is not None
            b.window.append(rtt_s)
            if len(b.window) < window:
                return
            p99 = quantile((r for r in b.window if r is not None), 0.99)
            b.window = []
            if sla_p99_s is not None and p99 is not None:
                svc.sla_windows += 1
                svc.sla_violations += p99 > sla_p99_s

    def probes(self, service: str, backend: str) -> tuple[int, int]:
        """(ok, failed) probes of one backend since edged started (or it was added)."""
        with self._lock:
            b = self._backends.get((service, backend))
            return (b.ok, b.failed) if b else (0, 0)

    def weight_pushed(self, service: str) -> None:
        """edged flipped service's table to newly computed weights."""
        with self._lock:
            self._services.setdefault(service, _ServiceStats()).pushes += 1

    def map_error(self, name: str) -> None:
        """A read or write of map name failed (the loop that met it goes on)."""
        with self._lock:
            self._map_errors[name] = self._map_errors.get(name, 0) + 1

    def retain(self, backends: Iterable[tuple[str, str]]) -> None:
        """Forgets backends (and services) not in backends: call on reload."""
        keep = set(backends)
        services = {s for s, _ in keep}
        with self._lock:
            self._backends = {k: v for k, v in self._backends.items() if k in keep}
            self._services = {k: v for k, v in self._services.items() if k in services}

    def read(self) -> Observed:
        with self._lock:
            rtt = {}
            for key, b in self._backends.items():
                cumulative, total = [], 0
                for n in b.buckets:
                    total += n
                    cumulative.append(total)
                rtt[key] = (cumulative, b.rtt_sum_s)
            return Observed(
                rtt=rtt,
                probes={key: (b.ok, b.failed) for key, b in self._backends.items()},
                sla={name: (s.sla_windows, s.sla_violations) for name, s in self._services.items() if s.sla},
                pushes={name: s.pushes for name, s in self._services.items()},
                map_errors=dict(self._map_errors),
            )


# ---------------------------------------------------------------- the collector


class EdgeCollector(Collector):
    """Reads source.snapshot() at every scrape and turns it, with what observer
    holds, into METRICS. A failing snapshot never fails the scrape: it counts
    edge_scrape_errors_total, calls on_error(one line) when the error is new
    (on the scrape thread), and the scrape carries everything that does not
    come from the maps."""

    def __init__(
        self,
        source,
        observer: Observer | None = None,
        iface: str = "",
        on_error: Callable[[str], None] | None = None,
        serving: Callable[[], bool] | None = None,
    ):
        self.source = source
        self.serving = serving  # edge_datapath_up; absent without it
        self.observer = observer or Observer()
        self.iface = iface
        self.on_error = on_error
        self._lock = threading.Lock()
        self._errors = 0
        self._last_error: str | None = None
        self._ct_entries: int | None = None  # the last complete count, and when it was asked for
        self._half_open_entries: int | None = None  # the half-open tables' count of that walk
        self._ct_at = -CT_COUNT_EVERY_S

    def describe(self) -> Iterator[Metric]:
        for spec in METRICS:
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        # the collector off while the snapshot's objects live, as for a status call (gcpause)
        with gcpause.paused():
            yield from self._collect()

    def _collect(self) -> Iterator[Metric]:
        fams = {spec.name: spec.family() for spec in METRICS}
        services: list[str] = []
        try:
            services = _add_snapshot(fams, self._snapshot())
        # The endpoint outlives whatever reading the maps raises (bcc raises
        # bare Exception, a source may time out or hand a malformed dict):
        # counted, reported once, and none of a half-read snapshot is shown.
        except Exception as e:
            fams = {spec.name: spec.family() for spec in METRICS}
            self._failed(f"metrics: reading the maps failed: {type(e).__name__}: {e}")
        else:
            with self._lock:
                self._last_error = None
        _add_observed(fams, self.observer.read(), services)
        fams["edge_info"].add_metric([], {"version": __version__, "iface": self.iface, "abi": str(abi.ABI_VERSION)})
        with self._lock:
            fams["edge_scrape_errors_total"].add_metric([], self._errors)
        if self.serving is not None:
            fams["edge_datapath_up"].add_metric([], 1 if self.serving() else 0)
        yield from fams.values()

    def _snapshot(self) -> dict:
        """The source's snapshot; every CT_COUNT_EVERY_S with a conntrack count (a count the walk's
        deadline cut keeps the one before)."""
        now = time.monotonic()
        if now - self._ct_at < CT_COUNT_EVERY_S:
            snap = self.source.snapshot()
        else:
            self._ct_at = now
            snap = self.source.snapshot(count_conntrack=True)
            if snap.get("conntrack_entries") is not None:
                self._ct_entries = snap["conntrack_entries"]
                self._half_open_entries = snap.get("half_open_entries")
        if self._ct_entries is not None:
            snap["conntrack_entries"] = self._ct_entries
            snap["half_open_entries"] = self._half_open_entries
        return snap

    def _failed(self, text: str) -> None:
        text = EdgeError(text).message  # one line
        with self._lock:
            self._errors += 1
            new = text != self._last_error
            self._last_error = text
        if new and self.on_error is not None:
            self.on_error(text)


def _add_conntrack(fams: dict[str, Metric], snap: dict) -> None:
    """How full conntrack is: its entries (when counted) and its capacity."""
    if snap.get("conntrack_entries") is not None:
        fams["edge_conntrack_entries"].add_metric([], snap["conntrack_entries"])
    if snap.get("half_open_entries") is not None:
        fams["edge_half_open_entries"].add_metric([], snap["half_open_entries"])
    if snap.get("node", {}).get("ct_size"):
        fams["edge_conntrack_capacity"].add_metric([], snap["node"]["ct_size"])
    # a conntrack count cut short keeps the last complete one (_snapshot): only the backends' walk counts here
    cut = [line for line in snap.get("stopped_early") or () if not line.startswith("conntrack:")]
    fams["edge_scrape_walk_complete"].add_metric([], 0 if cut else 1)


def _add_probe_budget(fams: dict, b: dict | None) -> None:
    """The prober's budget, what the probes ask for and the shortfall (edged only)."""
    if b:
        fams["edge_probe_budget_per_second"].add_metric([], b["budget_per_s"])
        fams["edge_probe_demand_per_second"].add_metric([], b["demand_per_s"])
        fams["edge_probe_shortfall_ratio"].add_metric([], b["shortfall_ratio"])


def _add_bgp(fams: dict, bgp: dict | None) -> None:
    """node.bgp: whether the speaker announces what edged decided, and its restarts."""
    if bgp and "speaker_up" in bgp:
        fams["edge_bgp_speaker_up"].add_metric([], 1 if bgp["speaker_up"] else 0)
        fams["edge_bgp_speaker_restarts_total"].add_metric([], bgp["speaker_restarts"])


def _add_counts(fams: dict[str, Metric], service: str, counts: dict) -> None:
    """One service's drop and verdict counters ("": the packets no service is known for)."""
    for reason, n in counts.get("drops", {}).items():
        fams["edge_drops_total"].add_metric([service, reason], n)
    for verdict, n in counts.get("verdicts", {}).items():
        fams["edge_verdicts_total"].add_metric([service, verdict], n)


def _add_snapshot(fams: dict[str, Metric], snap: dict) -> list[str]:
    """Adds the maps' counters and edged's view; returns the service names."""
    _add_counts(fams, "", snap.get("no_service") or {})
    for s in snap["services"]:
        _add_counts(fams, s["name"], s)
    counters = (
        ("edge_packets_total", "packets"),
        ("edge_bytes_total", "bytes"),
        ("edge_new_flows_total", "new_flows"),
        ("edge_return_packets_total", "return_packets"),
        ("edge_failovers_total", "failovers"),
    )
    gauges = (
        ("edge_backend_rtt_smoothed_seconds", "rtt_smoothed_s"),
        ("edge_backend_queue_waiting", "waiting"),
        ("edge_backend_queue_running", "running"),
        ("edge_backend_kv_cache_usage_ratio", "kv_usage"),
        ("edge_backend_hung", "hung"),
        ("edge_backend_probe_interval_seconds", "probe_interval_s"),
        ("edge_backend_probe_relaxed", "probe_relaxed"),
    )
    _add_conntrack(fams, snap)
    fleet = snap.get("fleet")
    if fleet:
        fams["edge_fleet_connected"].add_metric([], 1 if fleet["connected"] else 0)
        fams["edge_fleet_leader"].add_metric([], 1 if fleet["is_leader"] else 0)
        fams["edge_fleet_snapshot_version"].add_metric([], fleet["version"])
        fams["edge_fleet_faults_total"].add_metric([], fleet.get("faults", 0))
        fams["edge_fleet_refused_total"].add_metric([], fleet.get("refused", 0))
    _add_bgp(fams, snap.get("bgp"))
    _add_probe_budget(fams, snap.get("probe_budget"))
    services = []
    for s in snap["services"]:
        services.append(s["name"])
        d = s.get("discovery")
        if d:
            fams["edge_discovery_failures_total"].add_metric([s["name"], d["source"]], d["failures"])
            fams["edge_discovery_backends"].add_metric([s["name"], d["source"]], d["backends"])
            if d.get("age_s") is not None:
                fams["edge_discovery_age_seconds"].add_metric([s["name"], d["source"]], d["age_s"])
        for b in s["backends"]:
            labels = [s["name"], b["name"]]
            for metric, key in counters:
                fams[metric].add_metric(labels, b[key])
            health, edged = b["health"], b.get("edged") or {}
            probe_down = b.get("state") == "down" and (b.get("probe") or {}).get("state") == "down"
            fams["edge_backend_up"].add_metric(labels, 1 if health["usable"] and not probe_down else 0)
            fams["edge_backend_probe_down"].add_metric(labels, 1 if probe_down else 0)
            fams["edge_backend_weight"].add_metric(labels, b["weight"])
            config_weight = edged.get("config_weight")
            if config_weight is None:
                config_weight = (b.get("probe") or {}).get("config_weight")
            if config_weight is not None:
                fams["edge_backend_config_weight"].add_metric(labels, config_weight)
            if health.get("heartbeat_age_s") is not None:
                fams["edge_backend_heartbeat_age_seconds"].add_metric(labels, health["heartbeat_age_s"])
            for metric, key in gauges:
                value = edged.get(key)
                if value is not None:
                    fams[metric].add_metric(labels, float(value))
            if b.get("wire"):
                _add_wire(fams, labels, b["wire"])
    return services


_WIRE_LES = [floatToGoString(le) for le in wiresignals.upper_bounds_s()] + ["+Inf"]


def _add_wire(fams: dict[str, Metric], labels: list[str], w: dict) -> None:
    """One backend's wire signals (maps' wire_view) as two histograms and a gauge."""
    for metric, key in (
        ("edge_backend_handshake_seconds", "handshake"),
        ("edge_backend_first_byte_seconds", "first_byte"),
    ):
        total, cumulative = 0, []
        for n in w[f"{key}_buckets"]:
            total += n
            cumulative.append(total)
        fams[metric].add_metric(labels, list(zip(_WIRE_LES, cumulative)), w[f"{key}_sum_s"])
    fams["edge_backend_active_flows"].add_metric(labels, w["active"])


def _add_observed(fams: dict[str, Metric], seen: Observed, services: list[str]) -> None:
    les = [floatToGoString(le) for le in RTT_BUCKETS_S] + ["+Inf"]
    for key, (cumulative, sum_s) in sorted(seen.rtt.items()):
        fams["edge_backend_rtt_seconds"].add_metric(list(key), list(zip(les, cumulative)), sum_s)
    for key, (ok, failed) in sorted(seen.probes.items()):
        fams["edge_probes_total"].add_metric([*key, "ok"], ok)
        fams["edge_probes_total"].add_metric([*key, "failed"], failed)
    for name, (windows, violations) in sorted(seen.sla.items()):
        fams["edge_sla_windows_total"].add_metric([name], windows)
        fams["edge_sla_violations_total"].add_metric([name], violations)
    # every deployed service has a push counter from the start, so rate() sees the first push
    for name in sorted(set(services) | set(seen.pushes)):
        fams["edge_weight_pushes_total"].add_metric([name], seen.pushes.get(name, 0))
    # every map has its counter from the start, so rate() sees the first failure
    for name in sorted(set(abi.MAP_NAMES) | set(seen.map_errors)):
        fams["edge_map_errors_total"].add_metric([name], seen.map_errors.get(name, 0))


def make_registry(collector: EdgeCollector, process: bool = True) -> CollectorRegistry:
    """A registry of its own holding collector (and process_* metrics)."""
    registry = CollectorRegistry()
    registry.register(collector)
    if process:
        ProcessCollector(registry=registry)
    return registry


class LoopSource:
    """A source that runs fn(**kw) (edged's snapshot(count_conntrack=...)) on an asyncio
    loop (edged's) and waits for it from the scrape thread, so edged's state is read where it is written. fn may
    be a coroutine function: the loop runs it without blocking on it (edged walks
    the maps on a worker thread). Never call snapshot() on the loop's own thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[[], dict | Awaitable[dict]],
        timeout_s: float = LOOP_TIMEOUT_S,
    ):
        self.loop, self.fn, self.timeout_s = loop, fn, timeout_s

    def snapshot(self, **kw) -> dict:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def finish(task: asyncio.Future) -> None:
            if task.cancelled():
                future.set_exception(EdgeError("the daemon cancelled the snapshot"))
            elif task.exception() is not None:
                future.set_exception(task.exception())
            else:
                future.set_result(task.result())

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the scrape stopped waiting
            try:
                value = self.fn(**kw)
            except Exception as e:  # handed to the scrape thread, which counts it
                future.set_exception(e)
                return
            if inspect.isawaitable(value):
                asyncio.ensure_future(value).add_done_callback(finish)
            else:
                future.set_result(value)

        self.loop.call_soon_threadsafe(run)
        try:
            return future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:  # not yet the builtin before Python 3.11
            future.cancel()
            raise EdgeError(f"the daemon's loop did not answer within {self.timeout_s:g}s") from None
