"""controlplane.probe: the metrics parser (pure), then the probe engine against real servers on
127.0.0.1 (ports chosen by the OS): asyncio HTTP servers that answer, answer 503, answer late or
never, a grpc.aio health server, and ports nobody listens on.

Every server, prober and loop a test starts is closed by the test; every wait polls a condition
with a bound (wait_for), and each test runs under asyncio.wait_for as a last bound.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import controlplane.probe
from controlplane.config import MetricsScrape, Probe
from controlplane.lab.inference.page import EngineStats, vllm_page
from controlplane.probe import MetricsError, Prober, Target, load_from, parse_metrics
from controlplane.samples import Load, Sample
from controlplane.tests.proberstage import (
    LOOPBACK,
    Recorder,
    closing,
    free_port,
    http_probe,
    run,
    started,
    wait_for,
)

PROBE_DIR = os.path.dirname(controlplane.probe.__file__)

# ------------------------------------------------------------ pure: metrics pages

# Two data-parallel engines, then what a real page has besides: a family named like ours plus a
# suffix, the deprecated KV name, a counter's _created sample, a histogram.
VLLM = (
    vllm_page(
        EngineStats(running=3.0, waiting=1.0, kv_usage=0.25, generation_tokens=1000.0),
        EngineStats(running=4.0, waiting=2.0, kv_usage=0.75, generation_tokens=234.0),
    ).encode()
    + b"""\
vllm:num_requests_waiting_by_reason{reason="capacity"} 100.0
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.99
vllm:generation_tokens_created{engine="0",model_name="llama"} 1.7e+09
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 5.0
"""
)

SGLANG = b"""\
# HELP sglang:num_running_reqs The number of running requests.
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 6.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 9.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.28
sglang:generation_tokens_total{model_name="qwen",tp_rank="0"} 7.557572e+06
"""

TGI = b"""\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
tgi_request_success 41
"""


def test_vllm_page_sums_label_sets_takes_the_fullest_kv_cache_and_prefers_current_names():
    load = load_from(parse_metrics(VLLM), t_ns=5)

    assert load == Load(t_ns=5, ok=True, waiting=3.0, running=7.0, kv_usage=0.75, progress=1234.0)
    # waiting_by_reason is another metric; gpu_cache_usage_perc is the deprecated name of kv_cache_usage_perc


def test_vllm_falls_back_to_deprecated_kv_name_and_to_finished_requests_for_progress():
    page = b"""\
