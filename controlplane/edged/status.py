"""What edged shows: the status views (snapshot for `edgectl status` and the metrics,
backend_view, node_state for the BGP announcement) and the edge_be_probe record, written once
a second where it changed (and every REFRESH_S regardless), which a restarted edged and
`edgectl status` without edged read back.
Reads the State and the prober's windows; changes nothing but the status record. Walks
of the maps run on a worker thread within a deadline, never on edged's loop; the views of
thousands of backends and the once-a-second record are built in slices of about SLICE
backends (whole services), with the loop given back between them, so API calls and probes
are served meanwhile instead of after the whole of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from controlplane import abi, deploy, desired, statuspage, weights, wiresignals
from controlplane.edged import announce
from controlplane.edged.state import State
from controlplane.errors import EdgeError
from controlplane.maps import ProbeStatus
from controlplane.probe import Prober
from controlplane.probe.child import ChildProber
from controlplane.samples import quantiles
from controlplane.tasks import within

STATUS_EVERY_S = 1.0  # how often measurements are written to edge_be_probe
# A status walk stops counting conntrack here and reports it unknown. A full table of the
# default ct_size (262144) counts in about 0.9 s on a 2-core test VM; 3 s leaves a busy node room.
WALK_DEADLINE_S = 3.0
WALK_GRACE_S = 2.0  # past the deadline, a caller stops waiting for a walk that has not ended
# Walks of the maps for status and metrics run here, never on the loop: counting conntrack
# is O(ct_size) (seconds when full), the rest O(max_backends). One at a time.
_walker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edged-walk")
# Backends whose views (status) or records (edge_be_probe) are built before the loop is given
# back: whole services, so each service's part is consistent with one state of edged.
# 32: a step per service of the fleet's size (63); 256 held the loop up to 177 ms at 10,000 backends
# on a loaded 2-core machine, a status walk and conversion taking the interpreter meanwhile
# (tools/bench-probe --scale --gc-log)
SLICE = 32
# A walk (and then the status call's conversion, api.server) computes on a thread beside the loop:
# two busy threads hand the interpreter over every switch interval (5 ms by default), and each of
# the loop's wake-ups meanwhile waited that long. From the first walk on, the process switches
# every 0.5 ms (the prober's thread set it before the prober moved to a child process: probe.child).
SWITCH_S = 0.0005
# The status loop writes a backend's record only when it differs from what edged wrote last (at
# 10,000 backends under the probe budget most records change every few seconds, and rewriting all
# of them held edged's loop and the interpreter every second: tools/bench-probe --scale); an
# unchanged record is rewritten all the same once it is about this old (spread over the last third
# of it by backend id, so that the records written together at start are not all due in one second),
# so that updated_ns says edged looked at it no longer ago than that.
REFRESH_S = 10.0
_SPREAD = 32


def _leave_until_s(gone: desired.Leaving | None) -> int | None:
    """edge_be_probe's leave_until_s: None when not leaving, UNKNOWN when until its connections end."""
    if gone is None:
        return None
    return abi.UNKNOWN if gone.deadline_ns is None else gone.deadline_ns // 1_000_000_000


_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(ProbeStatus)))  # ProbeStatus -> its values


