"""edgectl status and undeploy without edged read the sizes of the pinned maps from the pins
themselves, not from the defaults: a node deployed with larger (or smaller) node.max_services,
max_backends, maglev_m and ct_size than the defaults is described and removed whole."""

from __future__ import annotations

import pytest

SIZES = [
    pytest.param({"max_services": 32, "max_backends": 2048, "maglev_m": 1009, "ct_size": 4096}, id="larger"),
    pytest.param({"max_services": 2, "max_backends": 8, "maglev_m": 65537, "ct_size": 1024}, id="smaller"),
]


@pytest.mark.parametrize("node", SIZES)
def test_status_reads_the_sizes_of_the_pins(net, router, node):
    services = [router.service("web"), router.service("chat", vip="198.18.255.2", backend_port=8001)]
    router.deploy(services, node=node)
    snap = router.status()
    assert sorted(s["name"] for s in snap["services"]) == ["chat", "web"]
    assert snap["node"]["maglev_m"] == node["maglev_m"]
    done = router.undeploy()
    assert done.returncode == 0 and not router.pin_path.exists(), done.stderr
