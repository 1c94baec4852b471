"""metrics.py over real HTTP: a stand-in source shaped like maps.snapshot()
plus edged's view, the endpoint on 127.0.0.1, scrapes parsed by
prometheus_client's own parser. Every server is closed in a finally."""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
import urllib.request
from contextlib import contextmanager

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from controlplane import __version__, abi
from controlplane.edged import metrics, metricsserver
from controlplane.errors import EdgeError
from controlplane.samples import Sample
from controlplane.tests.snapshotstage import realistic_snapshot

SCRAPE_TIMEOUT_S = 5


class Source:
    """Stand-in for edged's source: hands out a copy of snap, or raises."""

    def __init__(self, snap: dict | None = None):
        self.snap = snap if snap is not None else realistic_snapshot()
        self.fail: Exception | None = None
        self.counted = 0  # snapshots asked with a conntrack count
        self.entries: int | None = None  # what a count finds (None: cut by its deadline)
        self.half_open = 0  # and in the half-open tables

    def snapshot(self, count_conntrack: bool = False) -> dict:
        if self.fail is not None:
            raise self.fail
        snap = copy.deepcopy(self.snap)
        if count_conntrack:
            self.counted += 1
            snap["conntrack_entries"] = self.entries
            snap["half_open_entries"] = None if self.entries is None else self.half_open
        return snap


@contextmanager
def endpoint(source, observer: metrics.Observer | None = None, **kw):
    collector = metrics.EdgeCollector(source, observer, iface="eth1", **kw)
    server = metricsserver.start_http("127.0.0.1:0", metrics.make_registry(collector, process=False))
    try:
        yield server
    finally:
        server.close()


def scrape(server: metricsserver.MetricsServer) -> dict:
    """name -> family, parsed from one GET /metrics."""
    url = f"http://{server.address}/metrics"
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as r:
        assert r.status == 200
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict, name: str) -> dict:
    """sample name's values keyed by their labels (a frozenset of items)."""
    return {frozenset(s.labels.items()): s.value for f in fams.values() for s in f.samples if s.name == name}


def value(fams: dict, name: str, **labels):
    return samples(fams, name).get(frozenset(labels.items()))


def be(service: str, backend: str) -> dict:
    return {"service": service, "backend": backend}


def ok(rtt_ms: float, t_ns: int = 0) -> Sample:
    return Sample(t_ns, True, rtt_ms / 1000)


FAILED = Sample(0, False, None, "timeout after 0.05s")


# ---------------------------------------------------------------- from the maps


def test_traffic_counters_are_totals_per_service_and_backend():
    with endpoint(Source()) as server:
        fams = scrape(server)
    for name in ("edge_packets", "edge_bytes", "edge_new_flows", "edge_return_packets", "edge_failovers"):
        assert fams[name].type == "counter"
        assert {s.name for s in fams[name].samples} == {name + "_total"}
        assert {s.labels["service"] + "/" + s.labels["backend"] for s in fams[name].samples} == {
            "llama-70b/h100-a",
            "llama-70b/h100-b",
            "llama-70b/h100-spare",
            "embed/l4-0",
        }
    assert value(fams, "edge_packets_total", **be("llama-70b", "h100-a")) == 120_000
    assert value(fams, "edge_bytes_total", **be("llama-70b", "h100-b")) == 41_000_000
    assert value(fams, "edge_new_flows_total", **be("embed", "l4-0")) == 40
    assert value(fams, "edge_return_packets_total", **be("llama-70b", "h100-a")) == 110_000
    assert value(fams, "edge_failovers_total", **be("llama-70b", "h100-spare")) == 12


