"""The probe engine: the targets, one timer wheel and one epoll set that drive every check
(probe.checks) on the caller's asyncio loop, and each target's Window and last Load. Decides
nothing about weights (weights.py) and touches no map."""

from __future__ import annotations

import asyncio
import ipaddress
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Optional

from controlplane import config, limits
from controlplane.probe import budget as budgets
from controlplane.probe.checks import _Check, _HttpCheck, _monotonic_ns, _TcpCheck
from controlplane.probe.grpccheck import _GrpcCheck
from controlplane.samples import Load, Sample, Window

_perf_ns = time.perf_counter_ns
TICK_S = 0.002  # timer wheel resolution: probe times are rounded up to this
REBUDGET_S = 1.0  # how often the demand is summed again (relaxed targets ask for fewer probes)
RECV_SIZE = 262144  # the one receive buffer every HTTP check reads into


@dataclass(frozen=True)
class Target:
    """One backend to probe. key names it in callbacks, window() and last_load(); address is
    IPv4 or IPv6 text (an address object is converted). probe None: no probes; metrics None: no scrapes."""

    key: Hashable
    address: str
    port: int
    probe: Optional[config.Probe] = None
    metrics: Optional[config.MetricsScrape] = None

    def __post_init__(self) -> None:
        address = ipaddress.ip_address(str(self.address))  # never a name: no DNS on the loop
        object.__setattr__(self, "address", str(address))
        if not limits.is_port(int(self.port)):
            raise ValueError(f"port {self.port} is out of range {limits.PORTS}")


def by_key(targets: Iterable[Target]) -> dict[Hashable, Target]:
    """targets by key, in their order; ValueError naming a key given twice (set_targets' rule, for
    the prober here and its child process's caller, probe.child)."""
    wanted: dict[Hashable, Target] = {}
    for target in targets:
        if target.key in wanted:
            raise ValueError(f"target key {target.key!r} given twice")
        wanted[target.key] = target
    return wanted


def _intervals_ns(target: Target) -> list[int]:
    """The intervals of a target's schedules at the full rate: its probe's and its scrape's."""
    out = []
    if target.probe is not None:
        out.append(target.probe.interval_ms * 1_000_000)
    if target.metrics is not None:
        out.append(target.metrics.interval_ms * 1_000_000)
    return out


class _Backend:
    """A target's checks, its Window and its last Load."""

    def __init__(
        self, prober: "Prober", target: Target, window: Optional[Window] = None, last_load: Optional[Load] = None
    ):
        self.prober = prober
        self.target = target
        self.key = target.key
        self.checks: list[_Check] = []
        self.probe_check: Optional[_Check] = None  # the probe's schedule (the only one that relaxes)
        probe, metrics = target.probe, target.metrics
        self.window: Optional[Window] = None
        if probe is not None:
            self.window = window if window is not None else Window(probe.window)
            self.window.resize(probe.window)
            if probe.kind == "tcp":
                self.checks.append(_TcpCheck(prober, self, probe.interval_ms, probe.timeout_ms))
            elif probe.kind == "http":
                self.checks.append(_HttpCheck(prober, self, probe.interval_ms, probe.timeout_ms, probe.path, False))
            else:
                self.checks.append(_GrpcCheck(prober, self, probe))
            self.checks[-1].adapt(probe.relaxed_ms, probe.rise)
            self.probe_check = self.checks[-1]
        self.last_load = last_load if metrics is not None else None
        if metrics is not None:
            self.checks.append(_HttpCheck(prober, self, metrics.interval_ms, metrics.interval_ms, metrics.path, True))

    def sample(self, sample: Sample) -> None:
        if not sample.extra and self.prober.add_to_windows:  # a confirmation (Prober.confirm) is a second look
            self.window.add(sample)
        callback = self.prober.on_sample
        if callback is not None:
            try:
                callback(self.key, sample)
            except Exception as e:
                self.prober.report("prober: on_sample failed", e)

    def load(self, load: Load) -> None:
        self.last_load = load
        callback = self.prober.on_load
        if callback is not None:
            try:
                callback(self.key, load)
            except Exception as e:
                self.prober.report("prober: on_load failed", e)

    def hurry(self) -> None:
        for check in self.checks:
            check.hurry()

    def stop(self) -> None:
        for check in self.checks:
            check.stop()
            if isinstance(check, _GrpcCheck):
                self.prober._later(check.aclose())
        self.checks = []
        self.probe_check = None


