"""Pure: which services an apply must write when the config differs from the one the same
Maps applied last only in backends' weights or standby flags (the change edged makes most:
a reload that re-weights, a drain). Then no id, endpoint, VIP, name or heartbeat changes,
so maps.apply writes those services' backends, lists and Maglev tables only (writer.py,
_write_changed), instead of reading every map and rewriting every service. Anything else
(a service or backend added, removed, renamed or moved, another node section, other
heartbeat interfaces) returns None: the full apply."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address
from typing import AbstractSet, Mapping, Optional

from controlplane import desired
from controlplane.config import Backend, Config, Service
from controlplane.desired import Plan


def _fixed(b: Backend) -> Backend:
    """What of a backend the weights-only path may not change: all but weight and standby."""
    return replace(b, weight=0, standby=False)


def _same_shape(old: Service, new: Service) -> bool:
    if replace(old, backends=()) != replace(new, backends=()) or len(old.backends) != len(new.backends):
        return False
    return all(_fixed(a) == _fixed(b) for a, b in zip(old.backends, new.backends))


def changed_services(
    last: Optional[tuple[Config, Mapping[IPv4Address, int]]],
    cfg: Config,
    oifs: Mapping[IPv4Address, int],
    dirty: AbstractSet[str],
) -> Optional[list[Service]]:
    """The services of cfg to rewrite, when cfg differs from last (the config and heartbeat
    interfaces applied last) only in weights and standby flags; dirty: names of services
    whose tables were written since (set_weights), rewritten whatever their config. None:
    the change needs the full apply."""
    if last is None:
        return None
    old, old_oifs = last
    if dict(old_oifs) != dict(oifs) or replace(old, services=()) != replace(cfg, services=()):
        return None
    if [s.name for s in old.services] != [s.name for s in cfg.services]:
        return None
    out = []
    for a, b in zip(old.services, cfg.services):
        if a == b and b.name not in dirty:
            continue
        if not _same_shape(a, b):
            return None
        out.append(b)
    return out


def _kept_shape(old: Config, old_oifs: Mapping[IPv4Address, int], cfg: Config, oifs: Mapping[IPv4Address, int]) -> bool:
    return (
        dict(old_oifs) == dict(oifs)
        and replace(old, services=()) == replace(cfg, services=())
        and [s.name for s in old.services] == [s.name for s in cfg.services]
    )


def _members_changed(old: Config, cfg: Config, dirty: AbstractSet[str]) -> Optional[list[tuple[Service, Service]]]:
    """(old, new) of each service that changed, when only their backends did and none uses heartbeats."""
    out = []
    for a, b in zip(old.services, cfg.services):
        if a == b and b.name not in dirty:
            continue
        if replace(a, backends=()) != replace(b, backends=()) or (b.health and b.health.heartbeat):
            return None
        out.append((a, b))
    return out


class _Ids:
    """Ids below limit that nothing held before this change, lowest first; None when none is left."""

    def __init__(self, held, limit: int):
        self.held, self.limit, self.free = set(held), limit, None

    def take(self) -> Optional[int]:
        if self.free is None:
            self.free = sorted(set(range(self.limit)) - self.held, reverse=True)
        return self.free.pop() if self.free else None


def member_plan(
    last: Optional[tuple[Config, Mapping[IPv4Address, int]]],
    last_plan: Optional[Plan],
    cfg: Config,
    oifs: Mapping[IPv4Address, int],
    dirty: AbstractSet[str],
    max_backends: int,
) -> Optional[tuple[list[tuple[Service, Service]], Plan]]:
    """When cfg differs from last only in the backends of services without heartbeats (added,
    removed, re-weighted; none renamed, moved or recycled): (as applied last, as in cfg) of each
    service to rewrite, and the plan,
    from the one applied last without reading the maps. None: the full apply."""
    if last is None or last_plan is None or not _kept_shape(*last, cfg, oifs):
        return None
    pairs = _members_changed(last[0], cfg, dirty)
    if pairs is None:
        return None
    n_old = sum(len(s.backends) for s in last[0].services)
    added = sum(len({x.name for x in b.backends} - {x.name for x in a.backends}) for a, b in pairs)
    if n_old + added > max_backends:  # edge_rnat holds the old and the new meanwhile
        return None
    p = Plan(
        last_plan.svc_ids,
        dict(last_plan.be_ids),
        dict(last_plan.health_ids),
        [],
        [],
        [],
        [],
        {},
        {},
        {},
        recycled=False,
    )
    bids = _Ids(last_plan.be_ids.values(), max_backends)
    for a, b in pairs:
        if not _plan_service(a, b, p, bids):
            return None
    if not _plan_health(cfg, pairs, p, max_backends):
        return None
    return pairs, p


def _plan_service(a: Service, b: Service, p: Plan, bids: _Ids) -> bool:
    """Service b's backend ids into p (a: as applied last); False when the full plan is needed
    (a backend moved, renamed on its endpoint, or no id left that nothing held)."""
    old = {x.name: x for x in a.backends}
    names = {x.name for x in b.backends}
    gone = {(x.address, x.port) for x in a.backends if x.name not in names}
    for x in a.backends:
        if x.name not in names:
            p.removed_backends[(p.svc_ids[a.name], x.name)] = p.be_ids.pop((a.name, x.name))
    for x in b.backends:
        prev = old.get(x.name)
        if prev is not None:
            if (prev.address, prev.port) != (x.address, x.port):
                return False
            continue
        bid = bids.take()
        if bid is None or (x.address, x.port) in gone:
            return False
        p.be_ids[(b.name, x.name)] = bid
        p.new_backends.append((b.name, x.name))
    return True


def _plan_health(cfg: Config, pairs: list[tuple[Service, Service]], p: Plan, max_backends: int) -> bool:
    """Health ids of endpoints the changed services gained or lost (one per endpoint, all services)."""
    gained = {(x.address, x.port) for _, b in pairs for x in b.backends if (x.address, x.port) not in p.health_ids}
    lost = {(x.address, x.port) for a, _ in pairs for x in a.backends} - {
        (x.address, x.port) for _, b in pairs for x in b.backends
    }
    hids = _Ids(p.health_ids.values(), max_backends)  # an id freed here is not taken again in the same change
    for a, _ in pairs:  # an endpoint is in one service per protocol (config.py, desired.with_leaving)
        if lost:
            lost -= {(x.address, x.port) for s in cfg.services if s.protocol != a.protocol for x in s.backends}
    for ep in lost:
        p.health_ids.pop(ep, None)
    for ep in sorted(gained, key=desired.endpoint_order):
        hid = hids.take()
        if hid is None:
            return False
        p.health_ids[ep] = hid
        p.new_health.append(hid)
    return True
