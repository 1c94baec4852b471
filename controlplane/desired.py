"""Pure planning of membership changes: which ids a config's services and backends
get in the maps (plan), and, for edged, what a reload removed that must drain out
(leaving_after, with_leaving and fit, retire). No bcc, no kernel, no byte order: maps.py
reads the deployed ids into a Deployed and writes what a Plan says.

Identity. A service keeps its VIP id while its name stays, or, renamed, while its
VIP (address, port, protocol) stays. A backend keeps its id while its service does
and its name stays, or, renamed, while its endpoint (address, port) stays in that
service. Kept ids keep conntrack entries pointing at the right backend. A new
service or backend takes an id nothing held before this change; only when none is
left does it take one this change frees (Plan.recycled), and maps.apply then
removes before it adds."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv6Address
from typing import Mapping, Optional

from controlplane.abi import MAX_PER_SERVICE
from controlplane.config import Backend, Config, Service
from controlplane.errors import MapError

VipKey = tuple[IPv4Address | IPv6Address, int, str]  # address, port, protocol
Endpoint = tuple[IPv4Address | IPv6Address, int]


def endpoint_order(ep: Endpoint) -> tuple:
    """A sort key for endpoints of both families (addresses of two versions do not compare)."""
    return (ep[0].version, ep[0], ep[1])


@dataclass(frozen=True)
class Deployed:
    """The ids the maps hold now (maps.py reads them)."""

    services: Mapping[str, tuple[int, Optional[VipKey]]] = field(default_factory=dict)  # name -> (vid, VIP)
    backends: Mapping[tuple[int, str], tuple[int, Endpoint]] = field(default_factory=dict)  # (vid, name) -> (bid, ep)
    health: Mapping[Endpoint, int] = field(default_factory=dict)  # endpoint -> health id


@dataclass
class Plan:
    """The ids of every service and backend of a config, and what changes."""

    svc_ids: dict[str, int]
    be_ids: dict[tuple[str, str], int]  # (service, backend) -> backend id
    health_ids: dict[Endpoint, int]
    new_services: list[str]  # names whose VIP id is new (stats start at 0)
    new_backends: list[tuple[str, str]]  # whose backend id is new
    moved_backends: list[int]  # kept ids whose endpoint changed (cached next hops are stale)
    new_health: list[int]
    removed_services: dict[str, int]  # deployed name -> VIP id, gone from the config
    removed_backends: dict[tuple[int, str], int]  # deployed (vid, name) -> backend id, gone
    renamed_services: dict[str, str]  # old name -> new name
    recycled: bool  # a new id is one this change frees: removals must be written first

    def ids(self, cfg: Config) -> dict[str, tuple[int, dict[str, int]]]:
        return {
            s.name: (self.svc_ids[s.name], {b.name: self.be_ids[(s.name, b.name)] for b in s.backends})
            for s in cfg.services
        }


class _Ids:
    """Allocates ids below limit: never-held ones first, then the ones this change frees."""

    def __init__(self, held: set[int], freed: set[int], limit: int, what: str):
        self.free = sorted(set(range(limit)) - held - freed)
        self.freed = sorted(freed)
        self.limit, self.what, self.recycled = limit, what, False

    def take(self, need: int) -> int:
        if self.free:
            return self.free.pop(0)
        if self.freed:
            self.recycled = True
            return self.freed.pop(0)
        raise MapError(
            f"{self.what}: {need} needed, the maps hold {self.limit} (node.max_{self.what}); nothing was changed"
        )


def plan(deployed: Deployed, cfg: Config, max_services: int, max_backends: int) -> Plan:
    """The ids cfg gets when applied over deployed; MapError (one line) if it cannot fit."""
    n_backends = _check_fits(cfg, max_services, max_backends)
    svc = _service_ids(deployed, cfg, max_services)
    be = _backend_ids(deployed, cfg, svc, max_backends, n_backends)
    health = _health_ids(deployed, cfg, max_backends)
    return Plan(
        svc.ids,
        be.ids,
        health.ids,
        svc.new,
        be.new,
        be.moved,
        health.new,
        svc.removed,
        be.removed,
        svc.renamed,
        recycled=svc.recycled or be.recycled or health.recycled,
    )


def _check_fits(cfg: Config, max_services: int, max_backends: int) -> int:
    """The number of cfg's backends; MapError if cfg has more services or backends than the maps hold."""
    if len(cfg.services) > max_services:
        raise MapError(
            f"services: {len(cfg.services)} needed, the maps hold {max_services} "
            f"(node.max_services); nothing was changed"
        )
    n_backends = sum(len(s.backends) for s in cfg.services)
    if n_backends > max_backends:
        raise MapError(
            f"backends: {n_backends} needed, the maps hold {max_backends} (node.max_backends); nothing was changed"
        )
    for s in cfg.services:
        if len(s.backends) > MAX_PER_SERVICE:
            raise MapError(f"{s.name}: {len(s.backends)} backends, at most {MAX_PER_SERVICE} in one service")
    return n_backends


