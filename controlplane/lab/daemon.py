"""edged in a testbed's router namespace, as a process of its own: start it on a
config, read its JSON event lines as they come, wait for an event, stop it by
its pid. The Net terminates it on close() whatever the test did.

    with EdgedProc.start(net.router, router.config(services), iface) as edged:
        edged.wait_for(lambda e: e["kind"] == "weights", 10.0, "a weight push")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import yaml

from controlplane.lab.procs import stop_process

if TYPE_CHECKING:
    from controlplane.lab.topo import Ns

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0  # edged compiles the data path before its first event


def env_with_package() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return env


class EdgedProc:
    """One edged started with --log-format json; events are parsed on a reader thread."""

    def __init__(self, proc: subprocess.Popen, config_path: str):
        self.proc = proc
        self.config_path = config_path
        self.events: list[dict] = []
        self.other_lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"edged-{proc.pid}", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        ns: "Ns",
        doc: dict,
        iface: str,
        extra: tuple[str, ...] = (),
        wait_deployed: bool = True,
        env: dict | None = None,
    ) -> "EdgedProc":
        fd, path = tempfile.mkstemp(prefix="edged-test-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        argv = [
            sys.executable,
            "-m",
            "controlplane.edged.cli",
            "--config",
            path,
            "--iface",
            iface,
            "--log-format",
            "json",
            *extra,
        ]
        proc = ns.popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**env_with_package(), **(env or {})}
        )
        edged = cls(proc, path)
        if wait_deployed:
            edged.wait_for(lambda e: e["kind"] == "deployed", START_TIMEOUT_S, "edged to deploy")
        return edged

    def rewrite_config(self, doc: dict) -> None:
        with open(self.config_path, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)

    def _read(self) -> None:
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            with self._cond:
                if isinstance(event, dict) and "kind" in event:
                    event["seen_monotonic"] = time.monotonic()
                    self.events.append(event)
                else:
                    self.other_lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[dict], bool], timeout_s: float, what: str, after: int = 0) -> dict:
        """The first event (from index `after`) pred accepts; TimeoutError naming what, with the
        last events, if none comes within timeout_s or edged exits."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            i = after
            while True:
                while i < len(self.events):
                    if pred(self.events[i]):
                        return self.events[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    tail = [e.get("text") for e in self.events[-8:]] + self.other_lines[-5:]
                    raise TimeoutError(
                        f"{what}: not seen within {timeout_s}s (edged "
                        f"{'exited ' + str(self.proc.returncode) if self.proc.poll() is not None else 'running'}); "
                        f"last lines: {tail}"
                    )
                self._cond.wait(min(left, 0.5))

    def latest_weights(self, service: str) -> Optional[dict[str, int]]:
        with self._cond:
            for e in reversed(self.events):
                if e["kind"] == "weights" and e.get("service") == service:
                    return dict(e["weights"])
        return None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait; SIGKILL after timeout_s. Returns the exit status."""
        stop_process(self.proc, timeout_s)
        self._reader.join(timeout=timeout_s)
        try:
            os.unlink(self.config_path)
        except FileNotFoundError:
            pass
        return self.proc.returncode

    def __enter__(self) -> "EdgedProc":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
