"""The weight policy: probe samples and load scrapes in, integer backend weights out.

Owns the per-backend state between steps (Tracker), the steps that feed it
(observe_sample, observe_load), the decision for one service (decide: weights,
states, reasons, and whether a push is due) and describe() for status. Pure: no
I/O, no clock reads (every time comes in as CLOCK_MONOTONIC ns), no kernel; the
daemon probes, scrapes, calls these, and writes decide()'s weights when it says so.
The rules decide() applies are in its docstring.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from controlplane import config, limits, loadweights, steadyrtt
from controlplane.samples import Load, Sample

SCALE = 10_000  # weight of the best backend of an idle service
MAX_WEIGHT = limits.WEIGHT_MAX
RTT_MIN_S = 1e-6  # an RTT of 0 would be an infinite weight
KV_KNEE = 0.8  # KV-cache use below this costs nothing
KV_MIN = 0.1  # KV factor at a full cache
NEUTRAL_LOAD = 0.5  # unknown load: between idle (1) and a full engine (1/16)
QUEUE_POWER = 4  # the queue factor: 1 / (1 + outstanding / slots)^QUEUE_POWER

_NS_PER_MS = 1_000_000
_NS_PER_S = 1e9


@dataclass
class Tracker:
    """What one backend's past probes and scrapes left behind; mutated by observe_*."""

    recent: deque = field(default_factory=lambda: deque(maxlen=1))  # last weights.spike_filter RTTs
    history: deque = field(default_factory=lambda: deque(maxlen=1))  # last weights.steady_window RTTs
    before: deque = field(default_factory=deque)  # history as it was before the last slowdown jump
    recent_ns: deque = field(default_factory=lambda: deque(maxlen=1))  # times of the samples in recent
    checks: list = field(default_factory=list)  # (t_ns, RTT) of confirmation probes since recent's oldest
    rtt_s: Optional[float] = None  # smoothed RTT; None before the first sample
    rtt_t_ns: Optional[int] = None  # time of the sample that last fed rtt_s
    fails: int = 0  # failed probes in a row
    oks: int = 0  # good probes in a row
    down: bool = False  # probe.fall failures seen, probe.rise successes not yet
    last_error: Optional[str] = None  # of the newest failed probe
    load: Optional[Load] = None  # newest good scrape
    peak_running: float = 0.0  # the most requests ever seen running at once: the engine's slots, learned
    scrape_failures: int = 0  # failed scrapes since the newest good one
    scrape_error: Optional[str] = None
    stall_since_ns: Optional[int] = None  # first scrape of the current stretch of work without progress
    hung: bool = False  # as of the newest good scrape
    ramp_since_ns: Optional[int] = None  # start of the current slow start
    wire_rtt_s: Optional[float] = None  # handshake p50 of real traffic while fresh (edged sets it), else None
    speed: loadweights.Speed = field(default_factory=loadweights.Speed)  # tokens/s per running request


@dataclass(frozen=True)
class Decision:
    """decide()'s answer for one service; every dict is keyed by backend name."""

    weights: dict[str, int]  # what to use: computed (forced ones as forced) when push, else pushed
    computed: dict[str, int]  # what the policy wants right now
    states: dict[str, str]  # static, draining, down, fail-open, hung, slow-start, unknown-load, no-metrics, up
    reasons: dict[str, str]  # a few words for status and events
    push: bool  # write weights to the data path


# ---- steps ----


