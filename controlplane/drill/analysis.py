"""The drill's analysis: from per-flow observations (sent when, reached which backend when) and
the captured heartbeats to detection, failover, lost and late flows. Pure: unit-tested without root
(controlplane/tests/test_drill.py); the definitions are in analyse()'s docstring.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

LATE_MARGIN_MS = 1.0  # "late": after last heartbeat + timeout + this
RUN_GAP_SPACINGS = 20  # a gap of this many spacings (and >= RUN_GAP_MIN_MS) ends the dead run
RUN_GAP_MIN_MS = 20.0


@dataclass
class Flow:
    sport: int
    sent_ns: int
    backend: int | None  # index of the backend that got its first packet; None: lost
    arrived_ns: int | None
    refused: bool = False  # that backend answered with a RST


def ns_to_ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def down_windows(beats: Sequence[int], timeout_ns: float, rise: int) -> list[tuple[float, float | None]]:
    """When a backend was unusable for lack of heartbeats, from its heartbeat departures: after a gap
    longer than the timeout, from the last one + timeout until `rise` in a row (None: not again)."""
    out: list[tuple[float, float | None]] = []
    for k in range(1, len(beats)):
        if beats[k] - beats[k - 1] > timeout_ns:
            back = k + rise - 1
            out.append((beats[k - 1] + timeout_ns, beats[back] if back < len(beats) else None))
    return out


def _inside(t: float, windows: list[tuple[float, float | None]]) -> bool:
    return any(lo <= t and (hi is None or t < hi) for lo, hi in windows)


@dataclass(frozen=True)
class HealthSeen:
    """What the analysis needs of the service's health settings and of the captured heartbeats."""

    timeout_ms: int | None = None  # heartbeat timeout; None: no heartbeats
    rise: int = 1
    ejection_ms: int | None = None  # passive ejection; None: no passive detection
    beats: tuple[tuple[int, ...], ...] = ()  # per backend: heartbeat departures (monotonic ns)
    takes_new: tuple[bool, ...] = ()  # per backend: weight > 0


def _spacing_ns(before: list[Flow], dead_before: list[Flow], n_backends: int) -> float:
    """How often the dead backend took a flow before t0: measured on its own flows, else
    estimated from all flows (an even share), else 1 ms."""
    if len(dead_before) >= 2:
        return (dead_before[-1].sent_ns - dead_before[0].sent_ns) / (len(dead_before) - 1)
    if len(before) >= 2:
        return (before[-1].sent_ns - before[0].sent_ns) / (len(before) - 1) * n_backends
    return 1e6


def _dead_run(flows: list[Flow], dead: int, t0_ns: int, last_ns: float, gap_ns: float) -> list[Flow]:
    """The flows from t0 on that reached the dead backend or were lost, until a gap longer than
    gap_ns (counted from last_ns, the last flow it got before t0, at first)."""
    run: list[Flow] = []
    for f in flows:
        if f.sent_ns < t0_ns or not (f.backend == dead or f.backend is None):
            continue
        if f.sent_ns - last_ns > gap_ns:
            break
        run.append(f)
        last_ns = f.sent_ns
    return run


