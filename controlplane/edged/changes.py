"""Config changes of a running edged: a reload (SIGHUP or the API), what discovery found,
and removed backends draining out. Each is a diff against what runs (desired.py) applied
as one maps transaction under edged's apply lock and the router's write lock; removed
backends and services drain out until idle or their drain_timeout_ms. Owns the discovery
supervisor and State.cfg, static_cfg and leaving (and, when a change needs a new return
interface, the redeployed maps); the steering follows what it applied."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Mapping, TypeVar

from controlplane import compilechild, configdiff, deploy, desired, netlink
from controlplane.config import Config, load_config, load_config_text
from controlplane.discovery.supervisor import Supervisor, secrets_of
from controlplane.edged import bird
from controlplane.edged.state import State
from controlplane.edged.status import Status
from controlplane.edged.steer import Steering
from controlplane.errors import ConfigError, EdgeError
from controlplane.maps import ApplyReport

T = TypeVar("T")

LEAVING_IDLE_S = 3.0  # a removed backend with no packets this long has no connections left


async def off_loop(state: State, work: Callable[[], T]) -> T:
    """work() on a worker thread, awaited to its end: a thread cannot be stopped, so a caller
    cancelled meanwhile (an API client gone, edged stopping) still holds its locks until the
    work is done, then is cancelled. State.walks holds it too: close() waits for it before
    closing the maps."""
    fut = asyncio.ensure_future(asyncio.to_thread(work))
    state.walks.add(fut)
    fut.add_done_callback(state.walks.discard)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
            break
        except asyncio.CancelledError:
            if fut.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def apply_off_loop(state: State, applied: Config, routes: Mapping) -> ApplyReport:
    """The maps made to describe applied (deploy.adopted: the weights in force stay) on a worker
    thread: a full apply at 10,000 backends takes about 2 s of CPU, which edged's loop (the API,
    probes, the watch) must not wait for. The caller holds apply_lock and the write lock;
    State.maps_idle is clear meanwhile, so no step, operator action or status record writes the
    maps under the apply (they wait for it); status and metrics walks read on."""
    maps = state.maps
    state.maps_idle.clear()
    try:
        return await off_loop(state, lambda: maps.apply(deploy.adopted(maps, applied), routes))
    finally:
        state.maps_idle.set()


class Changes:
    """Config changes of one edged: reload(), discovery's answers, removed backends retiring."""

    def __init__(self, state: State, steering: Steering, status: Status):
        self.state = state
        self.steering = steering  # steers what was applied
        self.status = status  # what is draining out is in the status record at once
        self.discovery = Supervisor(self.apply_discovered, state.events.emit, is_local=netlink.local_of)

    async def reload(self, text: str | None = None) -> dict:
        """Validates a config and applies it as a diff: the text given (over the API), else
        the file edged was started with; never another file. A bad config raises ConfigError
        and changes nothing. Removed backends and services drain: weight 0, connections kept
        until idle or drain_timeout_ms."""
        state = self.state
        state.notify.reloading()
        try:
            # Reading (at most 1 MiB, refusing FIFOs and devices) and parsing run off the loop.
            new, source = await asyncio.to_thread(self._read_config, text)
            summary = await self._reload(new, source)
        except EdgeError as e:
            state.events.emit("reload-rejected", f"reload rejected, the running config stays: {e}", error=str(e))
            state.notify.ready(f"reload failed: {e}; running the previous config")
            raise
        state.notify.ready(f"reloaded; steering {len(state.cfg.services)} services on {state.iface}")
        return summary

    def _read_config(self, text: str | None) -> tuple[Config, str]:
        if text is not None:
            return load_config_text(text), "config text from the API"
        if self.state.config_path is None:
            raise ConfigError("reload: edged was started without a config file; send the config's text")
        return load_config(self.state.config_path), self.state.config_path

    async def _reload(self, new: Config, source: str) -> dict:
        state = self.state
        bird.Bird.check_change(state.cfg.node.bgp, new.node.bgp)
        for key in ("maglev_m", "max_services", "max_backends", "ct_size", "pin_dir", "xdp_mode", "reply_xdp"):
            if getattr(new.node, key) != getattr(state.cfg.node, key):
                raise ConfigError(
                    f"node.{key}: changed from {getattr(state.cfg.node, key)} to "
                    f"{getattr(new.node, key)}; a reload cannot resize the data path "
                    f"(restart edged after 'edgectl undeploy')"
                )
        if new.node.fleet != state.cfg.node.fleet:
            raise ConfigError("node.fleet: changed; joining, leaving or changing the fleet needs an edged restart")
        await self._load_ipv6(new)
        secrets = await asyncio.to_thread(secrets_of, new)  # an unreadable secret file refuses the reload
        async with state.apply_lock:
            old = state.static_cfg
            _, leaving = await self._switch(self.discovery.effective(new))
            state.static_cfg = new
        self.discovery.configure(new, secrets)
        self.discovery.start()
        # what the operator changed in the file: the config against the config (configdiff)
        summary = {
            **configdiff.diff(configdiff.shape_of_config(old), configdiff.shape_of_config(new)),
            "draining_backends": sorted(f"{k[0]}/{k[1]}" for k in leaving),
        }
        said = configdiff.describe(summary)
        if summary["draining_backends"]:
            said.append(f"draining: {', '.join(summary['draining_backends'])}")
        state.events.emit(
            "reload",
            f"reloaded {source}: {'; '.join(said) or 'no changes'}",
            **{k: ",".join(v) for k, v in summary.items()},
        )
        return summary

    async def _load_ipv6(self, new: Config) -> None:
        """The first IPv6 service of a data path deployed without IPv6 programs (for IPv4
        services only): they are compiled in a child and put into its empty IPv6 tail slots,
        under the router's write lock; IPv4 flows are not touched. Raises EdgeError (one line
        naming the service) and changes nothing else when that fails."""
        state = self.state
        first = next((i for i, s in enumerate(new.services) if s.vip.version == 6), None)
        if first is None or await asyncio.to_thread(deploy.ipv6_loaded, state.held):
            return
        state.events.emit("progress", f"loading the IPv6 programs (first IPv6 service, {new.services[first].name})")
        await asyncio.to_thread(state.write_lock.acquire)
        try:
            t0 = time.perf_counter()
            await off_loop(state, lambda: compilechild.load_ipv6(state.held))
        except EdgeError as e:
            raise type(e)(f"services[{first}].vip: {new.services[first].vip}: {e}") from e
        finally:
            state.write_lock.release()
        state.events.emit("progress", f"IPv6 programs loaded in {time.perf_counter() - t0:.1f} s")

    async def apply_discovered(self) -> None:
        """Discovery's hook: what the sources found now, through the same diff and apply as a
        reload (connections stay, removed backends drain, new ones slow-start). Raises EdgeError."""
        async with self.state.apply_lock:
            await self._switch(self.discovery.effective(self.state.static_cfg))

    async def _switch(self, new: Config):
        """Applies new (static + discovered) as a diff against what runs: removed backends and
        services drain out. Returns (apply report, what is draining)."""
        state = self.state
        now, old = time.monotonic_ns(), state.cfg
        # dropped: its endpoint or VIP is the new config's now, or no room is left
        applied, leaving, dropped = desired.fit(new, desired.leaving_after(old, new, state.leaving, now))
        report = await self._apply(applied)
        state.cfg, state.leaving = new, leaving
        self._repush_operator_marks()
        if state.announcer is not None and new.node.bgp != old.node.bgp:
            try:  # the tables are applied already: a speaker that refuses is reported, not a failed reload
                await state.announcer.speaker.reconfigure(new.node.bgp)
            except EdgeError as e:
                state.events.emit("error", f"bgp: the reloaded node.bgp is not in force: {e}")
        self.status.write_status(time.monotonic_ns())  # what is draining out must outlive a restart
        for key in dropped:
            state.events.emit(
                "removed",
                f"{key[0]}/{key[1]}: removed at once (its endpoint, VIP or room is taken by the new config)",
                service=key[0],
                backend=key[1],
                why="taken",
            )
        return report, leaving

    def _repush_operator_marks(self) -> None:
        """An apply wrote the weights its config gave: operator drains and pins are pushed
        again at once, not at the service's next periodic step."""
        state = self.state
        marked = {service for service, _ in (*state.drained, *state.overrides)}
        for name in marked & set(state.services):
            try:
                self.steering.step(state.services[name], time.monotonic_ns())
            except EdgeError as e:  # the periodic step tries again
                state.events.emit("error", f"{name}: operator weights not pushed again yet: {e}", service=name)

    async def _apply(self, applied: Config):
        """Programs applied into the maps (and the return path on a new backend-facing interface).
        Holds the router's write lock meanwhile: an edgectl undeploy waits for it."""
        await asyncio.to_thread(self.state.write_lock.acquire)
        try:
            return await self._apply_locked(applied)
        finally:
            self.state.write_lock.release()

    async def _apply_locked(self, applied: Config):
        state = self.state
        routes = await asyncio.to_thread(deploy.backend_routes, applied)
        node = state.maps.node()
        if set(routes.values()) <= set(node["return_ifindex"]):
            report = await apply_off_loop(state, applied, routes)
        else:  # a new backend-facing interface: the programs edged holds go there too, no compile
            loop, maps = asyncio.get_running_loop(), state.maps
            state.maps_idle.clear()  # as apply_off_loop: nothing else writes the maps meanwhile
            try:
                report, state.reply_ifindex = await off_loop(
                    state,
                    lambda: deploy.apply_on_new_links(
                        state.held,
                        maps,
                        deploy.adopted(maps, applied),
                        routes,
                        state.reply_ifindex,
                        lambda line: loop.call_soon_threadsafe(state.events.emit, "progress", line),
                    ),
                )
            finally:
                state.maps_idle.set()
        self.steering.set_services(applied)
        self.steering.start_loops()
        return report

    async def retire_leaving(self, now_ns: int) -> None:
        """Removes what a reload took out once it is idle (no packets for LEAVING_IDLE_S) or
        its drain timeout has passed (never by time with drain_timeout_ms 0)."""
        state = self.state
        if not state.leaving:
            return
        async with state.apply_lock:
            packets = {}
            for key in state.leaving:
                try:
                    _, bids = state.maps.ids(key[0])
                    packets[key] = state.maps.backend_stats(bids[key[1]])["packets"]
                except (LookupError, EdgeError):
                    packets[key] = None
            done = desired.retire(state.leaving, packets, now_ns, int(LEAVING_IDLE_S * 1e9))
            if not done:
                return
            leaving = dict(state.leaving)
            for key, _ in done:
                leaving.pop(key)
            applied, kept, _ = desired.fit(state.cfg, leaving)
            await self._apply(applied)
            state.leaving = kept
        for key, why in done:
            state.events.emit(
                "removed", f"{key[0]}/{key[1]}: removed after draining ({why})", service=key[0], backend=key[1], why=why
            )
