"""One node's membership of the fleet over etcd: lease, election, reports, the snapshot watch.

A session (one etcd connection) grants a lease of lease_ttl_s and runs four tasks until one
fails: keep the lease alive; put this node's report under nodes/NAME (on the lease) whenever its
own decision moves past the hysteresis, and every report_ms; watch the snapshot key and hand
every newer version to edged (snapshot.to_apply); and campaign: create the leader key on the
lease in a transaction that succeeds only while no leader key exists. The winner watches every
report and every operator mark (operator.py; edged records them with operate()) and publishes
the next snapshot (snapshot.next_snapshot, the marks folded in), each put guarded by a
transaction that it is still the leader; it also deletes the marks of backends nobody runs any
more (operator.unknown, for longer than stale_ms; a "fleet-operator" event each); the others watch the leader key and campaign again
when it goes (the leader stopped, or its lease ran out: within lease_ttl_s).

Everything read from etcd passes schema.py first; a document that fails, or a snapshot not
written by the current holder of the leader key on its lease (snapshot.refused), is counted and
ignored (a fleet-refused event), never raised. A new leader publishes at once, so every node
has a snapshot from it. Staleness of reports is the leader's own monotonic clock (when it last
saw each report put), never another node's wall clock.

Any fault, whatever it raises, ends the session: the node is no leader any more, keeps the
snapshot it applied (the data path keeps forwarding with it) and says so (a fleet-lost event,
edge_fleet_connected 0, `edgectl status`); it counts it (edge_fleet_faults_total), reconnects
(next endpoint, after retry_ms, doubled up to BACKOFF_MAX_S while it cannot connect) and
resumes with a full read.
The decisions are snapshot.py's and the I/O helpers etcdio.py's; this file only moves documents.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional

import aetcd
from aetcd import utils

from controlplane import weights as policy
from controlplane.config import Fleet, Service
from controlplane.discovery.etcd import close_quietly
from controlplane.fleet import etcdio, operator as op, schema, snapshot as fs
from controlplane.tasks import within

FAULTS = etcdio.FAULTS
BACKOFF_MAX_S = 10.0  # a session that fails before it connects waits twice as long each time, up to this


@dataclass
class Hooks:
    """What the member asks of edged. services(): the services edged runs now; apply(Apply):
    edged takes a snapshot's weights (synchronously, through its own step) and returns each
    service's table digest; emit(kind, text, **fields): edged's event log; serving(): whether
    edged says SERVING; local(): service -> backend -> what an operator set on this node only;
    wire(): service -> backend -> the wire signals edged last read (both for the report);
    unsettled(): the services whose discovery has said nothing yet (their marks are not swept)."""

    services: Callable[[], Iterable[Service]]
    apply: Callable[[fs.Apply], Optional[dict]]
    emit: Callable[..., object]
    serving: Callable[[], bool] = lambda: True
    local: Callable[[], dict] = dict
    wire: Callable[[], Mapping] = dict
    unsettled: Callable[[], Iterable[str]] = tuple


@dataclass
class _Term:
    """The leader's view during one term: every node's report (with when the leader itself saw
    it, on its own monotonic clock: staleness never compares two nodes' clocks), the operator
    marks with their revisions, and the last snapshot."""

    last: Optional[dict]
    reports: dict = field(default_factory=dict)  # report key -> report
    seen: dict = field(default_factory=dict)  # report key -> time.monotonic() of its last put
    marks: dict = field(default_factory=dict)  # operator key -> (service, backend, mark)
    revs: dict = field(default_factory=dict)  # operator key -> its mod revision
    unknown_since: dict = field(default_factory=dict)  # operator key -> when its backend was first unknown
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def fresh(self, stale_s: float) -> list[dict]:
        now = time.monotonic()
        return [r for k, r in self.reports.items() if now - self.seen.get(k, now) <= stale_s]


class Member:
    """One node's membership; hooks: what it asks of edged (Hooks)."""

    def __init__(self, cfg: Fleet, hooks: Hooks):
        self.cfg, self.hooks, self.emit = cfg, hooks, hooks.emit
        p = cfg.prefix
        self.k_leader, self.k_nodes, self.k_snapshot = (
            (p + fs.LEADER).encode(),
            (p + fs.NODES).encode(),
            (p + fs.SNAPSHOT).encode(),
        )
        self.k_me = self.k_nodes + cfg.name.encode()
        self.k_operator = (p + op.OPERATOR).encode()
        self.computed: dict[str, dict[str, int]] = {}  # this node's own decision, per service
        self.states: dict[str, dict[str, str]] = {}
        self.reported: dict[str, dict[str, int]] = {}
        self.shared: dict[str, dict[str, int]] = {}  # the applied snapshot's weights, per service
        self.marks: dict[str, dict[str, dict]] = {}  # the applied snapshot's operator marks, per service
        self.applied = 0  # snapshot version applied
        self.applied_t = 0.0
        self.leader = ""  # the leader's name, as last seen
        self.is_leader = False
        self.connected = False
        self.problem = ""  # why etcd is not reachable, '' while it is
        self.lost_since = 0.0
        self.faults = 0  # sessions that ended in a fault since edged started
        self.refused = 0  # documents read from etcd and refused (garbage, not from the leader, ...)
        self._bad: set[bytes] = set()  # keys whose last value was refused (one event each, not one per put)
        self._wake_report = asyncio.Event()
        self._lease: Optional[aetcd.Lease] = None
        self._client: Optional[aetcd.Client] = None

    def services(self) -> list[Service]:
        return list(self.hooks.services())

    # ------------------------------------------------------------ edged's side (its loop)

    def steer(
        self, s: Service, d: policy.Decision, pushed: Optional[dict[str, int]], forced: Optional[dict[str, int]] = None
    ) -> policy.Decision:
        """Records the node's own decision (the policy's, without the operator's) for its report;
        returns the decision to push: the snapshot's weights, with this node's operator weights
        (forced) on top, while one applies to s, else d unchanged."""
        self.computed[s.name], self.states[s.name] = dict(d.computed), dict(d.states)
        if policy.push_due(d.computed, self.reported.get(s.name), s.weights):
            self._wake_report.set()
        shared = self.shared.get(s.name)
        if shared is None or set(shared) != set(d.computed):
            return d
        wanted = {**shared, **(forced or {})}
        return policy.Decision(
            weights=wanted, computed=d.computed, states=d.states, reasons=d.reasons, push=wanted != pushed
        )

    def report_now(self) -> None:
        """Report at once (an operator changed what this node runs)."""
        self._wake_report.set()

    def view(self) -> dict:
        """For `edgectl status` and the metrics."""
        return {
            "name": self.cfg.name,
            "leader": self.leader,
            "is_leader": self.is_leader,
            "connected": self.connected,
            "problem": self.problem,
            "version": self.applied,
            "applied_age_s": round(time.time() - self.applied_t, 3) if self.applied_t else None,
            "services": sorted(self.shared),
            "faults": self.faults,
            "refused": self.refused,
        }

    # ------------------------------------------------------------ sessions

    async def run(self) -> None:
        """Sessions until cancelled; a failed one (whatever it raised) is reported and counted,
        and the next endpoint tried after retry_ms, doubled while sessions fail before they connect."""
        turn, delay = 0, self.cfg.retry_ms / 1000
        while True:
            host, port = self.cfg.etcd[turn % len(self.cfg.etcd)]
            self._client = None
            reached = False
            try:
                self._client = await etcdio.connect(self.cfg, host, port)
                await self._session(self._client)
                why = "session ended"
            except asyncio.CancelledError:  # edged stops: the lease goes now, so another node leads at once
                await self._resign()
                raise
            except Exception as e:  # noqa: BLE001 -- any fault ends the session, never the member
                why = self._why(e)
            finally:
                reached = self.connected
                self._lease = None
                if self._client is not None:
                    await close_quietly(self._client)
                self._client = None
            self.faults += 1
            self._lost(f"etcd {host}:{port}: {why}")
            turn += 1
            delay = self.cfg.retry_ms / 1000 if reached else min(BACKOFF_MAX_S, delay * 2)
            await asyncio.sleep(delay)

    def _why(self, e: BaseException) -> str:
        if isinstance(e, asyncio.TimeoutError):
            return f"no answer in {self.cfg.timeout_ms} ms"
        text = " ".join(str(e).split())[:160] or type(e).__name__
        return text if isinstance(e, FAULTS) else f"{type(e).__name__}: {text}"

    async def _resign(self) -> None:
        self.is_leader = False
        if self._lease is not None:
            try:
                await within(self._lease.revoke(), 1.0)
            except FAULTS:
                pass

    def _lost(self, why: str) -> None:
        was_leader, self.is_leader = self.is_leader, False
        if self.connected or not self.problem:
            self.lost_since = time.time()
            self.emit(
                "fleet-lost",
                f"fleet: {why}; keeping snapshot v{self.applied}, forwarding with it"
                + (" (no longer leader)" if was_leader else ""),
                version=self.applied,
                error=why,
            )
        self.connected, self.problem = False, why

    async def _call(self, coro):
        return await within(coro, self.cfg.timeout_ms / 1000)

    async def _session(self, c: aetcd.Client) -> None:
        await self._call(c.connect())
        self._lease = await self._call(c.lease(self.cfg.lease_ttl_s))
        got = await self._call(c.get_prefix(self.k_snapshot))
        start = got.header.revision + 1
        for kv in got:
            if kv.key == self.k_snapshot:
                await self._take(c, kv)
        if self.problem:
            self.emit(
                "fleet-recovered",
                f"fleet: etcd reachable again after {time.time() - self.lost_since:.1f} s (was: {self.problem})",
            )
        self.connected, self.problem = True, ""
        self._wake_report.set()
        tasks = [
            asyncio.create_task(t)
            for t in (self._keepalive(), self._report_loop(c), self._follow_snapshot(c, start), self._campaign(c))
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_ttl_s / 3)
            reply = await self._call(self._lease.refresh())
            if reply is None or reply.TTL <= 0:
                raise ConnectionError("lease expired")

    async def _report_loop(self, c: aetcd.Client) -> None:
        while True:
            self._wake_report.clear()
            h = self.hooks
            doc = fs.report(
                self.cfg.name,
                time.time(),
                self.applied,
                h.serving(),
                self.services(),
                self.computed,
                self.states,
                h.local(),
                h.wire(),
            )
            await self._call(c.put(self.k_me, fs.encode(doc), lease=self._lease))
            self.reported = {k: dict(v) for k, v in self.computed.items()}
            try:
                await within(self._wake_report.wait(), self.cfg.report_ms / 1000)
            except asyncio.TimeoutError:
                pass

    def _refuse(self, key: bytes, why: str, **fields) -> None:
        """A document read from etcd is not used: counted; an event the first time a key turns bad."""
        self.refused += 1
        if key not in self._bad:
            self._bad.add(key)
            self.emit("fleet-refused", f"fleet: {why}; ignored", key=key.decode(errors="replace"), error=why, **fields)

    def _good(self, key: bytes) -> None:
        self._bad.discard(key)

    async def _take(self, c: aetcd.Client, kv) -> None:
        """A snapshot seen: applied when it is well-formed, from the current holder of the leader
        key (on its lease), newer, and not a jump (edged writes the weights before this returns)."""
        snap = await self._trusted(c, kv)
        if snap is None:
            return
        got = fs.to_apply(snap, self.services(), self.applied)
        if got is None:
            return
        for name, why in sorted(got.refused.items()):  # unsafe weights: the last ones stay
            self._refuse(
                kv.key + b"#" + name.encode(),
                f"snapshot v{snap['version']}: {name}: {why}; its weights of v{self.applied} stay",
                service=name,
            )
        for name in got.weights:
            self._good(kv.key + b"#" + name.encode())
        kept = {n: self.shared[n] for n in got.refused if n in self.shared}
        self.shared, self.applied = {**kept, **got.weights}, got.version
        self.marks = {**{n: self.marks[n] for n in kept if n in self.marks}, **got.operator}
        tables = self.hooks.apply(got) or {}
        self.applied_t = time.time()
        self.emit(
            "fleet",
            f"fleet: applied snapshot v{got.version} from {snap['leader']}"
            + "".join(f"; {n} not taken: {why}" for n, why in sorted({**got.skipped, **got.refused}.items())),
            version=got.version,
            leader=snap["leader"],
            published_t=snap["t"],
            trigger_t=snap.get("trigger_t"),
            applied_t=self.applied_t,
            weights=got.weights,
            skipped=got.skipped,
            tables=tables,
            operator=got.operator,
        )
        self._wake_report.set()

    async def _trusted(self, c: aetcd.Client, kv) -> Optional[dict]:
        """The snapshot in kv, checked (schema.snapshot) and written by the current holder of the
        leader key on its lease (snapshot.refused); None (counted, said once) when it is not."""
        try:
            snap = schema.snapshot(kv.value)
        except ValueError as e:
            return self._refuse(kv.key, f"{e}; the applied snapshot v{self.applied} stays")
        holder = await self._call(c.get(self.k_leader))
        name = holder.value.decode(errors="replace") if holder is not None else None
        why = fs.refused(snap, name, holder.lease if holder is not None else 0, kv.mod_revision)
        if why is not None:
            return self._refuse(
                kv.key,
                f"snapshot v{snap['version']} {why}; the applied snapshot v{self.applied} stays",
                version=snap["version"],
                leader=snap["leader"],
            )
        self._good(kv.key)
        return snap

    async def _follow_snapshot(self, c: aetcd.Client, start: int) -> None:
        async for event in etcdio.events(c, self.k_snapshot, None, self.cfg.timeout_ms, start_revision=start):
            if event.kind == aetcd.EventKind.PUT:
                await self._take(c, event.kv)

    async def _campaign(self, c: aetcd.Client) -> None:
        t = c.transactions
        while True:
            won, responses = await self._call(
                c.transaction(
                    compare=[t.create(self.k_leader) == 0],
                    success=[t.put(self.k_leader, self.cfg.name.encode(), lease=self._lease)],
                    failure=[t.get(self.k_leader)],
                )
            )
            if won:
                self.leader, self.is_leader = self.cfg.name, True
                self.emit("fleet-leader", f"fleet: {self.cfg.name} is the leader", leader=self.cfg.name)
                await self._lead(c)
                return
            kvs = responses[0] if responses else []
            if not kvs:
                continue  # gone between the compare and the get: campaign again
            value, meta = kvs[0]
            if value.decode(errors="replace") != self.leader:
                self.leader = value.decode(errors="replace")
                self.emit("fleet-leader", f"fleet: {self.leader} is the leader", leader=self.leader)
            async for event in etcdio.events(
                c, self.k_leader, None, self.cfg.timeout_ms, start_revision=meta.mod_revision + 1
            ):
                if event.kind == aetcd.EventKind.DELETE:
                    break

    # ------------------------------------------------------------ the leader

    async def _lead(self, c: aetcd.Client) -> None:
        """Publishes a snapshot at the start of the term (so every node has one from this
        leader), then whenever the reports move one past the hysteresis, checking at every
        report_ms (a report not put again within stale_ms drops out)."""
        term, revisions = await self._open_term(c)
        pumps = [
            asyncio.create_task(self._pump(c, k, rev, term.queue))
            for k, rev in ((self.k_nodes, revisions[0]), (self.k_operator, revisions[1]))
        ]
        force = True
        try:
            while True:
                for pumping in pumps:
                    if pumping.done():
                        pumping.result()
                        raise ConnectionError("report watch ended")
                await self._publish(c, term, force)
                force = False
                await self._sweep_marks(c, term)
                await self._absorb(term)
        finally:
            for pumping in pumps:
                pumping.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _open_term(self, c: aetcd.Client) -> tuple[_Term, tuple[int, int]]:
        """The term's start: every report and mark as they are now, and the last snapshot to
        continue from; returns the revisions to watch reports and marks from."""
        got = await self._call(c.get(self.k_snapshot))
        listing = await self._call(c.get_prefix(self.k_nodes))
        marked = await self._call(c.get_prefix(self.k_operator))
        term = _Term(last=None)
        for kv in listing:
            self._put_report(term, kv.key, kv.value)
        for kv in marked:
            self._put_mark(term, kv.key, kv.value, kv.mod_revision)
        term.last = etcdio.continue_from(got, term.reports.values(), listing.header.revision)
        return term, (listing.header.revision + 1, marked.header.revision + 1)

    async def _pump(self, c: aetcd.Client, k: bytes, start: int, queue: asyncio.Queue) -> None:
        async for event in etcdio.events(c, k, utils.prefix_range_end(k), self.cfg.timeout_ms, start_revision=start):
            queue.put_nowait(event)

    async def _publish(self, c: aetcd.Client, term: _Term, force: bool) -> None:
        """The next snapshot, if one is due (or force: the term's first), put while this node
        still holds the leader key."""
        fresh = term.fresh(self.cfg.stale_ms / 1000)
        now = time.time()
        nxt = fs.next_snapshot(
            self.services(), fresh, term.last, self.cfg.name, now, math.inf, op.collect(term.marks.values())
        )
        if nxt is None and force and term.last is not None and term.last.get("services"):
            nxt = {**term.last, "version": term.last["version"] + 1, "leader": self.cfg.name, "t": now}
        if nxt is None:
            return
        # past whatever this node applied (a writer may have put a version in the leader's name)
        nxt["version"], nxt["lease"] = max(nxt["version"], self.applied + 1), self._lease.id
        nxt["trigger_t"] = max((r["t"] for r in fresh), default=now)
        t = c.transactions
        ok, _ = await self._call(
            c.transaction(
                compare=[t.value(self.k_leader) == self.cfg.name.encode()],
                success=[t.put(self.k_snapshot, fs.encode(nxt))],
                failure=[],
            )
        )
        if not ok:
            raise ConnectionError("no longer the leader (its key is gone)")
        term.last = nxt

    async def _absorb(self, term: _Term) -> None:
        """Waits up to report_ms for watch events, then takes every one that is there."""
        try:
            batch = [await within(term.queue.get(), self.cfg.report_ms / 1000)]
        except asyncio.TimeoutError:
            return
        while not term.queue.empty():
            batch.append(term.queue.get_nowait())
        for event in batch:
            k, put = event.kv.key, event.kind == aetcd.EventKind.PUT
            if k.startswith(self.k_operator):
                term.marks.pop(k, None)
                term.revs.pop(k, None)
                if put:
                    self._put_mark(term, k, event.kv.value, event.kv.mod_revision)
            elif put:
                self._put_report(term, k, event.kv.value)
            else:
                term.reports.pop(k, None)
                term.seen.pop(k, None)

    async def _sweep_marks(self, c: aetcd.Client, term: _Term) -> None:
        """Deletes the operator marks whose backend has been unknown (operator.unknown) for
        stale_ms: the leader's own config may be a reload behind the node that set one. Each
        delete is guarded by the leadership and by the mark's revision (a mark set again stays)."""
        stale_s, now, since = self.cfg.stale_ms / 1000, time.monotonic(), term.unknown_since
        unknown = set(
            op.unknown(term.marks, self.services(), term.fresh(stale_s), now, math.inf, self.hooks.unsettled())
        )
        for k in [k for k in since if k not in unknown]:
            del since[k]
        for k in sorted(unknown):
            if now - since.setdefault(k, now) < stale_s or k not in term.revs:
                continue
            del since[k]  # tried: the watch says what came of it; a refused delete waits stale_ms again
            await self._delete_mark(c, k, term.marks[k], term.revs[k])

    async def _delete_mark(self, c: aetcd.Client, k: bytes, entry: tuple, rev: int) -> None:
        service, backend, mark = entry
        t = c.transactions
        ok, _ = await self._call(
            c.transaction(
                compare=[t.value(self.k_leader) == self.cfg.name.encode(), t.mod(k) == rev],
                success=[t.delete(k)],
                failure=[],
            )
        )
        if ok:
            self.emit(
                "fleet-operator",
                f"fleet: deleted the operator mark of {service}/{backend} "
                f"({op.describe(mark)}, set by {mark.get('node') or '?'}): no node runs "
                f"that backend any more",
                service=service,
                backend=backend,
                mark={"drain": mark.get("drain"), "weight": mark.get("weight")},
            )

    def _put_report(self, term: _Term, key: bytes, value: bytes) -> None:
        term.reports.pop(key, None)  # garbage counts as no report
        try:
            term.reports[key] = schema.report(value, key.decode(errors="replace"))
        except ValueError as e:
            return self._refuse(key, str(e))
        term.seen[key] = time.monotonic()
        self._good(key)

    def _put_mark(self, term: _Term, key: bytes, value: bytes, rev: int) -> None:
        names = op.split_key(self.cfg.prefix, key)
        if names is None:
            return
        try:
            term.marks[key] = (*names, op.decode(value))
        except ValueError as e:
            return self._refuse(key, f"{key.decode(errors='replace')}: {e}")
        term.revs[key] = rev
        self._good(key)

    # ------------------------------------------------------------ operator actions (edged's API)

    async def operate(
        self, service: str, backend: str, kind: str, weight: Optional[int] = None
    ) -> tuple[Optional[dict], Optional[dict]]:
        """Records an operator action for the whole fleet (operator.change: drain, undrain, or
        weight with None clearing it) under operator/SERVICE/BACKEND, in a transaction against
        the key's revision (two nodes acting at once both count). Returns the mark before and
        after. ConnectionError when etcd is not reachable now: nothing is recorded."""
        c = self._client
        if c is None or not self.connected:
            raise ConnectionError(f"etcd not reachable ({self.problem or 'not connected yet'})")
        k, t = op.key(self.cfg.prefix, service, backend), c.transactions
        for _ in range(5):
            got = await self._call(c.get(k))
            try:
                before = op.decode(got.value) if got is not None else None
            except ValueError:
                before = None  # garbage: replaced
            after = op.change(before, kind, weight, self.cfg.name, time.time())
            compare = [t.mod(k) == got.mod_revision] if got is not None else [t.create(k) == 0]
            write = [t.put(k, fs.encode(after))] if after is not None else [t.delete(k)]
            ok, _ = await self._call(c.transaction(compare=compare, success=write, failure=[]))
            if ok:
                return before, after
        raise ConnectionError(f"{k.decode()}: changed by others five times in a row; try again")