def test_drops_by_reason_and_verdicts_cover_every_abi_name_per_service():
    """Every service, and "" for the packets no service was known for, has every reason and
    verdict; summed over services they are the node's counts."""
    with endpoint(Source()) as server:
        fams = scrape(server)
    drops, verdicts = samples(fams, "edge_drops_total"), samples(fams, "edge_verdicts_total")
    services = {"", "llama-70b", "embed"}
    assert {(dict(k)["service"], dict(k)["reason"]) for k in drops} == {
        (s, r) for s in services for r in abi.DROP_NAMES.values()
    }
    assert {(dict(k)["service"], dict(k)["verdict"]) for k in verdicts} == {
        (s, v) for s in services for v in abi.CNT_NAMES.values()
    }
    assert value(fams, "edge_drops_total", service="llama-70b", reason="no_backend") == 4
    assert value(fams, "edge_drops_total", service="embed", reason="no_backend") == 0
    assert value(fams, "edge_drops_total", service="", reason="malformed") == 2
    assert value(fams, "edge_verdicts_total", service="embed", verdict="redirect") == 3_000
    node = Source().snapshot()
    for reason, n in node["drops"].items():
        assert sum(v for k, v in drops.items() if dict(k)["reason"] == reason) == n
    for verdict, n in node["verdicts"].items():
        assert sum(v for k, v in verdicts.items() if dict(k)["verdict"] == verdict) == n
    assert fams["edge_drops"].type == fams["edge_verdicts"].type == "counter"


def test_backend_gauges_up_weights_and_heartbeat_age():
    with endpoint(Source()) as server:
        fams = scrape(server)
    assert fams["edge_backend_up"].type == "gauge"
    assert value(fams, "edge_backend_up", **be("llama-70b", "h100-a")) == 1
    assert value(fams, "edge_backend_up", **be("llama-70b", "h100-b")) == 0
    assert value(fams, "edge_backend_weight", **be("llama-70b", "h100-a")) == 700
    assert value(fams, "edge_backend_config_weight", **be("llama-70b", "h100-a")) == 1
    # embed has no edged view: the config weight comes from edge_be_probe
    assert value(fams, "edge_backend_config_weight", **be("embed", "l4-0")) == 2
    ages = samples(fams, "edge_backend_heartbeat_age_seconds")
    # h100-b never sent a heartbeat, l4-0's service has none: both omitted
    assert ages == {
        frozenset(be("llama-70b", "h100-a").items()): pytest.approx(0.0042),
        frozenset(be("llama-70b", "h100-spare").items()): pytest.approx(0.0971),
    }


def test_load_signals_are_exported_when_known_and_omitted_when_not():
    with endpoint(Source()) as server:
        fams = scrape(server)
    a = be("llama-70b", "h100-a")
    assert value(fams, "edge_backend_queue_waiting", **a) == 3
    assert value(fams, "edge_backend_queue_running", **a) == 12
    assert value(fams, "edge_backend_kv_cache_usage_ratio", **a) == 0.625
    assert value(fams, "edge_backend_hung", **a) == 0
    assert value(fams, "edge_backend_rtt_smoothed_seconds", **a) == pytest.approx(0.0009)
    assert value(fams, "edge_backend_hung", **be("llama-70b", "h100-spare")) == 1
    # h100-spare knows its queue but not its KV cache
    assert value(fams, "edge_backend_queue_waiting", **be("llama-70b", "h100-spare")) == 0
    assert value(fams, "edge_backend_kv_cache_usage_ratio", **be("llama-70b", "h100-spare")) is None
    for name in (
        "edge_backend_queue_waiting",
        "edge_backend_queue_running",
        "edge_backend_kv_cache_usage_ratio",
        "edge_backend_hung",
        "edge_backend_rtt_smoothed_seconds",
    ):
        for unknown in (be("llama-70b", "h100-b"), be("embed", "l4-0")):
            assert value(fams, name, **unknown) is None, (name, unknown)


