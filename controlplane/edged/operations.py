"""What an operator may do to edged: drains, weight overrides and drain-node, from the API.
Every change of this node goes through the maps at once (a step of steer.py) and is undone
if they refuse it; in a fleet, drains and overrides are recorded in etcd instead
(fleet/member.py), unless the operator asks for this node only. Owns State.drained,
State.overrides and State.node_drained; the status views are status.py's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from controlplane import deploy, limits
from controlplane.edged.state import State, Steered
from controlplane.edged.status import Status
from controlplane.edged.steer import Steering
from controlplane.errors import EdgeError
from controlplane.fleet import operator as fleet_operator

if TYPE_CHECKING:  # the fleet (aetcd, its etcd client) is imported only with node.fleet
    from controlplane.fleet import member as fleet_member


class Operations:
    """Operator actions on one edged: drain, undrain, weight overrides, drain-node."""

    def __init__(self, state: State, steering: Steering, status: Status):
        self.state = state
        self.steering = steering  # an action applies at once: one step of its service
        self.status = status  # and is in the status record at once

    async def drain_node(self, drained: bool = True) -> dict:
        """`edgectl drain-node`: withdraws every VIP from BGP (the data path keeps forwarding
        what still arrives); undrain announces them again. Returns the announcement. The drain
        is marked in the run dir first (deploy.set_node_drain), so a restarted edged keeps it."""
        state = self.state
        if state.announcer is None:
            raise EdgeError("node.bgp: not configured; drain-node withdraws the VIPs' BGP routes")
        deploy.set_node_drain(state.instance, drained)
        state.node_drained = drained
        state.events.emit(
            "drain-node",
            "node drained: withdrawing every VIP" if drained else "node undrained: announcing the VIPs again",
            drained=drained,
        )
        d = await state.announcer.sync()
        return {"announced": sorted(map(str, d.announce)), "withdrawn": {str(k): v for k, v in d.withdrawn.items()}}

    # ------------------------------------------------------------ operator actions (API)

    async def operate(
        self, kind: str, service: str, backend: str, weight: int | None = None, local: bool = False
    ) -> str:
        """An operator action from the API (kind drain, undrain, or weight: None clears the
        override). In a fleet it is recorded in etcd for every node (the leader's next snapshot
        applies it) unless local; else, and with local, it acts on this node (drain(),
        undrain(), set_override()). Returns the scope: "fleet" or "node"."""
        if kind not in ("drain", "undrain", "weight"):
            raise ValueError(f"operator action: {kind!r} is not drain, undrain or weight")
        fleet = self.state.fleet
        if fleet is not None and not local:
            await self._in_fleet(fleet, kind, service, backend, weight)
            return "fleet"
        await self.state.maps_idle.wait()  # an apply writing the maps on a worker thread comes first
        if kind == "drain":
            self.drain(service, backend)
        elif kind == "undrain":
            self.undrain(service, backend)
        else:
            self.set_override(service, backend, weight)
        return "node"

    async def _in_fleet(
        self, fleet: fleet_member.Member, kind: str, service: str, backend: str, weight: int | None
    ) -> None:
        """operate() in a fleet: the mark recorded in etcd (fleet.operate), or why not."""
        removing = kind == "undrain" or (kind == "weight" and weight is None)
        try:
            self._find(service, backend)
            unknown = None
        except LookupError as e:  # a mark for a backend this node lacks may still be removed
            if not removing:
                raise
            unknown = e
        if weight is not None and not limits.is_weight(int(weight)):
            raise ValueError(f"weight: {weight} is out of range {limits.WEIGHTS}")
        try:
            before, after = await fleet.operate(service, backend, kind, weight)
        except ConnectionError as e:
            raise EdgeError(f"fleet: {e}; nothing recorded (--local acts on this node only)") from None
        if unknown is not None and before is None:
            raise unknown
        self._refuse_local_only(kind, service, backend, weight, before or {})
        text = {"drain": "drained", "undrain": "undrained"}.get(kind) or (
            "weight override cleared" if weight is None else f"weight overridden to {int(weight)}"
        )
        self.state.events.emit(
            kind if kind != "weight" else "override",
            f"{service}/{backend}: {text} fleet-wide (in etcd; the leader's next snapshot applies it on every node)",
            service=service,
            backend=backend,
            scope="fleet",
            mark=after,
            **({"weight": weight} if kind == "weight" else {}),
        )

    def _refuse_local_only(self, kind: str, service: str, backend: str, weight: int | None, before: dict) -> None:
        """An undrain or a cleared weight that found no fleet-wide mark (before) to remove, for a
        mark set on this node only: EdgeError naming the --local command that removes it."""
        key = (service, backend)
        if kind == "undrain" and not before.get("drain") and key in self.state.drained:
            raise EdgeError(f"{service}/{backend} is drained on this node only: edgectl undrain --local")
        if kind == "weight" and weight is None and before.get("weight") is None and key in self.state.overrides:
            raise EdgeError(f"{service}/{backend}'s weight is pinned on this node only: edgectl weight --clear --local")

    def local_marks(self) -> dict[str, dict[str, str]]:
        """What an operator set on this node only, for the fleet report: service -> backend ->
        'drained' / 'weight 7'."""
        drained, overrides = self.state.drained, self.state.overrides
        out: dict[str, dict[str, str]] = {}
        for service, backend in sorted(set(drained) | set(overrides)):
            mark = {"drain": (service, backend) in drained, "weight": overrides.get((service, backend))}
            out.setdefault(service, {})[backend] = fleet_operator.describe(mark)
        return out

    def _find(self, service: str, backend: str) -> Steered:
        st = self.state.services.get(service)
        if st is None:
            raise LookupError(f"no service {service!r}")
        if backend not in st.trackers:
            raise LookupError(f"service {service!r} has no backend {backend!r}")
        return st

    def drain(self, service: str, backend: str) -> None:
        """Weight 0 for backend until undrained: no new flows, its connections stay."""
        self._operator(
            service, backend, "drain", "drained by the operator", lambda: self.state.drained.add((service, backend))
        )

    def undrain(self, service: str, backend: str) -> None:
        self._operator(
            service,
            backend,
            "undrain",
            "undrained by the operator",
            lambda: self.state.drained.discard((service, backend)),
        )

    def set_override(self, service: str, backend: str, weight: int | None) -> None:
        """A fixed weight for backend, beating the policy; None gives it back to the policy."""
        if weight is None:
            self._operator(
                service,
                backend,
                "override",
                "weight override cleared",
                lambda: self.state.overrides.pop((service, backend), None),
                weight=None,
            )
            return
        if not limits.is_weight(int(weight)):
            raise ValueError(f"weight: {weight} is out of range {limits.WEIGHTS}")
        self._operator(
            service,
            backend,
            "override",
            f"weight overridden to {int(weight)}",
            lambda: self.state.overrides.__setitem__((service, backend), int(weight)),
            weight=int(weight),
        )

    def _operator(
        self, service: str, backend: str, kind: str, text: str, change: Callable[[], object], **fields
    ) -> None:
        """One operator action: change edged's marks and apply them at once; when the maps
        refuse, the marks are as before (the caller gets the error, the loops retry nothing)."""
        state = self.state
        st = self._find(service, backend)
        before = set(state.drained), dict(state.overrides)
        change()
        try:
            self.steering.step(st, time.monotonic_ns())
        except EdgeError:
            state.drained, state.overrides = before
            raise
        fleet = state.fleet
        if fleet is not None:  # the report says this node's table differs from the fleet's
            fleet.report_now()
        state.events.emit(
            kind,
            f"{service}/{backend}: {text}" + (" on this node only" if fleet is not None else ""),
            service=service,
            backend=backend,
            scope="node",
            **fields,
        )
        self.status.write_service(service, time.monotonic_ns())  # its marks, at once; no other service changed
