"""No answer of a discovery source stops it, wedges it or exhausts edged's descriptors: the
sources (discovery/etcd.py, discovery/dns.py, the code edged runs per service) in this process
against a real etcd and a real dnsmasq on loopback, started and stopped by the test.

etcd: garbage, nesting too deep for the parser, wrong types, more keys than max_backends and
more than 4 MiB under the prefix are each a failure naming the cause, and the source answers
again once the keys are fixed. DNS: an SRV answer of more records than max_backends is refused
before any target is resolved, and the targets of one that fits are resolved a few at a time.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from controlplane.config import parse_config
from controlplane.discovery import Answer, Failure
from controlplane.discovery.dns import MAX_QUERIES, DnsSource
from controlplane.discovery.etcd import EtcdSource
from controlplane.lab.registry import Dnsmasq, Loopback, free_port

PREFIX = "/edge/services/web/"


def discovery(section: dict, max_backends: int):
    return (
        parse_config(
            {
                "version": 1,
                "services": [
                    {
                        "name": "web",
                        "vip": "198.18.255.1",
                        "port": 8000,
                        "discovery": {**section, "retry_ms": 100, "max_backends": max_backends},
                    }
                ],
            }
        )
        .services[0]
        .discovery
    )


async def next_result(results: list, after: int, pred, what: str, timeout_s: float = 15.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        for r in results[after:]:
            if pred(r):
                return r
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; got {results[after:][-3:]}")
        await asyncio.sleep(0.05)  # poll interval


def is_answer(n: int):
    return lambda r: isinstance(r, Answer) and len(r.backends) == n


def fails(text: str):
    return lambda r: isinstance(r, Failure) and text in r.why


def test_etcd_source_survives_any_value_and_recovers_once_fixed(etcd):
    good = {"address": "198.18.1.2", "port": 8000}
    cases = {
        "brackets": ("[" * 100000, "junk: "),
        "nested": ("[" * 50000 + "]" * 50000, "junk: "),
        "wrong types": (json.dumps({"address": [], "port": 8000}), "junk"),
        "port a list": (json.dumps({"address": "198.18.1.3", "port": []}), "junk"),
    }

    async def main():
        source = EtcdSource(
            discovery(
                {"etcd": {"endpoints": [f"127.0.0.1:{etcd.client_port}"], "prefix": PREFIX, "timeout_ms": 1000}},
                max_backends=50,
            )
        )
        results: list = []

        async def report(r):
            results.append(r)

        task = asyncio.create_task(source.run(report))
        try:
            await asyncio.to_thread(etcd.put, PREFIX + "b0", good)
            await next_result(results, 0, is_answer(1), "b0")
            for name, (value, says) in cases.items():
                mark = len(results)
                await asyncio.to_thread(etcd.put, PREFIX + "junk", value)
                await next_result(results, mark, fails(says), f"{name} refused")
                assert not task.done(), name
                mark = len(results)
                await asyncio.to_thread(etcd.delete, PREFIX + "junk")
                await next_result(results, mark, is_answer(1), f"answers again after {name}")
            # more keys than max_backends: refused, nothing parsed; fixed: answers again
            mark = len(results)
            for i in range(60):
                await asyncio.to_thread(etcd.put, f"{PREFIX}many/{i:03d}", good)
            await next_result(results, mark, fails("more than discovery.max_backends (50)"), "over the key cap")
            mark = len(results)
            await asyncio.to_thread(etcd.delete_prefix, PREFIX + "many/")
            await next_result(results, mark, is_answer(1), "answers again after the keys went")
            # 5 MiB under the prefix (gRPC's default receive limit is 4 MiB): each value over its cap
            mark = len(results)
            for i in range(5):
                await asyncio.to_thread(etcd.put, f"{PREFIX}big{i}", "x" * (1 << 20))
            await next_result(results, mark, fails("more than 4096"), "big values refused")
            # the source reads them again after a reconnect (a full read), and still only refuses them
            assert not task.done()
            mark = len(results)
            await asyncio.to_thread(etcd.delete_prefix, PREFIX + "big")
            await next_result(results, mark, is_answer(1), "answers again after the big values went")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def dnsmasq(tmp_path):
    d = Dnsmasq(Loopback(), tmp_path, port=free_port())
    yield d
    d.stop()


def test_an_srv_answer_is_capped_and_its_targets_resolved_a_few_at_a_time(dnsmasq):
    def serve(n: int) -> None:
        dnsmasq.set_records(
            srv=[("_web._tcp.disc.test", f"t{i}.disc.test", 8000, 0, 1) for i in range(n)],
            host_records=[(f"t{i}.disc.test", f"198.18.{2 + i // 250}.{1 + i % 250}") for i in range(n)],
        )
        dnsmasq.restart() if dnsmasq.proc is not None else dnsmasq.start()

    def source(max_backends: int) -> DnsSource:
        return DnsSource(
            discovery(
                {"dns": {"name": "_web._tcp.disc.test", "servers": [f"127.0.0.1:{dnsmasq.port}"], "timeout_ms": 5000}},
                max_backends,
            )
        )

    async def peak_during(coro) -> tuple[object, int]:
        base, peak = _open_fds(), 0
        task = asyncio.ensure_future(coro)
        while not task.done():
            peak = max(peak, _open_fds() - base)
            await asyncio.sleep(0)
        return task.result(), peak

    async def main():
        serve(200)
        answer, peak = await peak_during(source(256).resolve())
        assert len(answer.backends) == 200
        assert peak <= MAX_QUERIES + 4, f"{peak} descriptors open at once while resolving 200 targets"
        serve(400)
        with pytest.raises(Exception) as refused:
            await source(256).resolve()
        assert "SRV answer of 400 records, more than discovery.max_backends (256)" in str(refused.value)

    asyncio.run(main())


def test_with_etcd_auth_the_source_reads_as_its_user_and_fails_without_one(etcd, tmp_path):
    """A discovery user whose role reads the prefix only: the source answers with it; without
    credentials it is a failure that says why."""
    import secrets

    password = secrets.token_hex(16)
    etcd.put(PREFIX + "b0", {"address": "198.18.1.2", "port": 8000})
    etcd.grant("edge-discovery", password, [("READ", PREFIX, True)])
    (tmp_path / "password").write_text(password + "\n")
    etcd.enable_auth(secrets.token_hex(16))
    section = {"endpoints": [f"127.0.0.1:{etcd.client_port}"], "prefix": PREFIX, "timeout_ms": 1000}

    async def first(source) -> object:
        results: list = []

        async def report(r):
            results.append(r)

        task = asyncio.create_task(source.run(report))
        try:
            return await next_result(results, 0, lambda r: True, "a first result")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def main():
        authed = EtcdSource(
            discovery({"etcd": {**section, "user": "edge-discovery", "password_file": str(tmp_path / "password")}}, 50)
        )
        assert is_answer(1)(await first(authed))
        anonymous = await first(EtcdSource(discovery({"etcd": section}, 50)))
        assert isinstance(anonymous, Failure) and "etcdserver: user name is empty" in anonymous.why, anonymous

    asyncio.run(main())