def test_adaptive_probing_shows_each_backends_probe_interval_and_whether_it_is_relaxed():
    with endpoint(Source()) as server:
        fams = scrape(server)
    a, b = be("llama-70b", "h100-a"), be("llama-70b", "h100-b")
    assert value(fams, "edge_backend_probe_interval_seconds", **a) == 1.0  # real traffic measures it
    assert value(fams, "edge_backend_probe_relaxed", **a) == 1
    assert value(fams, "edge_backend_probe_interval_seconds", **b) == 0.1
    assert value(fams, "edge_backend_probe_relaxed", **b) == 0
    for unknown in (be("embed", "l4-0"), be("llama-70b", "h100-spare")):  # no probe / no edged view
        assert value(fams, "edge_backend_probe_interval_seconds", **unknown) is None
        assert value(fams, "edge_backend_probe_relaxed", **unknown) is None


def test_labels_are_bounded_names_never_addresses():
    with endpoint(Source()) as server:
        fams = scrape(server)
    label_values = {v for f in fams.values() for s in f.samples for v in s.labels.values()}
    addresses = {"198.18.0.10", "198.18.0.11", "198.18.1.2", "198.18.2.2", "198.18.3.2", "198.18.4.2"}
    assert not label_values & addresses
    label_names = {k for f in fams.values() for s in f.samples for k in s.labels}
    assert label_names <= {"service", "backend", "reason", "verdict", "result", "le", "version", "iface", "abi", "map"}


def test_info_names_version_interface_and_abi():
    with endpoint(Source()) as server:
        fams = scrape(server)
    assert samples(fams, "edge_info") == {
        frozenset({"version": __version__, "iface": "eth1", "abi": str(abi.ABI_VERSION)}.items()): 1
    }


# ---------------------------------------------------------------- kept by the observer


def test_rtt_histogram_buckets_are_cumulative_and_count_only_successful_probes():
    observer = metrics.Observer()
    rtts_ms = [0.05, 0.3, 0.3, 0.9, 4, 40, 700, 2500]  # 2.5 s lands above the last bucket, in +Inf only
    for rtt in rtts_ms:
        observer.observe_sample("llama-70b", "h100-a", ok(rtt), 10, None)
    observer.observe_sample("llama-70b", "h100-a", FAILED, 10, None)
    with endpoint(Source(), observer) as server:
        fams = scrape(server)
    assert fams["edge_backend_rtt_seconds"].type == "histogram"
    labels = be("llama-70b", "h100-a")
    buckets = {
        float(dict(k)["le"]): v
        for k, v in samples(fams, "edge_backend_rtt_seconds_bucket").items()
        if dict(k)["backend"] == "h100-a"
    }
    assert sorted(buckets) == [*metrics.RTT_BUCKETS_S, float("inf")]
    counts = [buckets[le] for le in sorted(buckets)]
    assert counts == sorted(counts), "buckets must be cumulative"
    # le=0.0001: 0.05 ms; le=0.0005: + two 0.3 ms; le=0.001: + 0.9 ms; le=0.005: + 4 ms; ...
    assert buckets[0.0001] == 1 and buckets[0.0005] == 3 and buckets[0.001] == 4 and buckets[0.005] == 5
    assert buckets[0.05] == 6 and buckets[1.0] == 7 and buckets[float("inf")] == 8
    assert value(fams, "edge_backend_rtt_seconds_count", **labels) == 8
    assert value(fams, "edge_backend_rtt_seconds_sum", **labels) == pytest.approx(sum(rtts_ms) / 1000)


def test_a_sample_exactly_on_a_bound_is_in_that_bucket():
    observer = metrics.Observer()
    observer.observe_sample("s", "b", Sample(0, True, 0.001), 1, None)
    cumulative, _ = observer.read().rtt[("s", "b")]
    assert cumulative[metrics.RTT_BUCKETS_S.index(0.001)] == 1
    assert cumulative[metrics.RTT_BUCKETS_S.index(0.0005)] == 0


def test_probes_are_counted_by_result():
    observer = metrics.Observer()
    for _ in range(5):
        observer.observe_sample("llama-70b", "h100-b", ok(1), 10, None)
    for _ in range(3):
        observer.observe_sample("llama-70b", "h100-b", FAILED, 10, None)
    with endpoint(Source(), observer) as server:
        fams = scrape(server)
    assert fams["edge_probes"].type == "counter"
    assert value(fams, "edge_probes_total", **be("llama-70b", "h100-b"), result="ok") == 5
    assert value(fams, "edge_probes_total", **be("llama-70b", "h100-b"), result="failed") == 3