def observe_sample(tr: Tracker, s: Sample, w: config.Weights, probe: config.Probe) -> None:
    """Feed one probe result: RTT smoothing and the fall/rise counters. A confirmation probe
    (s.extra) counts for health and can only veto a slowdown jump (steadyrtt.jumped); the RTTs the
    weights follow are the regular probes'."""
    x = s.rtt_s if s.ok else probe.timeout_ms / 1000
    if x is not None and s.extra:
        tr.checks.append((s.t_ns, x))
    elif x is not None:
        # the lower median of the last spike_filter samples: one stray slow sample (a busy
        # host, a GC pause) never reaches the average; a real slowdown shows in the second
        if tr.recent.maxlen != w.spike_filter:
            tr.recent = deque(tr.recent, maxlen=w.spike_filter)
        if tr.history.maxlen != w.steady_window:
            tr.history = deque(tr.history, maxlen=w.steady_window)
        if tr.recent_ns.maxlen != w.spike_filter:
            tr.recent_ns = deque(tr.recent_ns, maxlen=w.spike_filter)
        tr.recent.append(x)
        tr.recent_ns.append(s.t_ns)
        tr.checks = [c for c in tr.checks if c[0] >= tr.recent_ns[0]]
        jump = steadyrtt.jumped(tr, w)
        if jump:
            steadyrtt.restart(tr, jump, w)
        else:
            tr.history.append(x)
            if len(tr.history) > w.steady_window // 2:
                tr.before.clear()  # the new level fills half the window: it is the steady one now
        _smooth(tr, steadyrtt.lower_median(tr.recent), s.t_ns, w)
    if s.ok:
        tr.oks, tr.fails = tr.oks + 1, 0
        if tr.down and tr.oks >= probe.rise:
            tr.down, tr.ramp_since_ns = False, s.t_ns
    else:
        tr.oks, tr.fails = 0, tr.fails + 1
        tr.last_error = s.error or "failed"
        if not tr.down and tr.fails >= probe.fall:
            tr.down, tr.ramp_since_ns = True, None


def confirm_due(tr: Tracker, s: Sample, w: config.Weights) -> bool:
    """Whether a probe result that observe_sample() just fed to tr deserves a second look (a
    confirmation probe, Prober.confirm) before the next regular one: under latency_inverse with
    jump_pct, a good probe more than jump_pct % slower than the window's fastest that did not
    jump. Host noise comes in spells shorter than a probe interval that a second look finds
    fast again; a real step does not (steadyrtt.jumped)."""
    if w.policy == "static" or w.jump_pct == 0 or not s.ok or s.rtt_s is None:
        return False
    return steadyrtt.slow(tr, s.rtt_s, w)


def sample_moves(tr: Tracker, s: Sample, was_down: bool, w: config.Weights, probe_kind: Optional[str]) -> bool:
    """Whether a probe result that observe_sample() just fed to tr can change what decide()
    says, so that a decision is due at once: under the static policy when it took the backend
    down or brought it back up (fall, rise); otherwise unless
    it passed, the backend was and stays up, and the RTT the policy weighs is the wire's alone
    (rtt_input: a fresh wire signal with a tcp probe), which the probe's RTT does not move."""
    if w.policy == "static" or (s.extra and s.ok):
        return was_down != tr.down  # only health moves a static weight, or a confirmation's pass
    if not s.ok or was_down or tr.down:
        return True
    return tr.wire_rtt_s is None or probe_kind not in (None, "tcp")


def probe_rtt(tr: Tracker, w: config.Weights) -> Optional[float]:
    """The probes' RTT the policy weighs: with jump_pct, the steady RTT (steadyrtt.steady) of the
    backend's window of samples, which a jump (steadyrtt.jumped) restarts from the jump's samples;
    with jump_pct 0, the smoothed RTT (tr.rtt_s). None before the first sample."""
    if w.jump_pct == 0 or not tr.history:
        return tr.rtt_s
    return steadyrtt.steady(tr.history)


