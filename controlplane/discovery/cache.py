"""Last known good: what each service's discovery source last said that was usable, and the
effective config (static backends plus discovered ones) edged programs.

Pure: no network, no maps, no clock of its own (callers pass now_s). A source that is
down, times out, answers garbage, or answers empty (unless allow_empty) keeps the last
known good set; each failure is counted. An answer is good only if the config it makes
is valid (names, endpoints, sizes), so a bad answer can never reach the maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Optional

from controlplane import abi
from controlplane.config import Backend, Config, Service
from controlplane.discovery import Answer, Failure, Result, endpoint_name
from controlplane.discovery.tokens import derive_token
from controlplane.errors import ConfigError


@dataclass
class Cached:
    """One service's discovered set and how its source is doing."""

    service: str
    source: str  # dns or etcd
    watched: bool
    allow_empty: bool = False
    secret: Optional[bytes] = None
    backends: Optional[tuple[Backend, ...]] = None  # last known good, as the source said it; None: none yet
    good_at_s: Optional[float] = None  # when the source last confirmed it
    failures: int = 0  # every failed answer since edged started
    error: Optional[str] = None  # why the last answer failed; None while the source is fine
    changes: int = 0
    ttl_s: Optional[float] = None

    def state(self) -> str:
        if self.error is None:
            return "ok" if self.backends is not None else "waiting"
        return "failed" if self.backends is None else "stale"

    def age_s(self, now_s: float) -> Optional[float]:
        """Age of the data: 0 while a watched source is up; else since the source last confirmed it."""
        if self.good_at_s is None:
            return None
        if self.watched and self.error is None:
            return 0.0
        return max(0.0, now_s - self.good_at_s)

    def view(self, now_s: float) -> dict:
        age = self.age_s(now_s)
        return {
            "source": self.source,
            "state": self.state(),
            "age_s": age,
            "failures": self.failures,
            "backends": len(self.backends or ()),
            "changes": self.changes,
            "error": self.error or "",
        }


@dataclass(frozen=True)
class Verdict:
    """What one result did: changed (apply the new set), a transition worth an event, or nothing."""

    changed: bool = False
    failed: bool = False
    event: Optional[tuple[str, str]] = None  # (kind, text)
    previous: Optional[tuple[Backend, ...]] = field(default=None, compare=False)


NOT_BACKENDS = (
    (IPv4Network("169.254.0.0/16"), "link-local"),
    (IPv4Network("100.64.0.0/10"), "in 100.64.0.0/10 (shared address space)"),
    (IPv4Network("0.0.0.0/8"), "in 0.0.0.0/8"),
    (IPv4Network("255.255.255.255/32"), "broadcast"),
    # IPv6 (config refuses most of these in any backend already; kept here so that a source's answer
    # is screened the same whatever config allows). Unique-local fc00::/7 is allowed: it is IPv6's
    # private range, where backends live as they do in 10/8 for IPv4.
    (IPv6Network("fe80::/10"), "link-local"),
    (IPv6Network("::1/128"), "loopback"),
    (IPv6Network("::/128"), "the unspecified address"),
    (IPv6Network("::ffff:0:0/96"), "an IPv4-mapped address"),
    (IPv6Network("fec0::/10"), "site-local (deprecated)"),
    (IPv6Network("ff00::/8"), "multicast"),
)


def by_endpoint(b: Backend) -> tuple:
    """A sort key of backends by endpoint, of both families (addresses of two versions do not
    compare: IPv4 first)."""
    return (b.address.version, b.address, b.port)


def not_a_backend(address: IPv4Address | IPv6Address, vips) -> Optional[str]:
    """Why a discovered address may not be a backend (a source must not point the data path at
    the router itself, a VIP or a special range), or None. The router's own addresses are
    checked beside this, against its routes (Supervisor's is_local)."""
    if address in vips:
        return f"{address} is a VIP"
    return next((f"{address} is {what}" for net, what in NOT_BACKENDS if address in net), None)


def screen(backends, vips) -> Optional[str]:
    """The first discovered backend whose address not_a_backend refuses, as 'NAME: why'."""
    return next((f"{b.name}: {why}" for b in backends if (why := not_a_backend(b.address, vips))), None)


def with_tokens(c: Cached, backends: tuple[Backend, ...]) -> tuple[Backend, ...]:
    """Backends without a token get the one derived from the service secret."""
    if c.secret is None:
        return backends
    return tuple(
        b if b.token is not None else replace(b, token=derive_token(c.secret, b.address, b.port)) for b in backends
    )


