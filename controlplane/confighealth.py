"""The health sections of the edge config, one dataclass each: heartbeats, passive detection,
probes and their metrics scrapes (Health), wire signals, the weights policy and SLA marks.
Declared with configkit.option() like the rest of the schema; config.py composes them into
Service and re-exports them. Pure: no kernel, no network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from controlplane.configkit import (  # the checks and the machinery the schema below is made of
    MAX_MS,
    _bool,
    _int,
    _longer_than_interval,
    _ms,
    _one_of,
    _port,
    _section,
    _string,
    _url_path,
    option,
)
from controlplane.errors import ConfigError
from controlplane.limits import WEIGHT_MAX


@dataclass(frozen=True)
class Heartbeat:
    """UDP heartbeats from the backends, consumed by the XDP program."""

    port: int = option("UDP port the backends send heartbeats to", _port, 7946)
    interval_ms: int = option("how often a backend sends one", _ms, 100)
    timeout_ms: int = option("silence after which a backend is down; > interval_ms", _ms, 300)
    rise: int = option("heartbeats in a row that bring a down backend back", _int(1, 100), 3)

    def _validate(self, path: str) -> None:
        _longer_than_interval(self, path, "timeout_ms")


@dataclass(frozen=True)
class Passive:
    """Passive health: eject a backend whose new connections go unanswered."""

    syn_timeout_ms: int = option("a SYN unanswered this long counts as a failure", _ms, 200)
    consecutive: int = option("failures in a row that eject the backend", _int(1, 1000), 3)
    ejection_ms: int = option("how long an ejected backend stays out", _ms, 1000)
    max_ejected_percent: int = option("never eject more than this share of a service's backends", _int(0, 100), 50)


RELAXED_FACTOR = 10  # probe.relaxed_interval_ms by default: this many probe intervals,
RELAXED_CAP_MS = 2000  # but no longer than this: it bounds how much later `fall` is reached


@dataclass(frozen=True)
class Probe:
    """Active probes from the control plane: TCP connect, HTTP GET or gRPC health."""

    kind: str = option("tcp, http or grpc", _one_of("tcp", "http", "grpc"), "tcp")
    path: str = option("HTTP path of the readiness endpoint (kind http)", _url_path, "/v2/health/ready")
    interval_ms: int = option("time between two probes of one backend", _ms, 100)
    timeout_ms: int = option("a probe slower than this fails; <= interval_ms", _ms, 50)
    window: int = option("samples kept per backend for RTT and health", _int(1, 1000), 10)
    fall: int = option("failed probes in a row that take a backend out of the weights", _int(1, 100), 3)
    rise: int = option("good probes in a row that bring it back (then slow start)", _int(1, 100), 2)
    grpc_service: str = option(
        "service name sent in the grpc.health.v1 Check (kind grpc); '' is the server", _string, ""
    )
    relaxed_interval_ms: Optional[int] = option(
        "time between two probes of a backend while real traffic measures it (fresh wire signals); a failed "
        f"probe brings interval_ms back until rise probes pass. Absent: {RELAXED_FACTOR} x interval_ms, at most "
        f"{RELAXED_CAP_MS} (never below interval_ms); equal to interval_ms: the rate never adapts",
        _ms,
        None,
    )

    def _validate(self, path: str) -> None:
        # A probe that may outlive its interval lets probes pile up on a slow backend.
        if self.timeout_ms > self.interval_ms:
            raise ConfigError(
                f"{path}.timeout_ms: {self.timeout_ms} must not be greater than interval_ms ({self.interval_ms})"
            )
        if self.relaxed_interval_ms is not None and self.relaxed_interval_ms < self.interval_ms:
            raise ConfigError(
                f"{path}.relaxed_interval_ms: {self.relaxed_interval_ms} must not be less than "
                f"interval_ms ({self.interval_ms})"
            )

    @property
    def relaxed_ms(self) -> int:
        """The interval of relaxed probes: relaxed_interval_ms, or its default for interval_ms."""
        if self.relaxed_interval_ms is not None:
            return self.relaxed_interval_ms
        return max(self.interval_ms, min(RELAXED_FACTOR * self.interval_ms, RELAXED_CAP_MS))


@dataclass(frozen=True)
class MetricsScrape:
    """Load signals scraped from the backend's Prometheus endpoint (vLLM, SGLang, TGI)."""

    path: str = option("HTTP path of the backend's metrics", _url_path, "/metrics")
    interval_ms: int = option("time between two scrapes of one backend", _ms, 100)
    stale_ms: int = option("load signals older than this are ignored; > interval_ms", _ms, 2000)

    def _validate(self, path: str) -> None:
        _longer_than_interval(self, path, "stale_ms")


