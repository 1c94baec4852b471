"""Steering, edged's policy loop: probe results and scrapes in (the prober it owns, in a child
process of its own: probe.child), one decision per service (weights.decide, or the fleet's snapshot)
and, when it says so, the weights into the maps. Owns State.services and State.wire_fresh; reads the operator's marks
and what a reload left draining, never changes them. Holds no math (weights.py decides).
"""

from __future__ import annotations

import asyncio
import time
from typing import Collection

from controlplane import loadweights, weights, wiresignals
from controlplane.config import Config, Service
from controlplane.edged.state import State, Steered
from controlplane.edged.status import STATUS_EVERY_S
from controlplane.errors import EdgeError
from controlplane.probe import Target
from controlplane.probe.budget import Budget
from controlplane.probe.child import ChildProber
from controlplane.samples import Load, Sample
from controlplane.tasks import within

RELAX_HOLD_NS = int(3 * STATUS_EVERY_S * 1e9)  # relaxed probes outlive a late status round, not a stuck loop


def interval_s(s: Service, relaxed: bool = False, stretch: float = 1.0) -> float:
    """How often a service's step runs at least: its probes' interval (relaxed: every
    backend's probes are, and steps come as without probes: the scrapes' and the wire's
    intervals), else its scrapes', else 1 s; never less often than wire.interval_ms.
    Under the static policy every 1 s, probes or not: no probe or scrape result changes
    a configured weight (weights.decide), so a step at their pace would decide the same.
    stretch: the probe budget's (Prober.stretch), by which probe and scrape intervals run longer."""
    health, interval = s.health, 1.0
    if s.weights.policy == "static":
        return interval
    if health and health.probe:
        interval = max(health.probe.interval_ms, health.probe.relaxed_ms if relaxed else 0) / 1000
        if relaxed and health.metrics:
            interval = min(interval, health.metrics.interval_ms / 1000)
        interval *= stretch
    elif health and health.metrics:
        interval = health.metrics.interval_ms / 1000 * stretch
    if s.weights.wire.enabled:  # wire signals change between probes
        interval = min(interval, s.weights.wire.interval_ms / 1000)
    return interval


def targets(cfg: Config) -> list[Target]:
    """What the prober probes and scrapes: every backend of a service with a probe or metrics."""
    out = []
    for s in cfg.services:
        health = s.health
        probe = health.probe if health else None
        metrics = health.metrics if health else None
        if probe is None and metrics is None:
            continue
        for b in s.backends:
            out.append(Target((s.name, b.name), str(b.address), b.port, probe, metrics))
    return out


def _new_tracker(s: Service, joins_running: bool) -> weights.Tracker:
    """A backend that joins a running service (reload, discovery) enters through slow start."""
    tr = weights.Tracker()
    if joins_running and s.weights.slow_start_ms:
        tr.ramp_since_ns = time.monotonic_ns()
    return tr