def analyse(
    flows: list[Flow], names: list[str], dead: int, mode: str, t0_ns: int, late_from_ns: int | None, health: HealthSeen
) -> dict:
    """The drill's findings from per-flow observations.

    Flow k is one TCP SYN (UDP datagram) from client source port FIRST_SPORT + k, sent at s_k; a_k is
    when its first packet reached a backend's veth (kernel timestamp), or it reached none (lost).
    t0_ns, "silenced", is the silenced backend's last heartbeat as it left (heartbeat mode), the
    last frame its veth carried before `ip link set down` returned (link; the call takes ms), or its
    killed server's first RST (kill: heartbeats go on; the process closes its sockets ms after
    SIGKILL). The router's hash is its own, so which flow "belonged" to the dead backend is
    inferred: before t0 it took one flow every `spacing` ms. The dead run is the flows the router
    still gave it from t0 on (they reached it, or were lost: a dead link swallows them), ended by a
    gap longer than max(RUN_GAP_SPACINGS spacings, RUN_GAP_MIN_MS); L is its last flow.
      detection_ms   t0 -> the router marks the backend unusable, estimated as a_L (for a lost L,
                     s_L + median latency) + spacing/2 - t0: the switch came after a_L and before
                     the dead backend's next flow, due one spacing later on average; resolution_ms
                     (spacing/2) is the typical error of the estimate, not a bound.
      failover_ms    t0 -> the first rerouted flow: the dead backend's next flow after L, expected
                     one spacing after s_L.
      lost           flows that reached no backend: in the dead run (link mode), while every other
                     backend missed heartbeats (the router had none usable), or unexplained.
      late           flows the router gave the dead backend after late_from_ns (the last
                     heartbeat; in kill mode, where heartbeats go on, t0) + timeout + LATE_MARGIN_MS.
      after_detect   flows the dead backend got after the dead run; in kill mode those after its
                     passive ejection ran out are counted apart, as readmissions.
    """
    before = [f for f in flows if f.sent_ns < t0_ns]
    dead_before = [f for f in before if f.backend == dead]
    spacing_ns = _spacing_ns(before, dead_before, len(names))
    latencies = sorted(f.arrived_ns - f.sent_ns for f in flows if f.arrived_ns is not None)
    latency_ns = statistics.median(latencies) if latencies else 0

    def decided(f: Flow) -> float:
        """When the router picked a backend for f (arrival ~ pick; a lost flow: sent + median latency)."""
        return f.arrived_ns if f.arrived_ns is not None else f.sent_ns + latency_ns

    # The dead run: from the last flow the dead backend got before t0 on, the flows that reached it or
    # were lost, until a gap longer than max(RUN_GAP_SPACINGS spacings, RUN_GAP_MIN_MS).
    gap_ns = max(RUN_GAP_SPACINGS * spacing_ns, RUN_GAP_MIN_MS * 1e6)
    anchor = dead_before[-1] if dead_before else None
    run = _dead_run(flows, dead, t0_ns, anchor.sent_ns if anchor else t0_ns, gap_ns)
    in_run = {f.sport for f in run}
    end_ns = flows[-1].sent_ns if flows else t0_ns
    last = run[-1] if run else anchor
    detected = last is not None and end_ns - last.sent_ns > gap_ns
    detection_ns = failover_ns = None
    if detected:
        detection_ns = decided(last) + spacing_ns / 2 - t0_ns
        failover_ns = last.sent_ns + spacing_ns - t0_ns

    # Flows the dead backend got after the run; in kill mode the router tries it again once its
    # passive ejection (ejection_ms, doubling on repeats) has run out: those are readmissions.
    after = [f for f in flows if f.backend == dead and last is not None and f.sent_ns > last.sent_ns]
    readmit_ns = None
    if mode == "kill" and health.ejection_ms is not None and detection_ns is not None:
        readmit_ns = t0_ns + detection_ns + health.ejection_ms * 1e6 - gap_ns
    readmitted = [f for f in after if readmit_ns is not None and f.sent_ns >= readmit_ns]
    after_detect = [f for f in after if readmit_ns is None or f.sent_ns < readmit_ns]

    timeout_ns = health.timeout_ms * 1e6 if health.timeout_ms is not None else None
    windows = [down_windows(b, timeout_ns, health.rise) if timeout_ns else [] for b in health.beats]
    while len(windows) < len(names):
        windows.append([])

    def all_others_down(t: float) -> bool:
        return all(
            not (health.takes_new[i] if health.takes_new else True) or _inside(t, windows[i])
            for i in range(len(names))
            if i != dead
        )

    lost = [f for f in flows if f.backend is None]
    lost_run = [f for f in lost if f.sport in in_run]
    lost_gaps = [f for f in lost if f.sport not in in_run and timeout_ns and all_others_down(decided(f))]

    late = deadline_ns = None
    if timeout_ns is not None and late_from_ns is not None:
        deadline_ns = late_from_ns + timeout_ns + LATE_MARGIN_MS * 1e6
        readmitted_ports = {f.sport for f in readmitted}
        late = [
            f
            for f in flows
            if (f.backend == dead or f.sport in in_run)
            and f.sent_ns >= t0_ns
            and decided(f) > deadline_ns
            and f.sport not in readmitted_ports
        ]
    refused = [f for f in flows if f.backend == dead and f.refused] if mode == "kill" else None

    gaps = {}
    for i, name in enumerate(names):
        beats = health.beats[i] if i < len(health.beats) else ()
        if i == dead and mode != "kill":
            beats = tuple(t for t in beats if t <= t0_ns)
        if len(beats) >= 2 and timeout_ns:
            diffs = [beats[k] - beats[k - 1] for k in range(1, len(beats))]
            gaps[name] = {
                "heartbeats": len(beats),
                "max_gap_ms": ns_to_ms(max(diffs)),
                "over_timeout": sum(1 for d in diffs if d > timeout_ns),
            }
    per_backend = {
        name: {
            "before": sum(1 for f in before if f.backend == i),
            "after": sum(1 for f in flows if f.sent_ns >= t0_ns and f.backend == i),
        }
        for i, name in enumerate(names)
    }
    share = len(dead_before) / len(before) if before else None
    expected_rerouted = None
    if detected and share is not None:
        expected_rerouted = round(share * sum(1 for f in flows if f.sent_ns > last.sent_ns))
    return {
        "spacing_ms": ns_to_ms(spacing_ns),
        "dead_share_before": None if share is None else round(share, 4),
        "median_latency_ms": ns_to_ms(latency_ns),
        "detected": detected,
        "detection_ms": ns_to_ms(detection_ns),
        "failover_ms": ns_to_ms(failover_ns),
        "resolution_ms": ns_to_ms(spacing_ns / 2),
        "last_to_dead_ms": ns_to_ms(decided(last) - t0_ns) if last is not None else None,
        "dead_run": len(run),
        "lost": len(lost),
        "lost_dead_run": len(lost_run),
        "lost_heartbeat_gaps": len(lost_gaps),
        "lost_unexplained": len(lost) - len(lost_run) - len(lost_gaps),
        "lost_flows_ms": [ns_to_ms(f.sent_ns - t0_ns) for f in lost][:100],
        "late": None if late is None else len(late),
        "late_deadline_ms": ns_to_ms(deadline_ns - t0_ns) if deadline_ns is not None else None,
        "after_detection": len(after_detect),
        "readmitted": len(readmitted) if readmit_ns is not None else None,
        "refused": None if refused is None else len(refused),
        "expected_rerouted": expected_rerouted,
        "heartbeat_gaps": gaps,
        "per_backend": per_backend,
    }
