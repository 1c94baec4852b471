"""Heartbeats a peer cannot forge: what someone on a backend's link (another backend, anything
spoofing one) can do with heartbeats it sees or makes, against real agents and real flows.

        client ──veth── router ──veth── b0   agent 198.18.1.2 → 198.18.1.1:7946 (or one at a time)
                           ├────veth── b1   agent
                           └────veth── b2   agent

Each heartbeat carries a MAC over its contents under its backend's own key (abi.heartbeat), and
its epoch (the sender's clock) must be within the service's window of the router's clock.
"""

from __future__ import annotations

import time

import hb
from abuse import ALL, HEARTBEAT, TOKENS, flows, web

from controlplane import abi
from controlplane.lab.traffic import wait_until

EPOCH_OFFSET = 12  # of the epoch in abi.HEARTBEAT: magic 4, version 2, port 2, seq 4


def test_a_heartbeat_from_far_in_the_future_does_not_lock_out_the_agent(net, router):
    """All three agents run. One heartbeat for b0 from b0's address, made with b0's own key, says
    epoch 0xffffffff (a sender with a broken clock, or one that holds the key): it is refused,
    and b0's agent keeps it in service (on the code before, it was taken, and from then on
    every heartbeat of the real agent counted as replayed: b0 went down for good)."""
    router.deploy([web(router, {"heartbeat": HEARTBEAT})])
    agents = [hb.start_heartbeats(net, i, token=TOKENS[i]) for i in range(3)]
    sock = hb.hb_socket(net.backends[0], net.backend_addr(0), forge=True)
    try:
        wait_until(lambda: set(flows(net, 30)) == ALL, 5.0, "flows on every backend")
        hb.send(sock, net.topo.router_backend_addr(0).ip, 1, TOKENS[0], epoch=0xFFFFFFFF)
        time.sleep(4 * HEARTBEAT["timeout_ms"] / 1000)  # long enough for b0 to go down if it would
        seen = flows(net, 60)
    finally:
        sock.close()
        for agent in agents:
            agent.stop()

    assert set(seen) == ALL, seen


def test_a_heartbeat_altered_on_the_wire_is_refused(net, router):
    """b1 and b2 run agents; b0 has none. Someone on b0's link took one heartbeat of b0 (epoch E,
    seq 1: made here with b0's key) and sends it with the epoch changed to E + 1, E + 2, E + 3,
    keeping everything else. None is consumed, each is dropped as spoofed_heartbeat, and b0
    takes no flow (on the code before, the token was a bearer secret: whoever saw one heartbeat
    could make any, and b0 rose)."""
    router.deploy([web(router, {"heartbeat": HEARTBEAT})])
    with hb.b0_beside_agents(net, TOKENS) as sock:
        dst = (str(net.topo.router_backend_addr(0).ip), hb.HB_PORT)
        epoch = hb.now_epoch()
        taken = bytearray(abi.heartbeat(hb.SERVICE_PORT, 1, TOKENS[0], epoch))
        wait_until(lambda: set(flows(net, 30)) == {"b1", "b2"}, 5.0, "flows on b1 and b2")
        before = router.counters()
        for k in (1, 2, 3):
            taken[EPOCH_OFFSET : EPOCH_OFFSET + 4] = (epoch + k).to_bytes(4, "big")
            sock.sendto(bytes(taken), dst)
        wait_until(
            lambda: (
                router.counters()["drops"]["spoofed_heartbeat"] + router.counters()["verdicts"]["heartbeat"]
                >= before["drops"]["spoofed_heartbeat"] + before["verdicts"]["heartbeat"] + 3
            ),
            2.0,
            "the three heartbeats judged",
        )
        after = router.counters()
        seen = flows(net, 60)

    assert after["drops"]["spoofed_heartbeat"] - before["drops"]["spoofed_heartbeat"] == 3
    assert set(seen) == {"b1", "b2"}, seen