@dataclass
class _Part:
    """One part of a Plan (services, backends or health entries): ids, what is new, removed, moved."""

    ids: dict
    new: list
    recycled: bool
    removed: dict = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    moved: list[int] = field(default_factory=list)


def _service_ids(deployed: Deployed, cfg: Config, max_services: int) -> _Part:
    """VIP ids: kept by name, then by VIP (a rename), then new ones."""
    names = {s.name for s in cfg.services}
    by_vip = {key: name for name, (_, key) in deployed.services.items() if key is not None}
    svc_ids: dict[str, int] = {}
    renamed: dict[str, str] = {}
    for s in cfg.services:
        if s.name in deployed.services:
            svc_ids[s.name] = deployed.services[s.name][0]
    for s in cfg.services:
        old = by_vip.get(s.key)
        if s.name not in svc_ids and old is not None and old not in names and old not in renamed:
            svc_ids[s.name] = deployed.services[old][0]
            renamed[old] = s.name
    kept_vids = set(svc_ids.values())
    removed = {n: vid for n, (vid, _) in deployed.services.items() if vid not in kept_vids}
    ids = _Ids(kept_vids, set(removed.values()), max_services, "services")
    new_services = []
    for s in cfg.services:
        if s.name not in svc_ids:
            svc_ids[s.name] = ids.take(len(cfg.services))
            new_services.append(s.name)
    return _Part(svc_ids, new_services, ids.recycled, removed, renamed)


def _kept_backend_ids(
    s: Service, old: Mapping[str, tuple[int, Endpoint]], be_ids: dict[tuple[str, str], int], moved: list[int]
) -> None:
    """Into be_ids, the ids service s's backends keep from old: by name, then by endpoint (a rename
    keeps the endpoint under a name the service no longer has). A kept id whose endpoint changed
    goes into moved."""
    wanted = {b.name for b in s.backends}
    for b in s.backends:
        if b.name in old:
            bid, ep = old[b.name]
            be_ids[(s.name, b.name)] = bid
            if ep != (b.address, b.port):
                moved.append(bid)
    taken = set()
    for b in s.backends:
        if (s.name, b.name) in be_ids:
            continue
        for name, (bid, ep) in sorted(old.items()):
            if name not in wanted and ep == (b.address, b.port) and bid not in taken:
                be_ids[(s.name, b.name)] = bid
                taken.add(bid)
                break


def _backend_ids(deployed: Deployed, cfg: Config, svc: _Part, max_backends: int, n_backends: int) -> _Part:
    """Backend ids: kept within a kept service (by name, then endpoint), then new ones."""
    by_vid: dict[int, dict[str, tuple[int, Endpoint]]] = {}
    for (vid, name), held in deployed.backends.items():
        by_vid.setdefault(vid, {})[name] = held
    be_ids: dict[tuple[str, str], int] = {}
    moved: list[int] = []
    for s in cfg.services:
        old = {} if s.name in svc.new else by_vid.get(svc.ids[s.name], {})
        _kept_backend_ids(s, old, be_ids, moved)
    kept_bids = set(be_ids.values())
    removed = {key: bid for key, (bid, _) in deployed.backends.items() if bid not in kept_bids}
    bids = _Ids(kept_bids, set(removed.values()), max_backends, "backends")
    new_backends = []
    for s in cfg.services:
        for b in s.backends:
            if (s.name, b.name) not in be_ids:
                be_ids[(s.name, b.name)] = bids.take(n_backends)
                new_backends.append((s.name, b.name))
    return _Part(be_ids, new_backends, bids.recycled, removed, moved=moved)


def _health_ids(deployed: Deployed, cfg: Config, max_backends: int) -> _Part:
    """Health ids, one per endpoint (address, port): kept while the endpoint stays, then new ones."""
    endpoints = sorted({(b.address, b.port) for s in cfg.services for b in s.backends}, key=endpoint_order)
    health_ids = {ep: deployed.health[ep] for ep in endpoints if ep in deployed.health}
    gone = {h for ep, h in deployed.health.items() if ep not in health_ids}
    hids = _Ids(set(health_ids.values()), gone, max_backends, "backends")
    new_health = []
    for ep in endpoints:
        if ep not in health_ids:
            health_ids[ep] = hids.take(len(endpoints))
            new_health.append(health_ids[ep])
    return _Part(health_ids, new_health, hids.recycled)


def kept_part(deployed: Deployed, cfg: Config, p: Plan) -> Config:
    """cfg without what plan p adds: applied first when p recycles ids, it frees them
    in the safe order (tables stop naming a backend before it goes)."""
    services = []
    for s in cfg.services:
        if s.name in p.new_services:
            continue
        backends = tuple(b for b in s.backends if (s.name, b.name) not in p.new_backends)
        if not any(not b.standby for b in backends):
            raise MapError(
                f"{s.name}: every primary backend is replaced while the maps are full "
                f"(node.max_backends); replace them in two steps or raise node.max_backends; "
                f"nothing was changed"
            )
        services.append(replace(s, backends=backends))
    return replace(cfg, services=tuple(services))


# ---------------------------------------------------------------- edged: what drains out


@dataclass
class Leaving:
    """A backend (or a whole service) a reload removed: it stays in the tables with
    weight 0, keeping its connections, until it is idle or its drain timeout passes
    (deadline_ns None: drain_timeout_ms 0, until its connections end)."""

    service: Service  # the service as it was, for backends of a removed service
    backend: Backend
    deadline_ns: Optional[int]
    packets: int = -1
    quiet_since_ns: int = 0
    whole_service: bool = False


def deadline(s: Service, now_ns: int) -> Optional[int]:
    return None if s.drain_timeout_ms == 0 else now_ns + s.drain_timeout_ms * 1_000_000


def renames(old: Config, new: Config) -> dict[str, str]:
    """Services of old that new has under another name on the same VIP: old -> new name."""
    new_names = {s.name for s in new.services}
    by_key = {s.key: s.name for s in new.services}
    out = {}
    for s in old.services:
        if s.name not in new_names and s.key in by_key and by_key[s.key] not in {x.name for x in old.services}:
            out[s.name] = by_key[s.key]
    return out