def _smooth(tr: Tracker, x: float, t_ns: int, w: config.Weights) -> None:
    if tr.rtt_s is None or tr.rtt_t_ns is None:
        tr.rtt_s, tr.rtt_t_ns = x, t_ns
        return
    dt_ns = max(0, t_ns - tr.rtt_t_ns)  # a late, out-of-order sample moves the average no further
    alpha = 1.0 - math.exp(-dt_ns / (w.decay_ms * _NS_PER_MS))
    if w.smoothing == "peak_ewma" and x > tr.rtt_s:
        tr.rtt_s = x
    else:
        tr.rtt_s += alpha * (x - tr.rtt_s)
    tr.rtt_t_ns = max(tr.rtt_t_ns, t_ns)


def observe_load(tr: Tracker, l: Load, w: config.Weights) -> None:
    """Feed one scrape: the newest load signals and the hung-engine clock."""
    if not l.ok:
        tr.scrape_failures += 1
        tr.scrape_error = l.error or "failed"
        return
    prev = tr.load
    if prev is not None and l.t_ns < prev.t_ns:
        return  # older than what we have
    hung_ns = w.hung_ms * _NS_PER_MS
    if l.progress is None or _outstanding(l) <= 0:
        tr.stall_since_ns = None
    elif tr.stall_since_ns is None or prev is None or prev.progress != l.progress or l.t_ns - prev.t_ns > hung_ns:
        tr.stall_since_ns = l.t_ns
    hung = tr.stall_since_ns is not None and l.t_ns - tr.stall_since_ns >= hung_ns
    if tr.hung and not hung:
        tr.ramp_since_ns = l.t_ns
    loadweights.observe(tr.speed, prev, l)
    tr.hung, tr.load = hung, l
    tr.peak_running = max(tr.peak_running, l.running or 0.0)
    tr.scrape_failures, tr.scrape_error = 0, None


def _outstanding(l: Load) -> float:
    return (l.waiting or 0.0) + (l.running or 0.0)


# ---- per-backend views at a time ----


def load_state(tr: Tracker, now_ns: int, metrics: Optional[config.MetricsScrape]) -> str:
    """fresh, stale or none (never a good scrape, or no metrics configured)."""
    if metrics is None or tr.load is None:
        return "none"
    return "fresh" if now_ns - tr.load.t_ns < metrics.stale_ms * _NS_PER_MS else "stale"


def is_hung(tr: Tracker, now_ns: int, metrics: Optional[config.MetricsScrape]) -> bool:
    """Hung as of the newest scrape, and that scrape is still fresh."""
    return tr.hung and load_state(tr, now_ns, metrics) == "fresh"


def load_factor(l: Load, slots: float = 0.0) -> float:
    """queue * kv factor of one good scrape: 1 idle, towards 0 saturated. slots: the engine's
    learned capacity (Tracker.peak_running); the queue factor is 1 / (1 + outstanding / slots)^4,
    so a full engine weighs 1/16 of an idle one and one with a backlog of its size 1/81: new
    flows go where slots are free, as join-the-shortest-queue would send them."""
    waiting = max(0.0, l.waiting or 0.0)
    running = max(0.0, l.running or 0.0)
    queue = 1.0 / (1.0 + (waiting + running) / max(slots, running, 1.0)) ** QUEUE_POWER
    kv = 1.0
    if l.kv_usage is not None and l.kv_usage > KV_KNEE:
        over = (min(l.kv_usage, 1.0) - KV_KNEE) / (1.0 - KV_KNEE)
        kv = 1.0 - (1.0 - KV_MIN) * over
    return queue * kv


def rtt_input(tr: Tracker, probe_kind: Optional[str], w: Optional[config.Weights] = None) -> Optional[float]:
    """The RTT the policy weighs: the wire signal's handshake p50 while fresh, else the probes'
    (probe_rtt(); the smoothed RTT when w is None). A handshake is what a tcp probe measures, so the wire replaces it (and stands
    alone without probes); an http or grpc probe's answer also holds the server's own time,
    which a handshake (answered by the server's kernel) never sees, so it takes the larger."""
    probe = tr.rtt_s if w is None else probe_rtt(tr, w)
    if tr.wire_rtt_s is None:
        return probe
    if probe_kind in (None, "tcp") or probe is None:
        return tr.wire_rtt_s
    return max(probe, tr.wire_rtt_s)


