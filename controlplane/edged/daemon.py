"""edged: the control-plane daemon of one edge node. Owns the orchestration, not the policy:
deploy (or adopt) the data path, probe every backend (probe/), hand the results to weights.py,
write what changed (maps.set_weights) and, once a second, what it measured (edge_be_probe).
One asyncio loop, never blocked for long: walks of the maps for status and metrics run on a
worker thread within a deadline; a failed map write is an error event and
edge_map_errors_total, and the loop goes on. Stopping edged leaves the data path forwarding.

    (the command line, serve() and main() are in cli.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Optional

from controlplane import abi, deploy, desired, loader, weights, wire
from controlplane.edged import announce, bird, metrics, sdnotify, watch
from controlplane.config import Config, Service
from controlplane.edged.changes import Changes
from controlplane.errors import EdgeError
from controlplane.edged.events import Events
from controlplane.edged.operations import WALK_DEADLINE_S, WALK_GRACE_S, Operations
from controlplane.discovery.supervisor import Supervisor, secrets_of
from controlplane.fleet import member as fleet_member
from controlplane.probe import Prober, Target
from controlplane.signals import Load, Sample

STATUS_EVERY_S = 1.0  # how often measurements are written to edge_be_probe
DISCOVERY_START_S = 5.0  # at start, discovery's first answers are waited for this long at most
WATCH_EVERY_S = 1.0  # how often edged checks that its data path is still attached and pinned
RELAX_HOLD_NS = int(3 * STATUS_EVERY_S * 1e9)  # relaxed probes outlive a late status round, not a stuck loop


# pyroute2's sync calls cannot run on a thread whose event loop is running: the data-path
# watch's netlink queries (milliseconds) run here.
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edged-netlink")


Leaving = desired.Leaving


@dataclass
class Steered:
    """One service as edged drives it."""

    service: Service
    trackers: dict[str, weights.Tracker] = field(default_factory=dict)
    pushed: Optional[dict[str, int]] = None  # weights in the active table
    states: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    pushes: int = 0
    passed: set[str] = field(default_factory=set)  # backends whose probe passed since the last step
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # new signals since the last decision
    wire: Optional[wire.Windows] = None  # the data path's wire signals over weights.wire.window_ms
    wire_read_ns: int = 0
    wire_fresh: set[str] = field(default_factory=set)  # backends whose wire signal was fresh at the last step
    wire_applied: bool = False  # the trackers' wire_rtt_s and wire_fresh follow wire_signals

    @property
    def wire_signals(self) -> dict[str, wire.Signal]:
        """Backend name -> its wire signal as of the last read (worked out when first asked)."""
        return self.wire.signals() if self.wire is not None else {}

    @property
    def computed(self) -> bool:
        return self.service.weights.policy != "static"


class Daemon(Changes, Operations):
    """One edged: a deployed data path and the loop that steers it."""

    def __init__(self, cfg: Config, iface: str, events: Events | None = None, config_path: str | None = None):
        self.cfg = cfg
        self.iface = iface
        self.config_path = config_path
        self.drained: set[tuple[str, str]] = set()  # operator drains (API), kept across restarts
        self.overrides: dict[tuple[str, str], int] = {}  # operator weights (API)
        self.leaving: dict[tuple[str, str], Leaving] = {}  # removed by a reload, draining out
        self.notify = sdnotify.Notifier(log=lambda line: self.events.emit("error", f"sd_notify: {line}"))
        self.instance = loader.instance_name(iface)
        self.pin_path = loader.instance_dir(cfg.node.pin_dir, self.instance)
        self.events = events or Events()
        self.static_cfg = cfg  # the config file's; self.cfg adds what discovery found
        self.discovery = Supervisor(self._apply_discovered, self.events.emit)
        self._apply_lock = asyncio.Lock()  # one change of the maps at a time: reload, discovery, drain-out
        self.prober = Prober(on_sample=self._on_sample, on_load=self._on_load)
        self.observer = metrics.Observer()
        self._metrics: metrics.MetricsServer | None = None
        self.services: dict[str, Steered] = {}
        self.maps = None
        self._held = None
        self._reply_ifindex: tuple[int, ...] = ()  # where deploy put the XDP fast path of replies
        self._tasks: list[asyncio.Task] = []
        self._walks: set[asyncio.Future] = set()  # status walks on _walker, for close() to wait for
        self._stopping = asyncio.Event()
        # Why the data path is not whole ('' while it is): edged then says NOT_SERVING.
        self.not_serving = ""
        self.on_serving: Callable[[bool], object] | None = None  # serve() sets grpc health with it
        self.node_drained = False  # `edgectl drain-node`: every VIP withdrawn from BGP
        self.announcer: announce.Announcer | None = None  # with node.bgp: VIPs over BGP
        self._node_lock = deploy.NodeLock(self.instance, iface)  # no edgectl deploy while edged runs
        self._write_lock = deploy.NodeLock(self.instance, iface, "write", deploy.WRITE_WAIT_S)  # nor undeploy midway
        self.fleet: fleet_member.Member | None = None  # with node.fleet: the fleet's shared weights
        # (service, backend) whose wire signal was fresh at its service's last step (adaptive probing)
        self.wire_fresh: set[tuple[str, str]] = set()

    # ------------------------------------------------------------ start, stop

    async def start(self) -> None:
        """Serves metrics, deploys or adopts the data path and starts probing. Raises
        EdgeError; must run on the loop that will run run()."""
        loop = asyncio.get_running_loop()
        collector = metrics.EdgeCollector(
            metrics.LoopSource(loop, self.snapshot), self.observer, iface=self.iface,
            serving=lambda: not self.not_serving,
            # scrapes run on prometheus_client's thread; Events belongs to the loop
            on_error=lambda text: loop.call_soon_threadsafe(self.events.emit, "error", f"metrics: {text}"),
        )
        # first: a second edged on the same router is told so here, not by the metrics port it shares
        self._node_lock.acquire()  # held until close(): edgectl deploy is refused meanwhile
        # before deploy: a bad metrics_listen fails with the kernel untouched
        self._metrics = metrics.start_http(self.cfg.node.metrics_listen, metrics.make_registry(collector))
        # drain-node outlives edged (a mark beside the locks): a restart must not announce again
        self.node_drained = deploy.node_drain(self.instance) is not None
        # discovered backends are there from the first deploy (or a source's failure is on record)
        self.discovery.configure(self.static_cfg, secrets_of(self.static_cfg))
        await self.discovery.first(DISCOVERY_START_S)
        self.cfg = self.discovery.effective(self.static_cfg)
        # pyroute2's sync API runs an event loop of its own: netlink work goes to a thread
        await asyncio.to_thread(self._write_lock.acquire)
        try:
            res = await asyncio.to_thread(
                deploy.deploy, self.cfg, self.iface, adopt_weights=True, hold=True, amend=self._keep_leaving,
                progress=lambda line: loop.call_soon_threadsafe(self.events.emit, "progress", line),
                lock=self._node_lock)
        finally:
            self._write_lock.release()
        self._held, self.maps, self._reply_ifindex = res.held, res.maps, res.reply_ifindex
        self._adopt_operator_state()
        self._set_services(desired.fit(self.cfg, self.leaving)[0])
        if self.cfg.node.bgp is not None:  # announces nothing until run(): the node is not serving yet
            speaker = bird.Bird(self.cfg.node.bgp)
            await speaker.start()
            self.announcer = announce.Announcer(speaker, self.node_state, self.events.emit)
            self.events.emit("bgp", f"bgp: bird (pid {speaker.pid}) speaking to "
                                    f"{', '.join(str(p.address) for p in self.cfg.node.bgp.peers)}")
            if self.node_drained:
                self.events.emit("drain-node", "node drained before this start: every VIP stays withdrawn "
                                               "(edgectl undrain-node to end it)", drained=True)
        if self.cfg.node.fleet is not None:  # joins at run(); until a snapshot applies, weights are local
            self.fleet = fleet_member.Member(self.cfg.node.fleet, lambda: [st.service for st in self.services.values()],
                                             self._fleet_apply, self.events.emit, lambda: not self.not_serving,
                                             self.local_marks,
                                             lambda: {n: {b: wire.summary(g) for b, g in st.wire_signals.items()}
                                                      for n, st in self.services.items()},
                                             self.discovery.unsettled)
        verb = "adopted the data path on" if res.updated else "deployed on"
        self.events.emit("deployed", f"{verb} {res.iface} (XDP {res.mode}, return path on "
                                     f"{', '.join(res.return_ifaces)}), {len(self.cfg.services)} services",
                         iface=res.iface, adopted=res.updated,
                         weights={name: dict(st.pushed or {}) for name, st in self.services.items()})
        self.discovery.start()

    def _keep_leaving(self, maps, cfg: Config) -> Config:
        """What a restarted edged programs: cfg plus the backends a reload before the restart
        removed and that are still draining out (edge_be_probe remembers them)."""
        leaving = {}
        for s in cfg.services:
            for backend, until_s in maps.leaving(s):
                if all(b.name != backend.name for b in s.backends):  # not back in the config
                    until = None if until_s == abi.UNKNOWN else until_s * 1_000_000_000
                    leaving[(s.name, backend.name)] = Leaving(s, backend, until)
        applied, self.leaving, _ = desired.fit(cfg, leaving)
        return applied

    def _adopt_operator_state(self) -> None:
        """Drains and weight overrides set through the API live in edge_be_probe, so a
        restarted edged keeps them."""
        for s in self.cfg.services:
            _, bids = self.maps.ids(s.name)
            for name, bid in bids.items():
                p = self.maps.read_status(bid)
                if p.drained:
                    self.drained.add((s.name, name))
                if p.override is not None:
                    self.overrides[(s.name, name)] = p.override
        if self.drained or self.overrides or self.leaving:
            self.events.emit("adopted", f"kept {len(self.drained)} drains, {len(self.overrides)} weight "
                                        f"overrides and {len(self.leaving)} backends draining out from "
                                        f"before the restart", leaving=sorted(f"{k[0]}/{k[1]}" for k in self.leaving))

    def _set_services(self, cfg: Config) -> None:
        old = self.services
        self.services = {}
        for s in cfg.services:
            st = old.get(s.name) or Steered(s)
            st.service = s
            st.trackers = {b.name: st.trackers.get(b.name) or self._new_tracker(s, s.name in old)
                           for b in s.backends}
            st.wire_applied = False  # new trackers get the wire's RTT at the next step
            # what the tables hold now: an apply (reload, discovery) wrote the weights it was given,
            # and a drain or pin it did not know of is pushed again by the next step
            st.pushed = self.maps.weights(s.name)
            self.services[s.name] = st
        # what a service that is new here found fresh before (a reload took it out and back) counts no more
        self.wire_fresh = {(name, b) for name, st in self.services.items() for b in st.wire_fresh}
        self.prober.set_targets(self._targets(cfg))
        self.observer.retain((s.name, b.name) for s in cfg.services for b in s.backends)

    @staticmethod
    def _new_tracker(s: Service, joins_running: bool) -> weights.Tracker:
        """A backend that joins a running service (reload, discovery) enters through slow start."""
        tr = weights.Tracker()
        if joins_running and s.weights.slow_start_ms:
            tr.ramp_since_ns = time.monotonic_ns()
        return tr

    @staticmethod
    def _targets(cfg: Config) -> list[Target]:
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

    async def run(self) -> None:
        """Steers until stop() is called."""
        for st in self.services.values():
            name = st.service.name
            self._tasks.append(asyncio.create_task(self._steer_loop(name), name=f"steer:{name}"))
        self._tasks.append(asyncio.create_task(self._status_loop()))
        # faults of the node (interface gone, bpffs unmounted): reported through _serving()
        self._tasks.append(asyncio.create_task(
            watch.run(self._watched, self._serving, _worker, WATCH_EVERY_S, self._writing, self._repaired),
            name="watch"))
        if self.announcer is not None:
            self._tasks.append(asyncio.create_task(self.announcer.run(), name="announce"))
        if self.fleet is not None:
            self._tasks.append(asyncio.create_task(self.fleet.run(), name="fleet"))
        await self._stopping.wait()

    def stop(self) -> None:
        self._stopping.set()

    def healthy(self) -> bool:
        """For the systemd watchdog: no loop of ours died with an exception."""
        return self.discovery.healthy() and not any(
            t.done() and not t.cancelled() and t.exception() is not None for t in self._tasks)

    async def close(self) -> None:
        await self.discovery.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.announcer is not None:  # first: the upstream moves flows away while we still forward
            try:
                await self.announcer.withdraw_all("edged stopping")
            except EdgeError as e:
                self.events.emit("error", f"bgp: {e}")
            await self.announcer.speaker.stop()
            self.announcer = None
        if self._walks:  # a walk must not read maps being closed
            await asyncio.wait(set(self._walks), timeout=WALK_DEADLINE_S + WALK_GRACE_S)
        if self.maps is not None:  # the last measurements, while the prober still holds its windows
            self._write_status(time.monotonic_ns())
        await self.prober.close()
        if self.maps is not None:
            self.maps.close()
            self.maps = None
        if self._held is not None:
            self._held.close()
            self._held = None
        try:  # what `edgectl undeploy` told this edged ends with it; the next deploy finds no mark
            deploy.set_undeployed(self.instance, False)
        except EdgeError as e:
            self.events.emit("error", str(e))
        self._node_lock.release()
        self._write_lock.release()

    # ------------------------------------------------------------ signals in

    def _on_sample(self, key, sample: Sample) -> None:
        name, backend = key
        st = self.services.get(name)
        if st is None or backend not in st.trackers:
            return
        probe, sla = st.service.health.probe, st.service.sla
        tr = st.trackers[backend]
        was_down = tr.down
        weights.observe_sample(tr, sample, st.service.weights, probe)
        self.observer.observe_sample(name, backend, sample, probe.window if probe else 1,
                                     sla.p99_rtt_ms / 1000 if sla else None)
        if sample.ok and st.service.health.passive is not None:
            st.passed.add(backend)  # evidence for readmission after a passive ejection (step)
            st.wake.set()
        elif weights.sample_moves(tr, sample, was_down, st.service.weights, probe.kind if probe else None):
            st.wake.set()  # else the next periodic step decides the same

    def _on_load(self, key, load: Load) -> None:
        name, backend = key
        st = self.services.get(name)
        if st is None or backend not in st.trackers:
            return
        weights.observe_load(st.trackers[backend], load, st.service.weights)
        if st.computed:  # under the static policy a scrape moves no weight
            st.wake.set()

    # ------------------------------------------------------------ steering

    @staticmethod
    def _interval_s(s: Service, relaxed: bool = False) -> float:
        """How often a service's step runs at least: its probes' interval (relaxed: every
        backend's probes are, and steps come as without probes: the scrapes' and the wire's
        intervals), else its scrapes', else 1 s; never less often than wire.interval_ms.
        Under the static policy every 1 s, probes or not: no probe or scrape result changes
        a configured weight (weights.decide), so a step at their pace would decide the same."""
        health, interval = s.health, 1.0
        if s.weights.policy == "static":
            return interval
        if health and health.probe:
            interval = max(health.probe.interval_ms, health.probe.relaxed_ms if relaxed else 0) / 1000
            if relaxed and health.metrics:
                interval = min(interval, health.metrics.interval_ms / 1000)
        elif health and health.metrics:
            interval = health.metrics.interval_ms / 1000
        if s.weights.wire.enabled:  # wire signals change between probes
            interval = min(interval, s.weights.wire.interval_ms / 1000)
        return interval

    async def _steer_loop(self, name: str) -> None:
        """Decides when a probe result that can move a weight (weights.sample_moves) or a scrape
        came in, at most every quarter interval, and at least once an interval: a changed RTT
        reaches the table without waiting a tick. While every backend's probes are relaxed the
        interval is as without probes (a failed probe wakes the step at once all the same);
        under the static policy it is always so (_interval_s)."""
        failing = None
        while True:
            st = self.services.get(name)
            if st is None:
                return
            st.wake.clear()
            try:
                self.step(st, time.monotonic_ns())
                failing = None
            except EdgeError as e:
                failing = self._failed(f"{name}: {e}", e, failing, service=name)
            relaxed = st.computed and all(self.prober.relaxed((name, b.name)) for b in st.service.backends)
            interval = self._interval_s(st.service, relaxed)
            await asyncio.sleep(interval / 4)
            if not st.wake.is_set():
                try:
                    await asyncio.wait_for(st.wake.wait(), interval * 3 / 4)
                except asyncio.TimeoutError:
                    pass

    def step(self, st: Steered, now_ns: int) -> bool:
        """One decision for one service; pushes it when the policy says so."""
        s = st.service
        self._readmit(st)
        self._read_wire(st, now_ns)
        forced = self._operator_weights(s)
        d = weights.decide(s, st.trackers, st.pushed, now_ns, forced=forced)
        # decide() names every backend: with nothing changed the walk below would change nothing
        same = len(d.states) == len(s.backends) and d.states == st.states and d.reasons == st.reasons
        for b in () if same else s.backends:
            state, reason = d.states.get(b.name, ""), d.reasons.get(b.name, "")
            if state != st.states.get(b.name):
                if b.name in st.states:
                    self.events.emit("state", f"{s.name}/{b.name}: {st.states[b.name]} -> {state}"
                                              + (f" ({reason})" if reason else ""),
                                     service=s.name, backend=b.name, old=st.states[b.name], new=state,
                                     reason=reason)
                st.states[b.name] = state
            st.reasons[b.name] = reason
        if self.fleet is not None:  # the fleet's snapshot, once one applies, instead of this node's view
            d = self.fleet.steer(s, d, st.pushed, forced)
        if not d.push:
            return False
        t0 = time.perf_counter()
        self.maps.set_weights(s, d.weights)
        took_ms = (time.perf_counter() - t0) * 1000
        before = st.pushed or {}
        changes = ", ".join(f"{n} {before.get(n, '-')}->{w}" for n, w in d.weights.items() if before.get(n) != w)
        previous, st.pushed = st.pushed, dict(d.weights)
        st.pushes += 1
        self.observer.weight_pushed(s.name)
        self.events.emit("weights", f"{s.name}: weights {changes} ({took_ms:.1f} ms)",
                         service=s.name, weights=dict(d.weights), previous=previous, took_ms=took_ms)
        return True

    def _read_wire(self, st: Steered, now_ns: int) -> None:
        """The data path's wire signals of st's backends into its window (every wire.interval_ms);
        a fresh handshake p50 becomes the policy's RTT input, and wire_fresh says whose is fresh."""
        s, cfg = st.service, st.service.weights.wire
        if not cfg.enabled:
            st.wire_applied = st.wire_applied and st.wire is None
            st.wire = None
        elif st.wire is None or now_ns - st.wire_read_ns >= cfg.interval_ms * 1_000_000:
            st.wire_read_ns = now_ns
            st.wire = st.wire or wire.Windows(cfg.window_ms * 1_000_000, cfg.min_samples)
            st.wire.reconfigure(cfg.window_ms * 1_000_000, cfg.min_samples)
            _, bids = self.maps.ids(s.name)
            names = [b.name for b in s.backends if b.name in bids]
            st.wire.observe_rows(now_ns, names, self.maps.wire_rows([bids[n] for n in names]))
            st.wire_applied = False
        if st.wire_applied:  # the signals and the trackers are as the last step left them
            return
        p50s = st.wire.fresh_p50s() if st.wire is not None else {}  # the fresh ones' handshake p50
        for name, tr in st.trackers.items():
            tr.wire_rtt_s = p50s.get(name)
        fresh = set(p50s)
        if fresh != st.wire_fresh:  # wire_fresh changes by the difference: it holds every service's
            self.wire_fresh -= {(s.name, n) for n in st.wire_fresh - fresh}
            self.wire_fresh |= {(s.name, n) for n in fresh - st.wire_fresh}
            st.wire_fresh = fresh
        st.wire_applied = True

    def _fleet_apply(self, got) -> dict[str, str]:
        """A fleet snapshot arrived: every service it covers steps now (writing its weights).
        Returns each such service's table digest, for the fleet's event."""
        tables = {}
        for name in got.weights:
            st = self.services.get(name)
            if st is not None:
                try:
                    self.step(st, time.monotonic_ns())
                    tables[name] = self.maps.table_digest(st.service)
                except EdgeError as e:
                    self.events.emit("error", f"{name}: fleet snapshot v{got.version}: {e}", service=name)
        return tables

    def _readmit(self, st: Steered) -> None:
        """A passing probe is evidence: a backend on probation after a passive ejection takes new
        flows again without a trial flow (with heartbeats, the data path takes a heartbeat as
        evidence itself)."""
        passed, st.passed = st.passed, set()
        for name in sorted(passed):
            if self.maps.readmit(st.service.name, name):
                self.events.emit("state", f"{st.service.name}/{name}: probation -> readmitted (a probe passed)",
                                 service=st.service.name, backend=name, old="probation", new="readmitted")

    def _operator_weights(self, s: Service) -> dict[str, int]:
        """Backend name -> the weight the operator forces (drain, reload removal, override)."""
        if not (self.drained or self.leaving or self.overrides):
            return {}
        return weights.forced(
            s, (b.name for b in s.backends if (s.name, b.name) in self.drained or (s.name, b.name) in self.leaving),
            {b: w for (n, b), w in self.overrides.items() if n == s.name})

    # ------------------------------------------------------------ BGP announcement

    # ------------------------------------------------------------ faults of the node

    def _watched(self) -> watch.Watched | None:
        if self.maps is None or self._held is None:  # starting, stopping, or mid-redeploy
            return None
        backends = tuple(dict.fromkeys(str(b.address) for st in self.services.values() for b in st.service.backends))
        return watch.Watched(self._held, self.maps, self.iface, self.cfg.node.xdp_mode,
                             self.cfg.node.pin_dir, self.pin_path, self._reply_ifindex, backends,
                             self.cfg.node.reply_xdp)

    @contextlib.asynccontextmanager
    async def _writing(self):
        """What every change of the data path holds: one change at a time in edged, and the
        router's write lock (an edgectl undeploy waits for it, and it for an undeploy)."""
        async with self._apply_lock:
            await asyncio.to_thread(self._write_lock.acquire)
            try:
                yield
            finally:
                self._write_lock.release()

    async def _repaired(self, got: watch.Repaired) -> None:
        """The watch put part of the data path back (under _writing): a backend-facing interface
        made again also changes what the maps say heartbeats arrive on."""
        self._reply_ifindex = got.reply_ifindex
        if not got.return_ifindex:
            return
        applied = replace(self.cfg, services=tuple(st.service for st in self.services.values()))
        try:
            routes = await asyncio.to_thread(deploy.backend_routes, applied)
            self.maps.apply(deploy.adopted(self.maps, applied), routes)
        except EdgeError as e:
            self._failed(f"data path: after putting the return path back: {e}", e, None)

    def _serving(self, problem: str, did: str = "") -> None:
        """NOT_SERVING while problem says why (grpc health, status, a "datapath" event,
        edge_datapath_up, systemd's STATUS=); serving again when it is ''."""
        if problem == self.not_serving:
            return
        was, self.not_serving = self.not_serving, problem
        if problem:
            self.events.emit("datapath", f"NOT SERVING: {problem}", serving=False, problem=problem)
            self.notify.status(f"NOT SERVING: {problem}")
        else:
            self.events.emit("datapath", f"serving again: {did or 'the data path is whole'} (was: {was})",
                             serving=True, did=did)
            self.notify.status(f"steering {len(self.cfg.services)} services on {self.iface}")
        if self.on_serving is not None:
            asyncio.ensure_future(_maybe_await(self.on_serving(not problem)))

    # ------------------------------------------------------------ status out

    async def _status_loop(self) -> None:
        failing = None
        while True:
            self.pace_probes(self.wire_fresh, time.monotonic_ns())  # as of each service's last step
            try:
                self._write_status(time.monotonic_ns())
                await self._retire_leaving(time.monotonic_ns())
                failing = None
            except EdgeError as e:
                failing = self._failed(f"status: {e}", e, failing)
            await asyncio.sleep(STATUS_EVERY_S)

    def pace_probes(self, fresh: Collection[tuple[str, str]], now_ns: int) -> None:
        """Backends (service, backend) in fresh, whose wire signals real traffic keeps fresh, are
        probed every probe.relaxed_interval_ms for the next RELAX_HOLD_NS (the prober keeps
        health probing: a failed probe brings the full rate back); the others at the full rate."""
        keys = self.prober.keys()
        self.prober.relax([k for k in keys if k in fresh], now_ns + RELAX_HOLD_NS)
        self.prober.relax([k for k in keys if k not in fresh], 0)

    def _failed(self, text: str, e: EdgeError, before: str | None, **fields) -> str:
        """A loop's step failed and the loop goes on: counted every time when a map is to
        blame (edge_map_errors_total), an error event when the text is new to this loop."""
        where = getattr(e, "map", None)
        if where:
            self.observer.map_error(where)
            fields["map"] = where
        if text != before:
            self.events.emit("error", text, **fields)
        return text

async def _maybe_await(value):
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value
