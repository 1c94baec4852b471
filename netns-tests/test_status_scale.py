"""edgectl status at a thousand backends, from the pinned maps and from an edged that adopts
them: the summaries by default, a page of one service with --service, --offset and --limit,
every backend with --full, in JSON and in text, one shape with or without edged. No traffic:
the backends' block is routed to b0 (deploy needs a route to each backend), no address answers
there.
"""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network
from typing import Iterator

import pytest

from controlplane.lab.daemon import EdgedProc
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
        router.services = [service, small]
        router.deploy(router.services, node={"max_backends": 2 * N})
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


def _shape(snap: dict) -> tuple:
    return sorted(snap), [sorted(s) for s in snap["services"]]


def test_edged_shows_the_same_shape(router, tmp_path) -> None:
    """edged (adopting the deployed maps) answers the same views, in the same shape."""
    sock = str(tmp_path / "edged.sock")
    cfg = router.config(router.services, node={"max_backends": 2 * N, "api_socket": sock})
    with EdgedProc.start(router.net.router, cfg, router.iface) as edged:
        edged.wait_for(lambda e: e["kind"] == "api", 60.0, "the API to listen")
        from_maps, _ = status(router, "--maps")
        from_edged, _ = status(router, "--socket", sock)
        paged, _ = status(router, "--socket", sock, "--service", "big", "--offset", "10", "--limit", "3")
    assert from_edged["summarized"] and _shape(from_edged) == _shape(from_maps)
    big = {s["name"]: s for s in from_edged["services"]}["big"]
    assert big["backends"] == [] and big["summary"]["backends"] == N and big["backends_total"] == N
    (page,) = paged["services"]
    assert [b["name"] for b in page["backends"]] == ["b10", "b11", "b12"] and page["backends"][0]["edged"] is not None
