"""No value an etcd writer puts under the fleet's prefix stops a fleet member or makes two
leaders, and only the leader's snapshots are applied: fleet members (fleet/member.py, the code
edged runs as its fleet task) in this process against a real etcd (Debian's etcd-server) on
loopback, started and stopped by the test.

Each case puts garbage or forgeries through etcd's own API, checks that every member keeps
running, that exactly one leads, that nothing forged is applied, and that the fleet works again
(a weight change reaches every node) once the key is fixed.
"""

from __future__ import annotations

import asyncio
import json
import secrets

import aetcd
import pytest

from controlplane import weights as policy
from controlplane.config import parse_config
from controlplane.discovery.etcd import client as etcd_client
from controlplane.fleet import snapshot as fs
from controlplane.fleet.member import Hooks, Member
from controlplane.lab.registry import Etcd

PREFIX = "/edge/fleet/"
DEEP = "[" * 50000 + "]" * 50000


def config(port: int, name: str, auth: dict | None = None):
    return parse_config(
        {
            "version": 1,
            "node": {
                "fleet": {
                    "etcd": [f"127.0.0.1:{port}"],
                    "name": name,
                    "lease_ttl_s": 2,
                    "report_ms": 200,
                    "stale_ms": 1000,
                    "timeout_ms": 2000,  # the default: CI saw a call pass 1 s under load (a leaderless second)
                    "retry_ms": 100,
                    **(auth or {}),
                }
            },
            "services": [
                {
                    "name": "web",
                    "vip": "198.18.255.1",
                    "port": 8000,
                    "weights": {"policy": "latency_inverse"},
                    "backends": [
                        {"name": "a", "address": "198.18.1.2", "port": 8000},
                        {"name": "b", "address": "198.18.1.3", "port": 8000},
                    ],
                }
            ],
        }
    )


class Node:
    """One member with the hooks edged gives it: its own decision is set by decide()."""

    def __init__(self, port: int, name: str, auth: dict | None = None):
        self.cfg = config(port, name, auth)
        self.events: list[dict] = []
        self.applied: list[fs.Apply] = []
        self.member = Member(self.cfg.node.fleet, Hooks(lambda: self.cfg.services, self._apply, self._emit))
        self.task: asyncio.Task | None = None

    def _apply(self, got):
        self.applied.append(got)
        return {}

    def _emit(self, kind, text, **fields):
        self.events.append({"kind": kind, "text": text, **fields})

    def decide(self, a: int, b: int) -> None:
        d = policy.Decision(
            weights={"a": a, "b": b}, computed={"a": a, "b": b}, states={"a": "up", "b": "up"}, reasons={}, push=True
        )
        self.member.steer(self.cfg.services[0], d, None)

    def alive(self) -> bool:
        return self.task is not None and not self.task.done()


async def until(pred, what: str, timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)  # poll interval


async def started(etcd: Etcd, names=("r0", "r1"), auth=None) -> list[Node]:
    nodes = [Node(etcd.client_port, n, auth(n) if auth else None) for n in names]
    for i, n in enumerate(nodes):
        n.decide(10000, 5000 + i)
        n.task = asyncio.create_task(n.member.run())
    await until(lambda: all(n.member.connected for n in nodes), "every node connected")
    await until(lambda: all(n.applied for n in nodes), "a first snapshot everywhere")
    return nodes


async def stop(nodes: list[Node]) -> None:
    for n in nodes:
        n.task.cancel()
    await asyncio.gather(*(n.task for n in nodes), return_exceptions=True)


def leaders(nodes: list[Node]) -> list[str]:
    return [n.member.cfg.name for n in nodes if n.member.is_leader]


async def weight_change_reaches_all(nodes: list[Node], b: int) -> None:
    """Every node decides b's weight; every node applies one snapshot with it."""
    for n in nodes:
        n.decide(10000, b)
    await until(lambda: all(n.member.shared.get("web", {}).get("b") == b for n in nodes), f"b at {b} everywhere")


async def put(etcd: Etcd, key: str, value) -> None:
    await asyncio.to_thread(etcd.put, PREFIX + key, value)


async def delete(etcd: Etcd, key: str) -> None:
    await asyncio.to_thread(etcd.delete, PREFIX + key)


BAD = {
    "wrong types": '{"version":[],"services":{}}',
    "t a list": '{"node":"x","t":[],"version":1,"serving":true,"services":{}}',
    "brackets": "[" * 100000,
    "nested": DEEP,
}


@pytest.mark.parametrize("key", ["snapshot", "nodes/evil", "operator/web/a"])
def test_no_value_stops_a_member_or_makes_two_leaders(etcd, key):
    async def main():
        nodes = await started(etcd)
        try:
            leader = leaders(nodes)
            assert len(leader) == 1
            for name, value in BAD.items():
                await put(etcd, key, value)
                await asyncio.sleep(1.0)  # several report_ms: the leader reads it, every node sees it
                assert all(n.alive() for n in nodes), name
                assert leaders(nodes) == leader, (name, [n.events[-4:] for n in nodes])
                assert all(n.member.connected for n in nodes), (name, [n.events[-4:] for n in nodes])
            refused = sum(n.member.refused for n in nodes)
            assert refused >= 1, [n.events for n in nodes]
            assert any(e["kind"] == "fleet-refused" for n in nodes for e in n.events)
            if key != "snapshot":  # a garbage snapshot stays until the leader's next one replaces it
                await delete(etcd, key)
            await weight_change_reaches_all(nodes, 2000)
            assert leaders(nodes) == leader and all(n.alive() for n in nodes)
        finally:
            await stop(nodes)

    asyncio.run(main())


