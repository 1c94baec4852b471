"""Runs each service's discovery source on edged's loop and hands accepted changes to edged.

One task per service with a discovery section. Every result goes through
cache.offer (last known good, failure counting); an accepted change calls
apply(), edged's reload/apply path, which programs static + discovered backends
into the maps. If that apply fails, the change is undone in the cache and
counted as a failure, so the cache never claims what the maps do not have.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Optional

from controlplane.config import Backend, Config, Service
from controlplane.discovery import Answer, Failure, Result, Source
from controlplane.discovery.cache import Cached, adoptable, describe_change, merge, offer, screen, with_tokens
from controlplane.discovery.tokens import read_secret
from controlplane.errors import EdgeError
from controlplane.tasks import cancel_all

Emit = Callable[..., object]  # edged's Events.emit(kind, text, **fields)
CLOSE_WITHIN_S = 0.5  # close(): the sources' share of edged's stop
RESTART_S, RESTART_MAX_S = 1.0, 30.0  # a source that raised starts over after this, doubled each time


def make_source(s: Service) -> Source:
    """The source a service's discovery section names (imported here: only edged needs the libraries)."""
    if s.discovery.dns is not None:
        from controlplane.discovery.dns import DnsSource

        return DnsSource(s.discovery, s.vip.version)
    from controlplane.discovery.etcd import EtcdSource

    return EtcdSource(s.discovery)


def secrets_of(cfg: Config) -> dict[str, Optional[bytes]]:
    """Service name -> its token secret; ConfigError naming the field when a file cannot be read.
    Reads files (regular ones only, tokens.read_secret): edged calls it off its loop."""
    out = {}
    for i, s in enumerate(cfg.services):
        if s.discovery is not None:
            path = s.discovery.token_secret_file
            out[s.name] = read_secret(path, f"services[{i}].discovery.token_secret_file") if path else None
    return out