def describe(tr: Tracker, now_ns: int, metrics: Optional[config.MetricsScrape] = None) -> dict:
    """One backend's signals for status: RTTs in seconds, health, load and its state."""
    l = tr.load
    state = load_state(tr, now_ns, metrics)
    return {
        "health": "down" if tr.down else "up",
        "rtt_smoothed_s": tr.rtt_s,
        "fails_in_a_row": tr.fails,
        "oks_in_a_row": tr.oks,
        "last_error": tr.last_error,
        "load_state": state,
        "load_age_s": None if l is None else (now_ns - l.t_ns) / _NS_PER_S,
        "waiting": None if l is None else l.waiting,
        "running": None if l is None else l.running,
        "kv_usage": None if l is None else l.kv_usage,
        "progress": None if l is None else l.progress,
        "load_factor": load_factor(l, tr.peak_running) if state == "fresh" and l is not None else None,
        "scrape_failures": tr.scrape_failures,
        "scrape_error": tr.scrape_error,
        "hung": is_hung(tr, now_ns, metrics),
        "slow_start_since_ns": tr.ramp_since_ns,
    }


# ---- the decision ----


def forced(service: config.Service, zero: Iterable[str], overrides: Mapping[str, int]) -> dict[str, int]:
    """Backend name -> the weight the operator forces: 0 for the names in zero (drained,
    or removed by a reload and draining out), else the override. Names not in service
    are left out."""
    zero = set(zero)
    out = {}
    for b in service.backends:
        if b.name in zero:
            out[b.name] = 0
        elif b.name in overrides:
            out[b.name] = int(overrides[b.name])
    return out


