"""Echo requests (ping) to a VIP address, answered by the router in XDP (bpf/include/icmp.h,
icmp_echo), as Katran answers them; node.answer_ping: false hands them to the stack again.

        client ──veth── router ──veth── b0..b2      VIP 198.18.255.1 (not an address of the router)

Real `ping` from the client's namespace, bounded in count and time (-c, -W, -w).
"""

from __future__ import annotations

import re

PINGS = 3


def ping(net, count: int = PINGS) -> int:
    """Echo replies the client's `ping` got from the VIP (count requests, 0.2 s apart, 5 s at most)."""
    done = net.client.run(
        ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "1", "-w", "5", str(net.vip)], check=False
    )
    got = re.search(r"(\d+) received", done.stdout)
    assert got, done.stdout + done.stderr
    return int(got.group(1))


def test_ping_to_a_vip_is_answered_by_the_router(net, router):
    """Every echo request to the VIP is answered from the VIP, counted as icmp_echo; no backend
    sees them (the VIP is no address of the router, so its stack would not answer)."""
    router.deploy([router.service("web")])

    received = ping(net)

    verdicts = router.counters()["verdicts"]
    assert (received, verdicts["icmp_echo"]) == (PINGS, PINGS), verdicts
    assert verdicts["redirect"] == verdicts["nat_pass"] == verdicts["drop"] == 0


def test_with_answer_ping_off_echo_requests_go_to_the_stack(net, router):
    """node.answer_ping: false: the router's XDP leaves echo requests to the stack, which answers for
    a VIP on lo (and only then); icmp_echo stays 0."""
    router.deploy([router.service("web")], node={"answer_ping": False})
    unanswered = ping(net, 2)
    net.router.run(["ip", "addr", "add", f"{net.vip}/32", "dev", "lo"])

    received = ping(net)

    assert (unanswered, received) == (0, PINGS)
    assert router.counters()["verdicts"]["icmp_echo"] == 0
