"""The prober's adaptive rate (Prober.relax): relaxed targets are probed every
probe.relaxed_ms, a failure brings the full rate back at once, scrapes keep their interval,
and the timer wheel neither loses nor doubles a probe when the rate changes; edged's
pace_probes() and the config key. Real servers on 127.0.0.1, as in test_prober.py.

Intervals are chosen so that the relaxed and the full rate differ by 10x or more: the
assertions are about which schedule a probe follows, with that margin, not about timings.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from controlplane.config import MetricsScrape, Probe, parse_config
from controlplane.edged import daemon as edged
from controlplane.errors import ConfigError
from controlplane.probe import Prober, Target
from controlplane.tests.proberstage import LOOPBACK, Recorder, closing, run, started, wait_for

MS = 1_000_000
FAR_NS = 3600 * 10**9  # relaxed for the whole test


def relaxing(
    kind: str = "http", interval_ms: int = 20, relaxed_ms: int = 400, rise: int = 2, timeout_ms: int | None = None
) -> Probe:
    return Probe(
        kind=kind,
        path="/health",
        interval_ms=interval_ms,
        timeout_ms=timeout_ms or interval_ms,
        rise=rise,
        fall=3,
        relaxed_interval_ms=relaxed_ms,
    )


def gaps_ns(samples) -> list[int]:
    return [b.t_ns - a.t_ns for a, b in zip(samples, samples[1:])]


# ------------------------------------------------------------ config


def test_relaxed_interval_defaults_to_ten_intervals_capped_and_never_below_the_interval():
    assert Probe(interval_ms=100, timeout_ms=50).relaxed_ms == 1000
    assert Probe(interval_ms=500, timeout_ms=50).relaxed_ms == 2000  # the cap
    assert Probe(interval_ms=5000, timeout_ms=50).relaxed_ms == 5000  # never faster than the full rate
    assert Probe(interval_ms=100, timeout_ms=50, relaxed_interval_ms=300).relaxed_ms == 300


def test_a_relaxed_interval_below_the_interval_is_refused_with_its_path():
    doc = {
        "version": 1,
        "services": [
            {
                "name": "web",
                "vip": "198.18.0.10",
                "port": 80,
                "health": {"probe": {"interval_ms": 100, "timeout_ms": 50, "relaxed_interval_ms": 50}},
                "backends": [{"name": "b0", "address": "198.18.1.2", "port": 80}],
            }
        ],
    }
    with pytest.raises(ConfigError, match=r"services\[0\]\.health\.probe\.relaxed_interval_ms: 50 must not be less"):
        parse_config(doc)


# ------------------------------------------------------------ the engine


def test_a_relaxed_target_follows_the_relaxed_interval_and_the_others_the_full_rate():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = relaxing(interval_ms=20, relaxed_ms=400)
        p.set_targets([Target("slow", LOOPBACK, server.port, probe), Target("fast", LOOPBACK, server.port, probe)])
        p.relax(["slow", "unknown"], time.monotonic_ns() + FAR_NS)
        await wait_for(lambda: p.relaxed("slow"), 3, "slow relaxed")
        since = len(rec.of("slow"))
        # the first relaxed probe comes at a random point of the relaxed interval; 3 more after it
        await wait_for(lambda: len(rec.of("slow")) >= since + 4, 5, "4 relaxed probes")
        slow, fast = rec.of("slow")[since:], rec.of("fast")
        await closing(p, server)

        assert all(s.ok for s in slow + fast)
        assert not p.relaxed("fast")
        # after the first relaxed probe, starts are due one relaxed interval apart (a late loop
        # can shorten one gap, never add a start): at most one per 400 ms, plus one
        span_ns = slow[-1].t_ns - slow[1].t_ns
        assert len(slow[1:]) <= span_ns // (400 * MS) + 2, gaps_ns(slow)
        # meanwhile the other target was probed at the full rate (20 ms; 10x margin allowed)
        assert len(fast) > 3 * 400 / 20 / 10, len(fast)

    run(main())


def test_a_failed_probe_brings_the_full_rate_back_at_once_until_rise_probes_pass():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        relaxed_ms = 3000
        p.set_targets([Target("b", LOOPBACK, server.port, relaxing(interval_ms=20, relaxed_ms=relaxed_ms, rise=3))])
        p.relax(["b"], time.monotonic_ns() + FAR_NS)
        await wait_for(lambda: p.relaxed("b"), 3, "relaxed")
        server.pages["/health"] = (503, b"not ready")
        # fall (3) failures: the first one within a relaxed interval, the next two at the full rate
        await wait_for(lambda: sum(1 for s in rec.of("b") if not s.ok) >= 3, 2 * relaxed_ms / 1000, "3 failures")
        failed = [s for s in rec.of("b") if not s.ok][:3]
        assert not p.relaxed("b")
        server.pages["/health"] = (200, b"ok")
        await wait_for(lambda: p.relaxed("b"), 3, "relaxed again after rise passes")
        after = rec.of("b")[rec.of("b").index(failed[-1]) + 1 :]
        await closing(p, server)

        assert [s.error for s in failed] == ["HTTP 503"] * 3
        # the full rate (20 ms), not the relaxed one (3 s); a loaded machine may hold the loop up
        assert max(gaps_ns(failed)) < relaxed_ms * MS / 3, gaps_ns(failed)
        # relaxed again only after rise (3) passes in a row, each at the full rate
        assert len(after) >= 3 and all(s.ok for s in after[:3]), after
        assert max(gaps_ns(after[:3])) < relaxed_ms * MS / 3, gaps_ns(after)

    run(main())


def test_ending_the_relaxation_brings_the_full_rate_back_at_once_and_a_lapsed_end_within_one_relaxed_interval():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = relaxing(interval_ms=20, relaxed_ms=5000, rise=1)
        p.set_targets([Target("ended", LOOPBACK, server.port, probe), Target("lapsed", LOOPBACK, server.port, probe)])
        p.relax(["ended"], time.monotonic_ns() + FAR_NS)
        p.relax(["lapsed"], time.monotonic_ns() + 300 * MS)
        await wait_for(lambda: p.relaxed("ended") and p.relaxed("lapsed"), 3, "both relaxed")
        count = len(rec.of("ended"))
        p.relax(["ended"], 0)
        assert not p.relaxed("ended")
        # its next probe one interval after its last, not up to 5 s later
        await wait_for(lambda: len(rec.of("ended")) >= count + 3, 2, "3 probes at the full rate")
        # "lapsed" was never told: its relaxed probe that comes after the end (at most 5 s)
        # sets the full rate again
        await wait_for(lambda: not p.relaxed("lapsed"), 8, "lapsed back at the full rate")
        await closing(p, server)

        assert all(s.ok for s in rec.of("ended") + rec.of("lapsed"))

    asyncio.run(asyncio.wait_for(main(), 15))


def test_scrapes_keep_their_interval_while_the_probes_are_relaxed():
    async def main() -> None:
        server = await started(pages={"/health": (200, b"ok"), "/metrics": (200, b"vllm:num_requests_waiting 1\n")})
        rec = Recorder()
        p = Prober(on_sample=rec.sample, on_load=rec.load)
        p.set_targets(
            [
                Target(
                    "b",
                    LOOPBACK,
                    server.port,
                    relaxing(interval_ms=20, relaxed_ms=2000, rise=1),
                    MetricsScrape(interval_ms=20, stale_ms=1000),
                )
            ]
        )
        p.relax(["b"], time.monotonic_ns() + FAR_NS)
        await wait_for(lambda: p.relaxed("b"), 3, "relaxed")
        # The round that set the relaxed schedule may still be answering, and the first
        # relaxed round is at a random point of the interval (20 ms to 2 s): count from
        # after both, so the next round is one whole relaxed interval away.
        start = len(rec.of("b"))
        await wait_for(lambda: len(rec.of("b")) >= start + 2, 6, "the first relaxed round")
        probes, loads = len(rec.of("b")), len(rec.loads.get("b", []))
        await wait_for(lambda: len(rec.loads.get("b", [])) >= loads + 20, 3, "20 more scrapes")
        more_probes = len(rec.of("b")) - probes
        await closing(p, server)

        assert all(load.ok for load in rec.loads["b"])
        assert more_probes <= 1  # 20 scrapes at 20 ms take ~400 ms: within one 2 s relaxed interval

    run(main())


def test_changing_the_rate_many_times_neither_loses_nor_doubles_a_probe():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = relaxing(kind="tcp", interval_ms=20, relaxed_ms=200, rise=1, timeout_ms=20)
        keys = list(range(20))
        p.set_targets([Target(k, LOOPBACK, server.port, probe) for k in keys])
        rnd = random.Random(11)
        for _ in range(150):  # bounded: 150 changes, 2-10 ms apart
            chosen = rnd.sample(keys, rnd.randrange(len(keys)))
            p.relax(chosen, time.monotonic_ns() + (FAR_NS if rnd.random() < 0.7 else 0))
            p.relax([k for k in keys if k not in chosen], 0)
            await asyncio.sleep(rnd.uniform(0.002, 0.010))
        p.relax(keys, 0)
        counts = {k: len(rec.of(k)) for k in keys}
        # not lost: every target goes on at the full rate
        await wait_for(
            lambda: all(len(rec.of(k)) >= counts[k] + 5 for k in keys),
            3,
            "5 more probes each",
            observe=lambda: {k: len(rec.of(k)) - counts[k] for k in keys},
        )
        await closing(p, server)

        # not doubled: a target's starts are due at least one interval apart (a late loop can
        # make one gap look shorter, never add a start), so from its first to its last probe
        # it has at most one per interval, plus the first, plus one for a late first start
        for k in keys:
            samples = rec.of(k)
            span_ns = samples[-1].t_ns - samples[0].t_ns
            assert len(samples) <= span_ns // (20 * MS) + 2, (k, len(samples), span_ns)

    run(main())


def test_a_restarted_target_keeps_its_relaxation_and_a_removed_one_forgets_it():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        p = Prober(on_sample=rec.sample)
        probe = relaxing(interval_ms=20, relaxed_ms=400, rise=1)
        p.set_targets([Target("a", LOOPBACK, server.port, probe), Target("b", LOOPBACK, server.port, probe)])
        p.relax(["a", "b"], time.monotonic_ns() + FAR_NS)
        await wait_for(lambda: p.relaxed("a"), 3, "a relaxed")
        p.set_targets([Target("a", LOOPBACK, server.port, relaxing(interval_ms=30, relaxed_ms=400, rise=1))])
        assert not p.relaxed("a")  # a new schedule starts at the full rate, until rise passes
        await wait_for(lambda: p.relaxed("a"), 3, "a relaxed again")
        count = len(rec.of("b"))
        p.set_targets([Target("a", LOOPBACK, server.port, probe), Target("b", LOOPBACK, server.port, probe)])
        await wait_for(lambda: len(rec.of("b")) >= count + 3, 3, "b probed again")  # rise (1) passed twice
        not_b = not p.relaxed("b")
        await closing(p, server)

        assert not_b

    run(main())


# ------------------------------------------------------------ edged


def _relaxing_daemon():
    """edged with one tcp-probed service of two backends (b0, b1) that relaxes to 400 ms."""
    cfg = parse_config(
        {
            "version": 1,
            "services": [
                {
                    "name": "web",
                    "vip": "198.18.0.10",
                    "port": 80,
                    "health": {
                        "probe": {
                            "kind": "tcp",
                            "interval_ms": 20,
                            "timeout_ms": 20,
                            "rise": 1,
                            "relaxed_interval_ms": 400,
                        }
                    },
                    "backends": [
                        {"name": n, "address": f"198.18.1.{i + 2}", "port": 80} for i, n in enumerate(("b0", "b1"))
                    ],
                }
            ],
        }
    )
    return cfg, edged.Daemon(cfg, "edge-t0", edged.Events())


def test_edged_relaxes_the_fresh_backends_and_puts_the_others_back_at_the_full_rate():
    from controlplane.tests.edgedstage import FakeMaps

    async def main() -> None:
        server = await started()
        cfg, d = _relaxing_daemon()
        # the config's backends on 127.0.0.1 (test traffic stays on loopback)
        d.steering.prober.set_targets([Target(t.key, LOOPBACK, server.port, t.probe) for t in d.steering.targets(cfg)])
        d.state.maps = FakeMaps(cfg)
        d.steering.set_services(cfg)
        d.steering.pace_probes({("web", "b0")}, time.monotonic_ns())
        await wait_for(lambda: d.steering.prober.relaxed(("web", "b0")), 3, "b0 relaxed")
        b1_relaxed = d.steering.prober.relaxed(("web", "b1"))
        now = time.monotonic_ns()
        shown = {
            b: {k: d.status.backend_view("web", b, now)[k] for k in ("probe_relaxed", "probe_interval_s")}
            for b in ("b0", "b1")
        }  # what status, the API and the metrics show
        d.steering.pace_probes(set(), time.monotonic_ns())  # b0's wire signals went stale
        # the prober runs in its own process: the call reaches it a moment later (probe.child)
        await wait_for(lambda: not d.steering.prober.relaxed(("web", "b0")), 3, "b0 back at the full rate")
        b0_after = d.steering.prober.relaxed(("web", "b0"))
        shown_after = d.status.backend_view("web", "b0", time.monotonic_ns())["probe_interval_s"]
        await closing(d.steering.prober, server)

        assert not b1_relaxed and not b0_after
        assert shown == {
            "b0": {"probe_relaxed": True, "probe_interval_s": 0.4},
            "b1": {"probe_relaxed": False, "probe_interval_s": 0.02},
        }
        assert shown_after == 0.02

    run(main())


def test_edgeds_status_round_relaxes_the_backends_whose_wire_signal_is_fresh():
    from controlplane.tests.edgedstage import FakeMaps

    async def main() -> None:
        server = await started()
        cfg, d = _relaxing_daemon()
        d.state.maps = FakeMaps(cfg)
        d.steering.set_services(cfg)
        d.steering.prober.set_targets([Target(t.key, LOOPBACK, server.port, t.probe) for t in d.steering.targets(cfg)])
        d.state.wire_fresh = {("web", "b0")}  # what a step found fresh
        loop = asyncio.create_task(d._status_loop())
        try:
            await wait_for(lambda: d.steering.prober.relaxed(("web", "b0")), 3, "b0 relaxed")
            b1_relaxed = d.steering.prober.relaxed(("web", "b1"))
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await closing(d.steering.prober, server)

        assert not b1_relaxed

    run(main())