@dataclass(frozen=True)
class Health:
    """How a service's backends are judged; a sub-section that is absent is off (None)."""

    heartbeat: Optional[Heartbeat] = option("kernel-side liveness from UDP heartbeats", _section(Heartbeat), None)
    passive: Optional[Passive] = option("ejection on unanswered connections", _section(Passive), None)
    probe: Optional[Probe] = option("active probes from the control plane", _section(Probe), None)
    metrics: Optional[MetricsScrape] = option("load signals from the backend", _section(MetricsScrape), None)
    panic_percent: int = option(
        "when fewer than this share of the primaries is usable (and some is, or no standby is), new flows go "
        "to every admin-up primary by weight, health ignored; 0 is off",
        _int(0, 100),
        0,
    )


@dataclass(frozen=True)
class Wire:
    """Latency from real traffic: the data path times every client connection's handshake
    (SYN forwarded -> SYN-ACK seen) and its first request -> first reply byte, per backend."""

    enabled: bool = option(
        "while a backend's wire signal is fresh, its handshake p50 is the weight policy's RTT input (tcp or no "
        "probe: instead of the probe's RTT; http/grpc probes: the larger of the two)",
        _bool,
        True,
    )
    window_ms: int = option("p50/p99 and freshness are taken over this last stretch of time", _ms, 2000)
    min_samples: int = option(
        "handshakes within window_ms that make a backend's wire signal fresh; with fewer the probe's RTT is used",
        _int(1, 1000000),
        5,
    )
    interval_ms: int = option("how often edged reads the data path's wire histograms; < window_ms", _ms, 250)

    def _validate(self, path: str) -> None:
        if self.interval_ms >= self.window_ms:
            raise ConfigError(f"{path}.interval_ms: {self.interval_ms} must be less than window_ms ({self.window_ms})")


@dataclass(frozen=True)
class Weights:
    """How backend weights are computed."""

    policy: str = option(
        "static (the configured weights) or latency_inverse",
        _one_of("static", "latency_inverse"),
        "static",
    )
    floor: int = option("no computed weight goes below this", _int(1, WEIGHT_MAX), 1)
    max_ratio: int = option("largest weight / smallest weight", _int(1, WEIGHT_MAX), 20)
    hysteresis_pct: int = option("changes smaller than this are not applied", _int(0, 100), 10)
    smoothing: str = option(
        "RTT smoothing: peak_ewma (a slower sample counts at once, a faster one decays in) or ewma; weighed with jump_pct 0",
        _one_of("peak_ewma", "ewma"),
        "peak_ewma",
    )
    decay_ms: int = option("time constant of the RTT smoothing", _ms, 500)
    spike_filter: int = option(
        "RTT samples whose lower median is smoothed: 1 takes every sample (fastest); 2 ignores one "
        "stray slow sample (a slowdown then counts from its second probe)",
        _int(1, 5),
        2,
    )
    steady_window: int = option(
        "RTT samples whose faster half's mean is a backend's steady RTT, which the weights follow (jump_pct > 0)",
        _int(1, 1000),
        20,
    )
    jump_pct: int = option(
        "a slowdown this many % over the window's fastest RTT (its samples agreeing) or a speedup of "
        "sqrt(1 + this %) restarts the steady window at once; 0 weighs the smoothed RTT instead",
        _int(0, 1000),
        80,
    )
    rtt_offset_ms: int = option(
        "added to every RTT before weighting: differences far below it are probe noise", _int(0, MAX_MS), 1
    )
    load_aware: bool = option("scale weights down by queue depth and KV-cache use (needs health.metrics)", _bool, True)
    load_model: str = option(
        "with load_aware, how load scales a weight: queue (waiting + running over the engine's slots, "
        "the most seen running) or capacity (queue, times the backend's share of the largest capacity: "
        "slots x tokens/s per running request, from the progress counter)",
        _one_of("queue", "capacity"),
        "capacity",
    )
    hung_ms: int = option("work outstanding with no progress this long marks the engine hung", _ms, 2000)
    slow_start_ms: int = option(
        "a recovered backend ramps from the floor to its weight over this long, in quarter steps; 0 is off",
        _int(0, MAX_MS),
        5000,
    )
    wire: Wire = option("latency from real traffic as the RTT input (latency_inverse)", _section(Wire), Wire())


@dataclass(frozen=True)
class Sla:
    """Service-level marks: probe windows over the target are counted (edge_sla_violations_total)."""

    p99_rtt_ms: int = option("p99 of a backend's probe window above this counts as a violation", _ms)