def test_sla_violations_count_windows_whose_p99_is_over_target():
    observer = metrics.Observer()
    target_s = 0.010

    def window(backend, *rtts_ms):
        for rtt in rtts_ms:
            observer.observe_sample("llama-70b", backend, FAILED if rtt is None else ok(rtt), 4, target_s)

    window("h100-a", 2, 3, 2, 9)  # p99 of 4 samples is the largest: 9 ms, under
    window("h100-a", 2, 3, 2, 10)  # exactly on target is not over
    window("h100-a", 2, 3, 11, 2)  # 11 ms: one violation
    window("h100-b", 30, 40, 50, 60)  # another backend, same service: one more
    window("h100-b", None, 5, None, None)  # failures are not RTTs: p99 is 5 ms, under
    window("h100-b", None, None, None, None)  # nothing to judge: not a window of the SLA
    window("h100-a", 50, 50, 50)  # three of four: not full, not judged yet
    with endpoint(Source(), observer) as server:
        fams = scrape(server)
        assert value(fams, "edge_sla_windows_total", service="llama-70b") == 5
        assert value(fams, "edge_sla_violations_total", service="llama-70b") == 2
        window("h100-a", 1)  # completes the 50 ms window
        fams = scrape(server)
    assert value(fams, "edge_sla_windows_total", service="llama-70b") == 6
    assert value(fams, "edge_sla_violations_total", service="llama-70b") == 3
    assert fams["edge_sla_violations"].type == "counter"


def test_sla_windows_do_not_overlap_and_restart_when_the_size_changes():
    observer = metrics.Observer()
    for rtt in (50, 1, 1, 1, 1, 1):  # windows of 3: [50 1 1] [1 1 1]: one violation, not four
        observer.observe_sample("s", "b", ok(rtt), 3, 0.010)
    assert observer.read().sla["s"] == (2, 1)
    observer.observe_sample("s", "b", ok(50), 3, 0.010)
    observer.observe_sample("s", "b", ok(1), 2, 0.010)  # probe.window reloaded: [50] is dropped
    observer.observe_sample("s", "b", ok(1), 2, 0.010)
    assert observer.read().sla["s"] == (3, 1)


def test_probe_counts_per_backend_for_status():
    observer = metrics.Observer()
    assert observer.probes("s", "b") == (0, 0)
    for sample in (ok(1), ok(2), Sample(t_ns=0, ok=False, error="timeout")):
        observer.observe_sample("s", "b", sample, 10, None)
    assert observer.probes("s", "b") == (2, 1)
    observer.retain([])
    assert observer.probes("s", "b") == (0, 0)


def test_a_service_without_sla_has_no_sla_series():
    observer = metrics.Observer()
    for _ in range(4):
        observer.observe_sample("embed", "l4-0", ok(500), 2, None)
        observer.observe_sample("llama-70b", "h100-a", ok(1), 2, 0.010)
    with endpoint(Source(), observer) as server:
        fams = scrape(server)
    assert samples(fams, "edge_sla_violations_total") == {frozenset({"service": "llama-70b"}.items()): 0}


def test_weight_pushes_start_at_zero_for_every_deployed_service():
    observer = metrics.Observer()
    with endpoint(Source(), observer) as server:
        assert samples(scrape(server), "edge_weight_pushes_total") == {
            frozenset({"service": "llama-70b"}.items()): 0,
            frozenset({"service": "embed"}.items()): 0,
        }
        observer.weight_pushed("llama-70b")
        observer.weight_pushed("llama-70b")
        fams = scrape(server)
    assert value(fams, "edge_weight_pushes_total", service="llama-70b") == 2
    assert value(fams, "edge_weight_pushes_total", service="embed") == 0


