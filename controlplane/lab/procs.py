"""Processes the labs start: stop one by its pid (SIGTERM, then SIGKILL), close its pipes, and
read its first line of stdout with a deadline. Ends only the process it is given."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time


def stop_process(proc: subprocess.Popen, timeout_s: float = 3.0) -> int | None:
    """SIGTERM proc (by its pid), then SIGKILL if it has not exited within timeout_s; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
    return proc.returncode


def terminate(proc: subprocess.Popen, timeout_s: float = 3.0) -> None:
    """stop_process(), then close proc's pipes."""
    try:
        stop_process(proc, timeout_s)
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first stdout line of proc, waiting at most timeout_s; raise if proc exits first."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"pid {proc.pid}: no line on stdout within {timeout_s}s (got {buf!r})")
            if sel.select(left):
                chunk = os.read(fd, 4096)
                if not chunk:
                    code = proc.wait(timeout=timeout_s)
                    raise RuntimeError(f"pid {proc.pid} exited with {code} before its first line ({buf!r})")
                buf += chunk
    return buf.split(b"\n", 1)[0].decode()
