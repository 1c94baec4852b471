"""The edge config: YAML in, frozen dataclasses out, every error one line naming its path.

Each key is declared once, as a dataclass field made by option(): its default,
a help string and the check that turns the YAML value into the field's value
(ExaBGP's option()). Unknown keys are errors that list the allowed ones.
Pure: no kernel, no network; load_config() only reads the file it is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv6Address
from typing import Optional

from controlplane.abi import MAX_PER_SERVICE

# The health sections live in confighealth.py; re-exported: the schema is read from here.
from controlplane.confighealth import (  # noqa: F401
    RELAXED_CAP_MS,
    RELAXED_FACTOR,
    Health,
    Heartbeat,
    MetricsScrape,
    Passive,
    Probe,
    Sla,
    Weights,
    Wire,
)
from controlplane.configkit import (  # the checks and the machinery the schema below is made of
    MAX_CONFIG_BYTES,
    MAX_MS,
    _abs_path,
    _bool,
    _dns_name,
    _etcd_prefix,
    _group,
    _ifname,
    _int,
    _ip,
    _ipv4,
    _join,
    _kind,
    _list_of,
    _listen,
    _load_yaml,
    _maglev_m,
    _ms,
    _name,
    _one_of,
    _parse,
    _port,
    _section,
    _sections,
    _server,
    _token,
    _too_big,
    _version,
    _weight,
    option,
    read_config_text,
)
from controlplane.errors import ConfigError
from controlplane.probe.budget import DEFAULT_BUDGET_PER_S


@dataclass(frozen=True)
class Backend:
    """One inference server behind a service."""

    name: str = option("unique in its service; shown in status and metrics", _name)
    address: IPv4Address | IPv6Address = option(
        "IPv4 or IPv6 address of the backend (the family of its service's VIP)", _ip("backends")
    )
    port: int = option("port the backend serves the service on", _port)
    weight: int = option("relative share of new flows; 0 drains (no new flows)", _weight, 1)
    standby: bool = option("gets new flows only while no primary is usable", _bool, False)
    token: Optional[int] = option("64-bit value the backend's heartbeats carry, e.g. '0x5eed0001'", _token, None)


@dataclass(frozen=True)
class Dns:
    """Backends from DNS: SRV records (target, port, weight) or A/AAAA records plus a port."""

    name: str = option("the name to resolve, e.g. _chat._tcp.fleet.example.", _dns_name)
    type: str = option(
        "SRV (target, port, weight; lowest priority primary, others standby; targets resolved by A for an "
        "IPv4 VIP, by AAAA for an IPv6 one), A (IPv4 VIP) or AAAA (IPv6 VIP)",
        _one_of("SRV", "A", "AAAA"),
        "SRV",
    )
    port: Optional[int] = option("port of every backend (types A and AAAA only)", _port, None)
    servers: tuple[tuple[str, int], ...] = option(
        "resolvers as IPv4[:PORT]; empty: the system's (/etc/resolv.conf)", _list_of(_server), ()
    )
    timeout_ms: int = option("a query not answered this long fails", _ms, 2000)
    min_ttl_ms: int = option("re-resolve no sooner than this, whatever the TTL", _ms, 1000)
    max_ttl_ms: int = option("re-resolve at least this often, whatever the TTL", _ms, 300000)

    def _validate(self, path: str) -> None:
        if self.type != "SRV" and self.port is None:
            raise ConfigError(f"{path}.port: required when type is {self.type} ({self.type} records carry no port)")
        if self.type == "SRV" and self.port is not None:
            raise ConfigError(f"{path}.port: only for types A and AAAA (SRV records carry their port)")
        if self.max_ttl_ms < self.min_ttl_ms:
            raise ConfigError(f"{path}.max_ttl_ms: {self.max_ttl_ms} is less than min_ttl_ms ({self.min_ttl_ms})")


def _user_with_password(path: str, user: Optional[str], password_file: Optional[str]) -> None:
    """An etcd user and its password_file come together or not at all."""
    if (user is None) != (password_file is None):
        raise ConfigError(
            f"{path}.{'password_file' if user else 'user'}: required with {'user' if user else 'password_file'}"
        )


@dataclass(frozen=True)
class Etcd:
    """Backends from etcd v3: one key per backend under a prefix, watched."""

    endpoints: tuple[tuple[str, int], ...] = option(
        "etcd client endpoints as IPv4:PORT, tried in turn", _list_of(_server, empty=False)
    )
    prefix: str = option("key prefix; each key under it holds one backend as JSON", _etcd_prefix)
    timeout_ms: int = option("a read or connect not answered this long fails", _ms, 2000)
    user: Optional[str] = option("etcd user (etcd auth on); its role needs read on prefix only", _name, None)
    password_file: Optional[str] = option(
        "file holding user's password (a regular file of 16..4096 bytes, read at every connect)", _abs_path, None
    )

    def _validate(self, path: str) -> None:
        _user_with_password(path, self.user, self.password_file)


@dataclass(frozen=True)
class Discovery:
    """Backends found at run time, added to the static ones; on failure the last known good set stays."""

    dns: Optional[Dns] = option("resolve backends from DNS (one of dns, etcd)", _section(Dns), None)
    etcd: Optional[Etcd] = option("watch backends in etcd (one of dns, etcd)", _section(Etcd), None)
    allow_empty: bool = option("an empty answer empties the set; false: it counts as a failure", _bool, False)
    retry_ms: int = option("after a failure, ask again this soon", _ms, 1000)
    max_backends: int = option(
        "most backends one answer may hold (etcd keys under the prefix, SRV records); a larger answer is "
        "refused as a failure before anything in it is parsed or resolved",
        _int(1, 65536),
        256,
    )
    token_secret_file: Optional[str] = option(
        "file with the service's secret; heartbeat tokens are HMAC-SHA256(secret, 'ADDR:PORT') cut to 64 "
        "bits (edge-heartbeat --token-secret-file computes the same)",
        _abs_path,
        None,
    )

    def _validate(self, path: str) -> None:
        if (self.dns is None) == (self.etcd is None):
            raise ConfigError(f"{path}: set exactly one of dns, etcd")


def _check_dsr(s: "Service", path: str) -> None:
    """What direct server return cannot do: the router sees no reply, and the backend answers from
    the VIP's own port."""
    if s.health and s.health.passive:
        raise ConfigError(f"{path}.health.passive: not with forwarding dsr (the router sees no replies)")
    if s.weights.policy == "latency_inverse" and s.weights.wire.enabled:
        raise ConfigError(
            f"{path}.weights.wire.enabled: must be false with forwarding dsr (wire signals time "
            "replies, which the router does not see)"
        )
    for i, backend in enumerate(s.backends):
        if backend.port != s.port:
            raise ConfigError(
                f"{path}.backends[{i}].port: {backend.port} must be the service port {s.port} with "
                "forwarding dsr (the backend answers from the VIP's port)"
            )