def leaving_after(
    old: Config, new: Config, leaving: Mapping[tuple[str, str], Leaving], now_ns: int
) -> dict[tuple[str, str], Leaving]:
    """What drains out after a reload from old to new: backends of old that new has not
    (by name, or by endpoint in the same service), plus what was draining already and
    is still not back. A service renamed on its VIP is the same service."""
    renamed = renames(old, new)
    new_by_name = {s.name: s for s in new.services}
    out: dict[tuple[str, str], Leaving] = {}
    for (sname, bname), gone in leaving.items():
        target = renamed.get(sname, sname)
        if target != sname:
            gone = replace(gone, service=new_by_name[target], whole_service=False)
        out[(target, bname)] = gone
    for s in old.services:
        target = renamed.get(s.name, s.name)
        kept = new_by_name.get(target)
        for b in s.backends:
            key = (target, b.name)
            if kept is not None and any(
                nb.name == b.name or (nb.address, nb.port) == (b.address, b.port) for nb in kept.backends
            ):
                out.pop(key, None)
                continue
            if key not in out:
                out[key] = Leaving(kept or s, b, deadline(s, now_ns), whole_service=kept is None)
    for key in list(out):  # back in the config under its name
        back = new_by_name.get(key[0])
        if back is not None and any(b.name == key[1] for b in back.backends):
            del out[key]
    return out


def fit(
    cfg: Config, leaving: Mapping[tuple[str, str], Leaving]
) -> tuple[Config, dict[tuple[str, str], Leaving], list[tuple[str, str]]]:
    """with_leaving within cfg's node sizes: (the config to apply, what of leaving stays,
    the keys that cannot)."""
    applied, dropped = with_leaving(cfg, leaving, cfg.node.max_services, cfg.node.max_backends)
    return applied, {k: v for k, v in leaving.items() if k not in dropped}, dropped


def with_leaving(
    cfg: Config, leaving: Mapping[tuple[str, str], Leaving], max_services: int, max_backends: int
) -> tuple[Config, list[tuple[str, str]]]:
    """cfg plus what drains out, each at weight 0, and the keys that cannot stay: their
    endpoint or VIP now belongs to a configured service (replies can name one VIP
    only), or the maps have no room left for them (the config comes first)."""
    services = {s.name: s for s in cfg.services}
    order = [s.name for s in cfg.services]
    endpoints = {(b.address, b.port, s.protocol) for s in cfg.services for b in s.backends}
    vips = {s.key for s in cfg.services}
    room = max_backends - sum(len(s.backends) for s in cfg.services)
    dropped = []
    for (sname, bname), gone in sorted(
        leaving.items(), key=lambda kv: (kv[1].deadline_ns is None, kv[1].deadline_ns or 0, kv[0])
    ):
        b = replace(gone.backend, weight=0, standby=False)
        s = services.get(sname) or gone.service
        ep = (b.address, b.port, s.protocol)
        fits = room > 0 and (sname in services or (s.key not in vips and len(services) < max_services))
        if ep in endpoints or (sname not in services and s.key in vips) or not fits:
            dropped.append((sname, bname))
            continue
        if sname in services:
            if any(x.name == b.name for x in s.backends) or len(s.backends) >= MAX_PER_SERVICE:
                dropped.append((sname, bname))
                continue
            services[sname] = replace(s, backends=s.backends + (b,))
        else:
            services[sname] = replace(gone.service, backends=(b,))
            order.append(sname)
            vips.add(s.key)
        endpoints.add(ep)
        room -= 1
    return replace(cfg, services=tuple(services[n] for n in order)), sorted(dropped)


def retire(
    leaving: Mapping[tuple[str, str], Leaving],
    packets: Mapping[tuple[str, str], Optional[int]],
    now_ns: int,
    idle_ns: int,
) -> list[tuple[tuple[str, str], str]]:
    """Which leaving backends are done, and why: gone from the maps, drain timeout passed,
    or no packet for idle_ns. packets: each key's packet count now (None: not deployed).
    Updates each Leaving's packet count and quiet time."""
    done = []
    for key, gone in leaving.items():
        n = packets.get(key)
        if n is None:
            done.append((key, "gone"))
            continue
        if n != gone.packets:
            gone.packets, gone.quiet_since_ns = n, now_ns
        if gone.deadline_ns is not None and now_ns >= gone.deadline_ns:
            done.append((key, "drain timeout"))
        elif now_ns - gone.quiet_since_ns >= idle_ns:
            done.append((key, "idle"))
    return done
