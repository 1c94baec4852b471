"""desired.py's reload diff and draining set, and deploy.NodeLock (one writer per router)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from controlplane import deploy, desired
from controlplane.config import parse_config
from controlplane.errors import LoaderError


def config(*services, max_backends=8):
    return parse_config(
        {"version": 1, "node": {"max_services": 4, "max_backends": max_backends}, "services": list(services)}
    )


def svc(name, vip, *backends, drain=30000):
    return {
        "name": name,
        "vip": f"198.19.0.{vip}",
        "port": 80,
        "drain_timeout_ms": drain,
        "backends": [{"name": n, "address": f"198.18.1.{a}", "port": 8000} for n, a in backends],
    }


def test_drain_timeout_0_drains_until_the_connections_end():
    old = config(svc("chat", 1, ("b0", 10), ("b1", 11), drain=0))
    new = config(svc("chat", 1, ("b0", 10), drain=0))
    leaving = desired.leaving_after(old, new, {}, now_ns=5)
    assert list(leaving) == [("chat", "b1")] and leaving[("chat", "b1")].deadline_ns is None
    # an hour later, still carrying packets: it stays
    hour = 3600 * 10**9
    assert desired.retire(leaving, {("chat", "b1"): 1}, hour, idle_ns=3 * 10**9) == []
    assert desired.retire(leaving, {("chat", "b1"): 2}, 2 * hour, idle_ns=3 * 10**9) == []
    # quiet for the idle time: its connections ended
    assert desired.retire(leaving, {("chat", "b1"): 2}, 2 * hour + 3 * 10**9, 3 * 10**9) == [(("chat", "b1"), "idle")]


def test_a_renamed_service_on_its_vip_is_the_same_service():
    old = config(svc("chat", 1, ("b0", 10), ("b1", 11)))
    new = config(svc("chat-v2", 1, ("b0", 10)))
    leaving = desired.leaving_after(old, new, {}, now_ns=0)
    assert list(leaving) == [("chat-v2", "b1")]  # drains under the name that holds the VIP
    applied, dropped = desired.with_leaving(new, leaving, 4, 8)
    assert dropped == [] and [s.name for s in applied.services] == ["chat-v2"]
    assert [(b.name, b.weight) for b in applied.services[0].backends] == [("b0", 1), ("b1", 0)]


def test_renamed_and_moved_the_new_vip_gets_the_endpoints():
    old = config(svc("chat", 1, ("b0", 10)))
    new = config(svc("chat-v2", 2, ("b0", 10)))
    leaving = desired.leaving_after(old, new, {}, now_ns=0)
    applied, dropped = desired.with_leaving(new, leaving, 4, 8)
    # replies of an endpoint name one VIP: the new service's; the old VIP goes at once
    assert dropped == [("chat", "b0")] and [s.name for s in applied.services] == ["chat-v2"]


def test_draining_backends_never_take_room_the_config_needs():
    old = config(svc("chat", 1, ("b0", 10), ("b1", 11)), max_backends=2)
    new = config(svc("chat", 1, ("b0", 10), ("b2", 12)), max_backends=2)
    leaving = desired.leaving_after(old, new, {}, now_ns=0)
    applied, dropped = desired.with_leaving(new, leaving, 4, 2)
    assert dropped == [("chat", "b1")] and applied == new


def test_fit_keeps_what_fits_within_the_node_sizes_and_names_the_rest():
    old = config(svc("chat", 1, ("b0", 10), ("b1", 11), ("b3", 13)), max_backends=3)
    new = config(svc("chat", 1, ("b0", 10), ("b2", 12)), max_backends=3)
    leaving = desired.leaving_after(old, new, {}, now_ns=0)
    applied, kept, dropped = desired.fit(new, leaving)
    assert len(dropped) == 1 and set(kept) | set(dropped) == set(leaving) == {("chat", "b1"), ("chat", "b3")}
    assert {b.name for b in applied.services[0].backends} == {"b0", "b2", *(k[1] for k in kept)}


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, monkeypatch):
    monkeypatch.setenv(deploy.LOCK_DIR_ENV, str(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from controlplane import deploy; "
            "deploy.NodeLock('eth9-1', 'eth9').acquire(); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LoaderError) as e:
            deploy.NodeLock("eth9-1", "eth9").acquire()
        msg = str(e.value)
        assert "\n" not in msg and f"pid {holder.pid}" in msg and "NodeLock" in msg and msg.startswith("eth9:")
    finally:
        holder.stdin.close()
        holder.wait(10)
    with deploy.NodeLock("eth9-1", "eth9"):  # released when its holder ended
        pass


def test_a_writer_waits_for_the_write_before_it_and_gives_up_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(deploy.LOCK_DIR_ENV, str(tmp_path))
    code = (
        "import sys; from controlplane import deploy; l = deploy.NodeLock('eth9-1', 'eth9', 'write'); "
        "l.acquire(); print('held', flush=True); sys.stdin.readline(); l.release(); sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LoaderError) as e:
            deploy.NodeLock("eth9-1", "eth9", "write", wait_s=0.1).acquire()
        assert "\n" not in str(e.value) and f"pid {holder.pid}" in str(e.value) and "0.1 s" in str(e.value)
        holder.stdin.write("done\n")
        holder.stdin.flush()
        with deploy.NodeLock("eth9-1", "eth9", "write", wait_s=30.0):  # got it once the holder let go
            pass
    finally:
        holder.stdin.close()
        holder.wait(10)


def test_a_backend_renamed_on_its_endpoint_is_the_same_backend():
    """Not a drain plus an add: both would claim the endpoint's reply NAT."""
    old = config(svc("chat", 1, ("b0", 10), ("b1", 11)))
    new = config(svc("chat", 1, ("b0", 10), ("gpu-1", 11)))
    assert desired.leaving_after(old, new, {}, now_ns=0) == {}


def test_the_undeploy_mark_is_written_read_and_removed_and_the_watch_names_it(tmp_path, monkeypatch):
    """`edgectl undeploy` under edged leaves a mark beside the locks; the watch then reports the
    undeploy (with its time) instead of repairing; an unreadable mark still counts."""
    from controlplane.edged import watch

    monkeypatch.setenv(deploy.LOCK_DIR_ENV, str(tmp_path))
    pins = tmp_path / "v1" / "eth9-1"
    assert deploy.undeployed_at("eth9-1") is None and watch.undeployed(pins) == ""
    deploy.set_undeployed("eth9-1", True)
    assert abs(deploy.undeployed_at("eth9-1") - time.time()) < 60
    said = watch.undeployed(pins)
    assert said.startswith("undeployed by 'edgectl undeploy' at ") and "until it is restarted" in said
    assert deploy.undeployed_at("eth9-2") is None  # another instance's router
    (tmp_path / "eth9-1.undeployed").write_text("{")
    assert deploy.undeployed_at("eth9-1") == 0.0 and "an unknown time" in watch.undeployed(pins)
    deploy.set_undeployed("eth9-1", False)
    deploy.set_undeployed("eth9-1", False)  # removing twice is fine
    assert deploy.undeployed_at("eth9-1") is None and list(tmp_path.iterdir()) == []


def test_undeploy_marks_only_a_router_a_running_edged_owns(tmp_path, monkeypatch):
    monkeypatch.setenv(deploy.LOCK_DIR_ENV, str(tmp_path))
    assert not deploy.owned("eth9-1", "eth9")
    with deploy.NodeLock("eth9-1", "eth9"):  # what edged holds for its life (flocks: per open file)
        assert deploy.owned("eth9-1", "eth9")
    assert not deploy.owned("eth9-1", "eth9")
