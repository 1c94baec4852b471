"""What edged shows and what an operator may do to it: the status views
(snapshot, backend_view, the edge_be_probe record written once a second),
drains, weight overrides and drain-node. Mixed into edged's Daemon; every
change of this node goes through the maps and is undone if they refuse it; in
a fleet, drains and overrides are recorded in etcd instead (fleet/member.py),
unless the operator asks for this node only."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from controlplane import abi, deploy, weights, wire
from controlplane.edged import announce
from controlplane.errors import EdgeError
from controlplane.fleet import operator as fleet_operator
from controlplane.maps import ProbeStatus
from controlplane.signals import quantiles

if TYPE_CHECKING:
    from controlplane.desired import Leaving
    from controlplane.edged import Steered

# A status walk stops counting conntrack here and reports it unknown. A full table of the
# default ct_size (262144) counts in about 0.9 s on a 2-core test VM; 3 s leaves a busy node room.
WALK_DEADLINE_S = 3.0
WALK_GRACE_S = 2.0  # past the deadline, a caller stops waiting for a walk that has not ended
# Walks of the maps for status and metrics run here, never on the loop: counting conntrack
# is O(ct_size) (seconds when full), the rest O(max_backends). One at a time.
_walker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edged-walk")


def _leave_until_s(gone: Leaving | None) -> int | None:
    """edge_be_probe's leave_until_s: None when not leaving, UNKNOWN when until its connections end."""
    if gone is None:
        return None
    return abi.UNKNOWN if gone.deadline_ns is None else gone.deadline_ns // 1_000_000_000