def _check_dns_family(s: "Service", path: str) -> None:
    """A and AAAA records give addresses of one family: the VIP's."""
    dns = s.discovery.dns if s.discovery else None
    wanted = "AAAA" if s.vip.version == 6 else "A"
    if dns is not None and dns.type in ("A", "AAAA") and dns.type != wanted:
        raise ConfigError(
            f"{path}.discovery.dns.type: {dns.type} gives IPv{4 if dns.type == 'A' else 6} addresses but the VIP "
            f"{s.vip} is IPv{s.vip.version} (use {wanted})"
        )


@dataclass(frozen=True)
class Service:
    """A VIP:port/protocol and its backends."""

    name: str = option("unique in the config; shown in status and metrics", _name)
    vip: IPv4Address | IPv6Address = option(
        "virtual IPv4 or IPv6 address clients connect to; the backends are of its family", _ip("VIPs")
    )
    port: int = option("port on the VIP", _port)
    protocol: str = option("tcp or udp", _one_of("tcp", "udp"), "tcp")
    existing_flows: str = option(
        "when a backend becomes unusable its flows move (reselect) or stay (keep)",
        _one_of("reselect", "keep"),
        "reselect",
    )
    forwarding: str = option(
        "nat (the router rewrites both ways) or dsr (direct server return: packets go to the backend in IPIP, "
        "IPv6-in-IPv6 for an IPv6 VIP, with the VIP kept; the backend answers the client itself: tools/dsr-backend)",
        _one_of("nat", "dsr"),
        "nat",
    )
    new_flows: str = option(
        "how a new connection picks its backend: maglev (the Maglev slot of its hash, by weight), two_choices "
        "(that backend or a second one drawn uniformly, whichever has fewer open TCP connections), least_loaded "
        "(the fewest open TCP connections per slot, slots as the load scrapes show them, of that backend and up to "
        "7 others: every backend of a service of 8) or auto: least_loaded for a service with health.metrics on a "
        "node with neither node.bgp nor node.fleet (no other router shares its VIP), else maglev",
        _one_of("auto", "maglev", "two_choices", "least_loaded"),
        "auto",
    )
    health: Optional[Health] = option("health checks; none when absent", _section(Health), None)
    weights: Weights = option("weight policy", _section(Weights), Weights())
    sla: Optional[Sla] = option("SLA marks; none when absent", _section(Sla), None)
    drain_timeout_ms: int = option(
        "on reload, connections of a removed backend are kept this long (0: until they end)",
        _int(0, MAX_MS),
        30000,
    )
    discovery: Optional[Discovery] = option(
        "backends found in DNS or etcd, besides the static ones", _section(Discovery), None
    )
    backends: tuple[Backend, ...] = option(
        "the static backends; at least one not standby, unless discovery is set",
        _sections(Backend, empty=True),
        (),
        required=False,
    )

    @property
    def key(self) -> tuple[IPv4Address | IPv6Address, int, str]:
        """What identifies the service in the data path: (vip, port, protocol)."""
        return (self.vip, self.port, self.protocol)

    def _validate(self, path: str) -> None:
        names: dict[str, int] = {}
        endpoints: dict[tuple[IPv4Address | IPv6Address, int], int] = {}
        for i, backend in enumerate(self.backends):
            where = f"{path}.backends[{i}]"
            if backend.address.version != self.vip.version:
                raise ConfigError(
                    f"{where}.address: {backend.address} is IPv{backend.address.version} but the VIP "
                    f"{self.vip} is IPv{self.vip.version} (a service's VIP and backends are one family)"
                )
            if backend.name in names:
                raise ConfigError(f"{where}.name: duplicate name {backend.name!r}")
            names[backend.name] = i
            endpoint = (backend.address, backend.port)
            if endpoint in endpoints:
                raise ConfigError(
                    f"{where}.address: {backend.address}:{backend.port} is already used by "
                    f"{path}.backends[{endpoints[endpoint]}]"
                )
            endpoints[endpoint] = i
        if not self.backends and self.discovery is None:
            raise ConfigError(f"{path}.backends: none given (set backends, or discovery to find them at run time)")
        if self.backends and all(backend.standby for backend in self.backends) and self.discovery is None:
            raise ConfigError(f"{path}.backends: service {self.name!r} has no primary backend (all are standby)")
        _check_dns_family(self, path)
        if self.forwarding == "dsr":
            _check_dsr(self, path)
        if len(self.backends) > MAX_PER_SERVICE:
            raise ConfigError(f"{path}.backends: {len(self.backends)} backends; at most {MAX_PER_SERVICE} per service")
        if self.health and self.health.heartbeat:
            if self.discovery and self.discovery.dns and self.discovery.token_secret_file is None:
                raise ConfigError(
                    f"{path}.discovery.token_secret_file: required when {path}.health.heartbeat "
                    f"is set (discovered backends get their tokens from it)"
                )
            for i, backend in enumerate(self.backends):
                if backend.token is None:
                    raise ConfigError(
                        f"{path}.backends[{i}].token: required when {path}.health.heartbeat is set "
                        f"(heartbeats without the backend's token are rejected)"
                    )