def test_retain_forgets_backends_removed_from_the_config():
    observer = metrics.Observer()
    observer.observe_sample("llama-70b", "h100-a", ok(1), 1, 0.01)
    observer.observe_sample("llama-70b", "h100-old", ok(1), 1, 0.01)
    observer.observe_sample("gone", "x", ok(1), 1, 0.01)
    observer.retain([("llama-70b", "h100-a"), ("llama-70b", "h100-b")])
    seen = observer.read()
    assert set(seen.probes) == {("llama-70b", "h100-a")}
    assert set(seen.sla) == {"llama-70b"}


def test_observer_rejects_an_empty_window():
    with pytest.raises(ValueError):
        metrics.Observer().observe_sample("s", "b", ok(1), 0, None)


@settings(max_examples=60, deadline=None)
@given(
    rtts=st.lists(st.one_of(st.none(), st.floats(0, 3.0)), max_size=60),
    window=st.integers(1, 8),
    target_s=st.floats(0.0001, 1.0),
)
def test_observer_counts_stay_consistent(rtts, window, target_s):
    observer = metrics.Observer()
    for rtt in rtts:
        observer.observe_sample("s", "b", FAILED if rtt is None else Sample(0, True, rtt), window, target_s)
    seen = observer.read()
    cumulative, total_s = seen.rtt[("s", "b")] if rtts else ([0], 0.0)
    good = [r for r in rtts if r is not None]
    assert cumulative == sorted(cumulative) and cumulative[-1] == len(good)
    assert total_s == pytest.approx(sum(good))
    windows, violations = seen.sla.get("s", (0, 0))
    assert violations <= windows <= len(rtts) // window
    full = [rtts[i : i + window] for i in range(0, len(rtts) - window + 1, window)]
    assert windows == sum(1 for w in full if any(r is not None for r in w))
    # for windows of up to 100 samples the nearest-rank p99 is the largest RTT
    assert violations == sum(1 for w in full if any(r is not None and r > target_s for r in w))


# ---------------------------------------------------------------- failures


def test_a_failing_snapshot_counts_an_error_and_the_endpoint_keeps_serving():
    source, observer, errors = Source(), metrics.Observer(), []
    observer.observe_sample("llama-70b", "h100-a", ok(1), 10, None)
    with endpoint(source, observer, on_error=errors.append) as server:
        assert value(scrape(server), "edge_scrape_errors_total") == 0
        source.fail = OSError("edge_be_stats: lookup failed\nsecond line")
        first, second = scrape(server), scrape(server)
        source.fail = None
        recovered = scrape(server)
    assert value(first, "edge_scrape_errors_total") == 1
    assert value(second, "edge_scrape_errors_total") == 2
    # what does not come from the maps is still there; nothing from the maps is
    assert value(second, "edge_probes_total", **be("llama-70b", "h100-a"), result="ok") == 1
    assert len(samples(second, "edge_info")) == 1
    assert samples(second, "edge_packets_total") == {} and samples(second, "edge_drops_total") == {}
    assert value(recovered, "edge_packets_total", **be("llama-70b", "h100-a")) == 120_000
    assert value(recovered, "edge_scrape_errors_total") == 2
    # reported once per new error, on one line
    assert errors == ["metrics: reading the maps failed: OSError: edge_be_stats: lookup failed second line"]


def test_a_malformed_snapshot_shows_nothing_half_read():
    snap = realistic_snapshot()
    del snap["services"][1]["backends"][0]["packets"]  # embed is read after llama-70b
    with endpoint(Source(snap)) as server:
        fams = scrape(server)
    assert value(fams, "edge_scrape_errors_total") == 1
    assert samples(fams, "edge_packets_total") == {}


def test_bind_failure_is_one_line_naming_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(EdgeError) as e:
            metricsserver.start_http(listen, metrics.make_registry(metrics.EdgeCollector(Source()), process=False))
    assert listen in str(e.value) and "\n" not in str(e.value)