def decide(
    service: config.Service,
    trackers: dict[str, Tracker],
    pushed: Optional[dict[str, int]],
    now_ns: int,
    forced: Optional[Mapping[str, int]] = None,
) -> Decision:
    """Weights for every backend of service now; trackers are read, never changed.

    pushed: the weights last written to the data path, None when nothing was.
    forced: backend name -> the operator's weight, beating the policy (see forced()).
    A backend without a tracker is treated as never probed nor scraped.

    Rules, per service (w = service.weights; weights are integers 0..65535, 0 = no new flows):

    static      weight = backend.weight as configured; RTTs and load change nothing.
      health    as under latency_inverse: probe.fall failed probes in a row -> "down", weight 0
                (the data path gives it no new flows); probe.rise good ones -> its configured
                weight again (no slow start); every non-drained backend down -> "fail-open", all
                keep their configured weights. Up: state "static".
                push when pushed is None or any weight differs from the pushed one.

    latency_inverse, per backend b (base_b = backend.weight):
      drained   base_b == 0 -> 0 always (operator drain), state "draining".
      RTT       x = the lower median of the backend's last weights.spike_filter samples
                (1: every sample; with 2, the default, the smaller of two: host and scheduling
                noise only ever adds delay, so one stray slow sample is ignored, a slowdown
                counts from its second sample and a speedup at once), then
                smoothed per backend, tau = decay_ms, dt = time since the previous sample:
                  alpha = 1 - exp(-dt / tau)
                  ewma:      rtt <- rtt + alpha * (x - rtt)
                  peak_ewma: rtt <- x if x > rtt, else rtt + alpha * (x - rtt)
                the first sample sets rtt = x. A failed probe feeds x = probe.timeout_ms (a
                penalty) and counts toward probe.fall. That smoothed RTT is weighed only with
                jump_pct 0; otherwise (the default, 80) the steady RTT is:
      steady    the mean of the faster half of the backend's last steady_window samples (20;
                the slower half holds the noise, which only ever adds delay), so a burst of
                slow samples moves nothing and a lasting change counts once it fills half the
                window. A jump restarts the window from the last spike_filter samples at once:
                their lower median more than jump_pct % above the window's fastest sample
                while they agree (the slowest within sqrt(1 + jump_pct %) of it), or
                sqrt(1 + jump_pct %) below the steady RTT (a speedup is evidence already),
                keeping only the samples within sqrt(1 + jump_pct %) of their lower median.
                A speedup back within 1 + jump_pct % of the steady RTT before the last slowdown,
                while the new level fills at most half the window, brings that window back: a
                burst the jump took for a step costs two pushes, not a fresh window settling.
                A good probe more than jump_pct % over the window's fastest asks for a
                confirmation probe (confirm_due; edged's prober takes it a third of an
                interval later): a slowdown jump also needs no confirmation since the oldest
                of its samples to be sqrt(1 + jump_pct %) faster than their lower median.
                A real 2x step jumps at its second sample; on a loaded host probe RTTs make
                bursts of two samples at 1.5-1.75x, which do not. A backend with no RTT yet uses the
                median RTT of the backends being computed, or, when none has one,
                the same RTT for all (weights follow base alone).
      wire      while the backend's wire signal is fresh (edged sets tr.wire_rtt_s: the handshake
                p50 of real connections over weights.wire.window_ms), the RTT is rtt_input():
                the wire's with a tcp probe or none, max(probe's, wire's) with http or grpc.
      health    probe.fall failed probes in a row -> "down", weight 0; probe.rise good ones
                in a row -> up again, with slow start. A new backend starts up.
      fail-open when no non-drained backend (primary or standby) is up by its probes, the
                down ones get their computed weights from their last RTT, state
                "fail-open"; the kernel's heartbeats still gate liveness. A standby that is
                up is not failed open over: the data path serves from it while every
                primary has weight 0.
      hung      metrics fresh, waiting + running > 0 and the progress counter unchanged for
                hung_ms (measured between scrapes; a gap between two good scrapes longer
                than hung_ms, or an idle scrape, restarts the clock) while the probe says
                up -> weight = floor exactly (no max_ratio lift: effectively drained),
                state "hung". Detected whenever health.metrics is set, load_aware or not.
                When every primary is hung or down and a standby is up, hung ones get 0
                instead, so the data path hands new flows to the standby.
                When it ends (progress moves, or no work outstanding) slow start follows.
      latency   lat_b = base_b / max(rtt_b + rtt_offset, 1 us)   (rtt_offset = weights.rtt_offset_ms:
                differences far below it are probe noise, not a reason to move flows)
                raw_b = SCALE * lat_b / max(lat_c over computed backends c) * load_b
                (computed = non-drained, up or failed open, not hung; standbys included).
                The best backend of an idle service gets SCALE; the load factor is not
                normalised away, so a backend's weight moves with its own load only.
      load      load_b = 1 when load_aware is off or health.metrics is unset. Otherwise,
                from the newest good scrape while it is younger than metrics.stale_ms:
                  queue = 1 / (1 + (waiting + running) / slots)^QUEUE_POWER (4), slots = the
                          most requests the backend was ever seen running (at least running, 1):
                          an idle engine 1, a full one 1/16, a backlog of its size 1/81
                  kv    = 1 below KV_KNEE, falling linearly to KV_MIN at kv_usage 1.0
                  load  = queue * kv          (1 idle, -> 0 saturated; a signal the
                                               backend doesn't export counts as no pressure)
                  capacity (load_model capacity, the default): load *= the backend's share of the
                          largest capacity, slots x tokens/s per running request (the progress
                          counter's rate, smoothed over about a second: loadweights.py), so
                          equal relative queues get flows in proportion to capacity; unknown
                          capacity counts the median of the known ones
                stale (had a good scrape, now older than stale_ms; failed scrapes don't
                refresh it): load = NEUTRAL_LOAD, state "unknown-load". Never scraped:
                NEUTRAL_LOAD too, state "no-metrics" - unless no backend of the service
                ever had a good scrape, then load = 1 for all (state still "no-metrics").
      bounds    r_b = min(65535, round(raw_b)); lo = max(floor, ceil(max(r) / max_ratio));
                weight_b = max(lo, r_b).
      slow start after down -> up or hung -> not hung at time t0, while now - t0 < slow_start_ms:
                weight_b = floor + (weight_b - floor) * f, f = (now - t0) / slow_start_ms rounded
                down to a quarter (4 pushes a ramp), state "slow-start" (below lo; 0 turns it off).
      hysteresis push when pushed is None, the backend names differ, a weight crosses
                between 0 and non-zero, or for some backend
                  |weight_b - pushed_b| > hysteresis_pct% of max(pushed_b, max(pushed) / max_ratio)
                (relative to its own weight, but weights near the floor don't churn: the
                threshold never drops below that of the smallest weight the bounds allow).
                A host stall or noise holds such a push (not one for health or new backends):
                at least half of two or more weighted backends whose newest regular probe is at
                most two intervals old found it more than jump_pct % over their window's fastest
                (or the level before their last slowdown; steadyrtt.stalled), or no weight moved
                more than 3x the service's probe noise (the largest of its windows' lower median
                over fastest, as log ratios), capped at 1.4x (steadyrtt.within_noise).
                When no push is due, Decision.weights is pushed unchanged.

    operator    forced (see forced(): 0 for a drain or a backend a reload removed, else the
                API's override) beats the policy for those backends. The hysteresis is
                judged on the backends the policy still owns (as if the forced ones held
                what the policy computes for them), so a drain or an override never turns
                every small change into a push; a forced weight that differs from the
                pushed one is a push of its own.
    """
    w = service.weights
    if w.policy == "static":
        computed, states, reasons = _static(service, trackers)
    else:
        computed, states, reasons = _latency_inverse(service, trackers, now_ns)
    forced = {n: v for n, v in (forced or {}).items() if n in computed}
    judged = pushed
    if forced and pushed is not None:
        judged = {**pushed, **{n: computed[n] for n in forced}}
    push = _push_due(computed, judged, w)
    if (
        push
        and judged is not None
        and not _health_moved(computed, judged)
        and steadyrtt.held(service, trackers, computed, judged, now_ns)
    ):
        push = False  # the host stalls or the change is noise: a change of RTTs waits
    weights = {**(computed if push or judged is None else judged), **forced}
    push = (push or any(pushed is None or pushed.get(n) != v for n, v in forced.items())) and weights != pushed
    return Decision(
        weights=weights if push or pushed is None else dict(pushed),
        computed=computed,
        states=states,
        reasons=reasons,
        push=push,
    )


