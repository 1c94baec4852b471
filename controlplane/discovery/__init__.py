"""Service discovery: backends found in DNS or etcd at run time, cached into the maps.

What a source says is an Answer (a tuple of config.Backend, named after their
endpoint) or a Failure; sources (dns.py, etcd.py) share the Source interface
below and know nothing of edged or the maps. cache.py (pure) keeps the last
known good set per service and builds the effective config (static backends
plus discovered ones); supervisor.py runs the sources on edged's loop and
hands every accepted change to edged's reload/apply path.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Awaitable, Callable, Optional, Protocol, Union

from controlplane.config import Backend


@dataclass(frozen=True)
class Answer:
    """A source's complete current set; ttl_s is how long it may be trusted (None: until told)."""

    backends: tuple[Backend, ...]
    ttl_s: Optional[float] = None


@dataclass(frozen=True)
class Failure:
    """The source could not say: down, timed out, or answered garbage (why says which, one line)."""

    why: str


Result = Union[Answer, Failure]
Report = Callable[[Result], Awaitable[None]]


class Source(Protocol):
    """One discovery source of one service."""

    kind: str  # "dns" or "etcd": the source label of metrics and events
    watched: bool  # True: the source pushes changes (its data is current while it is up)

    async def run(self, report: Report) -> None:
        """Reports every answer and failure until cancelled; never raises on a source fault."""


NAME_MAX = 31  # config's backend names (the maps keep 31 bytes and a NUL)


def endpoint_name(address: IPv4Address | IPv6Address | str, port: int) -> str:
    """A discovered backend's name: its endpoint, so a moved backend is a new one (drain, then slow start).
    IPv4: '198.18.1.2-8000'. IPv6 (names have no ':'): the compressed address with '.' for ':', as
    '2001.2.0.1..2-8000'; one longer than a name may be is 'v6.' and 20 hex digits of the endpoint's
    SHA-256, as 'v6.1f0c...-8000'."""
    try:
        address = ipaddress.ip_address(address) if isinstance(address, (str, IPv6Address)) else address
    except ValueError:
        return f"{address}-{port}"  # not an address: the config check that follows names it
    if not isinstance(address, IPv6Address):
        return f"{address}-{port}"
    name = f"{str(address).replace(':', '.')}-{port}"
    if len(name) <= NAME_MAX:
        return name
    return f"v6.{hashlib.sha256(f'[{address}]:{port}'.encode()).hexdigest()[:20]}-{port}"
