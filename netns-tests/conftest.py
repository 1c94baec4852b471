"""Fixtures for the namespace tests: a privilege gate, `net` (client, router, 3 backends) and
`router` (edgectl on the net's router namespace, always undeployed in teardown), plus module-scoped
`shared_net` / `shared_router` for table-driven files whose cases share one deployment, and
`etcd` (Debian's etcd on loopback, for code in the test process that talks to it directly).

Namespace tests need root and bcc. Without them they skip with the reason, except under CI
(CI=true), where they fail loudly: a CI run that skipped them would prove nothing.
"""

from __future__ import annotations

import functools
import importlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from controlplane.lab.registry import Etcd, Loopback, free_port
from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Topo

BACKEND_PORT = 8000

# Files by their time in a full run (junit, two workers, 2026-12-02), slowest first. tools/test
# gives whole files to two workers in collection order (--dist loadfile --no-loadscope-reorder):
# the long files start first and the short ones fill in behind them, so that no worker runs a
# long file alone at the end (ordered by test count, a quarter of one run was one worker alone).
SLOW_FIRST = (
    "test_ipv6",  # 326 s
    "test_deploy",  # 196
    "test_ecmp",  # 187
    "test_vip_on_lo",  # 157
    "test_state_abuse",  # 142
    "test_health_abuse",  # 137
    "test_edged_faults",  # 120
    "test_edged_ops",  # 118
    "test_bgp6",  # 109
    "test_failover",  # 105
    "test_steering",  # 103
    "test_membership",  # 102
    "test_bench_serving",  # 92
    "test_reply_xdp",  # 90
    "test_dsr6",  # 89
    "test_fleet_trust",
    "test_two_choices",  # 79
    "test_cli_ops",  # 75
    "test_icmp6",  # 74
    "test_dsr",  # 71
    "test_restart_outage",  # 71
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow files first (SLOW_FIRST), then the rest as collected; a file's tests keep their
    order (the sort is stable)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@functools.lru_cache(maxsize=None)
def missing_privileges() -> str | None:
    """Why namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "namespace tests need root (network namespaces, veths, XDP)"
    try:
        # A capability probe only: loader.py stays the one module that uses bcc.
        importlib.import_module("bcc")
    except Exception as e:  # bcc fails with ImportError, or OSError when libbcc is missing
        return f"namespace tests need bcc (Debian python3-bpfcc; run tools/bootstrap): {e}"
    return None


def require_privileges() -> None:
    reason = missing_privileges()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def privileges() -> None:
    require_privileges()


@contextmanager
def built_net(backends: int = 3, start: Callable[[Net], None] | None = None) -> Iterator[Net]:
    """A net with `backends` backends, built; start(net) starts their servers (default: the HTTP
    backends on BACKEND_PORT). Closed on leaving, also when building or starting fails."""
    net = Net(Topo(backends=backends))
    try:
        net.build()
        if start is None:
            net.start_backends(port=BACKEND_PORT)
        else:
            start(net)
        yield net
    finally:
        net.close()


@contextmanager
def undeployed_after(net: Net) -> Iterator[Router]:
    """A Router on net; on exit every instance pinned in its namespace is undeployed (whatever the
    test did, on whichever interface) and no pins may remain.

    Runs before the net is closed, so undeploy still finds the interfaces it has to clean.
    """
    router = Router(net)
    try:
        yield router
    finally:
        failed = []
        for iface in sorted({router.iface, *router.pinned_ifaces()}):
            done = router.undeploy(iface, check=False)  # "nothing deployed on IF" is exit 0 too
            if done.returncode != 0:
                failed.append(f"{iface}: {done.stderr.strip()}")
        leftover = {iface: remove_pins(router.pin_path_of(iface)) for iface in router.pinned_ifaces()}
        assert failed == [], f"undeploy in teardown failed: {failed}"
        assert leftover == {}, f"pins left after undeploy (removed now): {leftover}"


def remove_pins(path: Path) -> list[str]:
    """Unpin what a failed undeploy left in one instance directory (and empty parents); return the names."""
    names = sorted(p.name for p in path.iterdir())
    for name in names:
        (path / name).unlink()
    path.rmdir()
    for parent in (path.parent, path.parent.parent):
        if any(parent.iterdir()):
            break
        parent.rmdir()
    return names


@pytest.fixture
def net(privileges: None) -> Iterator[Net]:
    """Client, router and three backends, each backend serving HTTP and UDP on BACKEND_PORT."""
    with built_net() as net:
        yield net


@pytest.fixture
def router(net: Net) -> Iterator[Router]:
    """edgectl on net's router namespace (nothing deployed yet); undeployed again in teardown."""
    with undeployed_after(net) as router:
        yield router


@pytest.fixture(scope="module")
def shared_net() -> Iterator[Net]:
    """Like net, for all tests of one module."""
    require_privileges()
    with built_net() as net:
        yield net


@pytest.fixture(scope="module")
def shared_router(shared_net: Net) -> Iterator[Router]:
    """Like router, on shared_net, for all tests of one module."""
    with undeployed_after(shared_net) as router:
        yield router


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """etcd on the test process's loopback, started and stopped by this test."""
    e = Etcd(Loopback(), tmp_path, free_port(), free_port())
    try:
        yield e.start()
    finally:
        e.stop()
