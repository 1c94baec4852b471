"""edged: the control-plane daemon of one edge node. Owns the orchestration, not the policy:
builds edged's State and its parts (steer.py, status.py, operations.py, changes.py), deploys
(or adopts) the data path, runs their loops, watches the data path and stops them all. One
asyncio loop, never blocked for long: the prober runs in a child process of its own
(probe.child), walks of the maps for status and metrics run on a worker thread within a deadline; a failed map write is an error event and
edge_map_errors_total, and the loop goes on. Stopping edged leaves the data path forwarding.

    (the command line, serve() and main() are in cli.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable

from controlplane import abi, compilechild, deploy, desired, statuspage, wiresignals
from controlplane.config import Config
from controlplane.discovery.supervisor import secrets_of
from controlplane.edged import announce, bird, metrics, metricsserver, openfix, watch
from controlplane.edged.changes import Changes, apply_off_loop
from controlplane.edged.events import Events
from controlplane.edged.operations import Operations
from controlplane.edged.state import State
from controlplane.edged.status import STATUS_EVERY_S, Status
from controlplane.edged.steer import Steering
from controlplane.errors import Cancelled, EdgeError
from controlplane.tasks import cancel_all

DISCOVERY_START_S = 5.0  # at start, discovery's first answers are waited for this long at most
WATCH_EVERY_S = 1.0  # how often edged checks that its data path is still attached and pinned
TASKS_END_WITHIN_S = 0.5  # at a stop, edged's own tasks get this long to end (the stop: well under 2 s)


# pyroute2's sync calls cannot run on a thread whose event loop is running: the data-path
# watch's netlink queries (milliseconds) run here.
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edged-netlink")


class Daemon:
    """One edged: a deployed data path and the loops that steer it. Its state is self.state;
    the parts: steering (probes in, weights out), status (the views and the status record),
    operations (the operator's actions), changes (reload, discovery, drain-out)."""

    def __init__(self, cfg: Config, iface: str, events: Events | None = None, config_path: str | None = None):
        self.state = State.new(cfg, iface, events, config_path)
        self.steering = Steering(self.state)
        self.status = Status(self.state, self.steering.prober)
        self.operations = Operations(self.state, self.steering, self.status)
        self.changes = Changes(self.state, self.steering, self.status)
        self.on_serving: Callable[[bool], object] | None = None  # serve() sets grpc health with it
        self._metrics: metricsserver.MetricsServer | None = None
        self._adopted: dict = {}  # at start: discovered backends kept from the pinned maps
        self._compile = compilechild.Cancel()  # stop() ends the start's compile with it
        self._watched_backends: tuple[list, tuple[str, ...]] | None = None  # the services they are of

    # ------------------------------------------------------------ what the API and cli.py call

    @property
    def events(self) -> Events:
        return self.state.events

    @property
    def config_path(self) -> str | None:
        return self.state.config_path

    @property
    def not_serving(self) -> str:
        """Why the data path is not whole; '' while it is."""
        return self.state.not_serving

    async def snapshot(self, count_conntrack: bool = False, view: statuspage.View | None = None) -> dict:
        """`edgectl status --json`, with edged's view of every backend shown (status.Status.snapshot);
        view: the summaries or a page (statuspage)."""
        return await self.status.snapshot(self.changes.discovery.view, count_conntrack, view)

    async def operate(
        self, kind: str, service: str, backend: str, weight: int | None = None, local: bool = False
    ) -> str:
        """An operator action (operations.Operations.operate); returns its scope."""
        return await self.operations.operate(kind, service, backend, weight, local)

    async def drain_node(self, drained: bool = True) -> dict:
        """`edgectl drain-node` and undrain-node (operations.Operations.drain_node)."""
        return await self.operations.drain_node(drained)

    async def reload(self, text: str | None = None) -> dict:
        """A reload: text over the API, else the config file (changes.Changes.reload)."""
        return await self.changes.reload(text)

    # ------------------------------------------------------------ start, stop

    async def start(self) -> None:
        """Serves metrics, deploys or adopts the data path and starts probing. Raises
        EdgeError; must run on the loop that will run run()."""
        state, loop = self.state, asyncio.get_running_loop()
        collector = metrics.EdgeCollector(
            metrics.LoopSource(loop, self.snapshot),
            state.observer,
            iface=state.iface,
            serving=lambda: not state.not_serving,
            # scrapes run on prometheus_client's thread; Events belongs to the loop
            on_error=lambda text: loop.call_soon_threadsafe(state.events.emit, "error", f"metrics: {text}"),
        )
        # first: a second edged on the same router is told so here, not by the metrics port it shares
        state.node_lock.acquire()  # held until close(): edgectl deploy is refused meanwhile
        # before deploy: a bad metrics_listen fails with the kernel untouched
        self._metrics = metricsserver.start_http(state.cfg.node.metrics_listen, metrics.make_registry(collector))
        # drain-node outlives edged (a mark beside the locks): a restart must not announce again
        state.node_drained = deploy.node_drain(state.instance) is not None
        # discovered backends are there from the first deploy (or a source's failure is on record)
        discovery = self.changes.discovery
        discovery.configure(state.static_cfg, await asyncio.to_thread(secrets_of, state.static_cfg))
        if discovery.sources:
            state.events.emit(
                "discovery-waiting",
                f"waiting up to {DISCOVERY_START_S:g} s for the first answers "
                f"of {len(discovery.sources)} discovery sources",
            )
        if not await self._unless_stopped(discovery.first(DISCOVERY_START_S)):
            return  # a stop while the sources are waited for: nothing deployed, nothing to undo
        state.cfg = discovery.effective(state.static_cfg)
        try:
            res = await self._deploy(loop)
        except Cancelled:
            if self.stopping:  # a stop while the data path compiled: the child killed, the deploy undone
                return
            raise
        if self._adopted:  # what the maps held for sources still down is their last known good set
            discovery.adopt(self._adopted)
            state.cfg = discovery.effective(state.static_cfg)
        self._adopt_operator_state()
        self.steering.set_services(desired.fit(state.cfg, state.leaving)[0])
        if state.cfg.node.bgp is not None:  # announces nothing until run(): the node is not serving yet
            await self._start_bgp()
        if state.cfg.node.fleet is not None:  # joins at run(); until a snapshot applies, weights are local
            state.fleet = self._member()
        verb = "adopted the data path on" if res.updated else "deployed on"
        state.events.emit(
            "deployed",
            f"{verb} {res.iface} (XDP {res.mode}, return path on "
            f"{', '.join(res.return_ifaces)}), {len(state.cfg.services)} services",
            iface=res.iface,
            adopted=res.updated,
            weights={name: dict(st.pushed or {}) for name, st in state.services.items()},
        )
        discovery.start()
        _freeze_startup_objects()
        _give_back_memory()

    async def _deploy(self, loop: asyncio.AbstractEventLoop) -> deploy.DeployResult:
        """Deploys state.cfg (or adopts what runs), under the router's write lock."""
        state = self.state
        # pyroute2's sync API runs an event loop of its own: netlink work goes to a thread
        await asyncio.to_thread(state.write_lock.acquire)
        try:
            res = await asyncio.to_thread(
                deploy.deploy,
                state.cfg,
                state.iface,
                adopt_weights=True,
                hold=True,
                amend=self._amend_at_start,
                progress=lambda line: loop.call_soon_threadsafe(state.events.emit, "progress", line),
                lock=state.node_lock,
                cancel=self._compile,
            )
        finally:
            state.write_lock.release()
        state.held, state.maps, state.reply_ifindex = res.held, res.maps, res.reply_ifindex
        return res

    async def _start_bgp(self) -> None:
        """node.bgp: BIRD started and the announcer over it (announcing from run() on)."""
        state, bgp = self.state, self.state.cfg.node.bgp
        speaker = bird.Bird(bgp)
        await speaker.start()
        state.announcer = announce.Announcer(speaker, self.status.node_state, state.events.emit)
        state.events.emit(
            "bgp", f"bgp: bird (pid {speaker.pid}) speaking to {', '.join(str(p.address) for p in bgp.peers)}"
        )
        if state.node_drained:
            state.events.emit(
                "drain-node",
                "node drained before this start: every VIP stays withdrawn (edgectl undrain-node to end it)",
                drained=True,
            )

    def _member(self):
        """node.fleet: this node's fleet member, over the state's services and signals (the fleet
        and aetcd are imported only then: a node without one holds neither)."""
        from controlplane.fleet import member as fleet_member

        state = self.state
        return fleet_member.Member(
            state.cfg.node.fleet,
            fleet_member.Hooks(
                services=lambda: [st.service for st in state.services.values()],
                apply=self.steering.fleet_apply,
                emit=state.events.emit,
                serving=lambda: not state.not_serving,
                local=self.operations.local_marks,
                wire=lambda: {
                    n: {b: wiresignals.summary(g) for b, g in st.wire_signals.items()}
                    for n, st in state.services.items()
                },
                unsettled=self.changes.discovery.unsettled,
            ),
        )

    def _amend_at_start(self, maps, cfg: Config) -> Config:
        """What a restarted edged programs over the data path it adopts: cfg plus, for a
        discovery source that has not answered since the start (down, as etcd or DNS may be
        during an outage), the discovered backends the maps hold (see Supervisor.adoptable),
        plus what is draining out (_keep_leaving). Runs on deploy's thread: changes no state
        of the loop's but self._adopted, which start() hands to discovery after."""
        discovery = self.changes.discovery
        self._adopted = discovery.adoptable(maps.deployed_backends)
        if self._adopted:
            cfg = discovery.effective(self.state.static_cfg, self._adopted)
        return self._keep_leaving(maps, cfg)

    def _keep_leaving(self, maps, cfg: Config) -> Config:
        """What a restarted edged programs: cfg plus the backends a reload before the restart
        removed and that are still draining out (edge_be_probe remembers them)."""
        leaving = {}
        for s in cfg.services:
            for backend, until_s in maps.leaving(s):
                if all(b.name != backend.name for b in s.backends):  # not back in the config
                    until = None if until_s == abi.UNKNOWN else until_s * 1_000_000_000
                    leaving[(s.name, backend.name)] = desired.Leaving(s, backend, until)
        applied, self.state.leaving, _ = desired.fit(cfg, leaving)
        return applied

    def _adopt_operator_state(self) -> None:
        """Drains and weight overrides set through the API live in edge_be_probe, so a
        restarted edged keeps them."""
        state = self.state
        for s in state.cfg.services:
            _, bids = state.maps.ids(s.name)
            for name, bid in bids.items():
                p = state.maps.read_status(bid)
                if p.drained:
                    state.drained.add((s.name, name))
                if p.override is not None:
                    state.overrides[(s.name, name)] = p.override
        if state.drained or state.overrides or state.leaving:
            state.events.emit(
                "adopted",
                f"kept {len(state.drained)} drains, {len(state.overrides)} weight "
                f"overrides and {len(state.leaving)} backends draining out from "
                f"before the restart",
                leaving=sorted(f"{k[0]}/{k[1]}" for k in state.leaving),
            )

    async def run(self) -> None:
        """Steers until stop() is called."""
        state = self.state
        self.steering.start_loops()
        state.tasks.append(asyncio.create_task(self._status_loop()))
        state.tasks.append(asyncio.create_task(openfix.run(state), name="openfix"))  # edged/openfix.py
        # faults of the node (interface gone, bpffs unmounted): reported through _serving()
        state.tasks.append(
            asyncio.create_task(
                watch.run(self._watched, self._serving, _worker, WATCH_EVERY_S, self._writing, self._repaired),
                name="watch",
            )
        )
        if state.announcer is not None:
            state.tasks.append(asyncio.create_task(state.announcer.run(), name="announce"))
        if state.fleet is not None:
            state.tasks.append(asyncio.create_task(state.fleet.run(), name="fleet"))
        await state.stopping.wait()

    def stop(self) -> None:
        self.state.stopping.set()
        self._compile.cancel()  # a compile under way at the start ends now, not seconds later

    @property
    def stopping(self) -> bool:
        return self.state.stopping.is_set()

    async def _unless_stopped(self, aw) -> bool:
        """Awaits aw unless stop() comes first (aw is then cancelled); False when stopped."""
        work = asyncio.ensure_future(aw)
        stopped = asyncio.ensure_future(self.state.stopping.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        await cancel_all([stopped] if work.done() else [work, stopped], TASKS_END_WITHIN_S)
        if work.done() and not work.cancelled():
            work.result()
        return not self.stopping

    def healthy(self) -> bool:
        """For the systemd watchdog: no loop of ours died with an exception."""
        return self.changes.discovery.healthy() and not any(
            t.done() and not t.cancelled() and t.exception() is not None for t in self.state.tasks
        )

    async def close(self) -> None:
        state = self.state
        await self.changes.discovery.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        left = await cancel_all(state.tasks, TASKS_END_WITHIN_S)  # whatever etcd or a source does
        if left:
            state.events.emit(
                "error",
                f"{', '.join(t.get_name() for t in left)}: did not end within "
                f"{TASKS_END_WITHIN_S:g} s of the stop; left behind",
            )
        state.tasks.clear()
        if state.announcer is not None:  # first: the upstream moves flows away while we still forward
            try:
                await state.announcer.withdraw_all("edged stopping")
            except EdgeError as e:
                state.events.emit("error", f"bgp: {e}")
            await state.announcer.speaker.stop()
            state.announcer = None
        await self.status.wait_walks()  # a walk must not read maps being closed
        if state.maps is not None:  # the last measurements, while the prober still holds its windows
            self.status.write_status(time.monotonic_ns())
        await self.steering.prober.close()
        self._release()

    def _release(self) -> None:
        """The maps, the programs and the locks let go; the data path keeps forwarding."""
        state = self.state
        if state.maps is not None:
            state.maps.close()
            state.maps = None
        if state.held is not None:
            state.held.close()
            state.held = None
        try:  # what `edgectl undeploy` told this edged ends with it; the next deploy finds no mark
            deploy.set_undeployed(state.instance, False)
        except EdgeError as e:
            state.events.emit("error", str(e))
        state.node_lock.release()
        state.write_lock.release()

    # ------------------------------------------------------------ faults of the node

    def _watched(self) -> watch.Watched | None:
        state = self.state
        if state.maps is None or state.held is None:  # starting, stopping, or mid-redeploy
            return None
        services = [st.service for st in state.services.values()]
        memo = self._watched_backends
        if memo is None or len(memo[0]) != len(services) or any(a is not b for a, b in zip(memo[0], services)):
            # every second on the loop: the addresses made anew (10,000 str() of an address) only
            # when a service changed
            memo = self._watched_backends = (
                services,
                tuple(dict.fromkeys(str(b.address) for service in services for b in service.backends)),
            )
        backends = memo[1]
        return watch.Watched(
            state.held,
            state.maps,
            state.iface,
            state.cfg.node.xdp_mode,
            state.cfg.node.pin_dir,
            state.pin_path,
            state.reply_ifindex,
            backends,
            state.cfg.node.reply_xdp,
        )

    @contextlib.asynccontextmanager
    async def _writing(self):
        """What every change of the data path holds: one change at a time in edged, and the
        router's write lock (an edgectl undeploy waits for it, and it for an undeploy)."""
        async with self.state.apply_lock:
            await asyncio.to_thread(self.state.write_lock.acquire)
            try:
                yield
            finally:
                self.state.write_lock.release()

    async def _repaired(self, got: watch.Repaired) -> None:
        """The watch put part of the data path back (under _writing): a backend-facing interface
        made again also changes what the maps say heartbeats arrive on."""
        state = self.state
        state.reply_ifindex = got.reply_ifindex
        if not got.return_ifindex:
            return
        applied = replace(state.cfg, services=tuple(st.service for st in state.services.values()))
        try:
            routes = await asyncio.to_thread(deploy.backend_routes, applied)
            await apply_off_loop(state, applied, routes)
        except EdgeError as e:
            state.failed(f"data path: after putting the return path back: {e}", e, None)

    def _serving(self, problem: str, did: str = "") -> None:
        """NOT_SERVING while problem says why (grpc health, status, a "datapath" event,
        edge_datapath_up, systemd's STATUS=); serving again when it is ''."""
        state = self.state
        if problem == state.not_serving:
            return
        was, state.not_serving = state.not_serving, problem
        if problem:
            state.events.emit("datapath", f"NOT SERVING: {problem}", serving=False, problem=problem)
            state.notify.status(f"NOT SERVING: {problem}")
        else:
            state.events.emit(
                "datapath", f"serving again: {did or 'the data path is whole'} (was: {was})", serving=True, did=did
            )
            state.notify.status(f"steering {len(state.cfg.services)} services on {state.iface}")
        if self.on_serving is not None:
            asyncio.ensure_future(_maybe_await(self.on_serving(not problem)))

    # ------------------------------------------------------------ status out

    async def _status_loop(self) -> None:
        """Once every STATUS_EVERY_S: the probes paced, the status record written, what a reload
        removed retired once drained."""
        failing = None
        while True:
            self.steering.pace_probes(self.state.wire_fresh, time.monotonic_ns())  # as of each service's last step
            await self.state.maps_idle.wait()  # the record is written between applies, not under one
            try:
                await self.status.write_status_sliced()  # API calls and probes go on between its slices
                await self.changes.retire_leaving(time.monotonic_ns())
                failing = None
            except EdgeError as e:
                failing = self.state.failed(f"status: {e}", e, failing)
            await asyncio.sleep(STATUS_EVERY_S)


GC_YOUNG = 10_000  # allocations between two young collections (Python's default: 700)


def _freeze_startup_objects() -> None:
    """What the start left alive (the config, the maps' handles, the steering's trackers and
    windows, bcc's and the libraries' objects) moves out of the cyclic collector's reach for good
    (gc.freeze): a full collection no longer walks it. At 10,000 backends each one took 0.3-0.8 s
    with the interpreter held, and there was one every few seconds while status calls ran
    (tools/bench-probe --scale; docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    if gc.get_threshold()[0] < GC_YOUNG:
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])


def _give_back_memory() -> None:
    """Hands the heap the deploy's temporaries left free back to the kernel: glibc keeps freed
    memory in the process otherwise (tools/bench-rss: about 10 MB at 1,000 backends)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


async def _maybe_await(value):
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value
