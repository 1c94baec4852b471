"""VIP announcement without root: the decision table (announce.decide), the Announcer's
bookkeeping, node.bgp config errors, and the BIRD config edged writes (parsed by bird itself
when it is installed)."""

from __future__ import annotations

import asyncio
import errno
import shutil
import subprocess
from ipaddress import IPv4Address, IPv6Address
from typing import NamedTuple

import pytest

from controlplane.config import parse_config
from controlplane.edged import bird
from controlplane.edged.announce import Announcer, Decision, NodeState, ServiceState, decide, describe_change
from controlplane.errors import ConfigError, SpeakerError

VIP1, VIP2 = IPv4Address("198.18.255.1"), IPv4Address("198.18.255.2")


def node(attached=True, serving=True, drained=False, usable=(2, 1)) -> NodeState:
    """chat and embed on VIP1 (usable[0], usable[1] usable backends), batch on VIP2 (1)."""
    return NodeState(
        attached,
        serving,
        drained,
        (
            ServiceState("chat", VIP1, usable[0]),
            ServiceState("embed", VIP1, usable[1]),
            ServiceState("batch", VIP2, 1),
        ),
    )


class Case(NamedTuple):
    description: str
    state: NodeState
    announce: set
    withdrawn: dict


CASES = [
    Case("attached, serving, backends up: every VIP", node(), {VIP1, VIP2}, {}),
    Case("one service of a VIP down, the other up: still announced", node(usable=(0, 1)), {VIP1, VIP2}, {}),
    Case("every backend of a VIP down: withdrawn", node(usable=(0, 0)), {VIP2}, {VIP1: "no usable backend"}),
    Case("drain-node: all withdrawn", node(drained=True), set(), {VIP1: "node drained", VIP2: "node drained"}),
    Case(
        "not serving (stopping): all withdrawn",
        node(serving=False),
        set(),
        {VIP1: "edged not serving", VIP2: "edged not serving"},
    ),
    Case(
        "data path detached: all withdrawn",
        node(attached=False),
        set(),
        {VIP1: "data path not attached", VIP2: "data path not attached"},
    ),
    Case(
        "detached wins over drained in the reason",
        node(attached=False, drained=True),
        set(),
        {VIP1: "data path not attached", VIP2: "data path not attached"},
    ),
    Case("no services: nothing", NodeState(True, True, False, ()), set(), {}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.description)
def test_decide(case):
    d = decide(case.state)
    assert d.announce == frozenset(case.announce)
    assert d.withdrawn == case.withdrawn


def test_decide_is_a_pure_function_of_the_state():
    assert decide(node()) == decide(node())


def test_describe_change_names_what_moved_and_why():
    d = decide(node(usable=(0, 0)))
    assert describe_change(frozenset({VIP1, VIP2}), d) == "withdrew 198.18.255.1 (no usable backend)"
    assert describe_change(frozenset(), d) == "announced 198.18.255.2"


class Recorder:
    """A speaker that remembers what it was told (the Announcer's bookkeeping, not BGP)."""

    def __init__(self, fail: bool = False):
        self.calls: list[frozenset] = []
        self.fail = fail
        self.pid, self.status, self.withdrawals, self.starts = 100, None, 0, 0

    async def announce(self, vips):
        if isinstance(self.fail, BaseException):
            raise self.fail
        if self.fail:
            raise SpeakerError("node.bgp.control_socket: birdc configure: 8002 syntax error")
        self.calls.append(frozenset(vips))

    def exited(self):
        return self.status

    async def restart(self):
        self.status, self.pid, self.starts = None, self.pid + 1, self.starts + 1

    async def withdraw_safely(self):
        self.withdrawals += 1
        return "birdc disable edge_vips"


def test_announcer_tells_the_speaker_only_changes():
    events = []
    sp = Recorder()
    a = Announcer(sp, node, lambda kind, text, **f: events.append((kind, text)))

    async def go():
        await a.sync()
        await a.sync()  # same decision: not told again
        await a.sync(node(drained=True))
        await a.withdraw_all("edged stopping")  # nothing announced: nothing to tell

    asyncio.run(go())
    assert sp.calls == [frozenset({VIP1, VIP2}), frozenset()]
    assert [k for k, _ in events] == ["bgp", "bgp"]
    assert "node drained" in events[1][1]


def test_a_failing_speaker_keeps_the_old_announcement_and_retries():
    sp = Recorder(fail=True)
    a = Announcer(sp, node, lambda *a, **k: None)
    with pytest.raises(SpeakerError):
        asyncio.run(a.sync())
    assert a.announced == frozenset()
    sp.fail = False
    asyncio.run(a.sync())
    assert a.announced == frozenset({VIP1, VIP2})


def test_any_error_telling_the_speaker_withdraws_safely_and_the_task_lives_on():
    """/run full while bird.conf is written: an OSError, not a SpeakerError. It used to end the
    announcer's task with the VIP still announced."""
    events = []
    sp = Recorder()
    a = Announcer(sp, node, lambda kind, text, **f: events.append((kind, text, f)), poll_s=0.01)

    async def go():
        await a.sync()
        assert a.announced == frozenset({VIP1, VIP2})
        sp.fail = OSError(errno.ENOSPC, "No space left on device")
        task = asyncio.create_task(a.run())
        a.poke()
        with pytest.raises(SpeakerError):
            await a.sync(node(drained=True))
        await asyncio.sleep(0.1)  # the task fails on every poll and goes on
        alive = not task.done()
        view = a.view()
        sp.fail = False
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return alive, view

    alive, view = asyncio.run(go())
    assert alive
    assert sp.withdrawals >= 1
    failed = [f for k, t, f in events if k == "bgp-speaker" and not f["ok"]]
    assert failed[0]["error"] == "node.bgp.config_file: No space left on device"
    assert failed[0]["withdrawn"] == sorted([str(VIP1), str(VIP2)])
    assert view["announced"] == [] and view["speaker_problem"]
    # the speaker works again: the decision (announce both) is told to it again
    assert a.announced == frozenset({VIP1, VIP2}) and not a.problem
    assert any(k == "bgp-speaker" and f["ok"] for k, t, f in events)


def test_a_dead_speaker_is_noticed_restarted_and_told_again():
    events = []
    sp = Recorder()
    a = Announcer(sp, node, lambda kind, text, **f: events.append((kind, text, f)))

    async def go():
        await a.sync()
        sp.status = -9  # killed
        await a.keep_speaker(100.0)
        assert a.announced == frozenset() and sp.starts == 1
        await a.sync()

    asyncio.run(go())
    texts = [t for k, t, f in events if k == "bgp-speaker"]
    assert texts[0].startswith("bgp: bird (pid 100) exited with status -9; the upstream withdraws")
    assert texts[1] == "bgp: bird restarted (pid 101, restart 1)"
    assert sp.calls == [frozenset({VIP1, VIP2})] * 2 and a.restarts == 1


# ---- node.bgp in the config


def doc(bgp: dict | None) -> dict:
    d = {
        "version": 1,
        "node": {},
        "services": [
            {
                "name": "chat",
                "vip": str(VIP1),
                "port": 80,
                "backends": [{"name": "a", "address": "198.18.1.2", "port": 80}],
            }
        ],
    }
    if bgp is not None:
        d["node"]["bgp"] = bgp
    return d


GOOD = {"local_as": 65001, "peers": [{"address": "198.18.32.1", "remote_as": 65000}]}


def test_bgp_defaults():
    cfg = parse_config(doc(GOOD)).node.bgp
    assert (cfg.speaker, cfg.hold_time_s, cfg.bfd, cfg.bfd_interval_ms, cfg.bfd_multiplier) == ("bird", 3, True, 100, 3)
    assert parse_config(doc(None)).node.bgp is None


@pytest.mark.parametrize(
    "bgp, error",
    [
        ({"peers": GOOD["peers"]}, "node.bgp.local_as: missing"),
        ({"local_as": 65001}, "node.bgp.peers: missing"),
        ({**GOOD, "local_as": 0}, "node.bgp.local_as: 0 is not an AS number"),
        ({**GOOD, "speaker": "quagga"}, "node.bgp.speaker: expected one of bird, got 'quagga'"),
        ({**GOOD, "hold_time_s": 1}, "node.bgp.hold_time_s: 1 is out of range 3..65535"),
        ({**GOOD, "peers": [{"address": "198.18.32.1"}]}, "node.bgp.peers[0].remote_as: missing"),
        (
            {**GOOD, "peers": [{"address": "fe80::1", "remote_as": 1}]},
            "node.bgp.peers[0].address: fe80::1 is a link-local address",
        ),
        ({**GOOD, "peers": GOOD["peers"] * 2}, "node.bgp.peers[1].address: 198.18.32.1 is already peers[0]"),
        ({**GOOD, "bfd": "yes"}, "node.bgp.bfd: expected true or false, got 'yes'"),
        ({**GOOD, "control_socket": "bird.ctl"}, "node.bgp.control_socket: expected an absolute path, got 'bird.ctl'"),
        (
            {**GOOD, "port": 179},
            "node.bgp.port: unknown key (allowed: speaker, local_as, router_id, peers, "
            "hold_time_s, bfd, bfd_interval_ms, bfd_multiplier, config_file, control_socket)",
        ),
    ],
)
def test_bgp_errors_name_the_field(bgp, error):
    with pytest.raises(ConfigError) as e:
        parse_config(doc(bgp))
    assert str(e.value) == error


# ---- the BIRD config


def bgp_cfg(**kw):
    return parse_config(doc({**GOOD, "router_id": "198.18.32.2", **kw})).node.bgp


def test_render_announces_exactly_the_vips_sorted():
    text = bird.render(bgp_cfg(), [VIP2, VIP1, VIP2])
    assert text.index(f"route {VIP1}/32 blackhole;") < text.index(f"route {VIP2}/32 blackhole;")
    assert text.count("blackhole") == 2
    assert "neighbor 198.18.32.1 as 65000;" in text and "local as 65001;" in text
    assert "bfd on;" in text and "multiplier 3;" in text and "hold time 3;" in text
    assert bird.render(bgp_cfg(), []).count("blackhole") == 0


def test_render_without_bfd_has_no_bfd():
    assert "bfd" not in bird.render(bgp_cfg(bfd=False), [VIP1])


@pytest.mark.skipif(shutil.which("bird") is None, reason="bird2 is not installed (tools/bootstrap installs it)")
@pytest.mark.parametrize("vips", [[], [VIP1, VIP2]], ids=["none", "two"])
def test_bird_parses_what_render_writes(tmp_path, vips):
    conf = tmp_path / "bird.conf"
    conf.write_text(bird.render(bgp_cfg(), vips))
    res = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr


def test_write_atomically_replaces_the_file(tmp_path):
    path = tmp_path / "sub" / "bird.conf"
    bird.write_atomically(str(path), "a\n")
    bird.write_atomically(str(path), "b\n")
    assert path.read_text() == "b\n" and [p.name for p in path.parent.iterdir()] == ["bird.conf"]


def test_decision_default_is_empty():
    assert Decision(frozenset()).withdrawn == {}


def test_a_data_path_that_is_not_whole_withdraws_with_its_problem():
    state = NodeState(
        True,
        True,
        False,
        (ServiceState("chat", VIP1, 2),),
        problem="eth0: XDP is not attached (the interface was made again?)",
    )
    assert decide(state).withdrawn == {VIP1: "not serving: eth0: XDP is not attached (the interface was made again?)"}


@pytest.mark.parametrize(
    "old, new, error",
    [
        (None, GOOD, "node.bgp: added; a reload cannot start the BGP speaker (restart edged)"),
        (GOOD, None, "node.bgp: removed; a reload cannot stop the BGP speaker (restart edged)"),
        (
            GOOD,
            {**GOOD, "control_socket": "/run/x.ctl"},
            "node.bgp.control_socket: changed from "
            "/run/edge/bird.ctl to /run/x.ctl; a reload cannot move the running speaker (restart edged)",
        ),
        (GOOD, {**GOOD, "hold_time_s": 9, "peers": [{"address": "198.18.32.9", "remote_as": 1}]}, None),
        (None, None, None),
    ],
)
def test_what_a_reload_may_change_in_node_bgp(old, new, error):
    def bgp(d):
        return parse_config(doc(d)).node.bgp

    if error is None:
        bird.Bird.check_change(bgp(old), bgp(new))
        return
    with pytest.raises(ConfigError) as e:
        bird.Bird.check_change(bgp(old), bgp(new))
    assert str(e.value) == error


def _with_ipv6_service(d: dict) -> dict:
    d["services"].append(
        {
            "name": "chat6",
            "vip": "2001:2::1",
            "port": 80,
            "backends": [{"name": "a", "address": "2001:2:1::2", "port": 80}],
        }
    )
    return d


def test_an_ipv6_vip_without_an_ipv6_peer_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        parse_config(_with_ipv6_service(doc(GOOD)))
    assert str(e.value) == (
        "services[1].vip: 2001:2::1 cannot be announced: node.bgp.peers has no IPv6 peer "
        "(a session carries the VIPs of its own family)"
    )


def test_an_ipv4_vip_without_an_ipv4_peer_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        parse_config(doc({**GOOD, "peers": [PEER6]}))
    assert str(e.value).startswith("services[0].vip: 198.18.255.1 cannot be announced: node.bgp.peers has no IPv4 peer")


PEER6 = {"address": "2001:2:0:20::1", "remote_as": 65000}


def bgp6_cfg():
    d = _with_ipv6_service(doc({**GOOD, "router_id": "198.18.32.2", "peers": [*GOOD["peers"], PEER6]}))
    return parse_config(d).node.bgp


def test_render_sends_ipv6_vips_as_128s_over_ipv6_sessions_only():
    vip6 = IPv6Address("2001:2::1")
    text = bird.render(bgp6_cfg(), [VIP1, vip6])
    assert f"route {VIP1}/32 blackhole;" in text and f"route {vip6}/128 blackhole;" in text
    peer4, peer6 = text.split("protocol bgp ")[1:]
    assert (
        "neighbor 198.18.32.1 as 65000;" in peer4
        and 'ipv4 { import none; export where proto = "edge_vips"; };' in peer4
    )
    assert "ipv6" not in peer4
    assert "neighbor 2001:2:0:20::1 as 65000;" in peer6
    assert 'ipv6 { import none; export where proto = "edge_vips_v6"; };' in peer6 and "ipv4" not in peer6
    static6 = text.split("protocol static edge_vips_v6 {")[1].split("}")[0]
    assert static6.split() == ["ipv6;", "route", f"{vip6}/128", "blackhole;"]


@pytest.mark.skipif(shutil.which("bird") is None, reason="bird2 is not installed (tools/bootstrap installs it)")
def test_bird_parses_what_render_writes_with_ipv6(tmp_path):
    conf = tmp_path / "bird.conf"
    conf.write_text(bird.render(bgp6_cfg(), [VIP1, IPv6Address("2001:2::1")]))
    res = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr


def test_a_decision_over_both_families_is_described_ipv4_first():
    """Addresses of two families do not compare: describing a change that announces an IPv4 and an
    IPv6 VIP at once raised TypeError before, and the announcer never told bird."""
    vip6 = IPv6Address("2001:2::1")
    d = decide(NodeState(True, True, False, (ServiceState("chat6", vip6, 1), ServiceState("chat", VIP1, 1))))
    assert describe_change(frozenset(), d) == f"announced {VIP1}, {vip6}"
    gone = decide(NodeState(True, True, True, (ServiceState("chat6", vip6, 1), ServiceState("chat", VIP1, 1))))
    assert describe_change(d.announce, gone) == f"withdrew {VIP1} (node drained), {vip6} (node drained)"