def _health_moved(computed: dict[str, int], pushed: dict[str, int]) -> bool:
    """Backends came or went, or a weight crossed between 0 and non-zero."""
    return set(computed) != set(pushed) or any((computed[n] == 0) != (pushed[n] == 0) for n in computed)


def _fail_open(service: config.Service, trs: dict[str, Tracker]) -> bool:
    """Every non-drained backend (primary or standby) is down by its probes: the probes are
    taken to be wrong rather than the whole service, and none is taken out."""
    live = [b for b in service.backends if b.weight > 0]
    return bool(live) and all(trs[b.name].down for b in live)


def _down_reason(tr: Tracker) -> str:
    return f"{tr.fails} failed probes in a row: {tr.last_error}"


def _static(
    service: config.Service, trackers: dict[str, Tracker]
) -> tuple[dict[str, int], dict[str, str], dict[str, str]]:
    """The static policy: configured weights, 0 for a backend its probes call down."""
    trs = {b.name: trackers.get(b.name) or Tracker() for b in service.backends}
    fail_open = _fail_open(service, trs)
    weights, states, reasons = {}, {}, {}
    for b in service.backends:
        tr, name = trs[b.name], b.name
        weights[name], states[name], reasons[name] = b.weight, "static", f"configured weight {b.weight}"
        if b.weight == 0:
            states[name] = "draining"
        elif tr.down and not fail_open:
            weights[name], states[name], reasons[name] = 0, "down", _down_reason(tr)
        elif tr.down:
            states[name] = "fail-open"
            reasons[name] = f"every backend fails its probes: failing open, configured weight {b.weight}"
    return weights, states, reasons


