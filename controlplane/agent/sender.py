"""The agent's sender and its entry point: one heartbeat per tick on absolute deadlines
while the gate is open (run, send_loop), and main() for the edge-heartbeat command."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from controlplane.agent.checker import CheckerGone, CheckerProcess, Gate, Readiness, start_checker
from controlplane.agent.checks import make_check
from controlplane.agent.options import PROG, Options, UsageError, fmt_ms, options, parser
from controlplane.agent.schedule import MAX_NAP_S, StopFlag, Ticker, sleep_until
from controlplane.agent.wire import Beats

MIN_STALE_MS = 100.0  # grace on top of check interval + timeout before a silent checker stops sending
PR_SET_TIMERSLACK = 29  # from include/uapi/linux/prctl.h


@dataclass
class SendStats:
    sent: int = 0
    missed_ticks: int = 0  # deadlines skipped because the sender woke too late for them
    max_late_ns: int = 0
    errors: int = 0


def send_loop(
    sock: socket.socket,
    dest: tuple[str, int],
    service_port: int,
    token: int,
    interval_ns: int,
    gate: Gate,
    stop: StopFlag,
    end_ns: Optional[int],
    say: Callable[[str], None],
) -> SendStats:
    """Send one heartbeat per tick while the gate is open, until stop is set or end_ns."""
    stats = SendStats()
    ticker = Ticker(time.monotonic_ns(), interval_ns)
    beats = Beats(service_port, token)
    failing = False
    while True:  # bounded by stop (signals) and end_ns (--duration-s)
        deadline = ticker.deadline_ns if end_ns is None else min(ticker.deadline_ns, end_ns)
        if not sleep_until(deadline, stop):
            break
        now = time.monotonic_ns()
        if end_ns is not None and now >= end_ns:
            break
        if gate.open(now):
            try:
                sock.sendto(beats.packet(), dest)
            except OSError as e:
                stats.errors += 1
                if not failing:
                    failing = True
                    say(f"send failing: {os.strerror(e.errno).lower() if e.errno else e}")
            else:
                beats.sent()
                stats.sent += 1
                if failing:
                    failing = False
                    say("sending again")
        stats.max_late_ns = max(stats.max_late_ns, now - ticker.deadline_ns)
        stats.missed_ticks += ticker.advance(time.monotonic_ns())
    return stats


def _hostport(address, port: int) -> str:
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _tighten_timer_slack() -> None:
    # Linux lets a sleeping thread wake up to 50 us late by default (timer slack); ask for 1 ns.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def run(opts: Options, stop: StopFlag, say: Callable[[str], None]) -> SendStats:
    """Open the socket, start the checker, send until stop or the duration ends."""
    check = make_check(opts)
    checker = None
    sock = socket.socket(socket.AF_INET if opts.router.version == 4 else socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        # Unconnected and non-blocking: ICMP errors from the router are not reported back,
        # and a full send buffer costs one heartbeat, never the schedule.
        sock.setblocking(False)
        try:
            sock.bind((str(opts.source) if opts.source else ("0.0.0.0" if opts.router.version == 4 else "::"), 0))
        except OSError as e:
            raise UsageError(f"--source {opts.source}: {os.strerror(e.errno).lower()}") from None
        readiness = Readiness(say, mmap.mmap(-1, 8))
        if opts.check == "http":
            what = f"while GET {opts.target.url} answers 2xx"
        elif opts.check == "tcp":
            what = f"while {opts.target.hostport} accepts tcp connections"
        else:
            what = "always (no check)"
        checking = (
            (f", checked every {fmt_ms(opts.check_interval_ms)}, timeout {fmt_ms(opts.check_timeout_ms)}")
            if opts.check != "none"
            else ""
        )
        say(
            f"sending to {_hostport(opts.router, opts.router_port)} from {opts.source or 'any address'} every "
            f"{fmt_ms(opts.interval_ms)} for service port {opts.service_port}, {what}{checking}"
        )
        stale_ns = None
        if opts.check == "none":
            readiness.update(check.check(0.0))
        else:
            checker = CheckerProcess(start_checker(check, readiness, opts, [sock]))
            check.close()  # the child's now
            stale_ms = opts.check_interval_ms + opts.check_timeout_ms + max(opts.check_timeout_ms, MIN_STALE_MS)
            stale_ns = int(stale_ms * 1e6)
        _tighten_timer_slack()
        if opts.rt_priority:  # the sender only: the checker is its own process, on its own time
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(opts.rt_priority))
            except OSError as e:
                raise UsageError(
                    f"--rt-priority {opts.rt_priority}: {os.strerror(e.errno).lower()} (needs CAP_SYS_NICE)"
                ) from None
        now = time.monotonic_ns()
        end_ns = now + int(opts.duration_s * 1e9) if opts.duration_s is not None else None
        gate = Gate(readiness, stale_ns, say, now, checker.gone if checker is not None else lambda: None)
        return send_loop(
            sock,
            (str(opts.router), opts.router_port),
            opts.service_port,
            opts.token,
            int(opts.interval_ms * 1e6),
            gate,
            stop,
            end_ns,
            say,
        )
    finally:
        sock.close()
        check.close()
        if checker is not None:
            checker.stop(timeout_s=opts.check_timeout_ms / 1000 + 2 * MAX_NAP_S + 1.0)


def dsr_problem(vip: str | None) -> str | None:
    """--dsr-vip: what the backend lacks for direct server return of vip (agent/dsr.py), or None."""
    if vip is None:
        return None
    from ipaddress import ip_address

    from controlplane.agent import dsr

    try:
        address = ip_address(vip)
    except ValueError:
        raise UsageError(f"--dsr-vip: {vip!r} is no IPv4 or IPv6 address") from None
    return dsr.problems(dsr.read_state(address.version), address)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    stop = StopFlag()
    try:
        opts = options(args)
        problem = dsr_problem(args.dsr_vip)
        if problem:
            print(f"{PROG}: {problem}", file=sys.stderr)
            return 1
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            stats = run(opts, stop, say)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except CheckerGone as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {os.strerror(e.errno).lower() if e.errno else e}", file=sys.stderr)
        return 1
    say(
        f"stopped: {stats.sent} heartbeats sent, {stats.missed_ticks} ticks missed, "
        f"{stats.errors} send errors, woke at most {stats.max_late_ns / 1e6:.3f} ms late"
    )
    return 0
