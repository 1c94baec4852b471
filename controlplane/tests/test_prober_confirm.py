"""controlplane.probe: Prober.confirm, an extra probe off the schedule that takes a second look at
a result that may be noise. Against a real HTTP server on 127.0.0.1 (a port the OS chose); every
server and prober is closed by the test, every wait polls a condition with a bound."""

from __future__ import annotations

from controlplane.probe import Prober, Target
from controlplane.tests.proberstage import LOOPBACK, Recorder, closing, http_probe, run, started, wait_for


def test_a_confirmation_probe_comes_off_the_schedule_and_leaves_the_regular_ones_in_place():
    async def main() -> None:
        server = await started()
        rec = Recorder()
        asked: list[bool] = []
        p = Prober()

        def on_sample(key, s) -> None:
            rec.sample(key, s)
            if not s.extra:
                asked.append(p.confirm("b", 60))  # a second look 60 ms after each regular probe
                asked.append(p.confirm("b", 60))  # one at a time: refused
                asked.append(p.confirm("b", 250))  # the next regular probe is as soon: refused

        p.on_sample = on_sample
        p.set_targets([Target("b", LOOPBACK, server.port, http_probe(interval_ms=300, timeout_ms=200))])
        await wait_for(lambda: sum(not s.extra for s in rec.of("b")) >= 5, 5, "5 regular samples")
        samples = rec.of("b")
        unknown = p.confirm("nobody", 60)
        await closing(p, server)

        regular = [s.t_ns for s in samples if not s.extra]
        extra = [s.t_ns for s in samples if s.extra]
        assert all(s.ok for s in samples), samples
        assert asked[:3] == [True, False, False] and not unknown, asked
        assert len(extra) >= len(regular) - 1, (regular, extra)
        assert all(0.25e9 <= b - a <= 0.4e9 for a, b in zip(regular, regular[1:])), regular  # still every 300 ms
        for t in extra:  # each about 60 ms after the regular probe before it
            before = max(r for r in regular if r < t)
            assert 0.04e9 <= t - before <= 0.15e9, (before, t)
        assert server.connections == 1  # the same kept-alive connection: never two rounds at once

    run(main())
