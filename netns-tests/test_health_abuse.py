"""Health logic a client cannot abuse: crafted frames from the client namespace against real backends.

        client ──veth── router ──veth── b0
      real sockets,   rt-c (XDP)  ├──veth── b1
      and crafted frames          └──veth── b2
      from 198.18.0.77

Each test attacks one rule of the health logic with what any client can send (bad checksums,
bare ACKs, a SYN it never completes, a flood of spoofed ACKs) or with an ordinary failure that
must not spread (a backend's heartbeats stop), then checks with real connections that the
router still judges the backends by what they did: passive detection counts only answers to
SYNs the router forwarded, matched by sequence number; conntrack holds only connections that
began with a SYN; no reply leaves with a backend's address.

Crafted frames are built with scapy and sent out of the client's veth (netns-tests/packets.py), from
CRAFTED_SRC, an address no socket uses. Where a test needs the backends' answers to reach the
client's link, the router gets a static neighbour entry for CRAFTED_SRC (the client's MAC):
the client's kernel drops what is not addressed to it, so nothing answers back, and a capture
on the client's veth sees exactly what the router sent.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import hb
from abuse import (
    ALL,
    HEARTBEAT,
    TOKENS,
    answer,
    crafted_neighbour,
    crafter,
    flows,
    handled,
    two_syn_acks,
    web,
)
from packets import Capture, send_frames
from scapy.layers.inet import TCP

from controlplane.lab.traffic import backends_seen, close_all, open_connections, wait_until

PORT = 8000  # conftest.BACKEND_PORT
PASSIVE = {"syn_timeout_ms": 50, "consecutive": 3, "ejection_ms": 2000, "max_ejected_percent": 50}


def test_bad_checksum_syns_and_bare_acks_eject_no_backend(net, router):
    """Passive detection on, no heartbeats. From 300 fresh client ports: a SYN with a wrong TCP
    checksum (the backend's kernel discards it unanswered) and a bare ACK (answered with RST).
    The bad SYNs are dropped as bad_checksum; the ACKs reach backends and are reset. Once the
    SYN timeout has long passed, 90 real connections all succeed on every backend and nothing
    was ejected: neither unanswered bad SYNs nor RSTs to stray ACKs count against a backend."""
    router.deploy([web(router, {"passive": PASSIVE})])
    wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "flows on every backend")
    before = router.counters()
    frame, frames = crafter(net, router), []
    for port in range(30000, 30300):
        frames.append(frame(TCP(sport=port, dport=PORT, flags="S", seq=1000, chksum=0xBAD)))
        frames.append(frame(TCP(sport=port + 1000, dport=PORT, flags="A", seq=5000, ack=7000)))
    send_frames(net.client, net.client_iface, frames)
    handled(router, before, len(frames))
    time.sleep(4 * PASSIVE["syn_timeout_ms"] / 1000)  # the span a SYN has to be answered in, passed

    seen = flows(net, 90)
    after = router.counters()
    snap = router.status()

    assert set(seen) == ALL, seen
    assert after["verdicts"]["ejection"] == before["verdicts"]["ejection"], snap["services"][0]["backends"]
    assert after["drops"]["bad_checksum"] - before["drops"]["bad_checksum"] == 300
    assert {b["state"] for b in snap["services"][0]["backends"]} == {"up"}


def test_resets_of_reselected_flows_eject_no_survivor(net, router):
    """Heartbeats and passive detection. 30 long-lived connections over the three backends; b0's
    heartbeats stop, so its connections move to b1 and b2 (reselect), which answer them with RST;
    all of them send at once while new connections arrive (SYNs outstanding at the survivors when
    the resets come back). The survivors are not ejected for those resets: new flows reach
    exactly b1 and b2, and the ejection counter does not move."""
    router.deploy([web(router, {"heartbeat": HEARTBEAT, "passive": PASSIVE})])
    agents = [hb.start_heartbeats(net, i, token=TOKENS[i]) for i in range(3)]
    try:
        wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "flows on every backend")
        conns = open_connections(net.client, net.vip, PORT, 30)
        try:
            first = [c.request().backend for c in conns]
            agents[0].stop()
            wait_until(lambda: set(flows(net, 30)) == {"b1", "b2"}, 5.0, "flows avoid b0")
            before = router.counters()
            # Live flows keep a silent backend for twice the timeout: the first of b0's
            # connections to be reset says that has passed.
            probe = conns[first.index("b0")]
            wait_until(lambda: answer(probe).startswith("error:"), 5.0, "a connection of b0 reset")
            with ThreadPoolExecutor(max_workers=len(conns) + 1) as pool:
                during = pool.submit(flows, net, 60)
                pending = [pool.submit(answer, conn) for conn in conns if conn is not probe]
                during.result()
                moved = iter([f.result() for f in pending])
            again = ["error:probe" if conn is probe else next(moved) for conn in conns]
            seen = flows(net, 60)
            after = router.counters()
        finally:
            close_all(conns)
    finally:
        for agent in agents:
            agent.stop()

    assert "b0" in first, first
    assert all(a == f for f, a in zip(first, again) if f != "b0"), (first, again)
    assert all(a.startswith("error:") for f, a in zip(first, again) if f == "b0"), (first, again)
    assert set(seen) == {"b1", "b2"}, seen
    assert after["verdicts"]["ejection"] == before["verdicts"]["ejection"]


def test_a_retransmitted_syn_ack_leaves_with_the_vip_as_its_source(net, router):
    """A SYN from CRAFTED_SRC that is never completed: the backend answers with a SYN-ACK and, with
    no ACK coming, retransmits it a second later. Both SYN-ACKs reach the client's link with the
    VIP as their source, none with the backend's address."""
    router.deploy([web(router, {})])
    syn = crafter(net, router)(TCP(sport=31000, dport=PORT, flags="S", seq=424242))
    with crafted_neighbour(net), Capture([(net.client, net.client_iface)]) as capture:
        send_frames(net.client, net.client_iface, [syn])

        got = two_syn_acks(capture, net.client_iface, 31000, "the SYN-ACK and its retransmission")

    assert set(got) == {(str(net.vip), PORT)}, got


CT_SIZE = 1024  # the smallest conntrack the config allows


def test_a_flood_of_spoofed_acks_does_not_flush_conntrack(net, router):
    """ct_size 1024. 12 long-lived connections over the three backends; then 5 x 1024 bare ACKs
    from fresh spoofed ports, each forwarded to a backend by the table (which resets it); then b1
    is drained (weight 0), which changes the table. A packet that is no SYN and has no conntrack
    entry creates one only within its CPU's budget (64 a second); beyond it it is forwarded by
    its Maglev pick without an entry (stateless: what keeps flows a router inherits through
    ECMP alive; before that it was dropped as untracked), and the backends' RSTs, reverse-NATed
    by the table, make none either: conntrack holds the 12 connections plus exactly the flood's
    packets that were neither stateless nor dropped (once the flood filled it: 908 entries of
    1024, and only the kernel's LRU, which keeps recently used entries, stood between it and the
    connections), and every connection still reaches its first backend (more than 12 when
    none of the first 12 is on b1)."""
    node = {"ct_size": CT_SIZE}
    router.deploy([router.service("web")], node=node)
    conns = open_connections(net.client, net.vip, PORT, 12)
    try:
        first = [c.request().backend for c in conns]
        while "b1" not in first and len(conns) < 48:  # 12 random ports miss b1 in ~0.8% of runs
            conns += open_connections(net.client, net.vip, PORT, 1)
            first.append(conns[-1].request().backend)
        frame = crafter(net, router)
        flood = [frame(TCP(sport=20000 + k, dport=PORT, flags="A", seq=5000, ack=7000)) for k in range(5 * CT_SIZE)]
        before = router.counters()
        send_frames(net.client, net.client_iface, flood)
        handled(router, before, len(flood))
        counted = router.counters()
        untracked = counted["drops"]["untracked"] - before["drops"]["untracked"]
        stateless = counted["verdicts"]["stateless"] - before["verdicts"]["stateless"]
        entries = router.status()["conntrack_entries"]
        router.deploy([router.service("web", weights=[1, 0, 1])], node=node)
        again = [answer(c) for c in conns]
    finally:
        close_all(conns)

    tracked = len(flood) - untracked - stateless  # the budget's entries
    assert stateless > 0, stateless
    assert 0 < tracked < CT_SIZE // 2, (untracked, stateless)
    assert entries == len(conns) + tracked
    assert "b1" in first, first
    assert again == first


def test_panic_mode_spreads_new_flows_over_every_backend_when_too_few_are_usable(net, router):
    """health.panic_percent 50, heartbeats. Only b0 heartbeats: 1 of 3 usable (33 % < 50 %), so new
    flows spread over all three (their servers answer) instead of piling onto b0. b1 heartbeats
    too: 2 of 3 (67 %), no panic, flows reach exactly b0 and b1. Nothing heartbeats: panic, and
    flows reach all three instead of being dropped as no_backend."""
    router.deploy([web(router, {"heartbeat": HEARTBEAT, "panic_percent": 50})])
    agents = [hb.start_heartbeats(net, 0, token=TOKENS[0])]
    try:
        wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "one usable of three: flows on all three")
        panic = flows(net, 90)
        agents.append(hb.start_heartbeats(net, 1, token=TOKENS[1]))
        wait_until(lambda: set(flows(net, 30)) == {"b0", "b1"}, 5.0, "two usable of three: flows on b0 and b1")
        calm = flows(net, 90)
        for agent in agents:
            agent.stop()
        before = router.counters()
        wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "none usable: flows on all three")
        all_down = flows(net, 90)
        dropped = router.counters()["drops"]["no_backend"] - before["drops"]["no_backend"]
    finally:
        for agent in agents:
            agent.stop()

    assert set(panic) == ALL, panic
    assert set(calm) == {"b0", "b1"}, calm
    assert set(all_down) == ALL, all_down
    assert dropped == 0


