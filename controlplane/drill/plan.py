"""The drill's plan: what one drill does (Plan), its limits, and the checks that hold it against the
config before anything is built; also the config and topology the drill's testbed deploys.
Pure: no privileges, no testbed built here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from controlplane.config import Config, Service
from controlplane.errors import EdgeError

if TYPE_CHECKING:
    from controlplane.lab.topo import Net

MODES = ("heartbeat", "link", "kill")
DEFAULT_RATE = 2000
DEFAULT_DURATION_S = 2.0
MAX_FLOWS = 50_000
FIRST_SPORT = 10_000  # flow k uses client source port FIRST_SPORT + k
MAX_RATE = 50_000
SILENCE_AT = 1 / 3  # of the duration
GRACE_S = 0.3  # capture goes on this long after the last flow was sent
LEAD_S = 0.05  # the first flow leaves this long after the capture said it is ready
UP_TIMEOUT_S = 60.0  # every backend "up" in edgectl status (each status compiles the data path)
RT_PRIORITY = 10  # SCHED_FIFO priority of the heartbeat agents' and the sender's sending threads


class DrillError(EdgeError):
    """The drill cannot run (bad arguments, a missing tool) or its testbed failed."""


@dataclass(frozen=True)
class Plan:
    """What one drill does; check_plan() holds it against the config before anything is built."""

    backend: str
    mode: str
    rate: int = DEFAULT_RATE
    duration_s: float = DEFAULT_DURATION_S
    service: str | None = None  # default: the config's first

    @property
    def n_flows(self) -> int:
        return max(1, round(self.rate * self.duration_s))


def pick_service(cfg: Config, name: str | None) -> Service:
    if name is None:
        return cfg.services[0]
    for s in cfg.services:
        if s.name == name:
            return s
    raise DrillError(f"--service: no service {name!r} in the config (have: {', '.join(s.name for s in cfg.services)})")


def check_plan(cfg: Config, plan: Plan) -> tuple[Service, int]:
    """The service and the index of the backend to silence; DrillError naming what does not fit."""
    if plan.mode not in MODES:
        raise DrillError(f"--mode: {plan.mode!r} is not one of {', '.join(MODES)}")
    if not 1 <= plan.rate <= MAX_RATE:
        raise DrillError(f"--rate: {plan.rate} is not in 1..{MAX_RATE} flows/s")
    if not 0.1 <= plan.duration_s <= 60:
        raise DrillError(f"--duration: {plan.duration_s} is not in 0.1..60 s")
    if plan.n_flows > MAX_FLOWS:
        raise DrillError(f"--rate x --duration: {plan.n_flows} flows; at most {MAX_FLOWS} (one source port each)")
    svc = pick_service(cfg, plan.service)
    names = [b.name for b in svc.backends]
    if plan.backend not in names:
        raise DrillError(f"--backend: no backend {plan.backend!r} in service {svc.name} (have: {', '.join(names)})")
    dead = names.index(plan.backend)
    b = svc.backends[dead]
    if b.standby or b.weight == 0:
        raise DrillError(
            f"--backend: {b.name} is {'standby' if b.standby else 'draining (weight 0)'}: "
            f"it gets no new flows, so there is nothing to fail over"
        )
    if not any(i != dead and (x.standby or x.weight > 0) for i, x in enumerate(svc.backends)):
        raise DrillError(f"service {svc.name}: no other backend takes new flows, so there is nowhere to fail over to")
    hb = svc.health.heartbeat if svc.health else None
    if plan.mode == "heartbeat" and hb is None:
        raise DrillError(
            f"--mode heartbeat: service {svc.name} has no health.heartbeat section, so there are no heartbeats to stop"
        )
    return svc, dead


def testbed_document(cfg: Config, svc: Service, net: "Net") -> dict:
    """The config deployed in the testbed: svc with the testbed's addresses.

    The service keeps its name, port, protocol, existing_flows, health and weights, and its backends
    their names, weights, standby, tokens and order; the addresses are the testbed's (the config's
    VIP if it fits the testbed's plan, else 198.18.255.1; backend i at 198.18.{i+1}.2), every backend
    serves on the first backend's port (each has a namespace of its own), and of the node section
    only the table sizes and xdp_mode are kept.
    """
    port = svc.backends[0].port
    backends = []
    for i, b in enumerate(svc.backends):
        entry: dict = {"name": b.name, "address": str(net.backend_addr(i)), "port": port, "weight": b.weight}
        if b.standby:
            entry["standby"] = True
        if b.token is not None:
            entry["token"] = hex(b.token)
        backends.append(entry)
    service: dict = {
        "name": svc.name,
        "vip": str(net.vip),
        "port": svc.port,
        "protocol": svc.protocol,
        "existing_flows": svc.existing_flows,
    }
    if svc.health is not None:
        service["health"] = _without_nones(asdict(svc.health))
    service["weights"] = asdict(svc.weights)
    service["backends"] = backends
    node = {k: getattr(cfg.node, k) for k in ("maglev_m", "max_services", "max_backends", "ct_size", "xdp_mode")}
    return {"version": 1, "node": node, "services": [service]}


def _without_nones(section: dict) -> dict:
    """section with its unset (None) values left out, at every depth: the config's schema
    takes an absent key for its default, but no null."""
    return {k: _without_nones(v) if isinstance(v, dict) else v for k, v in section.items() if v is not None}


def testbed_topo(svc: Service):
    """A Topo with one backend namespace per backend, and the service's VIP when the plan allows it."""
    from controlplane.lab.topo import Topo

    try:
        return Topo(backends=len(svc.backends), vip=svc.vip)
    except ValueError:
        return Topo(backends=len(svc.backends))