def _latency_inverse(
    service: config.Service, trackers: dict[str, Tracker], now_ns: int
) -> tuple[dict[str, int], dict[str, str], dict[str, str]]:
    w = service.weights
    health = service.health
    metrics = health.metrics if health else None
    scaled = w.load_aware and metrics is not None
    trs = {b.name: trackers[b.name] if b.name in trackers else Tracker() for b in service.backends}
    live = [b for b in service.backends if b.weight > 0]
    fail_open = _fail_open(service, trs)
    any_metrics = any(tr.load is not None for tr in trs.values())
    # Every primary hung or down while a standby serves: hung primaries go to 0, so the data
    # path (which uses standbys only while no primary takes new flows) hands new flows over.
    hung = {b.name for b in live if not trs[b.name].down and is_hung(trs[b.name], now_ns, metrics)}
    primaries = [b for b in live if not b.standby]
    standby_serves = any(b.standby and not trs[b.name].down and b.name not in hung for b in live)
    hand_over = bool(hung) and standby_serves and all(trs[b.name].down or b.name in hung for b in primaries)

    weights: dict[str, int] = {}
    states: dict[str, str] = {}
    reasons: dict[str, str] = {}
    computed = []
    for b in service.backends:
        tr = trs[b.name]
        if b.weight == 0:
            weights[b.name], states[b.name], reasons[b.name] = 0, "draining", "weight 0 in config"
        elif tr.down and not fail_open:
            weights[b.name], states[b.name], reasons[b.name] = 0, "down", _down_reason(tr)
        elif b.name in hung:
            assert tr.load is not None and tr.stall_since_ns is not None
            stalled_s = (tr.load.t_ns - tr.stall_since_ns) / _NS_PER_S
            weights[b.name], states[b.name] = (0 if hand_over else w.floor), "hung"
            reasons[b.name] = (
                f"hung: {_num(tr.load.waiting)} waiting, {_num(tr.load.running)} running, "
                f"no progress for {stalled_s:.1f} s" + ("; the standby serves" if hand_over else "")
            )
        else:
            computed.append(b)

    share = _shares(w, trs, computed) if scaled else {}
    kind = health.probe.kind if health and health.probe else None
    rtts = {b.name: rtt_input(trs[b.name], kind, w) for b in computed}
    known = [r for r in rtts.values() if r is not None]
    fill_s = statistics.median(known) if known else 1.0
    lat = {}
    for b in computed:
        rtt = rtts[b.name]
        rtt = fill_s if rtt is None else rtt
        lat[b.name] = b.weight / max(rtt + w.rtt_offset_ms / 1000, RTT_MIN_S)
    best = max(lat.values(), default=1.0)

    raw: dict[str, int] = {}
    for b in computed:
        tr = trs[b.name]
        rtt = rtts[b.name]
        source = "wire rtt" if tr.wire_rtt_s is not None and rtt == tr.wire_rtt_s else "rtt"
        words = [
            f"{source} {rtt * 1000:.2f} ms"
            if rtt is not None
            else (f"no probe data: median rtt {fill_s * 1000:.2f} ms" if known else "no probe data")
        ]
        state = "fail-open" if tr.down else "up"
        if tr.down:
            words.insert(0, "every backend fails its probes: failing open")
        factor = 1.0
        if scaled:
            factor, load_state_name, load_words = _load(tr, now_ns, metrics, any_metrics)
            words.append(load_words)
            if share.get(b.name, 1.0) < 1.0:  # the largest's words stay as they were
                factor *= share[b.name]
                words.append(f"capacity x{share[b.name]:.2f}")
            if state == "up" and load_state_name != "up":
                state = load_state_name
        raw[b.name] = min(MAX_WEIGHT, _round(SCALE * lat[b.name] / best * factor))
        states[b.name] = state
        reasons[b.name] = ", ".join(words)

    lo = max(w.floor, math.ceil(max(raw.values(), default=0) / w.max_ratio))
    ramp_ns = w.slow_start_ms * _NS_PER_MS
    for b in computed:
        tr = trs[b.name]
        weights[b.name] = max(lo, raw[b.name])
        if ramp_ns and tr.ramp_since_ns is not None and not tr.down:
            frac = (now_ns - tr.ramp_since_ns) / ramp_ns
            if frac < 1.0:
                frac = max(0.0, math.floor(frac * 4) / 4)  # quarter steps: not a push a decision
                target = weights[b.name]
                weights[b.name] = _round(w.floor + (target - w.floor) * frac)
                states[b.name] = "slow-start"
                reasons[b.name] += f", slow start {frac:.0%} of {target}"
    return {b.name: weights[b.name] for b in service.backends}, states, reasons