@dataclass(frozen=True)
class ApiTls:
    """Mutual TLS of edged's TCP API: its certificate, and the CA its clients' certificates come from."""

    cert: str = option("PEM certificate edged presents to clients", _abs_path)
    key: str = option("PEM private key of that certificate", _abs_path)
    client_ca: str = option("PEM CA bundle; only clients with a certificate it signed get in", _abs_path)


@dataclass(frozen=True)
class BgpPeer:
    """One BGP neighbour of this node (usually the upstream router or a route reflector)."""

    address: IPv4Address | IPv6Address = option(
        "the neighbour's IPv4 or global IPv6 address, on a directly connected network; the session carries "
        "the VIPs of its family (IPv4 VIPs to IPv4 peers, IPv6 VIPs to IPv6 peers)",
        _ip("peers"),
    )
    remote_as: int = option("the neighbour's AS number", _int(1, 4294967295, "an AS number"))


@dataclass(frozen=True)
class Bgp:
    """VIP announcement: edged runs a BGP speaker (BIRD 2) with this config and announces each
    VIP (a /32) while it has a usable backend; the upstream spreads flows over the nodes (ECMP)."""

    speaker: str = option("the BGP daemon edged runs: bird (BIRD 2)", _one_of("bird"), "bird")
    local_as: int = option("this node's AS number", _int(1, 4294967295, "an AS number"), 0, required=True)
    router_id: Optional[IPv4Address] = option(
        "BGP router id; absent: the speaker picks one of the node's IPv4 addresses (set it where there is none)",
        _ipv4("router ids"),
        None,
    )
    peers: tuple[BgpPeer, ...] = option(
        "the BGP neighbours the VIPs are announced to", _sections(BgpPeer), (), required=True
    )
    hold_time_s: int = option(
        "BGP hold time: a silent peer is dropped after this long (3..65535); keepalives every third of it",
        _int(3, 65535),
        3,
    )
    bfd: bool = option(
        "run BFD with each peer: a dead node is noticed in bfd_interval_ms * bfd_multiplier instead of the hold time",
        _bool,
        True,
    )
    bfd_interval_ms: int = option("BFD transmit and receive interval", _int(10, 10000), 100)
    bfd_multiplier: int = option("BFD packets missed in a row that take the session down", _int(2, 255), 3)
    config_file: str = option(
        "the speaker config edged writes (and rewrites on every change)", _abs_path, "/run/edge/bird.conf"
    )
    control_socket: str = option("the speaker's control socket (birdc -s)", _abs_path, "/run/edge/bird.ctl")

    def _validate(self, path: str) -> None:
        seen: dict[IPv4Address | IPv6Address, int] = {}
        for i, peer in enumerate(self.peers):
            if peer.address in seen:
                raise ConfigError(f"{path}.peers[{i}].address: {peer.address} is already peers[{seen[peer.address]}]")
            seen[peer.address] = i
        if self.config_file == self.control_socket:
            raise ConfigError(f"{path}.control_socket: the same path as {path}.config_file")


