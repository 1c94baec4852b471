"""edged writes new_flows least_loaded's scales (steer.py, _write_open_scales): each backend's
learned slots into the data path's edge_inflight third part (select.h, open_cost), only where
one changed, again after a reload, and not at all for a service that does not choose by counts."""

from __future__ import annotations

from controlplane import abi
from controlplane.samples import Load
from controlplane.tests.edgedstage import FakeMaps, config, daemon, on_loop

T0 = 10**12
MS = 1_000_000
METRICS = {"health": {"metrics": {"path": "/metrics", "interval_ms": 100}}}


def scraped(d, running: dict[str, float], t_ns: int = T0) -> None:
    for name, n in running.items():
        d.steering.on_load(("web", name), Load(t_ns=t_ns, ok=True, waiting=0.0, running=n))


def test_least_loaded_scales_follow_the_learned_slots_and_are_written_only_when_they_change():
    def test():
        d = daemon(config(**METRICS))  # new_flows auto: least_loaded (metrics, no BGP, no fleet)
        st, maps = d.state.services["web"], d.state.maps
        assert st.service.new_flows == "least_loaded" and isinstance(maps, FakeMaps)
        _, bids = maps.ids("web")
        scraped(d, {"b0": 4.0, "b1": 2.0})  # b2 never seen busy: the median's
        d.steering.step(st, T0)
        one = abi.OPEN_SCALE_ONE
        assert maps.open_scale == {bids["b0"]: 0, bids["b1"]: one, bids["b2"]: round(one * 4 / 3) - one}
        maps.open_scale.clear()
        d.steering.step(st, T0 + 100 * MS)
        assert maps.open_scale == {}  # nothing changed, nothing written
        scraped(d, {"b2": 4.0}, T0 + 200 * MS)
        d.steering.step(st, T0 + 200 * MS)
        assert maps.open_scale == {bids["b2"]: 0}
        maps.open_scale.clear()
        d.steering.set_services(d.state.cfg)  # a reload may renumber: every scale again
        d.steering.step(st, T0 + 300 * MS)
        assert set(maps.open_scale) == set(bids.values())

    on_loop(test)


def test_no_scales_for_a_service_that_picks_by_maglev():
    def test():
        d = daemon(config(**METRICS, new_flows="maglev"))
        scraped(d, {"b0": 4.0, "b1": 2.0})
        d.steering.step(d.state.services["web"], T0)
        assert d.state.maps.open_scale == {}

    on_loop(test)
