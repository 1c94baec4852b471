"""watch.run's order of work, without a kernel: a repair (and what edged does after it) runs
inside the lock every other change of the data path takes, and only when check found a problem."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from controlplane import watch


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
            task = asyncio.create_task(watch.run(lambda: w, lambda p, d: reports.append((p, d)), pool, 0.0,
                                                 locked, repaired))
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
    assert log[i:i + 4] == ["lock", "repair locked=True", "repaired locked=True replies=(7,)", "unlock"], log
    assert reports[0] == ("rt-b0: the return path is not attached", "")
    assert ("", "attached the return path on x again") in reports


def test_a_whole_data_path_takes_no_lock(monkeypatch):
    log, reports = _run_rounds(monkeypatch, ["", ""])
    assert "lock" not in log and not any(line.startswith("repair") for line in log), log
    assert reports and all(r == ("", "") for r in reports)
