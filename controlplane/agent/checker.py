"""The agent's checker process and what it shares with the sender: the verdict in one
shared page (Readiness), the sender's view of it (Gate, which closes when checks stop
coming), the check loop (Checker), and forking, reaping and stopping the process."""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Callable, Optional

from controlplane.agent.checks import Check, Result
from controlplane.agent.options import PROG, Options, fmt_ms
from controlplane.agent.schedule import MAX_NAP_S, StopFlag, Ticker

PR_SET_PDEATHSIG = 1  # from include/uapi/linux/prctl.h


class CheckerGone(RuntimeError):
    """The checker process exited while the sender was running."""


class Readiness:
    """The checker's verdict, in memory the sender can share (an anonymous mmap across fork):
    byte 0 is 0 before the first check, 1 ready, 2 not ready (one byte: never torn); bytes 4..7
    count finished checks. Written by the checker only."""

    _STATES = {0: None, 1: True, 2: False}

    def __init__(self, say: Callable[[str], None], mem: Optional[mmap.mmap] = None):
        self.mem = mem if mem is not None else bytearray(8)
        self.detail = ""
        self.say = say

    @property
    def ready(self) -> Optional[bool]:
        return self._STATES[self.mem[0]]

    @property
    def checks(self) -> int:
        return struct.unpack_from("<I", self.mem, 4)[0]

    def update(self, result: Result) -> None:
        """Take a check's result; say so when readiness changed."""
        changed = result.ok is not self.ready
        self.mem[0] = 1 if result.ok else 2
        struct.pack_into("<I", self.mem, 4, (self.checks + 1) & 0xFFFFFFFF)
        self.detail = result.detail
        if changed:
            self.say(f"ready: {result.detail}" if result.ok else f"not ready: {result.detail}")


class Gate:
    """The sender's side of Readiness: open while the last verdict is ready and checks keep
    finishing; closed once none finished for stale_ns (a checker that hangs). While closed
    for that reason, gone() is asked each tick and a checker that died raises CheckerGone."""

    def __init__(
        self,
        readiness: Readiness,
        stale_ns: Optional[int],
        say: Callable[[str], None],
        now_ns: int,
        gone: Callable[[], Optional[str]] = lambda: None,
    ):
        self.readiness = readiness
        self.stale_ns = stale_ns  # None: never stale (no checker)
        self.say = say
        self.gone = gone  # why the checker is gone, or None while it lives
        self.seen = readiness.checks
        self.seen_at_ns = now_ns
        self.stale = False

    def open(self, now_ns: int) -> bool:
        checks = self.readiness.checks
        if checks != self.seen:
            self.seen, self.seen_at_ns = checks, now_ns
            if self.stale:
                self.stale = False
                self.say("checks resumed")
        elif self.stale_ns is not None and now_ns - self.seen_at_ns > self.stale_ns:
            if not self.stale:
                self.stale = True
                self.say(f"not ready: no check finished for {fmt_ms(self.stale_ns / 1e6)}")
            why = self.gone()
            if why is not None:
                raise CheckerGone(why)
        return not self.stale and self.readiness.ready is True


class Checker(threading.Thread):
    """Runs check every interval (absolute deadlines) and, while ready, watches its connection
    in between: when it closes, one extra check runs at once (at most one per interval).
    The agent calls run() in its checker process; tests may start() it as a thread."""

    def __init__(self, check: Check, readiness: Readiness, interval_ms: float, timeout_ms: float, stop: StopFlag):
        super().__init__(name="edge-heartbeat-check", daemon=True)
        self.check = check
        self.readiness = readiness
        self.interval_ns = int(interval_ms * 1e6)
        self.timeout_s = timeout_ms / 1000
        self.stop = stop
        self.checks = 0

    def run(self) -> None:
        ticker = Ticker(time.monotonic_ns(), self.interval_ns)
        scheduled = True
        try:
            while not self.stop.is_set():
                self.readiness.update(self.check.check(self.timeout_s))
                self.checks += 1
                if scheduled:
                    ticker.advance(time.monotonic_ns())
                early = self._wait(ticker.deadline_ns, watch=scheduled and bool(self.readiness.ready))
                scheduled = not early
        finally:
            self.check.close()

    def _wait(self, deadline_ns: int, watch: bool) -> bool:
        """Wait for deadline_ns; True when the watched connection closed first."""
        sock = self.check.watched() if watch else None
        while not self.stop.is_set():
            left_s = (deadline_ns - time.monotonic_ns()) / 1e9
            if left_s <= 0:
                return False
            if sock is None:
                time.sleep(min(left_s, MAX_NAP_S))
                continue
            readable, _, _ = select.select([sock], [], [], min(left_s, MAX_NAP_S))
            if readable:
                if self.check.peer_closed():
                    return True
                sock = None
        return False


def start_checker(check: Check, readiness: Readiness, opts: Options, inherited: list[socket.socket]) -> int:
    """Fork the checker process; return its pid. It ends on SIGTERM or SIGINT, and when this
    process dies (PR_SET_PDEATHSIG)."""
    parent = os.getpid()
    stops = {signal.SIGTERM, signal.SIGINT}
    sys.stdout.flush()
    # Held back across fork until the child has its own handlers, so none is lost in between.
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        return pid
    code = 0
    try:  # the child: never returns into the caller's frames
        stop = StopFlag()
        for sig in stops:
            signal.signal(sig, lambda *_: stop.set())
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == parent:  # else the parent died before prctl took effect
            for sock in inherited:
                sock.close()
            Checker(check, readiness, opts.check_interval_ms, opts.check_timeout_ms, stop).run()
    except BaseException as e:  # the child's last word; the parent's gate notices the silence
        print(f"{PROG}: checker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        sys.stdout.flush()
        os._exit(code)


class CheckerProcess:
    """The forked checker, by pid: gone() reaps it if it exited, stop() ends it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.status: Optional[int] = None  # os.waitpid status once reaped

    def gone(self) -> Optional[str]:
        """Why the checker is no longer running, or None while it is."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid != self.pid:
                return None
            self.status = status
        if os.WIFSIGNALED(self.status):
            return f"checker process {self.pid} was killed by signal {os.WTERMSIG(self.status)}"
        return f"checker process {self.pid} exited with {os.waitstatus_to_exitcode(self.status)}"

    def stop(self, timeout_s: float) -> None:
        """SIGTERM, wait at most timeout_s, then SIGKILL; reap it. Idempotent."""
        if self.gone() is not None:
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # bounded by timeout_s
            if self.gone() is not None:
                return
            time.sleep(0.005)
        os.kill(self.pid, signal.SIGKILL)
        self.status = os.waitpid(self.pid, 0)[1]