def _shares(w: config.Weights, trs: dict[str, Tracker], computed: list) -> dict[str, float]:
    """load_model capacity: each computed backend's capacity share (loadweights.shares); queue: none."""
    if w.load_model != "capacity":
        return {}
    return loadweights.shares(
        {b.name: loadweights.capacity(trs[b.name].speed, trs[b.name].peak_running) for b in computed}
    )


def _load(
    tr: Tracker, now_ns: int, metrics: Optional[config.MetricsScrape], any_metrics: bool
) -> tuple[float, str, str]:
    """(factor, state, words) of one backend's load signals."""
    state = load_state(tr, now_ns, metrics)
    if state == "fresh":
        assert tr.load is not None
        l = tr.load
        words = f"{_num(l.waiting)} waiting, {_num(l.running)} running"
        if l.kv_usage is not None:
            words += f", kv {l.kv_usage:.0%}"
        factor = load_factor(l, tr.peak_running)
        return factor, "up", f"{words}: load x{factor:.2f}"
    if state == "stale":
        assert tr.load is not None
        age_s = (now_ns - tr.load.t_ns) / _NS_PER_S
        failing = f" ({tr.scrape_failures} failed scrapes: {tr.scrape_error})" if tr.scrape_failures else ""
        return NEUTRAL_LOAD, "unknown-load", f"metrics {age_s:.1f} s old{failing}: load x{NEUTRAL_LOAD} (unknown)"
    if any_metrics:
        return NEUTRAL_LOAD, "no-metrics", f"no metrics yet: load x{NEUTRAL_LOAD} (unknown)"
    return 1.0, "no-metrics", "no backend has metrics yet: not scaled"


def _push_due(computed: dict[str, int], pushed: Optional[dict[str, int]], w: config.Weights) -> bool:
    if pushed is None or set(pushed) != set(computed):
        return True
    if any((computed[n] == 0) != (pushed[n] == 0) for n in computed):
        return True
    if w.policy == "static":
        return computed != pushed
    least = max(pushed.values(), default=0) / w.max_ratio
    return any(abs(computed[n] - pushed[n]) > w.hysteresis_pct / 100 * max(pushed[n], least) for n in computed)


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def _num(x: Optional[float]) -> str:
    return "?" if x is None else f"{x:g}"


def push_due(computed: dict[str, int], pushed: Optional[dict[str, int]], w: config.Weights) -> bool:
    """Whether computed differs enough from pushed to be written (the hysteresis rule of decide());
    the fleet uses it for reports and snapshots too."""
    return _push_due(computed, pushed, w)