def test_close_frees_the_port():
    registry = metrics.make_registry(metrics.EdgeCollector(Source()), process=False)
    server = metricsserver.start_http("127.0.0.1:0", registry)
    listen = server.address
    server.close()
    server.close()  # twice is harmless
    again = metricsserver.start_http(listen, registry)
    again.close()


def test_ipv6_loopback_literal():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 is not configured here")
    server = metricsserver.start_http("[::1]:0", metrics.make_registry(metrics.EdgeCollector(Source()), process=False))
    try:
        assert server.address.startswith("[::1]:")
        assert value(scrape(server), "edge_packets_total", **be("embed", "l4-0")) == 3_000
    finally:
        server.close()


@pytest.mark.parametrize(
    "listen, expected",
    [
        ("127.0.0.1:9470", ("127.0.0.1", 9470)),
        ("[::1]:9470", ("::1", 9470)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_split_listen(listen, expected):
    assert metricsserver.split_listen(listen) == expected


@pytest.mark.parametrize("listen", ["127.0.0.1", "::1:9470", "127.0.0.1:70000", "", "[::1]"])
def test_split_listen_rejects(listen):
    with pytest.raises(EdgeError):
        metricsserver.split_listen(listen)


# ---------------------------------------------------------------- edged's loop


@contextmanager
def running_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop, thread
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_loop_source_reads_on_the_loop_thread():
    with running_loop() as (loop, loop_thread):
        threads = []

        def snap(count_conntrack=False):  # as edged's snapshot()
            threads.append(threading.current_thread())
            return realistic_snapshot()

        with endpoint(metrics.LoopSource(loop, snap)) as server:
            fams = scrape(server)
        assert value(fams, "edge_packets_total", **be("llama-70b", "h100-a")) == 120_000
    assert threads == [loop_thread]


def test_loop_source_awaits_a_coroutine_source_on_the_loop():
    async def snap(count_conntrack=False):
        await asyncio.sleep(0)  # edged awaits its walk of the maps on a worker thread
        return realistic_snapshot()

    with running_loop() as (loop, _):
        with endpoint(metrics.LoopSource(loop, snap)) as server:
            fams = scrape(server)
    assert value(fams, "edge_packets_total", **be("llama-70b", "h100-a")) == 120_000
    assert value(fams, "edge_scrape_errors_total") == 0


def test_loop_source_times_out_when_the_loop_is_busy():
    with running_loop() as (loop, _):
        release = threading.Event()
        loop.call_soon_threadsafe(release.wait, SCRAPE_TIMEOUT_S)  # the loop is stuck until released
        try:
            with endpoint(metrics.LoopSource(loop, realistic_snapshot, timeout_s=0.1)) as server:
                fams = scrape(server)
        finally:
            release.set()
    assert value(fams, "edge_scrape_errors_total") == 1


def test_map_errors_of_edgeds_loops_are_counted_per_map():
    observer = metrics.Observer()
    observer.map_error("edge_vips")
    observer.map_error("edge_vips")
    observer.map_error("edge_be_probe")
    with endpoint(Source(), observer) as server:
        fams = scrape(server)
    assert value(fams, "edge_map_errors_total", map="edge_vips") == 2
    assert value(fams, "edge_map_errors_total", map="edge_be_probe") == 1
    assert value(fams, "edge_map_errors_total", map="edge_ct") == 0


def test_fleet_gauges_only_with_a_fleet():
    with endpoint(Source()) as server:
        fams = scrape(server)
    assert samples(fams, "edge_fleet_connected") == {}
    snap = realistic_snapshot()
    snap["fleet"] = {"connected": False, "is_leader": False, "version": 7, "faults": 3, "refused": 2}
    with endpoint(Source(snap)) as server:
        fams = scrape(server)
    assert value(fams, "edge_fleet_connected") == 0
    assert value(fams, "edge_fleet_leader") == 0
    assert value(fams, "edge_fleet_snapshot_version") == 7
    assert value(fams, "edge_fleet_faults_total") == 3
    assert value(fams, "edge_fleet_refused_total") == 2


def test_wire_signals_are_histograms_in_seconds_from_the_log2_buckets_and_a_gauge():
    snap = realistic_snapshot()
    hs, fb = [0] * abi.WIRE_BUCKETS, [0] * abi.WIRE_BUCKETS
    hs[6], hs[14] = 90, 10  # 64..128 us, 16.4..32.8 ms
    fb[18] = 4  # 0.26..0.52 s
    snap["services"][0]["backends"][0]["wire"] = {
        "handshake_buckets": hs,
        "first_byte_buckets": fb,
        "handshake_sum_s": 0.25,
        "first_byte_sum_s": 1.5,
        "opened": 12,
        "closed": 9,
        "active": 3,
    }
    with endpoint(Source(snap)) as server:
        fams = scrape(server)
    assert fams["edge_backend_handshake_seconds"].type == fams["edge_backend_first_byte_seconds"].type == "histogram"
    assert fams["edge_backend_active_flows"].type == "gauge"
    a = be("llama-70b", "h100-a")
    assert value(fams, "edge_backend_handshake_seconds_bucket", **a, le="0.000128") == 90
    assert value(fams, "edge_backend_handshake_seconds_bucket", **a, le="0.016384") == 90
    assert value(fams, "edge_backend_handshake_seconds_bucket", **a, le="0.032768") == 100
    assert value(fams, "edge_backend_handshake_seconds_bucket", **a, le="+Inf") == 100
    assert value(fams, "edge_backend_handshake_seconds_count", **a) == 100
    assert value(fams, "edge_backend_handshake_seconds_sum", **a) == pytest.approx(0.25)
    assert value(fams, "edge_backend_first_byte_seconds_bucket", **a, le="0.524288") == 4
    assert value(fams, "edge_backend_active_flows", **a) == 3
    # a snapshot without wire signals (an older reader, a test source) shows none
    assert value(fams, "edge_backend_active_flows", **be("embed", "l4-0")) is None


def test_conntrack_fill_is_counted_at_most_every_30_s_and_the_capacity_always_shown(monkeypatch):
    source = Source()
    source.snap["node"] = {**source.snap.get("node", {}), "ct_size": 262144}
    source.entries = 1234
    collector = metrics.EdgeCollector(source, iface="eth1")
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])

    def gauges() -> tuple:
        fams = {f.name: f for f in collector.collect()}
        one = lambda name: [s.value for s in fams[name].samples]  # noqa: E731
        return one("edge_conntrack_entries"), one("edge_conntrack_capacity")

    assert gauges() == ([1234], [262144])
    source.entries = 5000
    clock[0] += 10
    assert gauges() == ([1234], [262144]) and source.counted == 1  # not walked again within 30 s
    clock[0] += 25
    assert gauges() == ([5000], [262144]) and source.counted == 2
    source.entries = None  # a walk cut by its deadline keeps the last complete count
    clock[0] += 31
    assert gauges() == ([5000], [262144]) and source.counted == 3


def test_half_open_entries_are_a_gauge_of_their_own_counted_with_conntrack(monkeypatch):
    """SYNs waiting for their handshake (edge_half_open, edge_half_open6) are not conntrack's
    connections: their own gauge, counted and kept with edge_conntrack_entries."""
    source = Source()
    source.entries, source.half_open = 1234, 56
    collector = metrics.EdgeCollector(source, iface="eth1")
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])

    def gauges() -> tuple:
        fams = {f.name: f for f in collector.collect()}
        one = lambda name: [s.value for s in fams[name].samples]  # noqa: E731
        return one("edge_conntrack_entries"), one("edge_half_open_entries")

    assert gauges() == ([1234], [56])
    source.half_open = 999
    clock[0] += 10
    assert gauges() == ([1234], [56])  # not walked again within 30 s
    source.entries = None  # a walk cut by its deadline keeps the last complete counts
    clock[0] += 31
    assert gauges() == ([1234], [56])
