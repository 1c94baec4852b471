"""watch.run's order of work, without a kernel: a repair (and what edged does after it) runs
inside the lock every other change of the data path takes, and only when check found a problem."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from controlplane.edged import watch


def _run_rounds(monkeypatch, problems: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """watch.run over fakes until check has answered every entry of problems; returns what
    happened in order and what was reported."""
    log: list[str] = []
    reports: list[tuple[str, str]] = []
    held = {"lock": False}
    answers = iter(problems)

    def check(*args):
        log.append("check")
        return next(answers, "")

    def repair(*args):
        log.append(f"repair locked={held['lock']}")
        return watch.Repaired("attached the return path on x again", (7,), (7,))

    @contextlib.asynccontextmanager
    async def locked():
        held["lock"] = True
        log.append("lock")
        try:
            yield
        finally:
            held["lock"] = False
            log.append("unlock")

    async def repaired(got):
        log.append(f"repaired locked={held['lock']} replies={got.reply_ifindex}")

    monkeypatch.setattr(watch, "check", check)
    monkeypatch.setattr(watch, "repair", repair)
    w = watch.Watched(None, None, "eth0", "native", "/sys/fs/bpf", Path("/nowhere"))

    async def main():
        with ThreadPoolExecutor(max_workers=1) as pool:
            task = asyncio.create_task(
                watch.run(lambda: w, lambda p, d: reports.append((p, d)), pool, 0.0, locked, repaired)
            )
            for _ in range(200):
                await asyncio.sleep(0.01)
                if log.count("check") > len(problems):
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    return log, reports


def test_a_repair_runs_inside_the_write_lock_and_edged_hears_of_it_there(monkeypatch):
    log, reports = _run_rounds(monkeypatch, ["rt-b0: the return path is not attached", ""])
    i = log.index("lock")
    assert log[i : i + 4] == ["lock", "repair locked=True", "repaired locked=True replies=(7,)", "unlock"], log
    assert reports[0] == ("rt-b0: the return path is not attached", "")
    assert ("", "attached the return path on x again") in reports


def test_a_whole_data_path_takes_no_lock(monkeypatch):
    log, reports = _run_rounds(monkeypatch, ["", ""])
    assert "lock" not in log and not any(line.startswith("repair") for line in log), log
    assert reports and all(r == ("", "") for r in reports)


class _Node:
    """A node record and this namespace's interfaces, as check() asks loader for them."""

    def __init__(
        self,
        monkeypatch,
        pin_path: Path,
        links: dict[int, tuple[str, str | None]],
        routes: dict[str, int],
        return_ifindex: list[int],
    ):
        from controlplane import abi, loader
        from controlplane.netlink import XdpState

        pin_path.mkdir()
        for name in abi.MAP_NAMES:
            (pin_path / name).touch()
        self.record = {"ingress_ifindex": 1, "return_ifindex": return_ifindex}
        monkeypatch.setattr(loader, "check_bpffs", lambda pin_dir: None)
        monkeypatch.setattr(loader, "ifindex", lambda name: next(i for i, (n, _) in links.items() if n == name))
        monkeypatch.setattr(loader, "ifname", lambda i: links[i][0] if i in links else f"ifindex {i}")
        monkeypatch.setattr(
            loader, "xdp_state", lambda i: XdpState(7, links[i][1], "native") if i in links and links[i][1] else None
        )
        monkeypatch.setattr(loader, "return_filter", lambda i: abi.PROG_RETURN if i in links else None)
        monkeypatch.setattr(loader, "route_oifs", lambda addrs: {a: routes.get(a) for a in addrs})

    def node(self) -> dict:
        return self.record


def test_check_names_a_backend_interface_made_again_and_reply_xdp_on_wants_every_return_interface(
    monkeypatch, tmp_path
):
    from controlplane import abi

    links = {1: ("rt-c", abi.PROG_INGRESS), 3: ("rt-b1", None), 9: ("rt-b0", None)}  # rt-b0 was 2
    node = _Node(monkeypatch, tmp_path / "pins", links, {"198.18.1.2": 9, "198.18.2.2": 3}, [2, 3])
    args = (node, "rt-c", str(tmp_path), tmp_path / "pins")

    assert (
        watch.check(*args, (2,), ("198.18.1.2", "198.18.2.2"))
        == "rt-b0: the return path is not attached (the interface was made again?)"
    )
    node.record["return_ifindex"] = [3, 9]  # what the repair writes
    assert watch.check(*args, (), ("198.18.1.2", "198.18.2.2")) == ""  # auto: those deploy put it on
    assert (
        watch.check(*args, (), ("198.18.1.2",), "on")
        == "rt-b1: the XDP fast path of replies is not attached (tc carries them)"
    )
    links[3], links[9] = ("rt-b1", abi.PROG_REPLY), ("rt-b0", abi.PROG_REPLY)
    assert watch.check(*args, (), ("198.18.1.2",), "on") == ""


def test_a_whole_data_path_asks_no_route_per_backend(monkeypatch, tmp_path):
    """The check runs every second: with 1,000 backends a route lookup each (a netlink socket
    and a RTM_GETROUTE per backend) cost edged about 35 % of a core in tools/bench-probe's
    "none" phase. While every interface of the node record is there, no backend can have moved
    to an interface made again, so no route is asked for."""
    from controlplane import abi, loader

    links = {1: ("rt-c", abi.PROG_INGRESS), 3: ("rt-b1", None)}
    node = _Node(monkeypatch, tmp_path / "pins", links, {}, [3])
    asked = []
    monkeypatch.setattr(
        loader, "route_oifs", lambda addrs: {a: asked.append(a) or (3 if 3 in links else 4) for a in addrs}
    )
    backends = tuple(f"198.18.{i // 250}.{i % 250 + 1}" for i in range(1000))
    assert watch.check(node, "rt-c", str(tmp_path), tmp_path / "pins", (), backends) == ""
    assert asked == []
    del links[3]  # gone: now the routes say where its backends went
    links[4] = ("rt-b1", None)
    assert (
        watch.check(node, "rt-c", str(tmp_path), tmp_path / "pins", (), backends)
        == "rt-b1: the return path is not attached (the interface was made again?)"
    )
    assert asked