class Status:
    """edged's views of itself, over the State and the prober's windows."""

    def __init__(self, state: State, prober: Prober | ChildProber):
        self.state = state
        self.prober = prober
        # what the status loop wrote last: per service, the maps and the Service it was written for
        # (an apply may reset or clear the records of a service it changes)
        self._written_for: dict[str, tuple[object, object]] = {}
        # backend id: (backend, when written, the record's fields...): one tuple of atoms, which the
        # collector untracks (a ProbeStatus kept per backend was walked by every young collection)
        self._written: dict[int, tuple] = {}
        # a window's RTT quantiles as of its newest sample: most windows get no sample in a second
        # under the probe budget at 10,000 backends (gone with their window)
        self._quantiles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def node_state(self) -> announce.NodeState:
        """What announce.decide() judges: data path open, serving (the watch finds the data path
        whole, edged is not stopping), drain-node, usable backends (the data path takes new
        flows to them and probes do not say down)."""
        state = self.state
        services = []
        for name, st in state.services.items():
            usable = 0
            if state.maps is not None:
                try:
                    usable = sum(
                        ok and not (b in st.trackers and st.trackers[b].down)
                        for b, ok in state.maps.usable(name).items()
                    )
                except EdgeError:
                    usable = 0
            services.append(announce.ServiceState(name, st.service.vip, usable))
        return announce.NodeState(
            attached=state.maps is not None,
            serving=not state.stopping.is_set(),
            drained=state.node_drained,
            services=tuple(services),
            problem=state.not_serving,
        )

    async def snapshot(
        self, discovered: Callable[[], dict], count_conntrack: bool = False, view: statuspage.View | None = None
    ) -> dict:
        """This instance as `edgectl status --json` shows it, plus edged's view per backend and
        discovered() (discovery's view per service, asked once the walk is done). The maps are
        walked on a worker thread within WALK_DEADLINE_S: a conntrack count cut by the deadline
        is None (conntrack_partial: entries counted before it). view: the summaries or a page
        (statuspage.apply), applied before edged's views are added: only to the backends shown."""
        state = self.state
        if state.maps is None:
            raise EdgeError("edged has no data path open (starting or stopping)")
        if view is not None:
            view.check()  # refused before the walk
        snap = await self._walk(count_conntrack)
        if view is not None:
            snap = statuspage.apply(snap, view)
        now = time.monotonic_ns()
        found = discovered()
        if state.fleet is not None:  # node.fleet: this node's view of its fleet
            snap["fleet"] = state.fleet.view()
        announcer = state.announcer
        if announcer is not None and announcer.last is not None:  # node.bgp: what bird announces, and why not
            view = announcer.view()
            snap["bgp"] = {
                "announced": view["announced"],
                "withdrawn": view["withdrawn"],
                "speaker_up": not announcer.problem,
                "speaker_restarts": announcer.restarts,
            }
        snap["probe_budget"] = self.probe_budget()
        done = 0
        for svc in snap["services"]:
            if done >= SLICE:  # the loop serves API calls and probes between services
                done = 0
                await asyncio.sleep(0)
                now = time.monotonic_ns()
            st = state.services.get(svc["name"])
            svc["pushes"] = st.pushes if st else 0
            if svc["name"] in found:
                svc["discovery"] = found[svc["name"]]
            for b in svc["backends"]:
                if st and b["name"] in st.trackers:
                    b["edged"] = self.backend_view(svc["name"], b["name"], now)
            done += len(svc["backends"])
        return snap

    def probe_budget(self) -> dict:
        """The prober's budget (node.probe_budget, lowered while probes take over half of the loop), what the
        probes ask for and the shortfall."""
        b = self.prober.budget
        return {
            "budget_per_s": b.budget_per_s,
            "configured_per_s": b.cap_per_s,
            "demand_per_s": b.demand_per_s,
            "run_per_s": b.run_per_s,
            "stretch": b.stretch,
            "shortfall_ratio": b.shortfall,
            "short": self.prober.short,
        }

    async def _walk(self, count_conntrack: bool) -> dict:
        """deploy.describe on the walker thread (State.walks holds it while it runs)."""
        state = self.state
        if sys.getswitchinterval() > SWITCH_S:
            sys.setswitchinterval(SWITCH_S)
        deadline_ns = time.monotonic_ns() + int(WALK_DEADLINE_S * 1e9)
        walk = asyncio.wrap_future(
            _walker.submit(deploy.describe, state.maps, state.instance, state.pin_path, count_conntrack, deadline_ns)
        )
        state.walks.add(walk)
        walk.add_done_callback(state.walks.discard)
        try:
            return await within(asyncio.shield(walk), WALK_DEADLINE_S + WALK_GRACE_S)
        except asyncio.TimeoutError:
            raise EdgeError(
                f"status: walking the maps took over {WALK_DEADLINE_S + WALK_GRACE_S:g}s; try again"
            ) from None

    async def wait_walks(self) -> None:
        """Until the walks in progress end (at most their deadline and grace): a walk must not
        read maps being closed."""
        if self.state.walks:
            await asyncio.wait(set(self.state.walks), timeout=WALK_DEADLINE_S + WALK_GRACE_S)

    def backend_view(self, name: str, backend: str, now_ns: int, full: bool = True) -> dict:
        """What edged knows of one backend: window, smoothing, load, state. full=False leaves
        out what the edge_be_probe record does not hold (rtt_window, config_weight, wire)."""
        state = self.state
        st = state.services[name]
        health = st.service.health
        view = weights.describe(st.trackers[backend], now_ns, health.metrics if health else None)
        window = self.prober.window((name, backend))  # the one window of recent probes
        rtts = window.rtts() if window else []
        p50, p99 = quantiles(rtts, 0.50, 0.99)  # as window.p50() and p99(), from one sorted copy
        ok, failed = state.observer.probes(name, backend)
        probe = health.probe if health else None
        relaxed = self.prober.relaxed((name, backend)) if probe is not None else None  # adaptive probing
        view.update(
            {
                # engines export gauges as floats; requests are counted in whole numbers
                "waiting": None if view.get("waiting") is None else int(view["waiting"]),
                "running": None if view.get("running") is None else int(view["running"]),
                "rtt_p50_s": p50,
                "rtt_p99_s": p99,
                **({"rtt_window": rtts} if full else {}),
                "probes_ok": ok,
                "probes_failed": failed,
                "weight": (st.pushed or {}).get(backend),
                **({"config_weight": next(b.weight for b in st.service.backends if b.name == backend)} if full else {}),
                "state": st.states.get(backend, "static" if not st.computed else ""),
                "reason": st.reasons.get(backend, ""),
                "drained": (name, backend) in state.drained,
                "override": state.overrides.get((name, backend)),
                "leaving": (name, backend) in state.leaving,
                "probe_relaxed": relaxed,
                "probe_interval_s": None
                if probe is None
                else (max(probe.relaxed_ms, probe.interval_ms) if relaxed else probe.interval_ms)
                * self.prober.stretch  # as run: under node.probe_budget, stretched
                / 1000,
            }
        )
        if full:
            view["wire"] = wiresignals.summary(st.wire_signals.get(backend))  # over weights.wire.window_ms
        self._explain(view, name, backend)
        return view

    def _explain(self, view: dict, name: str, backend: str) -> None:
        """The operator's and the fleet's marks in view: their state and reason win the policy's."""
        fleet = self.state.fleet
        mark = (fleet.marks.get(name) or {}).get(backend) if fleet is not None and name in fleet.shared else None
        if mark is not None:  # fleet-wide, from the applied snapshot
            view["fleet_drained"], view["fleet_override"] = bool(mark.get("drain")), mark.get("weight")
        if view["leaving"]:
            view["state"], view["reason"] = "leaving", "removed by reload; draining its connections"
        elif view["drained"]:
            view["state"], view["reason"] = (
                "drained",
                "drained by the operator"
                + (" on this node only (the fleet's table differs)" if fleet is not None else ""),
            )
        elif view.get("fleet_drained"):
            view["state"], view["reason"] = "drained", "drained fleet-wide by the operator"

    def record(self, name: str, backend: str, config_weight: int) -> ProbeStatus:
        """Backend backend's edge_be_probe record (updated_ns 0): what backend_view says of it,
        without the rest of the view (the record of every backend is built every second)."""
        state = self.state
        st = state.services[name]
        tracker = st.trackers[backend]
        load = tracker.load
        window = self.prober.window((name, backend))
        p50 = p99 = None
        if window is not None:
            newest, n = window.newest(), window.kept()
            seen = self._quantiles.get(window)
            if seen is not None and seen[0] is newest and seen[1] == n:
                p50, p99 = seen[2], seen[3]
            else:
                p50, p99 = quantiles(window.rtts(), 0.50, 0.99)
                self._quantiles[window] = (newest, n, p50, p99)
        ok, failed = state.observer.probes(name, backend)
        marks = {
            "state": st.states.get(backend, "static" if not st.computed else ""),
            "reason": st.reasons.get(backend, ""),
            "drained": (name, backend) in state.drained,
            "leaving": (name, backend) in state.leaving,
        }
        self._explain(marks, name, backend)
        return ProbeStatus(
            updated_ns=0,
            config_weight=config_weight,
            rtt_p50_s=p50,
            rtt_p99_s=p99,
            rtt_smoothed_s=tracker.rtt_s,
            # engines export gauges as floats; requests are counted in whole numbers
            waiting=None if load is None or load.waiting is None else int(load.waiting),
            running=None if load is None or load.running is None else int(load.running),
            kv_usage=None if load is None else load.kv_usage,
            probes_ok=ok,
            probes_failed=failed,
            state=marks["state"],
            reason=marks["reason"],
            drained=marks["drained"],
            override=state.overrides.get((name, backend)),
            leave_until_s=_leave_until_s(state.leaving.get((name, backend))),
        )

    def write_status(self, now_ns: int) -> None:
        """Every backend's edge_be_probe record that changed (or is REFRESH_S old): what edged
        measured and the operator's marks."""
        for name in list(self.state.services):
            self.write_service(name, now_ns, changed_only=True)

    async def write_status_sliced(self) -> None:
        """write_status as the status loop runs it: the loop is given back every SLICE backends
        (whole services); a service is written as edged has it then, and not under an apply
        (one that starts meanwhile is waited out first)."""
        state, done = self.state, 0
        for name in list(state.services):
            if done >= SLICE:
                done = 0
                await asyncio.sleep(0)
                await state.maps_idle.wait()
                if state.maps is None:  # stopping
                    return
            done += self.write_service(name, time.monotonic_ns(), changed_only=True)

    def write_service(self, name: str, now_ns: int, changed_only: bool = False) -> int:
        """The edge_be_probe records of service name's backends (an operator's action changes
        no other's); changed_only: only those that differ from what was written last, or are due
        for their refresh (REFRESH_S). How many backends were looked at (0: no such service, or
        gone meanwhile)."""
        state = self.state
        st = state.services.get(name)
        if st is None:
            return 0
        maps, written = state.maps, self._written
        _, bids = maps.ids(name)
        if changed_only:
            was = self._written_for.get(name)
            if was is None or was[0] is not maps or (was[1] is not st.service and was[1] != st.service):
                for bid in bids.values():  # written for another deployment or config of it: anew
                    written.pop(bid, None)
        self._written_for[name] = (maps, st.service)
        refresh_ns = int(REFRESH_S * 1e9)
        due: list[tuple[int, str, ProbeStatus, tuple]] = []
        for b in st.service.backends:
            bid = bids[b.name]
            record = self.record(name, b.name, b.weight)
            fields, last = _fields(record), written.get(bid)
            if (
                changed_only
                and last is not None
                and last[0] == b.name
                and last[2:] == fields
                and (now_ns - last[1]) * _SPREAD < refresh_ns * (_SPREAD - bid % (_SPREAD // 3))
            ):
                continue
            due.append((bid, b.name, record, fields))
        # in one call (a write each released the interpreter and waited to take it back)
        maps.write_statuses([(bid, dataclasses.replace(record, updated_ns=now_ns)) for bid, _, record, _ in due])
        for bid, backend, _, fields in due:
            written[bid] = (backend, now_ns) + fields
        return len(st.service.backends)
