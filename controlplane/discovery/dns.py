"""DNS discovery: SRV (target, port, weight) or A/AAAA records plus a port, re-resolved by TTL.

dnspython's asyncio resolver does the protocol; this module turns records into
backends and decides when to ask again: after the answer's smallest TTL,
clamped to min_ttl_ms..max_ttl_ms; after a failure, after retry_ms. SRV: the
lowest priority is primary, higher priorities are standby; weight 0 (RFC 2782:
"very small chance") becomes 1. SRV targets are resolved by the VIP's family: A for an
IPv4 VIP, AAAA for an IPv6 one (config checks that type A or AAAA is the VIP's). NXDOMAIN and no records are an empty answer;
SERVFAIL, timeouts and unusable records are failures. An answer of more records than
discovery.max_backends is refused before any target is resolved, and at most MAX_QUERIES
targets are resolved at once.
"""

from __future__ import annotations

import asyncio
from typing import Optional

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from controlplane.config import Backend, Discovery, Dns, parse_backend
from controlplane.discovery import Answer, Failure, Report, endpoint_name
from controlplane.errors import ConfigError
from controlplane.limits import WEIGHT_MAX

MAX_QUERIES = 16  # A/AAAA lookups of SRV targets in flight at once (each holds a socket; edged has 1,024 fds)


class DnsSource:
    kind = "dns"
    watched = False

    def __init__(self, d: Discovery, family: int = 4):
        """family: the VIP's IP version; SRV targets are looked up by its record type."""
        self.cfg: Dns = d.dns
        self.address_type = "AAAA" if family == 6 else "A"
        self.retry_s = d.retry_ms / 1000
        self.max_backends = d.max_backends
        self.resolver = dns.asyncresolver.Resolver(configure=not self.cfg.servers)
        if self.cfg.servers:
            self.resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in self.cfg.servers]
        self.resolver.timeout = self.resolver.lifetime = self.cfg.timeout_ms / 1000
        self.resolver.cache = None  # the TTL is ours to honour, and a restart must ask the server
        self.resolver.retry_servfail = False

    def next_in_s(self, ttl_s: Optional[float]) -> float:
        """When to ask again after a good answer whose smallest TTL was ttl_s."""
        lo, hi = self.cfg.min_ttl_ms / 1000, self.cfg.max_ttl_ms / 1000
        return hi if ttl_s is None else min(hi, max(lo, ttl_s))

    async def _query(self, name: str, rdtype: str):
        """The answer, or None for NXDOMAIN / no records of that type."""
        try:
            return await self.resolver.resolve(name, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return None

    def _cap(self, n: int, what: str) -> None:
        if n > self.max_backends:
            raise ConfigError(
                f"{what} of {n} records, more than discovery.max_backends "
                f"({self.max_backends}); over the cap, nothing in it used"
            )

    async def resolve(self) -> Answer:
        """One full resolution; raises dns.exception.DNSException or ConfigError (garbage)."""
        c = self.cfg
        if c.type == "SRV":
            return await self._resolve_srv()
        ans = await self._query(c.name, c.type)
        if ans is None:
            return Answer((), None)
        self._cap(len(ans), f"{c.type} answer")
        out = [_backend(str(r.address), c.port, 1, False, f"{c.name} {c.type}") for r in ans]
        return Answer(tuple(out), float(ans.rrset.ttl))

    async def _resolve_srv(self) -> Answer:
        ans = await self._query(self.cfg.name, "SRV")
        if ans is None:
            return Answer((), None)
        records = [r for r in ans if str(r.target) != "."]  # "." : service decidedly not here
        ttl = float(ans.rrset.ttl)
        if not records:
            return Answer((), ttl)
        self._cap(len(records), "SRV answer")  # before any target is resolved
        top = min(r.priority for r in records)
        addresses, ttl = await self._targets(sorted({str(r.target) for r in records}), ttl)
        out = []
        for r in sorted(records, key=lambda r: (r.priority, str(r.target), r.port)):
            for address in addresses[str(r.target)]:
                out.append(_backend(address, r.port, max(1, r.weight), r.priority != top, f"SRV {r.target}"))
        self._cap(len(out), "SRV answer (its targets' addresses)")
        return Answer(tuple(out), ttl)

    async def _targets(self, targets: list[str], ttl: float) -> tuple[dict[str, list[str]], float]:
        """Each target's addresses (at most MAX_QUERIES lookups in flight, each holding a socket)
        and the smallest TTL seen."""
        gate = asyncio.Semaphore(MAX_QUERIES)

        async def lookup(target: str):
            async with gate:
                return await self._query(target, self.address_type)

        found = await asyncio.gather(*(lookup(t) for t in targets))
        addresses = {}
        for target, a in zip(targets, found, strict=True):
            if a is None:
                raise ConfigError(f"SRV target {target} has no {self.address_type} record")
            addresses[target] = [str(r.address) for r in a]
            ttl = min(ttl, float(a.rrset.ttl))
        return addresses, ttl

    async def run(self, report: Report) -> None:
        while True:
            delay = self.retry_s
            try:
                answer = await self.resolve()
            except dns.resolver.NoNameservers as e:
                await report(Failure(f"{self.cfg.name}: no server answered ({_servfail(e)})"))
            except dns.exception.Timeout:
                await report(Failure(f"{self.cfg.name}: timed out after {self.cfg.timeout_ms} ms"))
            except (dns.exception.DNSException, ConfigError, OSError) as e:
                await report(Failure(f"{self.cfg.name}: {_one_line(e)}"))
            except Exception as e:  # noqa: BLE001 -- an answer no check foresaw is a failure, never the end
                await report(Failure(f"{self.cfg.name}: {type(e).__name__}: {_one_line(e)}"))
            else:
                await report(answer)
                delay = self.next_in_s(answer.ttl_s)
            await asyncio.sleep(delay)


def _backend(address: str, port: int, weight: int, standby: bool, where: str) -> Backend:
    """A record's endpoint as a Backend; ConfigError (garbage) if the address is no backend's."""
    return parse_backend(
        {
            "name": endpoint_name(address, port),
            "address": address,
            "port": port,
            "weight": min(weight, WEIGHT_MAX),
            "standby": standby,
        },
        where,
    )


def _servfail(e: Exception) -> str:
    text = _one_line(e)
    return "SERVFAIL" if "SERVFAIL" in text else text


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__