class Operations:
    """Status views and operator actions of a Daemon (mixed in)."""

    def node_state(self) -> announce.NodeState:
        """What announce.decide() judges: data path open, serving (the watch finds the data path
        whole, edged is not stopping), drain-node, usable backends (the data path takes new
        flows to them and probes do not say down)."""
        services = []
        for name, st in self.services.items():
            usable = 0
            if self.maps is not None:
                try:
                    usable = sum(ok and not (b in st.trackers and st.trackers[b].down)
                                 for b, ok in self.maps.usable(name).items())
                except EdgeError:
                    usable = 0
            services.append(announce.ServiceState(name, st.service.vip, usable))
        return announce.NodeState(attached=self.maps is not None, serving=not self._stopping.is_set(),
                                  drained=self.node_drained, services=tuple(services),
                                  problem=self.not_serving)

    async def drain_node(self, drained: bool = True) -> dict:
        """`edgectl drain-node`: withdraws every VIP from BGP (the data path keeps forwarding
        what still arrives); undrain announces them again. Returns the announcement. The drain
        is marked in the run dir first (deploy.set_node_drain), so a restarted edged keeps it."""
        if self.announcer is None:
            raise EdgeError("node.bgp: not configured; drain-node withdraws the VIPs' BGP routes")
        deploy.set_node_drain(self.instance, drained)
        self.node_drained = drained
        self.events.emit("drain-node", "node drained: withdrawing every VIP" if drained
                         else "node undrained: announcing the VIPs again", drained=drained)
        d = await self.announcer.sync()
        return {"announced": sorted(map(str, d.announce)),
                "withdrawn": {str(k): v for k, v in d.withdrawn.items()}}

    # ------------------------------------------------------------ operator actions (API)

    async def operate(self, kind: str, service: str, backend: str, weight: int | None = None,
                      local: bool = False) -> str:
        """An operator action from the API (kind drain, undrain, or weight: None clears the
        override). In a fleet it is recorded in etcd for every node (the leader's next snapshot
        applies it) unless local; else, and with local, it acts on this node (drain(),
        undrain(), set_override()). Returns the scope: "fleet" or "node"."""
        if kind not in ("drain", "undrain", "weight"):
            raise ValueError(f"operator action: {kind!r} is not drain, undrain or weight")
        fleet = getattr(self, "fleet", None)
        if fleet is None or local:
            if kind == "drain":
                self.drain(service, backend)
            elif kind == "undrain":
                self.undrain(service, backend)
            else:
                self.set_override(service, backend, weight)
            return "node"
        removing = kind == "undrain" or (kind == "weight" and weight is None)
        try:
            self._find(service, backend)
            unknown = None
        except LookupError as e:  # a mark for a backend this node lacks may still be removed
            if not removing:
                raise
            unknown = e
        if weight is not None and not 0 <= int(weight) <= 65535:
            raise ValueError(f"weight: {weight} is out of range 0..65535")
        try:
            before, after = await fleet.operate(service, backend, kind, weight)
        except ConnectionError as e:
            raise EdgeError(f"fleet: {e}; nothing recorded (--local acts on this node only)") from None
        if unknown is not None and before is None:
            raise unknown
        key = (service, backend)
        if kind == "undrain" and not (before or {}).get("drain") and key in self.drained:
            raise EdgeError(f"{service}/{backend} is drained on this node only: edgectl undrain --local")
        if kind == "weight" and weight is None and (before or {}).get("weight") is None and key in self.overrides:
            raise EdgeError(f"{service}/{backend}'s weight is pinned on this node only: "
                            f"edgectl weight --clear --local")
        text = {"drain": "drained", "undrain": "undrained"}.get(kind) or (
            "weight override cleared" if weight is None else f"weight overridden to {int(weight)}")
        self.events.emit(kind if kind != "weight" else "override",
                         f"{service}/{backend}: {text} fleet-wide (in etcd; the leader's next snapshot "
                         f"applies it on every node)", service=service, backend=backend, scope="fleet",
                         mark=after, **({"weight": weight} if kind == "weight" else {}))
        return "fleet"

    def local_marks(self) -> dict[str, dict[str, str]]:
        """What an operator set on this node only, for the fleet report: service -> backend ->
        'drained' / 'weight 7'."""
        out: dict[str, dict[str, str]] = {}
        for (service, backend) in sorted(set(self.drained) | set(self.overrides)):
            mark = {"drain": (service, backend) in self.drained, "weight": self.overrides.get((service, backend))}
            out.setdefault(service, {})[backend] = fleet_operator.describe(mark)
        return out

    def _find(self, service: str, backend: str) -> Steered:
        st = self.services.get(service)
        if st is None:
            raise LookupError(f"no service {service!r}")
        if backend not in st.trackers:
            raise LookupError(f"service {service!r} has no backend {backend!r}")
        return st

    def drain(self, service: str, backend: str) -> None:
        """Weight 0 for backend until undrained: no new flows, its connections stay."""
        self._operator(service, backend, "drain", "drained by the operator",
                       lambda: self.drained.add((service, backend)))

    def undrain(self, service: str, backend: str) -> None:
        self._operator(service, backend, "undrain", "undrained by the operator",
                       lambda: self.drained.discard((service, backend)))

    def set_override(self, service: str, backend: str, weight: int | None) -> None:
        """A fixed weight for backend, beating the policy; None gives it back to the policy."""
        if weight is None:
            self._operator(service, backend, "override", "weight override cleared",
                           lambda: self.overrides.pop((service, backend), None), weight=None)
            return
        if not 0 <= int(weight) <= 65535:
            raise ValueError(f"weight: {weight} is out of range 0..65535")
        self._operator(service, backend, "override", f"weight overridden to {int(weight)}",
                       lambda: self.overrides.__setitem__((service, backend), int(weight)), weight=int(weight))

    def _operator(self, service: str, backend: str, kind: str, text: str, change: Callable[[], object],
                  **fields) -> None:
        """One operator action: change edged's marks and apply them at once; when the maps
        refuse, the marks are as before (the caller gets the error, the loops retry nothing)."""
        st = self._find(service, backend)
        before = set(self.drained), dict(self.overrides)
        change()
        try:
            self.step(st, time.monotonic_ns())
        except EdgeError:
            self.drained, self.overrides = before
            raise
        fleet = getattr(self, "fleet", None)
        if fleet is not None:  # the report says this node's table differs from the fleet's
            fleet.report_now()
        self.events.emit(kind, f"{service}/{backend}: {text}" + (" on this node only" if fleet is not None else ""),
                         service=service, backend=backend, scope="node", **fields)
        self._write_status(time.monotonic_ns())

    async def snapshot(self, count_conntrack: bool = False) -> dict:
        """This instance as `edgectl status --json` shows it, plus edged's view per backend.
        The maps are walked on a worker thread within WALK_DEADLINE_S: a conntrack count cut
        by the deadline is None (conntrack_partial: entries counted before it)."""
        if self.maps is None:
            raise EdgeError("edged has no data path open (starting or stopping)")
        deadline_ns = time.monotonic_ns() + int(WALK_DEADLINE_S * 1e9)
        walk = asyncio.wrap_future(_walker.submit(deploy.describe, self.maps, self.instance, self.pin_path,
                                                  count_conntrack, deadline_ns))
        self._walks.add(walk)
        walk.add_done_callback(self._walks.discard)
        try:
            snap = await asyncio.wait_for(asyncio.shield(walk), WALK_DEADLINE_S + WALK_GRACE_S)
        except asyncio.TimeoutError:
            raise EdgeError(f"status: walking the maps took over {WALK_DEADLINE_S + WALK_GRACE_S:g}s; "
                            f"try again") from None
        now = time.monotonic_ns()
        discovered = self.discovery.view()
        if getattr(self, "fleet", None) is not None:  # node.fleet: this node's view of its fleet
            snap["fleet"] = self.fleet.view()
        announcer = getattr(self, "announcer", None)
        if announcer is not None and announcer.last is not None:  # node.bgp: what bird announces, and why not
            view = announcer.view()
            snap["bgp"] = {"announced": view["announced"], "withdrawn": view["withdrawn"],
                           "speaker_up": not announcer.problem, "speaker_restarts": announcer.restarts}
        for svc in snap["services"]:
            st = self.services.get(svc["name"])
            svc["pushes"] = st.pushes if st else 0
            if svc["name"] in discovered:
                svc["discovery"] = discovered[svc["name"]]
            for b in svc["backends"]:
                if st and b["name"] in st.trackers:
                    b["edged"] = self.backend_view(svc["name"], b["name"], now)
        return snap

    def backend_view(self, name: str, backend: str, now_ns: int, full: bool = True) -> dict:
        """What edged knows of one backend: window, smoothing, load, state. full=False leaves
        out what the edge_be_probe record does not hold (rtt_window, config_weight, wire)."""
        st = self.services[name]
        health = st.service.health
        view = weights.describe(st.trackers[backend], now_ns, health.metrics if health else None)
        window = self.prober.window((name, backend))  # the one window of recent probes
        rtts = window.rtts() if window else []
        p50, p99 = quantiles(rtts, 0.50, 0.99)  # as window.p50() and p99(), from one sorted copy
        ok, failed = self.observer.probes(name, backend)
        probe = health.probe if health else None
        relaxed = self.prober.relaxed((name, backend)) if probe is not None else None  # adaptive probing
        view.update({
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
            "drained": (name, backend) in self.drained,
            "override": self.overrides.get((name, backend)),
            "leaving": (name, backend) in self.leaving,
            "probe_relaxed": relaxed,
            "probe_interval_s": None if probe is None else
            (max(probe.relaxed_ms, probe.interval_ms) if relaxed else probe.interval_ms) / 1000,
        })
        if full:
            view["wire"] = wire.summary(st.wire_signals.get(backend))  # over weights.wire.window_ms
        fleet = getattr(self, "fleet", None)
        mark = (fleet.marks.get(name) or {}).get(backend) if fleet is not None and name in fleet.shared else None
        if mark is not None:  # fleet-wide, from the applied snapshot
            view["fleet_drained"], view["fleet_override"] = bool(mark.get("drain")), mark.get("weight")
        if view["leaving"]:
            view["state"], view["reason"] = "leaving", "removed by reload; draining its connections"
        elif view["drained"]:
            view["state"], view["reason"] = "drained", "drained by the operator" + (
                " on this node only (the fleet's table differs)" if fleet is not None else "")
        elif view.get("fleet_drained"):
            view["state"], view["reason"] = "drained", "drained fleet-wide by the operator"
        return view

    def _write_status(self, now_ns: int) -> None:
        for name, st in self.services.items():
            _, bids = self.maps.ids(name)
            for b in st.service.backends:
                v = self.backend_view(name, b.name, now_ns, full=False)
                gone = self.leaving.get((name, b.name))
                self.maps.write_status(bids[b.name], ProbeStatus(
                    updated_ns=now_ns, config_weight=b.weight,
                    rtt_p50_s=v["rtt_p50_s"], rtt_p99_s=v["rtt_p99_s"], rtt_smoothed_s=v.get("rtt_smoothed_s"),
                    waiting=v.get("waiting"), running=v.get("running"), kv_usage=v.get("kv_usage"),
                    probes_ok=v["probes_ok"], probes_failed=v["probes_failed"],
                    state=v["state"], reason=v["reason"], drained=v["drained"], override=v["override"],
                    leave_until_s=_leave_until_s(gone),
                ))