vllm:num_requests_waiting{model_name="a"} 0
vllm:gpu_cache_usage_perc{model_name="a"} 0.5
vllm:request_success_total{finished_reason="stop",model_name="a"} 7
vllm:request_success_total{finished_reason="length",model_name="a"} 2
"""
    load = load_from(parse_metrics(page), t_ns=0)

    assert (load.waiting, load.running, load.kv_usage, load.progress) == (0.0, None, 0.5, 9.0)


def test_sglang_and_tgi_names():
    sglang = load_from(parse_metrics(SGLANG), t_ns=0)
    tgi = load_from(parse_metrics(TGI), t_ns=0)

    assert (sglang.waiting, sglang.running, sglang.kv_usage, sglang.progress) == (9.0, 6.0, 0.28, 7.557572e6)
    assert (tgi.waiting, tgi.running, tgi.kv_usage, tgi.progress) == (4.0, 8.0, None, 41.0)


def test_counters_are_read_with_and_without_their_total_suffix():
    assert parse_metrics(b"vllm:generation_tokens_total 5\n") == {"vllm:generation_tokens": 5.0}
    assert parse_metrics(b"vllm:generation_tokens 5\n") == {"vllm:generation_tokens": 5.0}
    both = parse_metrics(b'vllm:generation_tokens{m="a"} 5\nvllm:generation_tokens_total{m="b"} 6\n')
    assert both == {"vllm:generation_tokens": 11.0}


def test_nan_garbage_and_lookalike_lines_are_skipped_and_labels_may_hold_anything():
    page = (
        b"# HELP vllm:num_requests_waiting 99 comment lines are not samples\n"
        b'vllm:num_requests_waiting_by_reason{reason="a"} 50\n'  # another family, with our name as prefix
        b"\x00\xff binary junk \n"
        b'vllm:num_requests_waiting{model_name="a"} NaN\n'
        b'vllm:num_requests_waiting{model_name="b"} garbage\n'
        b'vllm:num_requests_waiting{model_name="c"}\n'
        b'vllm:num_requests_waiting{model_name="d } e",x="{"} 2 1712345678000\n'
        b'vllm:num_requests_waiting{model_name="f"} +Inf\n'
        b"vllm:num_requests_waitingX 50\n"
        b"vllm:num_requests_waiting{unterminated 7\n"
        b"vllm:num_requests_waiting 1\n"
        b"vllm:num_requests_running\t3\r\n"
        b"vllm:kv_cache_usage_perc 0.5"  # the last line has no newline
    )
    assert parse_metrics(page) == {
        "vllm:num_requests_waiting": 3.0,
        "vllm:num_requests_running": 3.0,
        "vllm:kv_cache_usage_perc": 0.5,
    }


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html><body>Not metrics</body></html>\n",
        b"process_cpu_seconds_total 1.5\n",
        b"vllm:num_requests_waiting NaN\n",
    ],
)
def test_a_page_without_engine_metrics_is_an_error(body):
    with pytest.raises(MetricsError, match="no engine metrics"):
        parse_metrics(body)


def test_target_takes_addresses_of_both_families_and_converts_address_objects():
    import ipaddress

    assert Target("k", ipaddress.IPv4Address("10.0.0.1"), 80).address == "10.0.0.1"
    assert Target("k", ipaddress.IPv6Address("2001:2::0:1"), 80).address == "2001:2::1"
    with pytest.raises(ValueError):
        Target("k", "backend.example", 80)  # a name would need DNS on the loop
    with pytest.raises(ValueError):
        Target("k", "10.0.0.1", 0)


# ------------------------------------------------------------ helpers: proberstage.py


# ------------------------------------------------------------ tcp


def test_tcp_probe_of_a_listener_succeeds_and_of_a_closed_port_is_refused():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = Probe(kind="tcp", interval_ms=100, timeout_ms=100)  # slack for a loaded CI
        p.set_targets([Target("up", LOOPBACK, server.port, probe), Target("down", LOOPBACK, free_port(), probe)])
        await wait_for(lambda: len(rec.of("up")) >= 5 and len(rec.of("down")) >= 5, 3, "5 samples each")
        up, down = rec.of("up"), rec.of("down")
        await p.close()
        # Each probe is a new connection. The server counts one when its loop serves the
        # accept, which may come after the probe's sample: wait for the count, with no
        # probe running any more that could add to it.
        await wait_for(
            lambda: server.connections >= 5, 3, "the server counting 5 connections", observe=lambda: server.connections
        )
        await server.close()

        assert all(s.ok and 0 < s.rtt_s < 0.1 for s in up), up
        assert all(not s.ok and s.error == "refused" and s.rtt_s is None for s in down), down

    run(main())


def test_tcp_probe_over_ipv6_loopback():
    """An IPv6 backend is probed over IPv6 (the probe's socket is of its address's family)."""

    async def main() -> None:
        try:
            server = await asyncio.start_server(lambda r, w: w.close(), "::1", 0)
        except OSError:
            pytest.skip("no IPv6 loopback here")
        port = server.sockets[0].getsockname()[1]
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = Probe(kind="tcp", interval_ms=100, timeout_ms=100)
        p.set_targets([Target("up6", "::1", port, probe)])
        await wait_for(lambda: len(rec.of("up6")) >= 3, 3, "3 samples")
        up = rec.of("up6")
        await p.close()
        server.close()
        await server.wait_closed()
        assert all(s.ok and 0 < s.rtt_s < 0.1 for s in up), up

    run(main())


# ------------------------------------------------------------ http


def test_http_probe_is_ok_on_2xx_keeps_its_connection_and_measures_the_answer_time():
    async def main() -> None:
        server = await started(delay_s=0.03)
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        p.set_targets([Target("b", LOOPBACK, server.port, http_probe(interval_ms=250, timeout_ms=250))])
        await wait_for(lambda: len(rec.of("b")) >= 4, 5, "4 samples")
        samples = rec.of("b")[:4]
        await closing(p, server)

        assert all(s.ok for s in samples), samples
        assert all(0.03 <= s.rtt_s < 0.25 for s in samples), samples  # >= the server's delay
        assert server.connections == 1  # kept alive: one request per probe
        times = [s.t_ns for s in samples]
        assert all(0.2e9 <= b - a <= 0.4e9 for a, b in zip(times, times[1:])), times  # every 250 ms

    run(main())


def test_http_failures_say_why_503_404_refused_timeout():
    async def main() -> None:
        sick = await started(pages={"/health": (503, b"loading")})
        hung = await started(hang=True)
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        p.set_targets(
            [
                Target("503", LOOPBACK, sick.port, http_probe()),
                Target("404", LOOPBACK, sick.port, http_probe(path="/v2/health/ready")),
                Target("refused", LOOPBACK, free_port(), http_probe()),
                Target("hung", LOOPBACK, hung.port, http_probe()),
            ]
        )
        keys = ("503", "404", "refused", "hung")
        await wait_for(
            lambda: all(len(rec.of(k)) >= 3 for k in keys),
            3,
            "3 samples each",
            observe=lambda: {k: len(rec.of(k)) for k in keys},
        )
        errors = {k: rec.errors(k) for k in keys}
        oks = [s for k in keys for s in rec.of(k) if s.ok]
        await closing(p, sick, hung)

        assert errors == {"503": {"HTTP 503"}, "404": {"HTTP 404"}, "refused": {"refused"}, "hung": {"timeout"}}
        assert oks == []

    run(main())


def test_a_hanging_backend_never_delays_the_probes_of_another():
    async def main() -> None:
        fast = await started()
        hung = await started(hang=True)
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        p.set_targets(
            [
                Target("fast", LOOPBACK, fast.port, http_probe(interval_ms=20, timeout_ms=20)),
                Target("hung", LOOPBACK, hung.port, http_probe(interval_ms=200, timeout_ms=200)),
            ]
        )
        await wait_for(lambda: rec.of("fast"), 2, "a first sample")
        start = time.monotonic()
        first = len(rec.of("fast"))
        await asyncio.sleep(0.5)  # the measurement window itself
        got = len(rec.of("fast")) - first
        elapsed = time.monotonic() - start
        await wait_for(lambda: rec.of("hung"), 1, "a timeout of the hung backend")
        fast_samples, hung_samples = rec.of("fast"), rec.of("hung")
        await closing(p, fast, hung)

        assert got >= 0.7 * elapsed / 0.02, (got, elapsed)  # about one every 20 ms
        assert all(s.ok for s in fast_samples)
        assert hung_samples and {s.error for s in hung_samples} == {"timeout"}
        times = [s.t_ns for s in fast_samples]
        assert max(b - a for a, b in zip(times, times[1:])) < 0.1e9  # none waited out a 200 ms timeout

    run(main())


def test_http_reconnects_when_the_server_closes_and_reads_chunked_and_split_answers():
    async def main() -> None:
        closer = await started(close_after=True)
        chunked = await started(chunked=True, pages={"/health": (200, b"all systems go")})
        split = await started(split_s=0.02)
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        p.set_targets(
            [
                Target("closer", LOOPBACK, closer.port, http_probe()),
                Target("chunked", LOOPBACK, chunked.port, http_probe()),
                Target("split", LOOPBACK, split.port, http_probe(interval_ms=250, timeout_ms=250)),
            ]
        )
        keys = ("closer", "chunked", "split")
        await wait_for(lambda: all(len(rec.of(k)) >= 3 for k in keys), 3, "3 samples each")
        samples = {k: rec.of(k)[:3] for k in keys}
        connections = (closer.connections, chunked.connections, split.connections)
        await closing(p, closer, chunked, split)

        assert all(s.ok for k in keys for s in samples[k]), samples
        assert connections[0] >= 3 and connections[1:] == (1, 1)
        # The body came 20 ms after the head: the answer is complete only then.
        assert all(0.02 <= s.rtt_s < 0.25 for s in samples["split"]), samples["split"]

    run(main())


def test_the_window_keeps_the_last_probe_window_samples():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        p.set_targets([Target("b", LOOPBACK, server.port, http_probe(window=3))])
        await wait_for(lambda: len(rec.of("b")) >= 6, 3, "6 samples")
        window = p.window("b")
        kept, last = list(window.samples), rec.of("b")[-1]
        await closing(p, server)

        assert window.size == 3 and len(kept) == 3
        assert kept[-1] == last
        assert p.window("nobody") is None

    run(main())


def test_first_probes_of_many_targets_are_spread_over_the_interval():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        start = time.monotonic_ns()
        probe = Probe(kind="tcp", interval_ms=200, timeout_ms=100)
        p.set_targets([Target(i, LOOPBACK, server.port, probe) for i in range(40)])
        await wait_for(lambda: all(rec.of(i) for i in range(40)), 3, "a sample of each")
        firsts = sorted(rec.of(i)[0].t_ns - start for i in range(40))
        await closing(p, server)

        assert firsts[-1] - firsts[0] >= 0.1e9, firsts  # not all at once: over most of the 200 ms
        assert firsts[-1] <= 0.25e9, firsts

    run(main())


# ------------------------------------------------------------ metrics


def test_metrics_scrapes_become_loads_and_failed_scrapes_say_why():
    async def main() -> None:
        server = await started(
            pages={
                "/metrics": (200, VLLM),
                "/sglang": (200, SGLANG),
                "/tgi": (200, TGI),
                "/junk": (200, b"<html>hello</html>"),
            }
        )
        rec = Recorder()
        p = Prober(on_load=rec.load)

        def scrape(path: str) -> MetricsScrape:
            return MetricsScrape(path=path, interval_ms=20, stale_ms=1000)

        p.set_targets(
            [
                Target(k, LOOPBACK, port, None, scrape(path))
                for k, port, path in (
                    ("vllm", server.port, "/metrics"),
                    ("sglang", server.port, "/sglang"),
                    ("tgi", server.port, "/tgi"),
                    ("404", server.port, "/nothing"),
                    ("junk", server.port, "/junk"),
                    ("refused", free_port(), "/metrics"),
                )
            ]
        )
        keys = ("vllm", "sglang", "tgi", "404", "junk", "refused")
        await wait_for(lambda: all(len(rec.loads.get(k, [])) >= 2 for k in keys), 3, "2 loads each")
        last = {k: p.last_load(k) for k in keys}
        windows = {k: p.window(k) for k in keys}
        await closing(p, server)

        assert (last["vllm"].ok, last["vllm"].waiting, last["vllm"].kv_usage) == (True, 3.0, 0.75)
        assert (last["sglang"].waiting, last["tgi"].running) == (9.0, 8.0)
        assert {k: (last[k].ok, last[k].error) for k in ("404", "junk", "refused")} == {
            "404": (False, "HTTP 404"),
            "junk": (False, "no engine metrics"),
            "refused": (False, "refused"),
        }
        assert all(window is None for window in windows.values())  # no probe configured: no window
        assert server.connections == 5  # one kept-alive connection per scraped target

    run(main())


def test_a_metrics_page_that_never_comes_times_out_at_the_interval():
    async def main() -> None:
        hung = await started(hang=True)
        rec = Recorder()
        p = Prober(on_load=rec.load)
        p.set_targets([Target("m", LOOPBACK, hung.port, None, MetricsScrape(interval_ms=30, stale_ms=1000))])
        await wait_for(lambda: len(rec.loads.get("m", [])) >= 2, 3, "2 loads")
        loads = rec.loads["m"]
        await closing(p, hung)

        assert all(not load.ok and load.error == "timeout" for load in loads), loads

    run(main())


# ------------------------------------------------------------ grpc


class GrpcServer:
    """grpc.aio server with the health service: "" and "chat" SERVING, "sick" NOT_SERVING."""

    async def start(self) -> "GrpcServer":
        self.server = grpc.aio.server()
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{LOOPBACK}:0")
        await self.health.set("chat", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("sick", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        return self

    async def close(self) -> None:
        await self.server.stop(None)


def test_grpc_health_probe_is_ok_iff_serving():
    async def main() -> None:
        server = await GrpcServer().start()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)

        def probe(service: str) -> Probe:
            return Probe(kind="grpc", grpc_service=service, interval_ms=250, timeout_ms=250)  # slack for a loaded CI

        p.set_targets(
            [
                Target(k, LOOPBACK, port, probe(service))
                for k, port, service in (
                    ("server", server.port, ""),
                    ("chat", server.port, "chat"),
                    ("sick", server.port, "sick"),
                    ("unknown", server.port, "nope"),
                    ("refused", free_port(), ""),
                )
            ]
        )
        keys = ("server", "chat", "sick", "unknown", "refused")
        await wait_for(
            lambda: all(len(rec.of(k)) >= 3 for k in keys),
            5,
            "3 samples each",
            observe=lambda: {k: rec.errors(k) for k in keys},
        )
        samples = {k: rec.of(k)[-2:] for k in keys}  # the first may include the channel's connect
        await closing(p, server)

        assert all(s.ok and 0 < s.rtt_s < 0.25 for k in ("server", "chat") for s in samples[k]), samples
        assert {s.error for s in samples["sick"]} == {"NOT_SERVING"}
        assert {s.error for s in samples["unknown"]} == {"grpc NOT_FOUND"}
        assert {s.error for s in samples["refused"]} <= {"refused", "unavailable", "timeout"}

    run(main())


# ------------------------------------------------------------ targets and lifecycle


def open_sockets() -> set[str]:
    """socket:[inode] of each socket this process has open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed while we looked
            continue
        if name.startswith("socket:"):
            found.add(name)
    return found


