"""cache.adoptable: which backends a restarted edged takes from the pinned maps for a discovery
source that has not answered since the start (etcd or DNS down during the restart), and
Supervisor.adopt making them the last known good set."""

from __future__ import annotations

from ipaddress import IPv4Address

from controlplane import abi
from controlplane.config import Backend, load_config_text
from controlplane.discovery import Answer
from controlplane.discovery.cache import adoptable
from controlplane.discovery.supervisor import Supervisor
from controlplane.discovery.tokens import derive_token

CONFIG = """
version: 1
services:
  - name: web
    vip: 198.18.0.10
    port: 8000
    weights: {{policy: {policy}}}
    backends:
      - {{name: fixed, address: 198.18.1.9, port: 8000}}
    discovery:
      etcd: {{endpoints: ["127.0.0.1:2379"], prefix: /edge/services/web/}}
"""


def cfg(policy: str = "static"):
    return load_config_text(CONFIG.format(policy=policy))


def found(addr: str, port: int = 8000, weight: int = 1, **kw) -> Backend:
    return Backend(name=f"{addr}-{port}", address=IPv4Address(addr), port=port, weight=weight, **kw)


def test_discovered_backends_are_adopted_static_and_leaving_ones_not():
    (s,) = cfg().services
    deployed = [
        (Backend(name="fixed", address=IPv4Address("198.18.1.9"), port=8000), 0),  # static: the config's
        (found("198.18.1.2", weight=3), 0),
        (found("198.18.1.3", standby=True), 0),
        (found("198.18.1.4"), abi.PROBE_F_LEAVING),  # draining out: edged keeps it itself
        (Backend(name="old-static", address=IPv4Address("198.18.1.5"), port=8000), 0),  # never discovered
    ]
    got = adoptable(s, deployed)
    assert [(b.name, b.weight, b.standby) for b in got] == [("198.18.1.2-8000", 3, False), ("198.18.1.3-8000", 1, True)]


def test_a_forced_or_computed_zero_weight_is_not_taken_for_the_configured_one():
    static = cfg("static").services[0]
    computed = cfg("latency_inverse").services[0]
    drained = (found("198.18.1.2", weight=0), abi.PROBE_F_DRAINED)
    down = (found("198.18.1.3", weight=0), 0)
    assert [b.weight for b in adoptable(static, [drained, down])] == [1, 0]  # static 0: the source's drain
    assert [b.weight for b in adoptable(computed, [drained, down])] == [1, 1]


def test_a_derived_token_is_left_to_derivation_an_explicit_one_kept():
    (s,) = cfg().services
    secret = b"s" * 32
    derived = derive_token(secret, IPv4Address("198.18.1.2"), 8000)
    got = adoptable(s, [(found("198.18.1.2", token=derived), 0), (found("198.18.1.3", token=0x5EED), 0)], secret)
    assert [b.token for b in got] == [None, 0x5EED]


def test_adopted_set_is_the_last_known_good_until_the_source_answers():
    c = cfg()
    events = []
    sup = Supervisor(apply=None, emit=lambda kind, text, **f: events.append((kind, f)))
    sup.configure(c, {"web": None})
    deployed = {"web": [(found("198.18.1.2"), 0), (found("198.18.1.3"), 0)]}
    got = sup.adoptable(lambda s: deployed[s.name])
    assert list(got) == ["web"] and sup.unsettled() == {"web"}  # adoptable() changes nothing
    sup.adopt(got)
    assert events[-1][0] == "discovery-adopted" and events[-1][1]["backends"] == ["198.18.1.2-8000", "198.18.1.3-8000"]
    assert [b.name for b in sup.effective(c).services[0].backends] == ["fixed", "198.18.1.2-8000", "198.18.1.3-8000"]
    assert sup.unsettled() == set()
    assert sup.adoptable(lambda s: deployed[s.name]) == {}  # a source with a set adopts nothing more
    # the source's first answer replaces the adopted set as any change does
    verdict = sup._offer("web", Answer((found("198.18.1.2"),)))
    assert verdict.changed and [b.name for b in sup.caches["web"].backends] == ["198.18.1.2-8000"]


def test_nothing_is_adopted_for_a_source_that_answered():
    c = cfg()
    sup = Supervisor(apply=None, emit=lambda *a, **k: None)
    sup.configure(c, {"web": None})
    sup._offer("web", Answer((found("198.18.1.7"),)))
    assert sup.adoptable(lambda s: [(found("198.18.1.2"), 0)]) == {}