class Steering:
    """The services edged steers (State.services), their probes and their decisions."""

    def __init__(self, state: State):
        self.state = state
        # in a child process of its own: probe rounds hold neither edged's loop nor its GIL; results come back
        # in batches; a child that dies is an error event and is started again
        self.prober = ChildProber(
            on_sample=self.on_sample,
            on_load=self.on_load,
            on_budget=self.on_budget,
            on_restart=lambda text: state.events.emit("error", text),
        )
        self.targets = targets  # what set_services() hands the prober (a test may probe nothing)

    # ------------------------------------------------------------ the services

    def set_services(self, cfg: Config) -> None:
        """cfg's services are the ones steered from now on: trackers kept for the backends
        that stay, the prober's targets and the observer's series follow."""
        state = self.state
        old = state.services
        state.services = {}
        for s in cfg.services:
            st = old.get(s.name) or Steered(s)
            st.service = s
            st.trackers = {b.name: st.trackers.get(b.name) or _new_tracker(s, s.name in old) for b in s.backends}
            st.wire_applied = False  # new trackers get the wire's RTT at the next step
            st.open_extras = {}  # an apply may have renumbered: the next step writes every scale
            # what the tables hold now: an apply (reload, discovery) wrote the weights it was given,
            # and a drain or pin it did not know of is pushed again by the next step
            st.pushed = state.maps.weights(s.name)
            state.services[s.name] = st
        # what a service that is new here found fresh before (a reload took it out and back) counts no more
        state.wire_fresh = {(name, b) for name, st in state.services.items() for b in st.wire_fresh}
        self.prober.set_budget(cfg.node.probe_budget)
        self.prober.set_targets(self.targets(cfg))
        state.observer.retain((s.name, b.name) for s in cfg.services for b in s.backends)

    def start_loops(self) -> None:
        """A steer loop (State.tasks) for every service that has none running."""
        tasks = self.state.tasks
        for name in self.state.services:
            if not any(t.get_name() == f"steer:{name}" for t in tasks if not t.done()):
                tasks.append(asyncio.create_task(self.steer_loop(name), name=f"steer:{name}"))

    # ------------------------------------------------------------ signals in

    def on_sample(self, key, sample: Sample) -> None:
        name, backend = key
        st = self.state.services.get(name)
        if st is None or backend not in st.trackers:
            return
        probe, sla = st.service.health.probe, st.service.sla
        tr = st.trackers[backend]
        was_down = tr.down
        weights.observe_sample(tr, sample, st.service.weights, probe)
        if probe is not None and weights.confirm_due(tr, sample, st.service.weights):
            self.prober.confirm(key, probe.interval_ms / 3)  # a second look before the next probe
        if not sample.extra:
            self.state.observer.observe_sample(
                name, backend, sample, probe.window if probe else 1, sla.p99_rtt_ms / 1000 if sla else None
            )
        if sample.ok and st.service.health.passive is not None:
            st.passed.add(backend)  # evidence for readmission after a passive ejection (step)
            st.wake.set()
        elif weights.sample_moves(tr, sample, was_down, st.service.weights, probe.kind if probe else None):
            st.wake.set()  # else the next periodic step decides the same

    def on_load(self, key, load: Load) -> None:
        name, backend = key
        st = self.state.services.get(name)
        if st is None or backend not in st.trackers:
            return
        weights.observe_load(st.trackers[backend], load, st.service.weights)
        if st.computed:  # under the static policy a scrape moves no weight
            st.wake.set()

    def on_budget(self, b: Budget) -> None:
        """The probes configured started or stopped asking for more than node.probe_budget."""
        if b.short:
            over = f"node.probe_budget {b.budget_per_s:.0f}"
            if b.limited_by_loop:
                over = f"the budget {b.budget_per_s:.0f} (node.probe_budget {b.cap_per_s:.0f}, lowered: the probes took over half of the loop)"
            text = (
                f"probes: the configured intervals ask for {b.demand_per_s:.0f} probes/s, over {over}: every interval "
                f"runs {b.stretch:.2f}x longer ({b.shortfall:.0%} of the probes are not run)"
            )
        else:
            text = f"probes: {b.demand_per_s:.0f} probes/s asked for, within node.probe_budget {b.budget_per_s:.0f}"
        self.state.events.emit(
            "probe-budget",
            text,
            short=b.short,
            budget_per_s=round(b.budget_per_s, 1),
            configured_per_s=b.cap_per_s,
            demand_per_s=round(b.demand_per_s, 1),
            stretch=round(b.stretch, 3),
            shortfall_ratio=round(b.shortfall, 4),
        )

    def pace_probes(self, fresh: Collection[tuple[str, str]], now_ns: int) -> None:
        """Backends (service, backend) in fresh, whose wire signals real traffic keeps fresh, are
        probed every probe.relaxed_interval_ms for the next RELAX_HOLD_NS (the prober keeps
        health probing: a failed probe brings the full rate back); the others at the full rate."""
        keys = self.prober.keys()
        self.prober.relax([k for k in keys if k in fresh], now_ns + RELAX_HOLD_NS)
        self.prober.relax([k for k in keys if k not in fresh], 0)

    # ------------------------------------------------------------ deciding

    async def steer_loop(self, name: str) -> None:
        """Decides when a probe result that can move a weight (weights.sample_moves) or a scrape
        came in, at most every quarter interval, and at least once an interval: a changed RTT
        reaches the table without waiting a tick. While every backend's probes are relaxed the
        interval is as without probes (a failed probe wakes the step at once all the same);
        under the static policy it is always so (interval_s)."""
        failing = None
        while True:
            st = self.state.services.get(name)
            if st is None:
                return
            await self.state.maps_idle.wait()  # an apply writing the maps on a worker thread comes first
            st.wake.clear()
            try:
                self.step(st, time.monotonic_ns())
                failing = None
            except EdgeError as e:
                failing = self.state.failed(f"{name}: {e}", e, failing, service=name)
            relaxed = st.computed and all(self.prober.relaxed((name, b.name)) for b in st.service.backends)
            interval = interval_s(st.service, relaxed, self.prober.stretch)
            await asyncio.sleep(interval / 4)
            if not st.wake.is_set():
                try:
                    await within(st.wake.wait(), interval * 3 / 4)
                except asyncio.TimeoutError:
                    pass

    def step(self, st: Steered, now_ns: int) -> bool:
        """One decision for one service; pushes it when the policy says so. Not while an apply
        writes the maps on a worker thread (State.applying): callers on the loop wait for it."""
        s, state = st.service, self.state
        if state.applying:
            raise EdgeError(f"{s.name}: an apply is writing the maps; the step waits for it")
        self._readmit(st)
        self._read_wire(st, now_ns)
        self._write_open_scales(st)
        forced = self._operator_weights(s)
        d = weights.decide(s, st.trackers, st.pushed, now_ns, forced=forced)
        # decide() names every backend: with nothing changed the walk below would change nothing
        same = len(d.states) == len(s.backends) and d.states == st.states and d.reasons == st.reasons
        for b in () if same else s.backends:
            state_now, reason = d.states.get(b.name, ""), d.reasons.get(b.name, "")
            if state_now != st.states.get(b.name):
                if b.name in st.states:
                    state.events.emit(
                        "state",
                        f"{s.name}/{b.name}: {st.states[b.name]} -> {state_now}" + (f" ({reason})" if reason else ""),
                        service=s.name,
                        backend=b.name,
                        old=st.states[b.name],
                        new=state_now,
                        reason=reason,
                    )
                st.states[b.name] = state_now
            st.reasons[b.name] = reason
        if state.fleet is not None:  # the fleet's snapshot, once one applies, instead of this node's view
            d = state.fleet.steer(s, d, st.pushed, forced)
        if not d.push:
            return False
        self._push(st, d.weights)
        return True

    def _push(self, st: Steered, new: dict[str, int]) -> None:
        """new into the maps and st.pushed; a "weights" event says what moved and how long it took."""
        s, state = st.service, self.state
        t0 = time.perf_counter()
        state.maps.set_weights(s, new)
        took_ms = (time.perf_counter() - t0) * 1000
        before = st.pushed or {}
        changes = ", ".join(f"{n} {before.get(n, '-')}->{w}" for n, w in new.items() if before.get(n) != w)
        previous, st.pushed = st.pushed, dict(new)
        st.pushes += 1
        state.observer.weight_pushed(s.name)
        state.events.emit(
            "weights",
            f"{s.name}: weights {changes} ({took_ms:.1f} ms)",
            service=s.name,
            weights=dict(new),
            previous=previous,
            took_ms=took_ms,
        )

    def _write_open_scales(self, st: Steered) -> None:
        """new_flows least_loaded: each backend's scale from its learned slots (loadweights.open_extras)
        into the data path where it changed (edge_inflight's third part; select.h, open_cost)."""
        s, maps = st.service, self.state.maps
        if s.new_flows != "least_loaded" or maps is None:
            return
        _, bids = maps.ids(s.name)
        extras = loadweights.open_extras({n: st.trackers[n].peak_running for n in bids if n in st.trackers})
        for name, extra in extras.items():
            if st.open_extras.get(bids[name]) != extra:
                maps.set_open_scale(bids[name], extra)
                st.open_extras[bids[name]] = extra

    def _read_wire(self, st: Steered, now_ns: int) -> None:
        """The data path's wire signals of st's backends into its window (every wire.interval_ms);
        a fresh handshake p50 becomes the policy's RTT input, and wire_fresh says whose is fresh."""
        s, cfg, state = st.service, st.service.weights.wire, self.state
        if not cfg.enabled:
            st.wire_applied = st.wire_applied and st.wire is None
            st.wire = None
        elif st.wire is None or now_ns - st.wire_read_ns >= cfg.interval_ms * 1_000_000:
            st.wire_read_ns = now_ns
            st.wire = st.wire or wiresignals.Windows(cfg.window_ms * 1_000_000, cfg.min_samples)
            st.wire.reconfigure(cfg.window_ms * 1_000_000, cfg.min_samples)
            _, bids = state.maps.ids(s.name)
            names = [b.name for b in s.backends if b.name in bids]
            st.wire.observe_rows(now_ns, names, state.maps.wire_rows([bids[n] for n in names]))
            st.wire_applied = False
        if st.wire_applied:  # the signals and the trackers are as the last step left them
            return
        p50s = st.wire.fresh_p50s() if st.wire is not None else {}  # the fresh ones' handshake p50
        for name, tr in st.trackers.items():
            tr.wire_rtt_s = p50s.get(name)
        fresh = set(p50s)
        if fresh != st.wire_fresh:  # wire_fresh changes by the difference: it holds every service's
            state.wire_fresh -= {(s.name, n) for n in st.wire_fresh - fresh}
            state.wire_fresh |= {(s.name, n) for n in fresh - st.wire_fresh}
            st.wire_fresh = fresh
        st.wire_applied = True

    def fleet_apply(self, got) -> dict[str, str]:
        """A fleet snapshot arrived: every service it covers steps now (writing its weights).
        Returns each such service's table digest, for the fleet's event."""
        tables = {}
        for name in got.weights:
            st = self.state.services.get(name)
            if st is not None and self.state.applying:  # its steer loop steps once the apply is done
                st.wake.set()
            elif st is not None:
                try:
                    self.step(st, time.monotonic_ns())
                    tables[name] = self.state.maps.table_digest(st.service)
                except EdgeError as e:
                    self.state.events.emit("error", f"{name}: fleet snapshot v{got.version}: {e}", service=name)
        return tables

    def _readmit(self, st: Steered) -> None:
        """A passing probe is evidence: a backend on probation after a passive ejection takes new
        flows again without a trial flow (with heartbeats, the data path takes a heartbeat as
        evidence itself)."""
        passed, st.passed = st.passed, set()
        for name in sorted(passed):
            if self.state.maps.readmit(st.service.name, name):
                self.state.events.emit(
                    "state",
                    f"{st.service.name}/{name}: probation -> readmitted (a probe passed)",
                    service=st.service.name,
                    backend=name,
                    old="probation",
                    new="readmitted",
                )

    def _operator_weights(self, s: Service) -> dict[str, int]:
        """Backend name -> the weight the operator forces (drain, reload removal, override)."""
        state = self.state
        if not (state.drained or state.leaving or state.overrides):
            return {}
        return weights.forced(
            s,
            (b.name for b in s.backends if (s.name, b.name) in state.drained or (s.name, b.name) in state.leaving),
            {b: w for (n, b), w in state.overrides.items() if n == s.name},
        )
