"""tools/bench-serving's client (controlplane/lab/serving/client.py) against the simulator on
loopback: streamed outcomes, the two client behaviours, failures as outcomes. No root."""

from __future__ import annotations

import asyncio
import socket

from controlplane.lab.inference import Options, run_in_thread
from controlplane.lab.serving.client import Client
from controlplane.lab.serving.workload import Req

LOOPBACK = "127.0.0.1"


def test_streamed_requests_end_as_outcomes_with_ttft_tokens_and_the_backend():
    with run_in_thread(Options(name="s1", host=LOOPBACK, ttft_ms=40, tpot_ms=5, max_running=8)) as h:
        reqs = [Req(i, i * 0.01, 3, 4 + i) for i in range(6)]
        for behaviour, most_conns in (("new", 6), ("pooled", 6)):  # all 6 overlap
            client = Client(LOOPBACK, h.address[1], behaviour, deadline_s=10)
            outs = asyncio.run(client.run(reqs))
            assert [o.i for o in outs] == list(range(6))
            assert all(o.ok and o.backend == "s1" for o in outs), outs
            assert [o.tokens for o in outs] == [4 + i for i in range(6)]
            assert all(0.04 <= o.ttft_s <= o.e2e_s for o in outs)
            assert client.opened <= most_conns
        # one after another: a pooled client rides one connection
        client = Client(LOOPBACK, h.address[1], "pooled", deadline_s=10)
        outs = asyncio.run(client.run([Req(i, i * 0.3, 1, 2) for i in range(3)]))
        assert all(o.ok for o in outs) and client.opened == 1


def test_a_refused_connection_and_a_hung_server_are_failed_outcomes():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        (o,) = asyncio.run(Client(LOOPBACK, port, "new").run([Req(0, 0.0, 1, 2)]))
    assert not o.ok and o.error
    with run_in_thread(Options(name="s2", host=LOOPBACK)) as h:
        h.degrade(hang=True)
        fired = []
        (o,) = asyncio.run(
            Client(LOOPBACK, h.address[1], "new", deadline_s=0.5).run(
                [Req(0, 0.0, 1, 2)], at=[(0.1, lambda: fired.append(1))]
            )
        )
        assert not o.ok and "within 0.5 s" in o.error and fired == [1]