def prober_tasks() -> set[asyncio.Task]:
    """The loop's tasks running code of controlplane/probe/ (the servers have their own)."""

    def code(task: asyncio.Task) -> str:
        return getattr(getattr(task.get_coro(), "cr_code", None), "co_filename", "")

    return {task for task in asyncio.all_tasks() if os.path.dirname(code(task)) == PROBE_DIR}


def test_removed_targets_stop_changed_ones_restart_and_close_leaves_nothing_behind():
    async def main() -> None:
        server = await started()
        grpc_server = await GrpcServer().start()
        sockets_before = open_sockets()
        rec = Recorder()
        p = Prober(on_sample=rec.sample, on_load=rec.load)
        tcp = Target("tcp", LOOPBACK, server.port, Probe(kind="tcp", interval_ms=20, timeout_ms=20))
        web = Target("http", LOOPBACK, server.port, http_probe(), MetricsScrape(path="/health", interval_ms=20))
        rpc = Target("grpc", LOOPBACK, grpc_server.port, Probe(kind="grpc", interval_ms=20, timeout_ms=20))
        p.set_targets([tcp, web, rpc])
        await wait_for(lambda: all(len(rec.of(k)) >= 3 for k in ("tcp", "http", "grpc")), 5, "3 samples each")

        p.set_targets([web])  # tcp and grpc go
        removed = {k: len(rec.of(k)) for k in ("tcp", "grpc")}
        window = p.window("http")
        await asyncio.sleep(0.1)  # five intervals in which the removed targets must stay silent
        assert {k: len(rec.of(k)) for k in ("tcp", "grpc")} == removed
        assert p.window("tcp") is None and p.keys() == ["http"]

        p.set_targets([Target("http", LOOPBACK, server.port, http_probe(window=4))])  # changed: restarted
        assert p.window("http") is window and window.size == 4  # same endpoint: the samples stay
        assert p.last_load("http") is None  # no metrics any more
        count = len(rec.of("http"))
        await wait_for(lambda: len(rec.of("http")) >= count + 3, 3, "samples after the restart")

        await p.close()
        leaked_tasks = prober_tasks()
        # The servers' ends of the prober's connections close when they read the reset.
        await wait_for(
            lambda: not open_sockets() - sockets_before,
            2,
            "no socket left",
            observe=lambda: open_sockets() - sockets_before,
        )
        await server.close()
        await grpc_server.close()

        assert not leaked_tasks
        with pytest.raises(RuntimeError):
            p.set_targets([])

    run(main())


def test_a_callback_that_raises_is_reported_and_probing_goes_on():
    async def main() -> None:
        server = await started()
        reported = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))

        def bad(key: Any, sample: Sample) -> None:
            raise RuntimeError("callback bug")

        p = Prober(on_sample=bad)
        p.set_targets([Target("b", LOOPBACK, server.port, http_probe(window=5))])
        await wait_for(lambda: len(p.window("b").samples) == 5, 3, "a full window")
        await closing(p, server)

        assert reported and isinstance(reported[0]["exception"], RuntimeError)

    run(main())


def test_duplicate_keys_are_refused():
    async def main() -> None:
        p = Prober()
        probe = Probe(kind="tcp")
        with pytest.raises(ValueError, match="given twice"):
            p.set_targets([Target("a", LOOPBACK, 1, probe), Target("a", LOOPBACK, 2, probe)])
        await p.close()

    run(main())