def test_replayed_heartbeats_do_not_revive_a_silent_backend(net, router):
    """Heartbeats with rise 3. b1 and b2 run agents; b0's heartbeats are sent one at a time from
    its own address with its token (epoch E, seq 1..3): it rises and takes flows. Then it goes
    silent, and new flows avoid it. Someone on b0's link replays those three datagrams, 10 times
    over, and sends one of an older epoch with a higher seq: each is dropped as
    replayed_heartbeat, none is consumed, and b0 takes no new flow. A heartbeat of a newer
    epoch (an agent restarted) is taken again."""
    router.deploy([web(router, {"heartbeat": HEARTBEAT})])
    with hb.b0_beside_agents(net, TOKENS) as sock:
        dst = net.topo.router_backend_addr(0).ip
        epoch = hb.now_epoch()

        def beat(seq: int, at_epoch: int = epoch) -> None:
            hb.send(sock, dst, seq, TOKENS[0], epoch=at_epoch)

        for seq in (1, 2, 3):
            beat(seq)
        wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "b0 risen: flows on every backend")
        wait_until(lambda: set(flows(net, 30)) == {"b1", "b2"}, 5.0, "b0 silent: flows avoid it")
        before = router.counters()
        for _ in range(10):
            for seq in (1, 2, 3):
                beat(seq)
        beat(1000, epoch - 1)
        wait_until(
            lambda: router.counters()["drops"]["replayed_heartbeat"] - before["drops"]["replayed_heartbeat"] >= 31,
            2.0,
            "31 replays dropped",
        )
        after = router.counters()
        seen = flows(net, 60)
        for seq in (0, 1, 2):
            beat(seq, epoch + 1)
        wait_until(
            lambda: router.counters()["verdicts"]["heartbeat"] >= after["verdicts"]["heartbeat"] + 3,
            2.0,
            "a newer epoch taken",
        )

    assert after["drops"]["replayed_heartbeat"] - before["drops"]["replayed_heartbeat"] == 31
    assert set(seen) == {"b1", "b2"}, seen