def _forged(version: int, leader: str, lease: int, weights: dict) -> dict:
    return {
        "version": version,
        "leader": leader,
        "lease": lease,
        "t": 1.0,
        "services": {"web": {"digest": "", "weights": weights, "backends": []}},
    }


def test_only_the_leaders_snapshots_are_applied(etcd):
    async def main():
        nodes = await started(etcd)
        try:
            leader = next(n for n in nodes if n.member.is_leader)
            digest = fs.digest(leader.cfg.services[0])
            v = max(n.member.applied for n in nodes)
            lease = leader.member._lease.id

            def forge(version, who, lease_id, weights):
                doc = _forged(version, who, lease_id, weights)
                doc["services"]["web"]["digest"] = digest
                return json.dumps(doc)

            cases = {
                "leader nobody, every weight 0": forge(v + 1, "nobody", lease, {"a": 0, "b": 0}),
                "the leader's name, another lease": forge(v + 1, leader.member.cfg.name, lease + 1, {"a": 1, "b": 1}),
                "a version of 10^15": forge(10**15, leader.member.cfg.name, lease, {"a": 1, "b": 1}),
                "the leader's lease, every weight 0": forge(v + 1, leader.member.cfg.name, lease, {"a": 0, "b": 0}),
                "a weight out of range": forge(v + 1, leader.member.cfg.name, lease, {"a": 70000, "b": 1}),
            }
            for name, value in cases.items():
                before = [n.member.shared.get("web") for n in nodes]
                await put(etcd, "snapshot", value)
                await asyncio.sleep(0.6)
                assert [n.member.shared.get("web") for n in nodes] == before, name
                assert all(w and w["a"] > 0 and w["b"] > 0 for w in before), name
            assert sum(n.member.refused for n in nodes) >= len(cases)
            # the real leader's next version is applied everywhere (the fleet is not frozen)
            await weight_change_reaches_all(nodes, 3000)
            # an operator's drain of every backend is an all-zero snapshot that is applied
            for backend in ("a", "b"):
                await nodes[1].member.operate("web", backend, "drain")
            await until(
                lambda: all(n.member.shared.get("web") == {"a": 0, "b": 0} for n in nodes),
                "the operator's all-zero snapshot everywhere",
            )
        finally:
            await stop(nodes)

    asyncio.run(main())


def test_a_new_leader_continues_past_a_deleted_or_forged_snapshot(etcd):
    async def main():
        nodes = await started(etcd)
        try:
            old = next(n for n in nodes if n.member.is_leader)
            other = next(n for n in nodes if n is not old)
            await put(etcd, "snapshot", json.dumps(_forged(10**15, "nobody", 0, {"a": 0, "b": 0})))
            await asyncio.sleep(0.5)
            applied = other.member.applied
            old.task.cancel()  # the leader stops: its lease is revoked, the other leads
            await asyncio.gather(old.task, return_exceptions=True)
            await until(lambda: other.member.is_leader, "the other node leads")
            await until(lambda: other.member.applied > applied, "a snapshot of the new leader applied")
            await delete(etcd, "snapshot")
            now = other.member.applied
            other.decide(10000, 1500)
            await until(
                lambda: other.member.applied > now and other.member.shared["web"]["b"] == 1500,
                "the new leader's next version after the delete",
            )
        finally:
            await stop(nodes)

    asyncio.run(main())


def node_role(name: str) -> list[tuple[str, str, bool]]:
    """The etcd role of fleet node NAME (docs: security): read the fleet's prefix; write the
    leader key and the snapshot (any node may lead), operator marks (edgectl drain on any node),
    and its own report only."""
    return [
        ("READ", PREFIX, True),
        ("READWRITE", PREFIX + "leader", False),
        ("READWRITE", PREFIX + "snapshot", False),
        ("READWRITE", PREFIX + "operator/", True),
        ("READWRITE", f"{PREFIX}nodes/{name}", False),
    ]


def test_with_etcd_auth_a_fleet_runs_and_each_node_writes_only_its_own_report(etcd, tmp_path):
    passwords = {n: secrets.token_hex(16) for n in ("r0", "r1")}
    for n, password in passwords.items():
        etcd.grant(f"edge-{n}", password, node_role(n))
        (tmp_path / f"{n}.password").write_text(password + "\n")
    etcd.enable_auth(secrets.token_hex(16))

    def auth(n: str) -> dict:
        return {"user": f"edge-{n}", "password_file": str(tmp_path / f"{n}.password")}

    async def main():
        nodes = await started(etcd, auth=auth)
        try:
            assert len(leaders(nodes)) == 1
            await weight_change_reaches_all(nodes, 2500)
            await nodes[0].member.operate("web", "b", "drain")  # an operator mark, under auth
            await until(lambda: all(n.member.shared["web"]["b"] == 0 for n in nodes), "the drain everywhere")
            c = etcd_client("127.0.0.1", etcd.client_port, 2000, "edge-r1", passwords["r1"].encode())
            try:
                await c.put(f"{PREFIX}nodes/r1".encode(), b"{}")  # its own key: allowed
                with pytest.raises(aetcd.ClientError, match="permission denied"):
                    await c.put(f"{PREFIX}nodes/r0".encode(), b"{}")
                with pytest.raises(aetcd.ClientError, match="permission denied"):
                    await c.put(b"/edge/services/web/b9", b"{}")  # outside the fleet's prefix
            finally:
                await c.close()
            without = etcd_client("127.0.0.1", etcd.client_port, 2000)
            try:
                with pytest.raises(aetcd.ClientError):
                    await without.put(f"{PREFIX}snapshot".encode(), b"{}")
            finally:
                await without.close()
            assert all(n.alive() and n.member.connected for n in nodes)
        finally:
            await stop(nodes)

    asyncio.run(main())
