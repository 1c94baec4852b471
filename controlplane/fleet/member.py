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

Any fault ends the session: the node is no leader any more, keeps the snapshot it applied (the
data path keeps forwarding with it) and says so (a fleet-lost event, edge_fleet_connected 0,
`edgectl status`); it reconnects (next endpoint, after retry_ms) and resumes with a full read.
The decisions are snapshot.py's; this file only moves documents.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterable, Mapping, Optional

import aetcd
import grpc
from aetcd import utils

from controlplane import weights as policy
from controlplane.config import Fleet, Service
from controlplane.discovery.etcd import client as etcd_client, close_quietly
from controlplane.fleet import operator as op
from controlplane.fleet import snapshot as fs

FAULTS = (asyncio.TimeoutError, aetcd.ClientError, grpc.RpcError, OSError, ConnectionError, ValueError)


class Member:
    """services(): the services edged runs now; apply(Apply): edged takes a snapshot's weights
    (synchronously, through its own step) and returns each service's table digest; emit(kind, text, **fields): edged's event log;
    serving(): whether edged says SERVING; local(): service -> backend -> what an operator set
    on this node only (reported, so `edgectl fleet status` shows whose table differs)."""

    def __init__(self, cfg: Fleet, services: Callable[[], Iterable[Service]], apply: Callable[[fs.Apply], Optional[dict]],
                 emit: Callable[..., object], serving: Callable[[], bool] = lambda: True,
                 local: Callable[[], dict] = dict, wire: Callable[[], Mapping] = dict,
                 unsettled: Callable[[], Iterable[str]] = tuple):
        """local: what an operator set on this node only; wire: service -> backend -> the wire
        signals edged last read (both for the report); unsettled: the services whose discovery
        has said nothing yet (their marks are not swept)."""
        self.cfg = cfg
        self.services, self._apply, self.emit, self.serving = services, apply, emit, serving
        self.local, self.wire, self.unsettled = local, wire, unsettled
        p = cfg.prefix
        self.k_leader, self.k_nodes, self.k_snapshot = (p + fs.LEADER).encode(), (p + fs.NODES).encode(), \
            (p + fs.SNAPSHOT).encode()
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
        self._wake_report = asyncio.Event()
        self._lease: Optional[aetcd.Lease] = None
        self._client: Optional[aetcd.Client] = None

    # ------------------------------------------------------------ edged's side (its loop)

    def steer(self, s: Service, d: policy.Decision, pushed: Optional[dict[str, int]],
              forced: Optional[dict[str, int]] = None) -> policy.Decision:
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
        return policy.Decision(weights=wanted, computed=d.computed, states=d.states, reasons=d.reasons,
                               push=wanted != pushed)

    def report_now(self) -> None:
        """Report at once (an operator changed what this node runs)."""
        self._wake_report.set()

    def view(self) -> dict:
        """For `edgectl status` and the metrics."""
        return {"name": self.cfg.name, "leader": self.leader, "is_leader": self.is_leader,
                "connected": self.connected, "problem": self.problem, "version": self.applied,
                "applied_age_s": round(time.time() - self.applied_t, 3) if self.applied_t else None,
                "services": sorted(self.shared)}

    # ------------------------------------------------------------ sessions

    async def run(self) -> None:
        """Sessions until cancelled; a failed one is reported and the next endpoint tried."""
        turn = 0
        while True:
            host, port = self.cfg.etcd[turn % len(self.cfg.etcd)]
            self._client = etcd_client(host, port, self.cfg.timeout_ms)
            try:
                await self._session(self._client)
                why = "session ended"
            except asyncio.TimeoutError:
                why = f"no answer in {self.cfg.timeout_ms} ms"
            except FAULTS as e:
                why = " ".join(str(e).split())[:160] or type(e).__name__
            except asyncio.CancelledError:  # edged stops: the lease goes now, so another node leads at once
                self.is_leader = False
                if self._lease is not None:
                    try:
                        await asyncio.wait_for(self._lease.revoke(), 1.0)
                    except FAULTS:
                        pass
                raise
            finally:
                self._lease = None
                await close_quietly(self._client)
                self._client = None
            self._lost(f"etcd {host}:{port}: {why}")
            turn += 1
            await asyncio.sleep(self.cfg.retry_ms / 1000)

    def _lost(self, why: str) -> None:
        was_leader, self.is_leader = self.is_leader, False
        if self.connected or not self.problem:
            self.lost_since = time.time()
            self.emit("fleet-lost", f"fleet: {why}; keeping snapshot v{self.applied}, forwarding with it"
                      + (" (no longer leader)" if was_leader else ""), version=self.applied, error=why)
        self.connected, self.problem = False, why

    async def _call(self, coro):
        return await asyncio.wait_for(coro, self.cfg.timeout_ms / 1000)

    async def _session(self, c: aetcd.Client) -> None:
        await self._call(c.connect())
        self._lease = await self._call(c.lease(self.cfg.lease_ttl_s))
        got = await self._call(c.get_prefix(self.k_snapshot))
        start = got.header.revision + 1
        for kv in got:
            if kv.key == self.k_snapshot:
                self._take(kv.value)
        if self.problem:
            self.emit("fleet-recovered", f"fleet: etcd reachable again after "
                                         f"{time.time() - self.lost_since:.1f} s (was: {self.problem})")
        self.connected, self.problem = True, ""
        self._wake_report.set()
        tasks = [asyncio.create_task(t) for t in (self._keepalive(), self._report_loop(c),
                                                  self._follow_snapshot(c, start), self._campaign(c))]
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
            doc = fs.report(self.cfg.name, time.time(), self.applied, self.serving(), self.services(),
                            self.computed, self.states, self.local(), self.wire())
            await self._call(c.put(self.k_me, fs.encode(doc), lease=self._lease))
            self.reported = {k: dict(v) for k, v in self.computed.items()}
            try:
                await asyncio.wait_for(self._wake_report.wait(), self.cfg.report_ms / 1000)
            except asyncio.TimeoutError:
                pass

    def _take(self, value: bytes) -> None:
        """A snapshot seen: applied when newer (edged writes the weights before this returns)."""
        try:
            snap = fs.decode(value, "snapshot")
        except ValueError as e:
            self.emit("error", f"fleet: {e}; the applied snapshot stays")
            return
        got = fs.to_apply(snap, list(self.services()), self.applied)
        if got is None:
            return
        self.shared, self.marks, self.applied = got.weights, got.operator, got.version
        tables = self._apply(got) or {}
        self.applied_t = time.time()
        self.emit("fleet", f"fleet: applied snapshot v{got.version} from {snap.get('leader')}"
                  + "".join(f"; {n} not taken: {why}" for n, why in sorted(got.skipped.items())),
                  version=got.version, leader=snap.get("leader"), published_t=snap.get("t"),
                  trigger_t=snap.get("trigger_t"), applied_t=self.applied_t,
                  weights=got.weights, skipped=got.skipped, tables=tables, operator=got.operator)
        self._wake_report.set()

    async def _follow_snapshot(self, c: aetcd.Client, start: int) -> None:
        async for event in _events(c, self.k_snapshot, None, self.cfg.timeout_ms, start_revision=start):
            if event.kind == aetcd.EventKind.PUT:
                self._take(event.kv.value)

    async def _campaign(self, c: aetcd.Client) -> None:
        t = c.transactions
        while True:
            won, responses = await self._call(c.transaction(
                compare=[t.create(self.k_leader) == 0],
                success=[t.put(self.k_leader, self.cfg.name.encode(), lease=self._lease)],
                failure=[t.get(self.k_leader)]))
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
            async for event in _events(c, self.k_leader, None, self.cfg.timeout_ms,
                                       start_revision=meta.mod_revision + 1):
                if event.kind == aetcd.EventKind.DELETE:
                    break

    async def _lead(self, c: aetcd.Client) -> None:
        """Publishes a snapshot whenever the reports move one past the hysteresis, and checks at
        every report_ms (a stale report drops out)."""
        got = await self._call(c.get(self.k_snapshot))
        last = None
        if got is not None:
            try:
                last = fs.decode(got.value, "snapshot")
            except ValueError:
                last = None
        reports: dict[bytes, dict] = {}
        marks: dict[bytes, tuple[str, str, dict]] = {}  # operator key -> (service, backend, mark)
        revs: dict[bytes, int] = {}  # operator key -> its mod revision
        unknown_since: dict[bytes, float] = {}  # operator key -> when its backend was first unknown
        queue: asyncio.Queue = asyncio.Queue()
        listing = await self._call(c.get_prefix(self.k_nodes))
        for kv in listing:
            _put_report(reports, kv.key, kv.value)
        marked = await self._call(c.get_prefix(self.k_operator))
        for kv in marked:
            self._put_mark(marks, kv.key, kv.value)
            revs[kv.key] = kv.mod_revision

        async def pump(k: bytes, start: int) -> None:
            async for event in _events(c, k, utils.prefix_range_end(k), self.cfg.timeout_ms, start_revision=start):
                queue.put_nowait(event)

        pumps = [asyncio.create_task(pump(self.k_nodes, listing.header.revision + 1)),
                 asyncio.create_task(pump(self.k_operator, marked.header.revision + 1))]
        t = c.transactions
        try:
            while True:
                for pumping in pumps:
                    if pumping.done():
                        pumping.result()
                        raise ConnectionError("report watch ended")
                now = time.time()
                nxt = fs.next_snapshot(list(self.services()), reports.values(), last, self.cfg.name, now,
                                       self.cfg.stale_ms / 1000, op.collect(marks.values()))
                if nxt is not None:
                    nxt["trigger_t"] = max((float(r.get("t", 0)) for r in reports.values()), default=now)
                    ok, _ = await self._call(c.transaction(
                        compare=[t.value(self.k_leader) == self.cfg.name.encode()],
                        success=[t.put(self.k_snapshot, fs.encode(nxt))], failure=[]))
                    if not ok:
                        raise ConnectionError("no longer the leader (its key is gone)")
                    last = nxt
                await self._sweep_marks(c, marks, revs, reports, unknown_since, now)
                try:
                    batch = [await asyncio.wait_for(queue.get(), self.cfg.report_ms / 1000)]
                except asyncio.TimeoutError:
                    continue
                while not queue.empty():
                    batch.append(queue.get_nowait())
                for event in batch:
                    if event.kv.key.startswith(self.k_operator):
                        marks.pop(event.kv.key, None)
                        revs.pop(event.kv.key, None)
                        if event.kind == aetcd.EventKind.PUT:
                            self._put_mark(marks, event.kv.key, event.kv.value)
                            revs[event.kv.key] = event.kv.mod_revision
                    elif event.kind == aetcd.EventKind.PUT:
                        _put_report(reports, event.kv.key, event.kv.value)
                    else:
                        reports.pop(event.kv.key, None)
        finally:
            for pumping in pumps:
                pumping.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _sweep_marks(self, c: aetcd.Client, marks: dict, revs: dict, reports: dict, since: dict,
                           now: float) -> None:
        """Deletes the operator marks whose backend has been unknown (operator.unknown) for
        stale_ms: the leader's own config may be a reload behind the node that set one. Each
        delete is guarded by the leadership and by the mark's revision (a mark set again stays)."""
        stale_s = self.cfg.stale_ms / 1000
        unknown = set(op.unknown(marks, list(self.services()), reports.values(), now, stale_s, self.unsettled()))
        for k in [k for k in since if k not in unknown]:
            del since[k]
        t = c.transactions
        for k in sorted(unknown):
            if now - since.setdefault(k, now) < stale_s or k not in revs:
                continue
            del since[k]  # tried: the watch says what came of it; a refused delete waits stale_ms again
            service, backend, mark = marks[k]
            ok, _ = await self._call(c.transaction(
                compare=[t.value(self.k_leader) == self.cfg.name.encode(), t.mod(k) == revs[k]],
                success=[t.delete(k)], failure=[]))
            if ok:
                self.emit("fleet-operator", f"fleet: deleted the operator mark of {service}/{backend} "
                                            f"({op.describe(mark)}, set by {mark.get('node') or '?'}): no node runs "
                                            f"that backend any more", service=service, backend=backend,
                          mark={"drain": mark.get("drain"), "weight": mark.get("weight")})

    def _put_mark(self, marks: dict, key: bytes, value: bytes) -> None:
        names = op.split_key(self.cfg.prefix, key)
        try:
            if names is not None:
                marks[key] = (*names, op.decode(value))
        except ValueError as e:
            self.emit("error", f"fleet: {key.decode(errors='replace')}: {e}; ignored")

    # ------------------------------------------------------------ operator actions (edged's API)

    async def operate(self, service: str, backend: str, kind: str, weight: Optional[int] = None
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


def _put_report(reports: dict, key: bytes, value: bytes) -> None:
    try:
        reports[key] = fs.decode(value, key.decode(errors="replace"))
    except ValueError:
        reports.pop(key, None)  # garbage counts as no report


def _marks_of(prefix: str, kvs) -> list[dict]:
    """The fleet-wide operator marks for `edgectl fleet status`, garbage left out."""
    out = []
    for kv in kvs:
        names = op.split_key(prefix, kv.key)
        try:
            mark = op.decode(kv.value) if names else None
        except ValueError:
            continue
        if mark is not None:
            out.append({"service": names[0], "backend": names[1], **mark})
    return out


async def _events(c: aetcd.Client, key: bytes, range_end: Optional[bytes], timeout_ms: int,
                  start_revision: Optional[int] = None):
    """The watch's events one by one; ConnectionError when the stream ends."""
    watch = await asyncio.wait_for(c.watch(key, range_end=range_end, start_revision=start_revision),
                                   timeout_ms / 1000)
    try:
        async for event in watch:
            yield event
        raise ConnectionError("watch stream ended")
    finally:
        await watch.cancel()


async def read_status(cfg: Fleet) -> dict:
    """`edgectl fleet status`: the leader, the snapshot and every node's report, read from etcd
    (the first endpoint that answers). Raises ConnectionError naming the endpoints."""
    errors = []
    for host, port in cfg.etcd:
        c = etcd_client(host, port, cfg.timeout_ms)
        try:
            await asyncio.wait_for(c.connect(), cfg.timeout_ms / 1000)
            prefix = cfg.prefix.encode()
            leader = await asyncio.wait_for(c.get(prefix + fs.LEADER.encode()), cfg.timeout_ms / 1000)
            snap = await asyncio.wait_for(c.get(prefix + fs.SNAPSHOT.encode()), cfg.timeout_ms / 1000)
            nodes = await asyncio.wait_for(c.get_prefix(prefix + fs.NODES.encode()), cfg.timeout_ms / 1000)
            marked = await asyncio.wait_for(c.get_prefix(prefix + op.OPERATOR.encode()), cfg.timeout_ms / 1000)
        except FAULTS as e:
            errors.append(f"{host}:{port}: {' '.join(str(e).split())[:80] or type(e).__name__}")
            continue
        finally:
            await close_quietly(c)
        reports = {}
        for kv in nodes:
            _put_report(reports, kv.key, kv.value)
        snapshot = fs.decode(snap.value, "snapshot") if snap is not None else None
        leader_name = leader.value.decode(errors="replace") if leader is not None else ""
        return {"leader": leader_name, "version": int(snapshot["version"]) if snapshot else 0,
                "published_t": snapshot.get("t") if snapshot else None,
                "nodes": fs.status_rows(leader_name, snapshot, reports.values(), time.time()),
                "operator": _marks_of(cfg.prefix, marked)}
    raise ConnectionError("etcd: " + "; ".join(errors))