@dataclass(frozen=True)
class Fleet:
    """Membership of a fleet of edge nodes that share one table through etcd: every node reports
    its probe results, one elected leader computes the weights from all reports and publishes a
    versioned snapshot, and every node applies the same version (controlplane/fleet/)."""

    etcd: tuple[tuple[str, int], ...] = option(
        "etcd client endpoints as IPv4:PORT, tried in turn", _list_of(_server, empty=False)
    )
    name: str = option("this node's name in the fleet; unique among the nodes", _name)
    prefix: str = option("key prefix of the fleet (leader, nodes/, snapshot)", _etcd_prefix, "/edge/fleet/")
    lease_ttl_s: int = option(
        "the lease of the leader key and of this node's report: a dead leader "
        "is replaced, and a dead node's report goes, within this many seconds",
        _int(1, 3600),
        2,
    )
    report_ms: int = option("a node reports at least this often (and whenever its own decision changes)", _ms, 1000)
    stale_ms: int = option("the leader ignores a report older than this", _ms, 5000)
    timeout_ms: int = option("an etcd call not answered this long fails", _ms, 2000)
    retry_ms: int = option("after a failure, etcd is tried again (next endpoint) this long after", _ms, 500)
    user: Optional[str] = option(
        "etcd user of this node (etcd auth on); its role lets it write its own "
        "report only (nodes/NAME), see the security docs",
        _name,
        None,
    )
    password_file: Optional[str] = option(
        "file holding user's password (a regular file of 16..4096 bytes, read at every connect)", _abs_path, None
    )

    def _validate(self, path: str) -> None:
        _user_with_password(path, self.user, self.password_file)
        if self.stale_ms <= self.report_ms:
            raise ConfigError(f"{path}.stale_ms: {self.stale_ms} must be greater than report_ms ({self.report_ms})")