class Supervisor:
    """Every discovery source of one edged, their caches, and the hook into edged's apply."""

    def __init__(
        self,
        apply: Callable[[], Awaitable[None]],
        emit: Emit,
        clock: Callable[[], float] = time.monotonic,
        is_local: Optional[Callable[[list[str]], set[str]]] = None,
    ):
        """is_local(addresses): those this node routes as local (its own addresses, routes of
        type local), run in a worker thread; None: not checked (no router here)."""
        self.apply = apply  # programs merge(static config, found()) into the maps; raises EdgeError
        self.emit = emit
        self.is_local = is_local
        self.clock = clock
        self.cfg: Optional[Config] = None
        self.caches: dict[str, Cached] = {}
        self.sources: dict[str, Source] = {}
        self._sections: dict[str, object] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def found(self) -> dict[str, tuple[Backend, ...]]:
        return {name: with_tokens(c, c.backends) for name, c in self.caches.items() if c.backends is not None}

    def effective(self, cfg: Config, adopted: Optional[dict[str, tuple[Backend, ...]]] = None) -> Config:
        """cfg (static) plus what discovery found (and what adopted would add): the config edged programs."""
        extra = {name: with_tokens(self.caches[name], bs) for name, bs in (adopted or {}).items()}
        return merge(cfg, {**self.found(), **extra})

    def adoptable(self, deployed: Callable[[Service], list]) -> dict[str, tuple[Backend, ...]]:
        """Service name -> the discovered backends the pinned maps hold (deployed(service):
        maps.deployed_backends), for every service whose source has given nothing since the
        start: a restart during an outage keeps what worked. Changes nothing (see adopt)."""
        out = {}
        for s in self.cfg.services if self.cfg is not None else ():
            c = self.caches.get(s.name)
            if c is not None and c.backends is None:
                found = adoptable(s, deployed(s), c.secret)
                if found:
                    out[s.name] = found
        return out

    def adopt(self, found: dict[str, tuple[Backend, ...]]) -> None:
        """Takes found (adoptable()) as the last known good sets of sources that have still said
        nothing usable; their next good answer replaces it as any change does."""
        for name, backends in found.items():
            c = self.caches.get(name)
            if c is None or c.backends is not None:
                continue
            c.backends = backends
            self.emit(
                "discovery-adopted",
                f"{name}: {c.source} discovery has not answered since the start; kept the "
                f"{len(backends)} discovered backends the pinned maps hold as the last known good set",
                service=name,
                source=c.source,
                backends=[b.name for b in backends],
                error=c.error or "",
            )

    def configure(self, cfg: Config, secrets: dict[str, Optional[bytes]]) -> None:
        """Takes the (new) static config: sources of services whose discovery section changed start
        over (their cached set stays until the new source answers); removed ones stop."""
        self.cfg = cfg
        wanted = {s.name: s for s in cfg.services if s.discovery is not None}
        for name in list(self.caches):
            if name not in wanted:
                self._stop(name)
                self.caches.pop(name)
                self.sources.pop(name, None)
                self._sections.pop(name, None)
        for name, s in wanted.items():
            if self._sections.get(name) != s.discovery:
                self._stop(name)
                source = self.sources[name] = make_source(s)
                self._sections[name] = s.discovery
                if name not in self.caches or self.caches[name].source != source.kind:
                    self.caches[name] = Cached(name, source.kind, source.watched)
            c = self.caches[name]
            c.allow_empty, c.secret = s.discovery.allow_empty, secrets.get(name)

    async def first(self, timeout_s: float) -> None:
        """One answer (or failure) from every source that has none yet, waited for at most timeout_s:
        what edged deploys with, so a restart does not begin with an empty set."""

        async def one(name: str) -> None:
            result = await _first_result(self.sources[name])
            self._offer(name, await self._screen(result))

        names = [n for n, c in self.caches.items() if c.backends is None and n not in self._tasks]
        tasks = [asyncio.ensure_future(one(n)) for n in names]
        if not tasks:
            return
        try:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
        finally:  # also when edged stops meanwhile
            await cancel_all(tasks, CLOSE_WITHIN_S)
        for name, t in zip(names, tasks, strict=True):
            if t in late:
                self._offer(name, Failure(f"no answer in {timeout_s:.1f} s at start"))

    def start(self) -> None:
        """Runs every configured source that is not running."""
        for name, source in self.sources.items():
            if name not in self._tasks:
                self._tasks[name] = asyncio.create_task(self._run(name, source), name=f"discovery:{name}")

    def _stop(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def close(self, within_s: float = CLOSE_WITHIN_S) -> None:
        """Ends every source task, within within_s whatever a source does (tasks.cancel_all)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        left = await cancel_all(tasks, within_s)
        if left:
            self.emit(
                "error",
                f"discovery: {', '.join(t.get_name() for t in left)} did not end within "
                f"{within_s:g} s of the stop; left behind",
            )

    def unsettled(self) -> set[str]:
        """Services whose source has given nothing usable since edged started (no last known
        good): their discovered backends are not known, so nothing may be concluded from their
        absence (the fleet leader keeps those services' operator marks)."""
        return {name for name, c in self.caches.items() if c.backends is None}

    def healthy(self) -> bool:
        return not any(t.done() and not t.cancelled() and t.exception() is not None for t in self._tasks.values())

    def view(self) -> dict[str, dict]:
        now = self.clock()
        return {name: c.view(now) for name, c in self.caches.items()}

    # ------------------------------------------------------------ results in

    def _fits(self, name: str):
        def check(backends) -> None:
            merge(self.cfg, {**self.found(), name: with_tokens(self.caches[name], backends)})

        return check

    async def _screen(self, result: Result) -> Result:
        """result, or a Failure when an answer names an address no backend may have: a VIP, a
        special range (cache.not_a_backend), or one this node routes as local."""
        if not isinstance(result, Answer) or not result.backends or self.cfg is None:
            return result
        why = screen(result.backends, {s.vip for s in self.cfg.services})
        if why is None and self.is_local is not None:
            why = await self._local(result.backends)
        return result if why is None else Failure(f"answer rejected: {why}")

    async def _local(self, backends) -> Optional[str]:
        """'NAME: why' of the first backend whose address this node routes as local, or None."""
        try:
            local = await asyncio.to_thread(self.is_local, sorted({str(b.address) for b in backends}))
        except Exception as e:  # noqa: BLE001 -- netlink failed: nothing is known, nothing is taken
            return f"not checked against this node's routes ({type(e).__name__}: {e})"
        return next(
            (
                f"{b.name}: {b.address} is this node's own (a route of type local)"
                for b in backends
                if str(b.address) in local
            ),
            None,
        )

    def _offer(self, name: str, result: Result):
        c = self.caches[name]
        verdict = offer(c, result, self.clock(), self._fits(name))
        if verdict.event is not None:
            kind, text = verdict.event
            self.emit(kind, text, service=name, source=c.source, failures=c.failures, error=c.error or "")
        return verdict

    async def _run(self, name: str, source: Source) -> None:
        async def report(result: Result) -> None:
            if self.sources.get(name) is not source:
                return  # replaced by a reload
            c = self.caches[name]
            verdict = self._offer(name, await self._screen(result))
            if not verdict.changed:
                return
            text = describe_change(verdict.previous, c.backends)
            t0 = time.perf_counter()
            try:
                await self.apply()
            except Exception as e:  # noqa: BLE001 -- EdgeError, or anything else: the maps did not take it
                c.backends = verdict.previous
                why = str(e) if isinstance(e, EdgeError) else f"{type(e).__name__}: {e}"
                self._offer(name, Failure(f"cannot apply ({text}): {why}"))
                return
            self.emit(
                "discovery",
                f"{name}: {source.kind} discovery: {text}; now {len(c.backends)} backends "
                f"({(time.perf_counter() - t0) * 1000:.1f} ms to the maps)",
                service=name,
                source=source.kind,
                change=text,
                backends=[b.name for b in c.backends],
            )

        delay = RESTART_S
        while True:  # a source never ends; if one raises all the same, it is a failure and it starts over
            try:
                await source.run(report)
                why = "the source ended"
            except Exception as e:  # noqa: BLE001 -- counted and retried, never the end of discovery
                why = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
            if self.sources.get(name) is not source:
                return
            self._offer(name, Failure(f"{source.kind} source failed ({why}); started again in {delay:.1f} s"))
            await asyncio.sleep(delay)
            delay = min(RESTART_MAX_S, delay * 2)


async def _first_result(source: Source) -> Result:
    """The first thing source reports (runs it until then)."""
    got: asyncio.Future = asyncio.get_running_loop().create_future()

    async def report(result: Result) -> None:
        if not got.done():
            got.set_result(result)

    task = asyncio.create_task(source.run(report))
    try:
        return await got
    finally:
        await cancel_all([task], CLOSE_WITHIN_S)
