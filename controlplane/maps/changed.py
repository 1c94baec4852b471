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

from controlplane.config import Backend, Config, Service


def _fixed(b: Backend) -> Backend:
    """What of a backend the weights-only path may not change: all but weight and standby."""
    return replace(b, weight=0, standby=False)


def _same_shape(old: Service, new: Service) -> bool:
    if replace(old, backends=()) != replace(new, backends=()) or len(old.backends) != len(new.backends):
        return False
    return all(_fixed(a) == _fixed(b) for a, b in zip(old.backends, new.backends))


def changed_services(last: Optional[tuple[Config, Mapping[IPv4Address, int]]], cfg: Config,
                     oifs: Mapping[IPv4Address, int], dirty: AbstractSet[str]) -> Optional[list[Service]]:
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
