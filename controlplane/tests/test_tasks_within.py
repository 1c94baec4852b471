"""tasks.within, the product's one wait with a deadline: a cancel that arrives in the loop step
where the awaited thing completes still ends the caller (Python 3.11's asyncio.wait_for
returned the result and lost the cancel: a fleet leader cancelled as a report arrived kept
leading, and its stop never ended). No product module calls asyncio.wait_for."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from controlplane.config import parse_config
from controlplane.fleet.member import Hooks, Member, _Term
from controlplane.tasks import within

TOP = Path(__file__).resolve().parents[2]


async def _cancelled_as_it_completes(make_waiter) -> bool:
    """Starts make_waiter(queue) as a task, then in one loop step puts an item (which completes
    the waiter's get) and cancels it. True when the task ended cancelled."""
    queue: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(make_waiter(queue))
    await asyncio.sleep(0.01)  # the task waits in queue.get()
    queue.put_nowait("event")
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


def test_a_cancel_that_races_the_result_ends_the_caller():
    async def waiter(queue):
        return await within(queue.get(), 5.0)

    assert asyncio.run(_cancelled_as_it_completes(waiter))


def test_within_returns_the_result_or_times_out():
    async def main():
        assert await within(asyncio.sleep(0, "done"), 1.0) == "done"
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(5), 0.01)

    asyncio.run(main())


def _member() -> Member:
    c = parse_config(
        {
            "version": 1,
            "node": {"fleet": {"etcd": ["127.0.0.1:2379"], "name": "n1", "report_ms": 200}},
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "backends": [{"name": "a", "address": "198.18.1.2", "port": 8000}],
                }
            ],
        }
    )
    return Member(c.node.fleet, Hooks(lambda: c.services, lambda got: {}, lambda *a, **k: None))


def test_a_leader_cancelled_as_a_report_arrives_stops():
    """The leader's wait for watch events (Member._absorb) ends on a cancel even when a report
    arrives in the same loop step; on the old code the cancel was lost and the term went on."""
    member = _member()

    async def main():
        term = _Term(last=None)

        async def absorb(queue):
            term.queue = queue
            await member._absorb(term)

        return await _cancelled_as_it_completes(absorb)

    assert asyncio.run(main())


def test_no_product_module_calls_asyncio_wait_for():
    """One home for waits with a deadline (tasks.within); the lab and tests may use either."""
    offenders = []
    for path in sorted((TOP / "controlplane").rglob("*.py")):
        rel = path.relative_to(TOP).as_posix()
        if rel.startswith(("controlplane/lab/", "controlplane/tests/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for":
                if isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                    offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders
