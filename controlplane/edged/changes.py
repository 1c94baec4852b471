"""Config changes of a running edged: a reload (SIGHUP or the API), what discovery found,
and removed backends draining out. Each is a diff against what runs (desired.py) applied
as one maps transaction under edged's apply lock and the router's write lock; removed
backends and services drain out until idle or their drain_timeout_ms. Mixed into edged's
Daemon."""

from __future__ import annotations

import asyncio
import time

from controlplane import configdiff, deploy, desired
from controlplane.edged import bird
from controlplane.config import Config, load_config, load_config_text
from controlplane.discovery.supervisor import secrets_of
from controlplane.errors import ConfigError, EdgeError

LEAVING_IDLE_S = 3.0  # a removed backend with no packets this long has no connections left


class Changes:
    async def reload(self, text: str | None = None) -> dict:
        """Validates a config and applies it as a diff: the text given (over the API), else
        the file edged was started with; never another file. A bad config raises ConfigError
        and changes nothing. Removed backends and services drain: weight 0, connections kept
        until idle or drain_timeout_ms."""
        self.notify.reloading()
        try:
            # Reading (at most 1 MiB, refusing FIFOs and devices) and parsing run off the loop.
            new, source = await asyncio.to_thread(self._read_config, text)
            summary = await self._reload(new, source)
        except EdgeError as e:
            self.events.emit("reload-rejected", f"reload rejected, the running config stays: {e}", error=str(e))
            self.notify.ready(f"reload failed: {e}; running the previous config")
            raise
        self.notify.ready(f"reloaded; steering {len(self.cfg.services)} services on {self.iface}")
        return summary

    def _read_config(self, text: str | None) -> tuple[Config, str]:
        if text is not None:
            return load_config_text(text), "config text from the API"
        if self.config_path is None:
            raise ConfigError("reload: edged was started without a config file; send the config's text")
        return load_config(self.config_path), self.config_path

    async def _reload(self, new: Config, source: str) -> dict:
        bird.Bird.check_change(self.cfg.node.bgp, new.node.bgp)
        for key in ("maglev_m", "max_services", "max_backends", "ct_size", "pin_dir", "xdp_mode", "reply_xdp"):
            if getattr(new.node, key) != getattr(self.cfg.node, key):
                raise ConfigError(f"node.{key}: changed from {getattr(self.cfg.node, key)} to "
                                  f"{getattr(new.node, key)}; a reload cannot resize the data path "
                                  f"(restart edged after 'edgectl undeploy')")
        if new.node.fleet != self.cfg.node.fleet:
            raise ConfigError("node.fleet: changed; joining, leaving or changing the fleet needs an edged restart")
        secrets = secrets_of(new)  # an unreadable secret file refuses the reload
        async with self._apply_lock:
            old = self.static_cfg
            _, leaving = await self._switch(self.discovery.effective(new))
            self.static_cfg = new
        self.discovery.configure(new, secrets)
        self.discovery.start()
        # what the operator changed in the file: the config against the config (configdiff)
        summary = {**configdiff.diff(configdiff.shape_of_config(old), configdiff.shape_of_config(new)),
                   "draining_backends": sorted(f"{k[0]}/{k[1]}" for k in leaving)}
        said = configdiff.describe(summary)
        if summary["draining_backends"]:
            said.append(f"draining: {', '.join(summary['draining_backends'])}")
        self.events.emit("reload", f"reloaded {source}: {'; '.join(said) or 'no changes'}",
                         **{k: ",".join(v) for k, v in summary.items()})
        return summary

    async def _apply_discovered(self) -> None:
        """Discovery's hook: what the sources found now, through the same diff and apply as a
        reload (connections stay, removed backends drain, new ones slow-start). Raises EdgeError."""
        async with self._apply_lock:
            await self._switch(self.discovery.effective(self.static_cfg))

    async def _switch(self, new: Config):
        """Applies new (static + discovered) as a diff against what runs: removed backends and
        services drain out. Returns (apply report, what is draining)."""
        now, old = time.monotonic_ns(), self.cfg
        # dropped: its endpoint or VIP is the new config's now, or no room is left
        applied, leaving, dropped = desired.fit(new, desired.leaving_after(old, new, self.leaving, now))
        report = await self._apply(applied)
        self.cfg, self.leaving = new, leaving
        self._repush_operator_marks()
        if self.announcer is not None and new.node.bgp != old.node.bgp:
            try:  # the tables are applied already: a speaker that refuses is reported, not a failed reload
                await self.announcer.speaker.reconfigure(new.node.bgp)
            except EdgeError as e:
                self.events.emit("error", f"bgp: the reloaded node.bgp is not in force: {e}")
        self._write_status(time.monotonic_ns())  # what is draining out must outlive a restart
        for key in dropped:
            self.events.emit("removed", f"{key[0]}/{key[1]}: removed at once (its endpoint, VIP or room "
                                        f"is taken by the new config)", service=key[0], backend=key[1],
                             why="taken")
        return report, leaving

    def _repush_operator_marks(self) -> None:
        """An apply wrote the weights its config gave: operator drains and pins are pushed
        again at once, not at the service's next periodic step."""
        marked = {service for service, _ in (*self.drained, *self.overrides)}
        for name in marked & set(self.services):
            try:
                self.step(self.services[name], time.monotonic_ns())
            except EdgeError as e:  # the periodic step tries again
                self.events.emit("error", f"{name}: operator weights not pushed again yet: {e}", service=name)

    async def _apply(self, applied: Config):
        """Programs applied into the maps; a full deploy when it needs a new return interface.
        Holds the router's write lock meanwhile: an edgectl undeploy waits for it."""
        await asyncio.to_thread(self._write_lock.acquire)
        try:
            return await self._apply_locked(applied)
        finally:
            self._write_lock.release()

    async def _apply_locked(self, applied: Config):
        routes = await asyncio.to_thread(deploy.backend_routes, applied)
        node = self.maps.node()
        if set(routes.values()) <= set(node["return_ifindex"]):
            report = self.maps.apply(deploy.adopted(self.maps, applied), routes)
        else:  # new backend-facing interface: deploy attaches the return path there
            res = await asyncio.to_thread(deploy.deploy, applied, self.iface, adopt_weights=True, hold=True,
                                          lock=self._node_lock)
            old_held, old_maps = self._held, self.maps
            self._held, self.maps, self._reply_ifindex = res.held, res.maps, res.reply_ifindex
            old_maps.close()
            old_held.close()
            report = res.report
        self._set_services(applied)
        for name in self.services:
            if not any(t.get_name() == f"steer:{name}" for t in self._tasks if not t.done()):
                self._tasks.append(asyncio.create_task(self._steer_loop(name), name=f"steer:{name}"))
        return report

    async def _retire_leaving(self, now_ns: int) -> None:
        """Removes what a reload took out once it is idle (no packets for LEAVING_IDLE_S) or
        its drain timeout has passed (never by time with drain_timeout_ms 0)."""
        if not self.leaving:
            return
        async with self._apply_lock:
            packets = {}
            for key in self.leaving:
                try:
                    _, bids = self.maps.ids(key[0])
                    packets[key] = self.maps.backend_stats(bids[key[1]])["packets"]
                except (LookupError, EdgeError):
                    packets[key] = None
            done = desired.retire(self.leaving, packets, now_ns, int(LEAVING_IDLE_S * 1e9))
            if not done:
                return
            leaving = dict(self.leaving)
            for key, _ in done:
                leaving.pop(key)
            applied, kept, _ = desired.fit(self.cfg, leaving)
            await self._apply(applied)
            self.leaving = kept
        for key, why in done:
            self.events.emit("removed", f"{key[0]}/{key[1]}: removed after draining ({why})",
                             service=key[0], backend=key[1], why=why)