class Prober:
    """Probes the targets given to set_targets() until close(); lives on one asyncio loop
    (the one running at the first set_targets()). A failed probe is a Sample (ok False,
    error in a few words: "timeout", "refused", "reset", "closed", "unreachable", "HTTP 503",
    "NOT_SERVING", "grpc NOT_FOUND", ...), a failed scrape a Load(ok=False), never an exception.

        prober = Prober(on_sample=f, on_load=g)   # f(key, Sample), g(key, Load): plain calls on the loop
        prober.set_targets([Target(("chat", "h100-a"), "10.0.0.7", 8000, probe, metrics), ...])
        prober.window(key), prober.last_load(key), prober.keys()
        await prober.close()

    set_targets() must be called on the loop the prober is to live on; it adds new targets, stops
    removed ones and restarts changed ones (a changed target on the same address and port keeps
    its Window, resized, and its last Load). window() is None for a target without probe.

    Built for thousands of probes a second in one Python thread (tools/bench-probe measures it):
    - One timer wheel: times are rounded up to tick_s (2 ms) and each occupied tick is one loop
      timer, so a tick starts and times out all its probes together (no task, future or timer
      handle per probe). A target's first probe is at a random point of its interval; a late
      loop skips starts, never bunches them; a target's probes never overlap.
    - One private epoll set holds every probe socket and is itself one reader of the loop, so a
      wake-up serves every ready socket (the same under uvloop, which measured no faster).
    - RTTs come from the kernel where it has them, so the loop's own delays never show in them:
      TCP connect RTT is tcpi_rtt of the new connection (SYN to SYN-ACK); HTTP RTT is the receive
      timestamp of the answer's last segment (SO_TIMESTAMPNS) minus the time just before send().
      A probe whose RTT exceeds timeout_ms fails as "timeout", even if the loop read it later;
      an answer that came in time but was not read yet is read at the deadline, not lost.
    - TCP probes reuse one socket per target: connect, read TCP_INFO, then connect(AF_UNSPEC),
      which resets the connection (RST: no TIME_WAIT on the prober) and frees the socket for the
      next connect; where libc cannot be reached, a new socket with SO_LINGER 0 per probe.
    - HTTP/1.1 keeps one connection per target (another for metrics), reconnects after an error,
      and retries once on a new connection when a kept-alive one turns out closed; the request is
      sent once connected, so the RTT never includes the connect.
    - gRPC (grpc.health.v1.Health/Check) runs on grpc.aio: one channel per target, one task per
      probe; its RTT is the call's time as the loop sees it.
    - Metrics are scraped every metrics.interval_ms with that as the timeout; the page's engine
      signals become a Load (parse_metrics, load_from).
    - Adaptive rate: relax(keys, until_ns) slows the probes of those targets to
      probe.relaxed_ms (while real traffic measures them, say) until until_ns. Health probing
      stays: a relaxed target is probed at the full rate again from its first failed probe
      (the next probe one interval after it) until its last `rise` probes passed, so `fall`
      is reached at most one relaxed interval later than at the full rate. Scrapes keep
      their own interval. The first relaxed probe of each target is at a random point of the
      relaxed interval, so targets relaxed together do not bunch; relaxed probes start and
      time out on a 10 ms grid (checks.SLOW_GRID_NS), and tcp connections (relaxed or not, with
      a timeout longer than a grid step) are looked at on it rather than waited for on epoll,
      so sparse probes share loop wake-ups.
    - Budget: with budget_per_s (set_budget), every schedule's interval (full rate, relaxed and
      scrape) is stretched by one factor when the targets together ask for more probes a second
      than that (probe.budget): every target is still probed, all at the same share of their
      rate, rather than the loop falling behind and skipping starts at random. The demand is
      summed at set_targets() and every REBUDGET_S (a relaxed target asks for fewer), and the
      budget follows the loop below budget_per_s: lowered while the prober's callbacks take
      more than half of the loop's wall time, raised while they take less (budget.adapt).
      on_budget(Budget) is called when the shortfall starts and when it ends (budget.still_short).
    """

    def __init__(
        self,
        on_sample: Optional[Callable[[Hashable, Sample], None]] = None,
        on_load: Optional[Callable[[Hashable, Load], None]] = None,
        *,
        tick_s: float = TICK_S,
        budget_per_s: float = 0,
        on_budget: Optional[Callable[[budgets.Budget], None]] = None,
        add_to_windows: bool = True,
    ):
        self.on_sample = on_sample
        # False: on_sample's caller adds each Sample to window(key) itself (probe.child, on the caller's loop)
        self.add_to_windows = add_to_windows
        # in a process of its own (probe.child): busy_elsewhere() is a running total (ns) of the wall
        # time the results' handling took on the caller's loop, counted into the prober's share
        self.busy_elsewhere: Optional[Callable[[], int]] = None
        self._elsewhere_ns = 0
        self.on_load = on_load
        self.on_budget = on_budget
        self._cap_per_s = budget_per_s  # node.probe_budget
        self._budget_per_s = budget_per_s  # the budget now: the cap, or less while probes take over half of the loop
        self._busy_ns = 0  # wall time in the prober's callbacks since the last _rebudget
        self._period_ns = _perf_ns()
        self.budget = budgets.NO_BUDGET  # the last plan (probe.budget)
        self.stretch = 1.0  # every check's intervals are multiplied by this (checks.Host)
        self._short = False  # a shortfall is being reported (on_budget)
        self._rebudget_timer: Optional[asyncio.TimerHandle] = None
        self._tick_ns = max(1, int(tick_s * 1e9))
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ep: Optional[select.epoll] = None
        self._backends: dict[Hashable, _Backend] = {}
        self._relaxed: dict[Hashable, int] = {}  # key -> relaxed until (monotonic ns)
        self._slots: dict[int, list[_Check]] = {}  # tick number -> the checks to call then
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._handlers: dict[int, Callable[[int], None]] = {}  # fd -> on_event of the check owning it
        self.recv_view = memoryview(bytearray(RECV_SIZE))  # every check reads into it (checks.Host)
        self._dead: list[socket.socket] = []  # closed while an event batch is dispatched
        self._in_batch = False
        self._closing: set[asyncio.Task] = set()
        self._closed = False

    # -- public

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Probe exactly these targets from now on; call on the loop."""
        if self._closed:
            raise RuntimeError("prober is closed")
        wanted = by_key(targets)
        self._bind()
        # the stretch before any new check takes its first start (spread over its stretched interval)
        self._plan(budgets.demand(ns for t in wanted.values() for ns in _intervals_ns(t)))
        for key, backend in list(self._backends.items()):
            target = wanted.get(key)
            if target == backend.target:
                continue
            del self._backends[key]
            backend.stop()
            if target is not None:
                same = (target.address, target.port) == (backend.target.address, backend.target.port)
                self._backends[key] = _Backend(
                    self, target, backend.window if same else None, backend.last_load if same else None
                )
        for key, target in wanted.items():
            if key not in self._backends:
                self._backends[key] = _Backend(self, target)
        for key in [key for key in self._relaxed if key not in wanted]:
            del self._relaxed[key]

    def set_budget(self, budget_per_s: float) -> None:
        """At most about budget_per_s probes a second from now on (0: no budget); the stretch
        follows at once."""
        if budget_per_s != self._cap_per_s:
            self._cap_per_s = self._budget_per_s = budget_per_s
            if self._loop is not None:
                self._plan(self.budget.demand_per_s)

    @property
    def short(self) -> bool:
        """Whether a shortfall is being reported (on_budget said so last)."""
        return self._short

    def relax(self, keys: Iterable[Hashable], until_ns: int) -> None:
        """Probe these targets every probe.relaxed_ms until until_ns (time.monotonic_ns), as long
        as their last probe.rise probes passed; a later call moves the end either way. An end
        that has passed brings the full rate back at once (the next probe one interval after
        the last). Unknown keys and targets without probe are ignored."""
        now = _monotonic_ns()
        relaxed, backends = self._relaxed, self._backends
        for key in keys:
            backend = backends.get(key)
            if backend is None or backend.window is None:
                continue
            if until_ns > now:
                relaxed[key] = until_ns
            elif relaxed.pop(key, None) is not None:
                backend.hurry()

    def confirm(self, key: Hashable, delay_ms: float) -> bool:
        """One extra probe of key delay_ms from now, off its schedule, whose Sample has extra
        set: a second look at a result that may be noise (weights.confirm_due). Refused (False)
        when the next regular probe starts about as soon, one is asked already, the target is
        relaxed, or unknown or without probe."""
        backend = self._backends.get(key)
        if backend is None or backend.probe_check is None:
            return False
        return backend.probe_check.confirm(int(delay_ms * 1_000_000))

    def relaxed(self, key: Hashable) -> bool:
        """Whether key's next probe was set at the relaxed interval."""
        backend = self._backends.get(key)
        return backend is not None and backend.probe_check is not None and backend.probe_check.slow

    def window(self, key: Hashable) -> Optional[Window]:
        """The recent samples of key; None for an unknown key or a target without probe."""
        backend = self._backends.get(key)
        return backend.window if backend is not None else None

    def last_load(self, key: Hashable) -> Optional[Load]:
        backend = self._backends.get(key)
        return backend.last_load if backend is not None else None

    def keys(self) -> list[Hashable]:
        return list(self._backends)

    async def close(self) -> None:
        """Stop every probe and close every socket and channel; the prober is then unusable."""
        self._closed = True
        if self._rebudget_timer is not None:
            self._rebudget_timer.cancel()
            self._rebudget_timer = None
        for backend in self._backends.values():
            backend.stop()
        self._backends.clear()
        self._relaxed.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._slots.clear()
        for sock in self._dead:
            sock.close()
        self._dead.clear()
        if self._ep is not None:
            self._loop.remove_reader(self._ep.fileno())
            self._ep.close()
            self._ep = None
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    # -- for the checks: checks.Host, all a check may ask of the prober running it

    def at(self, t_ns: int, check: _Check) -> None:
        """Call check.tick() at the first tick at or after t_ns (monotonic)."""
        tick = -(-t_ns // self._tick_ns)
        checks = self._slots.get(tick)
        if checks is None:
            checks = self._slots[tick] = []
            delay_s = (tick * self._tick_ns - _monotonic_ns()) / 1e9
            self._timers[tick] = self._loop.call_later(delay_s if delay_s > 0 else 0, self._fire, tick)
        checks.append(check)

    def relaxed_until(self, key: Hashable) -> int:
        """Until when (monotonic ns) key is relaxed (Prober.relax); 0: not relaxed."""
        return self._relaxed.get(key, 0)

    def watch(self, fd: int, on_event: Callable[[int], None]) -> None:
        """Call on_event(events) for fd's epoll events (armed by register and modify)."""
        self._handlers[fd] = on_event

    def register(self, fd: int, events: int) -> None:
        self._ep.register(fd, events)

    def modify(self, fd: int, events: int) -> None:
        self._ep.modify(fd, events)

    def drop(self, fd: int, sock: socket.socket) -> None:
        """Forget and close sock. Inside an event batch the close waits for the batch's end,
        so that no new socket reuses the number while events for the old one are pending."""
        self._handlers.pop(fd, None)
        if self._in_batch:
            self._dead.append(sock)
        else:
            sock.close()

    def spawn(self, coroutine) -> asyncio.Task:
        """coroutine as a task on the prober's loop (a grpc check's call)."""
        return self._loop.create_task(coroutine)

    def report(self, message: str, e: BaseException) -> None:
        """A bug in a check or a callback: to the loop's exception handler; probing goes on."""
        if self._loop is not None:
            self._loop.call_exception_handler({"message": message, "exception": e})

    # -- the wheel and epoll

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._period_ns = _perf_ns()  # the first budget period
            self._ep = select.epoll()
            loop.add_reader(self._ep.fileno(), self._on_epoll)
            self._rebudget_timer = loop.call_later(REBUDGET_S, self._rebudget)
        elif loop is not self._loop:
            raise RuntimeError("prober used from another event loop")

    def _rebudget(self) -> None:
        """The demand summed again over the checks as they run now (relaxed ones at their
        relaxed interval), and the stretch planned from it; again in REBUDGET_S."""
        if self._closed:
            return
        now = _perf_ns()
        if self.busy_elsewhere is not None:  # the results' handling on another loop (probe.child)
            elsewhere = self.busy_elsewhere()
            self._busy_ns += elsewhere - self._elsewhere_ns
            self._elsewhere_ns = elsewhere
        share = self._busy_ns / (now - self._period_ns) if now > self._period_ns else 0.0
        self._busy_ns, self._period_ns = 0, now
        self._budget_per_s = budgets.adapt(self._budget_per_s, self._cap_per_s, self.budget.run_per_s, share)
        rates = (check.interval_now_ns() for backend in self._backends.values() for check in backend.checks)
        self._plan(budgets.demand(rates))
        self._rebudget_timer = self._loop.call_later(REBUDGET_S, self._rebudget)

    def _plan(self, demand_per_s: float) -> None:
        b = self.budget = budgets.plan(demand_per_s, self._budget_per_s, self._cap_per_s)
        self.stretch = b.stretch
        short = budgets.still_short(self._short, b)
        if short != self._short:
            self._short = short
            if self.on_budget is not None:
                try:
                    self.on_budget(b)
                except Exception as e:
                    self.report("prober: on_budget failed", e)

    def _fire(self, tick: int) -> None:
        t0 = _perf_ns()
        self._timers.pop(tick, None)
        due_ns = tick * self._tick_ns
        for check in self._slots.pop(tick, ()):
            try:
                check.tick(due_ns)
            except Exception as e:  # the tick's other probes still run
                self.report("prober: a scheduled call failed", e)
        self._busy_ns += _perf_ns() - t0  # the prober's share of the loop (budget.adapt)

    def _on_epoll(self) -> None:
        t0 = _perf_ns()
        handlers = self._handlers
        self._in_batch = True
        try:
            for fd, events in self._ep.poll(0):
                on_event = handlers.get(fd)
                if on_event is not None:
                    try:
                        on_event(events)
                    except Exception as e:  # a bug in one check must not stop the batch
                        on_event.__self__._fault(e)
        finally:
            self._in_batch = False
            dead, self._dead = self._dead, []
            for sock in dead:
                sock.close()
            self._busy_ns += _perf_ns() - t0

    def _later(self, coroutine) -> None:
        task = self._loop.create_task(coroutine)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