def test_a_dead_server_behind_passive_detection_costs_one_connection_per_readmission(net, router):
    """Passive detection only (no heartbeats, no probes), ejection 200 ms doubling. b0's server is
    killed; connections are made one at a time. The first `consecutive` (3) reaching b0 are
    refused and eject it. When an ejection ends, b0 gets one trial connection, not more: refused,
    it is ejected again for twice as long. So after E ejections at most 3 + (E - 1) connections
    were refused (on main: 3 per ejection), and every other one reached b1 or b2."""
    passive = {**PASSIVE, "ejection_ms": 200}
    router.deploy([web(router, {"passive": passive})])
    wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "flows on every backend")
    net.servers[0].proc.kill()
    net.servers[0].proc.wait(timeout=5.0)
    before = router.counters()["verdicts"]["ejection"]
    seen: Counter = Counter()

    def ejections() -> int:
        return router.counters()["verdicts"]["ejection"] - before

    def four_ejections() -> bool:
        seen.update(backends_seen(net.client, net.vip, PORT, 20, concurrency=1, flow_timeout_s=1.0))
        return ejections() >= 4

    wait_until(four_ejections, 30.0, "4 ejections", observe=lambda: (ejections(), seen))
    ejected = ejections()

    assert set(seen) - {"error:refused"} == {"b1", "b2"}, seen
    assert seen["error:refused"] <= passive["consecutive"] + ejected - 1, (seen, ejected)
