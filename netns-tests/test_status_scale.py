"""edgectl status at a thousand backends (no edged: the pinned maps' view; edged's view takes
the same statuspage.apply, tested over the API in controlplane/tests/test_status_scale.py):
the summaries by default, a page of one service with --service, --offset and --limit, every
backend with --full, in JSON and in text. No traffic: the backends' block is routed to b0
(deploy needs a route to each backend), no address answers there.
"""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network
from typing import Iterator

import pytest

from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Topo

N = 1000
BLOCK = IPv4Network("198.19.0.0/16")  # clear of the lab's 198.18.x link nets


def address(i: int) -> IPv4Address:
    return BLOCK.network_address + 256 * (i // 250) + i % 250 + 1


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    with Net(Topo(backends=1)) as net:
        net.build()
        with net.router.iproute() as ipr:
            ipr.route("add", dst=str(BLOCK), gateway=str(net.backend_addr(0)))
        router = Router(net)
        service = {
            "name": "big",
            "vip": str(net.vip),
            "port": 8000,
            "backends": [{"name": f"b{i}", "address": str(address(i)), "port": 8000} for i in range(N)],
        }
        small = router.service("small", vip="198.18.255.2")
        router.deploy([service, small], node={"max_backends": 2 * N})
        try:
            yield router
        finally:
            router.undeploy(check=False)


def status(router: Router, *args: str) -> tuple[dict, int]:
    done = router.edgectl("status", "--iface", router.iface, "--json", *args)
    assert done.returncode == 0, done.stderr
    (snap,) = json.loads(done.stdout)
    return snap, len(done.stdout)


def test_a_thousand_backends_show_as_summaries_by_default(router) -> None:
    snap, size = status(router)
    full, full_size = status(router, "--full")
    big = {s["name"]: s for s in snap["services"]}["big"]
    assert snap["summarized"] and big["backends"] == [] and big["backends_total"] == N
    assert big["summary"]["backends"] == N and big["summary"]["up"] == N and big["summary"]["weights_sum"] == N
    assert snap["stopped_early"] == []
    assert not full["summarized"] and len({s["name"]: s for s in full["services"]}["big"]["backends"]) == N
    assert size * 50 < full_size  # the summaries are a small fraction of the whole
    text = router.edgectl("status", "--iface", router.iface)
    assert text.returncode == 0, text.stderr
    assert f"summaries only ({N + len(full['services'][1]['backends'])} backends)" in text.stdout
    assert f"backends {N}: up {N}, down 0, draining 0; weights sum {N}; failovers 0" in text.stdout


def test_a_page_of_one_service(router) -> None:
    snap, _ = status(router, "--service", "big", "--offset", "990", "--limit", "20")
    (big,) = snap["services"]
    assert [b["name"] for b in big["backends"]] == [f"b{i}" for i in range(990, N)]
    assert (big["backends_total"], big["backends_offset"]) == (N, 990)
    text = router.edgectl("status", "--iface", router.iface, "--service", "big", "--limit", "5")
    assert text.returncode == 0, text.stderr
    assert "backends 1-5 of 1000 (--offset, --limit for others)" in text.stdout
    assert sum(f"{address(i)}:8000" in text.stdout for i in range(N)) == 5
    wrong = router.edgectl("status", "--iface", router.iface, "--service", "nope")
    assert wrong.returncode != 0 and "--service: no service 'nope' here" in wrong.stderr