def merge(cfg: Config, found: dict[str, tuple[Backend, ...]]) -> Config:
    """cfg with each service's discovered backends after its static ones. A discovered endpoint
    that a static backend of the same service already has is left out (the static one wins).
    Raises ConfigError (naming the service) when the result is not a valid config."""
    services = []
    for i, s in enumerate(cfg.services):
        extra = found.get(s.name) if s.discovery else None
        if extra:
            static = {(b.address, b.port) for b in s.backends}
            s = replace(s, backends=s.backends + tuple(b for b in extra if (b.address, b.port) not in static))
            s._validate(f"services[{i}] ({s.name}, with discovered backends)")
        services.append(s)
    out = replace(cfg, services=tuple(services))
    out._validate("")
    return out


def offer(c: Cached, result: Result, now_s: float, fits=None) -> Verdict:
    """Takes one result of c's source. fits(backends) raises ConfigError when the set cannot be
    programmed (merge with the static config fails); such an answer counts as a failure.
    Backends are kept as the source said them; tokens are derived when they are used (found())."""
    why = None
    backends: tuple[Backend, ...] = ()
    if isinstance(result, Failure):
        why = result.why
    elif isinstance(result, Answer):
        backends = tuple(sorted(result.backends, key=by_endpoint))
        if not backends and not c.allow_empty:
            why = "empty answer (allow_empty is false)"
        elif fits is not None:
            try:
                fits(backends)
            except ConfigError as e:
                why = f"answer rejected: {e}"
    else:
        why = f"not an answer: {result!r}"
    if why is not None:
        c.failures += 1
        first = c.error is None or c.error != why
        c.error = why
        kept = (
            f"keeping the last known good set ({len(c.backends)} backends)"
            if c.backends is not None
            else "no backends discovered yet"
        )
        event = ("discovery-failed", f"{c.service}: {c.source} discovery failed: {why}; {kept}") if first else None
        return Verdict(failed=True, event=event)
    recovered = c.error is not None
    c.error, c.good_at_s, c.ttl_s = None, now_s, result.ttl_s
    if backends == c.backends:
        event = (
            (
                "discovery-recovered",
                f"{c.service}: {c.source} discovery answers again; {len(backends)} backends, unchanged",
            )
            if recovered
            else None
        )
        return Verdict(event=event)
    previous, c.backends = c.backends, backends
    c.changes += 1
    return Verdict(changed=True, previous=previous)


def adoptable(s: Service, deployed: list[tuple[Backend, int]], secret: Optional[bytes] = None) -> tuple[Backend, ...]:
    """The discovered backends of service s among those the pinned maps hold (deployed:
    (Backend, edge_be_probe flags), maps.deployed_backends): what a restarted edged takes for
    the last known good set while the source has not answered. Left out: static backends,
    those draining out after a removal (edged keeps those itself), and any not named after
    its endpoint (never discovered). The table's weight stands for the configured one, except
    where it is not the configuration's: a weight the operator forces (drain, override) or a
    computed policy's 0 comes back as 1, the default, and the operator's mark and the policy
    still decide over it. A token that is the one derived from secret is left to derivation."""
    static = {b.name for b in s.backends}
    out = []
    for b, flags in deployed:
        if b.name in static or flags & abi.PROBE_F_LEAVING or b.name != endpoint_name(b.address, b.port):
            continue
        forced = flags & (abi.PROBE_F_DRAINED | abi.PROBE_F_OVERRIDE)
        if forced or (b.weight == 0 and s.weights.policy != "static"):
            b = replace(b, weight=1)
        if secret is not None and b.token == derive_token(secret, b.address, b.port):
            b = replace(b, token=None)
        out.append(b)
    return tuple(sorted(out, key=by_endpoint))


def describe_change(previous: Optional[tuple[Backend, ...]], now: tuple[Backend, ...]) -> str:
    """'+a, +b, -c' by endpoint name, or 'weights' when only attributes changed."""
    before = {b.name: b for b in previous or ()}
    after = {b.name: b for b in now}
    parts = [f"+{n}" for n in after if n not in before] + [f"-{n}" for n in before if n not in after]
    parts += [f"~{n}" for n in after if n in before and after[n] != before[n]]
    return ", ".join(parts) or "no change"
