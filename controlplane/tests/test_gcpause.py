"""The cyclic collector held off while a status call's objects live (controlplane.gcpause): off
within a span and on again after the last (an exception's included), nested and overlapping
spans from threads, a collector someone else turned off left alone, spans that keep overlapping
bounded by PAUSE_MAX_S, the cycles made meanwhile collected at the end; and GetStatus over a
real socket (apistage's daemon of plain data) running with the collector off and leaving
nothing behind across many calls."""

from __future__ import annotations

import gc
import os
import threading
import weakref

import pytest

from controlplane import gcpause
from controlplane.config import Node
from controlplane.tests.apistage import FakeDaemon, serving
from controlplane.tests.test_status_scale import many


class _Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture(autouse=True)
def _collector_on():
    assert gc.isenabled() and gcpause.held() == 0
    yield
    assert gcpause.held() == 0
    if not gc.isenabled():  # a failed test must not leave the rest of the run without it
        gc.enable()
        pytest.fail("the collector was left off")


def test_off_within_a_span_and_on_after_the_last():
    with gcpause.paused():
        assert not gc.isenabled()
        with gcpause.paused():
            assert not gc.isenabled() and gcpause.held() == 2
        assert not gc.isenabled() and gcpause.held() == 1
    assert gc.isenabled()


def test_on_again_after_an_exception():
    with pytest.raises(KeyError):
        with gcpause.paused():
            raise KeyError("x")
    assert gc.isenabled()


def test_overlapping_spans_on_threads():
    inside, release = threading.Barrier(3), threading.Event()

    def span():
        with gcpause.paused():
            inside.wait(5)
            release.wait(5)

    threads = [threading.Thread(target=span) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(5)
    assert not gc.isenabled() and gcpause.held() == 2
    release.set()
    for t in threads:
        t.join(5)
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_is_left_off():
    gc.disable()
    try:
        with gcpause.paused():
            assert gcpause.held() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_spans_that_keep_overlapping_cannot_hold_it_off_past_the_bound(monkeypatch):
    monkeypatch.setattr(gcpause, "PAUSE_MAX_S", 0.0)
    with gcpause.paused():
        with gcpause.paused():  # starts after the bound: not counted
            assert gcpause.held() == 1
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_cycles_made_in_a_span_are_collected_at_its_end():
    with gcpause.paused():
        refs = [weakref.ref(_Cycle()) for _ in range(1000)]
        assert all(r() is not None for r in refs)  # no collection while off
    assert all(r() is None for r in refs)


class _Daemon(FakeDaemon):
    """apistage's daemon with a snapshot of 1,260 backends that notes whether the collector was
    on, and fails when told to."""

    def __init__(self):
        super().__init__()
        self.collector_on: list[bool] = []
        self.raise_next = False

    def snapshot(self, count_conntrack=False, view=None):
        self.collector_on.append(gc.isenabled())
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("walk failed")
        return many(20, 63)


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_status_calls_run_with_the_collector_off_and_leave_nothing_behind(lt, sockdir):
    daemon = _Daemon()
    with serving(lt, Node(api_socket=os.path.join(sockdir, "run", "edged.sock")), daemon) as served:
        with served.client() as c:
            for _ in range(3):
                c.status()
            before = _tracked()
            for _ in range(20):
                assert len(c.status()["services"]) == 20
                assert gc.isenabled() and gcpause.held() == 0
            after = _tracked()
            daemon.raise_next = True
            with pytest.raises(Exception, match="walk failed"):
                c.status()
            assert gc.isenabled() and gcpause.held() == 0
    assert daemon.collector_on == [False] * 24
    # a snapshot of 1,260 backends is tens of thousands of tracked objects: none of 20 stays
    assert after - before < 2_000, (before, after)
