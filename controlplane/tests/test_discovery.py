"""Discovery's pure parts: config sections, tokens, last known good, the effective config, etcd values.

The sources against real dnsmasq and etcd are in netns-tests/test_discovery_*.py.
"""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from controlplane.config import Backend, parse_config
from controlplane.discovery import Answer, Failure, endpoint_name
from controlplane.discovery.cache import Cached, describe_change, merge, offer
from controlplane.discovery.etcd import answer_of, parse_value
from controlplane.discovery.supervisor import Supervisor
from controlplane.discovery.tokens import derive_token, heartbeat_key, read_secret
from controlplane.errors import ConfigError

SECRET = b"0123456789abcdef-secret"


def config(discovery: dict | None = None, backends: list | None = None, heartbeat: bool = False, **service):
    s = {"name": "chat", "vip": "198.18.255.1", "port": 8000, **service}
    if discovery is not None:
        s["discovery"] = discovery
    if backends is not None:
        s["backends"] = backends
    if heartbeat:
        s["health"] = {"heartbeat": {}}
    return parse_config({"version": 1, "services": [s]})


def be(address: str, port: int = 8000, **kw) -> Backend:
    return Backend(name=endpoint_name(address, port), address=IPv4Address(address), port=port, **kw)


DNS = {"dns": {"name": "_chat._tcp.fleet.test.", "servers": ["127.0.0.1:5353"]}}
ETCD = {"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "/edge/chat/"}}


# ---- config


def test_a_service_with_discovery_needs_no_static_backends():
    cfg = config(DNS)
    s = cfg.services[0]
    assert s.backends == () and s.discovery.dns.type == "SRV" and s.discovery.dns.servers == (("127.0.0.1", 5353),)
    assert s.discovery.allow_empty is False and s.discovery.dns.min_ttl_ms <= s.discovery.dns.max_ttl_ms


@pytest.mark.parametrize(
    "discovery, backends, heartbeat, error",
    [
        ({}, None, False, "services[0].discovery: set exactly one of dns, etcd"),
        ({**DNS, **ETCD}, None, False, "services[0].discovery: set exactly one of dns, etcd"),
        (
            {"dns": {"name": "x.test.", "type": "A"}},
            None,
            False,
            "services[0].discovery.dns.port: required when type is A (A records carry no port)",
        ),
        (
            {"dns": {"name": "x.test.", "port": 80}},
            None,
            False,
            "services[0].discovery.dns.port: only for types A and AAAA (SRV records carry their port)",
        ),
        ({"dns": {"name": "x..test"}}, None, False, "services[0].discovery.dns.name: 'x..test' is not a DNS name"),
        (
            {"dns": {"name": "x.test.", "servers": ["dns.example"]}},
            None,
            False,
            "services[0].discovery.dns.servers[0]: expected IPv4[:PORT] (e.g. 127.0.0.1:53), got 'dns.example'",
        ),
        (
            {"dns": {"name": "x.test.", "min_ttl_ms": 5000, "max_ttl_ms": 1000}},
            None,
            False,
            "services[0].discovery.dns.max_ttl_ms: 1000 is less than min_ttl_ms (5000)",
        ),
        (
            {"etcd": {"endpoints": [], "prefix": "/a/"}},
            None,
            False,
            "services[0].discovery.etcd.endpoints: must not be empty",
        ),
        (
            {"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "a"}},
            None,
            False,
            "services[0].discovery.etcd.prefix: expected a key prefix like '/edge/services/chat/', got 'a'",
        ),
        (
            {**DNS, "bogus": 1},
            None,
            False,
            "services[0].discovery.bogus: unknown key (allowed: dns, etcd, allow_empty, retry_ms, max_backends, token_secret_file)",
        ),
        (
            DNS,
            None,
            True,
            "services[0].discovery.token_secret_file: required when services[0].health.heartbeat is set "
            "(discovered backends get their tokens from it)",
        ),
        (None, None, False, "services[0].backends: none given (set backends, or discovery to find them at run time)"),
    ],
)
def test_discovery_config_errors_name_the_field(discovery, backends, heartbeat, error):
    with pytest.raises(ConfigError) as e:
        config(discovery, backends, heartbeat)
    assert str(e.value) == error


# ---- tokens


def test_tokens_are_keyed_by_secret_and_endpoint_and_never_zero():
    t = derive_token(SECRET, "198.18.1.2", 8000)
    assert t == derive_token(SECRET, IPv4Address("198.18.1.2"), 8000)
    assert 2**64 <= t < 2**128 or 0 < t < 2**64  # 128 bits (a leading zero byte now and then)
    assert t != derive_token(SECRET, "198.18.1.2", 8001) != derive_token(SECRET, "198.18.1.3", 8000)
    assert t != derive_token(SECRET + b"x", "198.18.1.2", 8000)
    # HMAC-SHA256(secret, label + "198.18.1.2:8000"), first 16 bytes big-endian: any language gets the same
    import hashlib
    import hmac

    digest = hmac.new(SECRET, b"edge heartbeat key v2 198.18.1.2:8000", hashlib.sha256).digest()
    assert t == int.from_bytes(digest[:16], "big")


def test_heartbeat_key_gives_one_backend_its_own_key_and_names_what_is_missing(tmp_path):
    """edgectl heartbeat-key: a configured token as it is; a discovered backend's key derived from
    the service secret (what the router derives); no secret, no key, in one line naming why."""
    secret = tmp_path / "chat.secret"
    secret.write_bytes(SECRET)
    cfg = config(
        {**DNS, "token_secret_file": str(secret)},
        heartbeat=True,
        backends=[{"name": "b0", "address": "198.18.1.2", "port": 8000, "token": "0x5eed0001"}],
    )
    assert heartbeat_key(cfg, "chat", "198.18.1.2:8000") == 0x5EED0001
    assert heartbeat_key(cfg, "chat", "198.18.1.9:8000") == derive_token(SECRET, "198.18.1.9", 8000)
    with pytest.raises(ConfigError, match=r"^--service: no service 'web'"):
        heartbeat_key(cfg, "web", "198.18.1.9:8000")
    with pytest.raises(ConfigError, match=r"^--backend: 'nope' is not ADDR:PORT$"):
        heartbeat_key(cfg, "chat", "nope")
    static = config(backends=[{"name": "b0", "address": "198.18.1.2", "port": 8000}])
    with pytest.raises(ConfigError, match=r"^--backend: 198.18.1.9:8000 has no token"):
        heartbeat_key(static, "chat", "198.18.1.9:8000")


def test_a_short_or_missing_secret_file_is_an_error_naming_the_field(tmp_path):
    short = tmp_path / "short"
    short.write_bytes(b"abc\n")
    with pytest.raises(ConfigError, match=r"^services\[0\]\.discovery\.token_secret_file: .* holds 3 bytes"):
        read_secret(str(short), "services[0].discovery.token_secret_file")
    with pytest.raises(ConfigError, match=r"^f: cannot read .*missing: No such file"):
        read_secret(str(tmp_path / "missing"), "f")
    good = tmp_path / "good"
    good.write_bytes(SECRET + b"\n")
    assert read_secret(str(good), "f") == SECRET


def test_a_secret_file_that_is_no_regular_file_is_refused_without_blocking(tmp_path):
    """A FIFO (nobody writing) blocked the reader, and so edged's loop, for good; /dev/zero is
    endless. Both are refused at once, naming the field."""
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"s" * 5000)
    got: dict = {}

    def read_all() -> None:
        for name, path in (("fifo", str(fifo)), ("zero", "/dev/zero"), ("big", str(big))):
            try:
                read_secret(path, "services[0].discovery.token_secret_file")
            except ConfigError as e:
                got[name] = str(e)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(5.0)
    if reader.is_alive():  # the old code blocks in open(): a writer end lets it go, then fail
        with open(fifo, "wb"):
            pass
        reader.join(5.0)
        raise AssertionError("read_secret blocked on a FIFO")
    assert got["fifo"].endswith("fifo is not a regular file"), got
    assert got["zero"].endswith("/dev/zero is not a regular file"), got
    assert got["big"].endswith("is larger than 4096 bytes"), got


# ---- last known good


def cached(**kw) -> Cached:
    return Cached("chat", "dns", watched=False, **kw)


def test_a_good_answer_is_taken_and_an_equal_one_changes_nothing():
    c = cached()
    v = offer(c, Answer((be("198.18.1.2"), be("198.18.2.2"))), now_s=10)
    assert v.changed and c.state() == "ok" and c.good_at_s == 10 and len(c.backends) == 2
    v = offer(c, Answer((be("198.18.2.2"), be("198.18.1.2"))), now_s=12)  # order does not matter
    assert not v.changed and c.good_at_s == 12 and c.changes == 1


@pytest.mark.parametrize(
    "result, why",
    [
        (Failure("timed out after 2000 ms"), "timed out after 2000 ms"),
        (Answer(()), "empty answer (allow_empty is false)"),
    ],
)
def test_a_failure_or_an_empty_answer_keeps_the_last_known_good_set_and_is_counted(result, why):
    c = cached()
    offer(c, Answer((be("198.18.1.2"),)), now_s=1)
    v1 = offer(c, result, now_s=5)
    v2 = offer(c, result, now_s=6)
    assert v1.failed and not v1.changed and v1.event[0] == "discovery-failed" and why in v1.event[1]
    assert "keeping the last known good set (1 backends)" in v1.event[1]
    assert v2.event is None  # the same failure again: counted, not told again
    assert c.backends == (be("198.18.1.2"),) and c.failures == 2 and c.state() == "stale"
    assert c.age_s(6) == 5
    v3 = offer(c, Answer((be("198.18.1.2"),)), now_s=7)
    assert not v3.changed and v3.event[0] == "discovery-recovered" and c.state() == "ok" and c.age_s(7) == 0


def test_an_empty_answer_empties_the_set_when_allowed():
    c = cached(allow_empty=True)
    offer(c, Answer((be("198.18.1.2"),)), now_s=1)
    assert offer(c, Answer(()), now_s=2).changed and c.backends == ()


def test_an_answer_that_does_not_fit_the_config_is_a_failure():
    c = cached()

    def fits(backends):
        raise ConfigError("services[0].backends: 300 backends; at most 256 per service")

    v = offer(c, Answer((be("198.18.1.2"),)), now_s=1, fits=fits)
    assert v.failed and c.backends is None and c.state() == "failed" and "answer rejected: services[0]" in c.error


def test_a_watched_source_data_is_current_while_it_is_up():
    c = Cached("chat", "etcd", watched=True)
    offer(c, Answer((be("198.18.1.2"),)), now_s=1)
    assert c.age_s(100) == 0
    offer(c, Failure("etcd 127.0.0.1:2379: connection refused"), now_s=100)
    assert c.age_s(130) == 129


def test_describe_change_names_added_removed_and_changed_backends():
    a, b = be("198.18.1.2"), be("198.18.2.2")
    assert (
        describe_change((a, b), (replace_weight(a, 5), be("198.18.3.2")))
        == "+198.18.3.2-8000, -198.18.2.2-8000, ~198.18.1.2-8000"
    )


def replace_weight(b: Backend, w: int) -> Backend:
    from dataclasses import replace

    return replace(b, weight=w)


# ---- the effective config


def test_merge_adds_discovered_backends_after_static_ones_and_static_wins_on_an_endpoint():
    cfg = config(DNS, backends=[{"name": "h100-a", "address": "198.18.1.2", "port": 8000}])
    out = merge(cfg, {"chat": (be("198.18.1.2"), be("198.18.2.2"))})
    assert [b.name for b in out.services[0].backends] == ["h100-a", "198.18.2.2-8000"]
    assert merge(cfg, {}) == cfg


def test_merge_refuses_a_discovered_endpoint_that_serves_another_service():
    cfg = parse_config(
        {
            "version": 1,
            "services": [
                {"name": "chat", "vip": "198.18.255.1", "port": 8000, "discovery": DNS},
                {
                    "name": "embed",
                    "vip": "198.18.255.1",
                    "port": 8001,
                    "backends": [{"name": "a", "address": "198.18.1.2", "port": 8000}],
                },
            ],
        }
    )
    with pytest.raises(ConfigError, match="198.18.1.2:8000/tcp already serves"):
        merge(cfg, {"chat": (be("198.18.1.2"),)})


def test_the_supervisor_derives_tokens_and_never_applies_a_set_that_does_not_fit():
    cfg = config({**DNS, "token_secret_file": "/etc/edge/chat.secret"}, heartbeat=True)
    applied = []
    events = []

    async def apply():
        applied.append(sup.effective(cfg))

    sup = Supervisor(apply, lambda kind, text, **f: events.append(kind), clock=lambda: 1.0)
    sup.cfg = cfg
    sup.caches["chat"] = cached(secret=SECRET)
    v = sup._offer("chat", Answer((be("198.18.1.2"),)))
    assert v.changed
    (b,) = sup.effective(cfg).services[0].backends
    assert b.token == derive_token(SECRET, "198.18.1.2", 8000)
    too_many = tuple(be(f"198.18.{i // 250 + 1}.{i % 250 + 1}") for i in range(1025))  # one over MAX_PER_SERVICE
    v = sup._offer("chat", Answer(too_many))
    assert v.failed and events == ["discovery-failed"] and len(sup.found()["chat"]) == 1


def test_a_service_is_unsettled_until_its_source_gave_something_usable():
    cfg = config(DNS)
    sup = Supervisor(lambda: None, lambda kind, text, **f: None, clock=lambda: 1.0)
    sup.cfg = cfg
    sup.caches["chat"] = cached()
    assert sup.unsettled() == {"chat"}
    sup._offer("chat", Failure("no answer in 5.0 s at start"))
    assert sup.unsettled() == {"chat"}  # failed with nothing cached: still not known
    sup._offer("chat", Answer((be("198.18.1.2"),)))
    assert sup.unsettled() == set()
    sup._offer("chat", Failure("timeout"))
    assert sup.unsettled() == set()  # stale: the last known good set stands


# ---- etcd values


def test_an_etcd_value_becomes_a_backend_named_after_its_endpoint():
    b = parse_value(b"/edge/chat/a", b'{"address": "198.18.1.2", "port": 8000, "weight": 3, "token": "0x5eed0001"}')
    assert b == Backend(
        name="198.18.1.2-8000", address=IPv4Address("198.18.1.2"), port=8000, weight=3, token=0x5EED0001
    )


@pytest.mark.parametrize(
    "value, error",
    [
        (b"{", "etcd /edge/chat/a: not JSON"),
        (b"[1]", "etcd /edge/chat/a: expected a JSON object with address, port, weight, standby, token"),
        (b'{"address": "198.18.1.2"}', "etcd /edge/chat/a.port: missing"),
        (b'{"address": "198.18.1.2", "port": 70000}', "etcd /edge/chat/a.port: 70000 is not a port"),
        (b'{"address": "127.0.0.1", "port": 80}', "etcd /edge/chat/a.address: 127.0.0.1 is a loopback address"),
        (b'{"address": "198.18.1.2", "port": 80, "name": "x"}', "etcd /edge/chat/a.name: unknown key"),
        (b"\xff", "etcd /edge/chat/a: not JSON"),
    ],
)
def test_a_garbage_etcd_value_is_an_error_naming_the_key(value, error):
    with pytest.raises(ConfigError) as e:
        parse_value(b"/edge/chat/a", value)
    assert str(e.value).startswith(error)


def test_one_garbage_key_fails_the_whole_answer():
    kvs = {b"/edge/chat/a": b'{"address": "198.18.1.2", "port": 8000}', b"/edge/chat/b": b"nope"}
    with pytest.raises(ConfigError, match="/edge/chat/b"):
        answer_of(kvs)
    del kvs[b"/edge/chat/b"]
    assert answer_of(kvs).backends == (be("198.18.1.2"),)


def test_dns_ttl_is_clamped():
    from controlplane.discovery.dns import DnsSource

    d = config({"dns": {"name": "x.test.", "servers": ["127.0.0.1"], "min_ttl_ms": 500, "max_ttl_ms": 10000}})
    src = DnsSource(d.services[0].discovery)
    assert (src.next_in_s(0), src.next_in_s(3), src.next_in_s(3600), src.next_in_s(None)) == (0.5, 3, 10, 10)


def test_no_discovered_address_may_be_a_vip_link_local_or_shared_space():
    from ipaddress import IPv4Address as A

    from controlplane.discovery.cache import not_a_backend

    vips = {A("198.18.255.1")}
    assert not_a_backend(A("198.18.255.1"), vips) == "198.18.255.1 is a VIP"
    assert not_a_backend(A("169.254.1.1"), vips) == "169.254.1.1 is link-local"
    assert "100.64.0.0/10" in not_a_backend(A("100.127.255.254"), vips)
    assert not_a_backend(A("198.18.1.2"), vips) is None