def half_open_size(ct_size: int) -> int:
    """Entries of edge_half_open (TCP connections between the SYN and the client's ACK) for a
    conntrack of ct_size entries: a quarter, at least 1024. Not a setting of its own."""
    return max(ct_size // 4, 1024)


def ct6_size(ct_size: int) -> int:
    """Entries of edge_ct6 (IPv6 connections) for an IPv4 conntrack of ct_size entries: a quarter,
    at least 1024 (an IPv6 entry takes 128 bytes to IPv4's 104: the same count would more than
    double conntrack's memory on a node whose clients are mostly IPv4). Not a setting of its own."""
    return max(ct_size // 4, 1024)


@dataclass(frozen=True)
class Node:
    """Settings of this edge node; sizes here are compiled into the BPF programs."""

    maglev_m: int = option("Maglev table size per VIP; a prime in 1009..1000003", _maglev_m, 65537)
    max_services: int = option("capacity of the per-VIP maps", _int(1, 256), 16)
    max_backends: int = option("capacity of the backend maps, all services together", _int(1, 65536), 1024)
    ct_size: int = option("conntrack entries (and as many reverse-NAT entries)", _int(1024, 16777216), 262144)
    pin_dir: str = option("bpffs directory the maps are pinned under", _abs_path, "/sys/fs/bpf/edge")
    api_socket: str = option("unix socket edged serves edgectl on", _abs_path, "/run/edge/edged.sock")
    api_group: Optional[int | str] = option(
        "group that may use the API socket (mode 0660); absent: edged's own group", _group, None
    )
    api_listen: Optional[str] = option("HOST:PORT to serve the API on over TCP as well; needs api_tls", _listen, None)
    api_tls: Optional[ApiTls] = option(
        "mutual TLS of the TCP API (clients must show a certificate)", _section(ApiTls), None
    )
    metrics_listen: str = option("HOST:PORT of the Prometheus endpoint", _listen, "127.0.0.1:9470")
    probe_budget: int = option(
        "probes a second edged starts at most, all services together; when the probes configured ask "
        "for more, every probe and scrape interval is stretched by the same factor and the shortfall "
        "is reported (status, edge_probe_shortfall_ratio, a probe-budget event); 0: no budget",
        _int(0, 1_000_000),
        DEFAULT_BUDGET_PER_S,
    )
    iface: Optional[str] = option("interface edged deploys on when it finds nothing deployed", _ifname, None)
    xdp_mode: str = option("native (driver) or generic (skb) XDP", _one_of("native", "generic"), "native")
    reply_xdp: str = option(
        "XDP fast path of replies on the backend-facing interfaces (tc takes the rest): "
        "auto (where the driver takes it; else tc alone, said in one line), on (deploy "
        "fails where it cannot attach), off (tc alone)",
        _one_of("auto", "on", "off"),
        "auto",
    )
    answer_ping: bool = option(
        "answer ICMP and ICMPv6 echo requests (ping) to VIP addresses in XDP, from the VIP; false: hand them to "
        "the stack, which answers only a VIP that is a local address (on lo)",
        _bool,
        True,
    )
    bgp: Optional[Bgp] = option(
        "announce the VIPs over BGP; absent: routing the VIPs here is someone else's job", _section(Bgp), None
    )
    fleet: Optional[Fleet] = option(
        "join a fleet: the same weights on every node, from etcd; absent: this node decides alone",
        _section(Fleet),
        None,
    )

    def _validate(self, path: str) -> None:
        # The API can reconfigure the router: over TCP, only clients with a certificate get in.
        if self.api_listen and self.api_tls is None:
            raise ConfigError(
                f"{_join(path, 'api_listen')}: TCP is served only with mutual TLS; "
                f"set {_join(path, 'api_tls')} (cert, key, client_ca)"
            )
        if self.api_tls and not self.api_listen:
            raise ConfigError(
                f"{_join(path, 'api_tls')}: set, but {_join(path, 'api_listen')} is not "
                "(TLS is for the TCP listener; the unix socket needs none)"
            )


@dataclass(frozen=True)
class Config:
    """A whole config file."""

    version: int = option("format version; must be 1", _version)
    node: Node = option("settings of this edge node", _section(Node), Node())
    services: tuple[Service, ...] = option("the services; at least one", _sections(Service), (), required=True)

    def _validate(self, path: str) -> None:
        names: dict[str, int] = {}
        keys: dict[tuple[IPv4Address | IPv6Address, int, str], int] = {}
        for i, service in enumerate(self.services):
            if service.name in names:
                raise ConfigError(f"services[{i}].name: duplicate name {service.name!r}")
            names[service.name] = i
            if service.key in keys:
                raise ConfigError(
                    f"services[{i}].vip: {service.vip}:{service.port}/{service.protocol} "
                    f"is already used by services[{keys[service.key]}]"
                )
            keys[service.key] = i
        node = self.node
        if node.bgp is not None:
            families = {peer.address.version for peer in node.bgp.peers}
            for i, service in enumerate(self.services):
                if service.vip.version not in families:
                    v = service.vip.version
                    raise ConfigError(
                        f"services[{i}].vip: {service.vip} cannot be announced: node.bgp.peers has no IPv{v} peer "
                        f"(a session carries the VIPs of its own family)"
                    )
        if len(self.services) > node.max_services:
            raise ConfigError(
                f"services: {len(self.services)} services, more than node.max_services ({node.max_services})"
            )
        total = sum(len(service.backends) for service in self.services)
        if total > node.max_backends:
            raise ConfigError(
                f"services: {total} backends in all services, more than node.max_backends ({node.max_backends})"
            )
        endpoints: dict[tuple[IPv4Address | IPv6Address, int, str], str] = {}
        tokens: dict[int, str] = {}
        for i, service in enumerate(self.services):
            for j, backend in enumerate(service.backends):
                if backend.token is not None:
                    if backend.token in tokens:
                        raise ConfigError(
                            f"services[{i}].backends[{j}].token: the same as {tokens[backend.token]}; each backend "
                            f"needs its own (one backend's token must not make heartbeats for another)"
                        )
                    tokens[backend.token] = f"services[{i}].backends[{j}].token"
                endpoint = (backend.address, backend.port, service.protocol)
                if endpoint in endpoints:
                    raise ConfigError(
                        f"services[{i}].backends[{j}]: {backend.address}:{backend.port}/{service.protocol} "
                        f"already serves {endpoints[endpoint]}; in NAT mode a backend endpoint serves one "
                        f"service (its replies say which VIP they belong to)"
                    )
                endpoints[endpoint] = f"services[{i}]"
        # new_flows auto, resolved once here: every reader sees maglev, two_choices or least_loaded
        object.__setattr__(self, "services", tuple(_preset(s, node) for s in self.services))


def _preset(s: Service, node: Node) -> Service:
    """new_flows auto as the node resolves it (docs/design-decisions.md, "least_loaded by slots"):
    least_loaded where the load scrapes show slots and no other router shares the VIP (no BGP, no
    fleet: ECMP consistency buys nothing), maglev everywhere else; an explicit value stays."""
    if s.new_flows != "auto":
        return s
    alone = node.bgp is None and node.fleet is None
    return replace(s, new_flows="least_loaded" if alone and s.health and s.health.metrics else "maglev")


def parse_config(doc: object, source: str = "<config>") -> Config:
    """Validate an already-loaded YAML document; source names it in top-level errors."""
    if doc is None:
        raise ConfigError(f"config: {source} is empty")
    if not isinstance(doc, dict):
        # the type only: a file that is no config must not be quoted (see _parse)
        raise ConfigError(f"config: {source}: expected a mapping at the top level, got {_kind(doc)}")
    return _parse(Config, doc, "")


def load_config(path: str | os.PathLike) -> Config:
    """Read, parse and validate the YAML config file at path (see read_config_text)."""
    source = os.fsdecode(path)
    return parse_config(_load_yaml(read_config_text(source), source), source)


def load_config_text(text: str, source: str = "config_text") -> Config:
    """Parse and validate config text (at most MAX_CONFIG_BYTES of UTF-8); source names it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise _too_big(size, source)
    return parse_config(_load_yaml(text, source), source)


def parse_backend(doc: object, path: str) -> Backend:
    """One backend from a mapping (a discovered record or etcd value), checked as the config checks
    services[].backends[]; errors name path."""
    return _parse(Backend, doc, path)
