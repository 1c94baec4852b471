"""The prober on a thread of its own (edged's until probe.child took its place; kept for a caller
that wants no child process): a Prober (probe.engine) run on a private asyncio loop in one
thread, so that its timer wheel, epoll batches and socket work never hold the caller's loop
(edged's, which answers the API). Same calls as Prober; what crosses between the two loops:

- results out, in batches: the prober thread collects every Sample, Load and budget change of one
  pass of its loop and hands them over with one call_soon_threadsafe; on the caller's loop they go
  into the target's Window and to on_sample / on_load / on_budget, in the order they came. The
  Windows belong to the caller's loop (status reads them there and on its worker threads): the
  prober thread never touches one after set_targets.
- calls in: set_targets and set_budget run on the prober's loop and are waited for (the caller sees
  their effect, and their errors, on return); relax and confirm are posted and return at once
  (confirm says only that it was posted). window, last_load, keys, relaxed, budget, stretch and
  short read what the prober thread wrote last.
- the budget (probe.budget): the prober's share is the wall time of its callbacks on its own loop
  (waits for the GIL while edged's loop holds it included: the budget gives way to edged's loop)
  plus that of the handed-over results' handling on the caller's loop, so "half of the loop" still
  means the probes with their steering.
- close() stops every probe on the prober's loop, then that loop, and joins the thread.

The thread shares the interpreter: it frees the caller's loop, not the GIL. tools/bench-probe
--scale measures what it gives."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Optional

from controlplane.probe import budget as budgets
from controlplane.probe.engine import Prober, Target
from controlplane.samples import Load, Sample, Window

# Two busy threads hand the GIL over every switch interval (5 ms by default): each time the caller's
# loop wakes while the prober's thread computes, it waits that long. A shorter interval from the
# first prober thread's start on (the process's setting: it is not put back), so that an API
# call's few wake-ups cost little (tools/bench-probe --scale).
SWITCH_S = 0.0005
CALL_WITHIN_S = 30.0  # set_targets of tens of thousands of targets takes well under this
THREAD_NAME = "edged-prober"
_perf_ns = time.perf_counter_ns
_KINDS = {"s": "sample", "l": "load", "b": "budget"}


class ThreadedProber:
    """A Prober on its own thread and loop (module docstring); the thread starts at the first
    set_targets() with a target, which binds the caller's loop (callbacks run there)."""

    def __init__(
        self,
        on_sample: Optional[Callable[[Hashable, Sample], None]] = None,
        on_load: Optional[Callable[[Hashable, Load], None]] = None,
        *,
        on_budget: Optional[Callable[[budgets.Budget], None]] = None,
        **prober_kwargs: Any,
    ):
        self.on_sample = on_sample
        self.on_load = on_load
        self.on_budget = on_budget
        self._prober = Prober(
            self._took_sample, self._took_load, on_budget=self._took_budget, add_to_windows=False, **prober_kwargs
        )
        self._prober.busy_elsewhere = lambda: self._handoff_ns
        self._handoff_ns = 0  # wall time the caller's loop spent on handed-over results (budget.adapt)
        self._home: Optional[asyncio.AbstractEventLoop] = None  # the caller's loop
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the prober's
        self._thread: Optional[threading.Thread] = None
        self._out: list[tuple] = []  # results of this pass of the prober's loop (prober thread only)
        self._keys: list[Hashable] = []
        self._closed = False

    # -- what Prober offers

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Prober.set_targets, run on the prober's loop and waited for."""
        if self._closed:
            raise RuntimeError("prober is closed")
        targets = list(targets)
        if self._thread is None and not targets:  # no thread until there is something to probe
            self._keys = []
            return
        self._start()
        self._call(self._prober.set_targets, targets)
        self._keys = self._prober.keys()

    def set_budget(self, budget_per_s: float) -> None:
        if self._loop is None:  # before the first set_targets: nothing runs yet
            self._prober._cap_per_s = self._prober._budget_per_s = budget_per_s
        else:
            self._call(self._prober.set_budget, budget_per_s)

    def relax(self, keys: Iterable[Hashable], until_ns: int) -> None:
        if self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(self._prober.relax, list(keys), until_ns)

    def confirm(self, key: Hashable, delay_ms: float) -> bool:
        """Posts Prober.confirm; True: posted (the prober may still refuse it)."""
        if self._loop is None or self._closed:
            return False
        self._loop.call_soon_threadsafe(self._prober.confirm, key, delay_ms)
        return True

    def relaxed(self, key: Hashable) -> bool:
        return self._prober.relaxed(key)

    def window(self, key: Hashable) -> Optional[Window]:
        return self._prober.window(key)

    def last_load(self, key: Hashable) -> Optional[Load]:
        return self._prober.last_load(key)

    def keys(self) -> list[Hashable]:
        return list(self._keys)

    @property
    def budget(self) -> budgets.Budget:
        return self._prober.budget

    @property
    def stretch(self) -> float:
        return self._prober.stretch

    @property
    def short(self) -> bool:
        return self._prober.short

    @property
    def running(self) -> bool:
        """Whether the prober's thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    async def close(self) -> None:
        """Every probe stopped and every socket closed on the prober's loop, then that loop ends
        and its thread is joined; results not yet handed over are dropped."""
        if self._closed:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._prober.close(), loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)

    # -- the prober's thread

    def _start(self) -> None:
        if self._thread is not None:
            if asyncio.get_running_loop() is not self._home:
                raise RuntimeError("prober used from another event loop")
            return
        self._home = asyncio.get_running_loop()
        if sys.getswitchinterval() > SWITCH_S:
            sys.setswitchinterval(SWITCH_S)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=THREAD_NAME, daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._report)
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _report(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """A fault on the prober's loop goes to the caller loop's exception handler."""
        home = self._home
        if home is not None and not home.is_closed():
            home.call_soon_threadsafe(home.call_exception_handler, context)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the prober's loop; waits for it and returns or raises what it did."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as e:
                done.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return done.result(CALL_WITHIN_S)

    def _took_sample(self, key: Hashable, sample: Sample) -> None:
        self._queue(("s", key, sample, self._prober.window(key)))

    def _took_load(self, key: Hashable, load: Load) -> None:
        self._queue(("l", key, load, None))

    def _took_budget(self, b: budgets.Budget) -> None:
        self._queue(("b", None, b, None))

    def _queue(self, item: tuple) -> None:
        """Collected until the end of this pass of the prober's loop (call_soon runs after it)."""
        if not self._out:
            self._loop.call_soon(self._hand_over)
        self._out.append(item)

    def _hand_over(self) -> None:
        batch, self._out = self._out, []
        home = self._home
        if batch and home is not None and not home.is_closed():
            home.call_soon_threadsafe(self._deliver, batch)

    # -- the caller's loop

    def _deliver(self, batch: list[tuple]) -> None:
        if self._closed:
            return
        t0 = _perf_ns()
        for kind, key, value, window in batch:
            try:
                if kind == "s":
                    if window is not None and not value.extra:  # a confirmation is not a round of the window
                        window.add(value)
                    if self.on_sample is not None:
                        self.on_sample(key, value)
                elif kind == "l":
                    if self.on_load is not None:
                        self.on_load(key, value)
                elif self.on_budget is not None:
                    self.on_budget(value)
            except Exception as e:
                self._home.call_exception_handler({"message": f"prober: on_{_KINDS[kind]} failed", "exception": e})
        self._handoff_ns += _perf_ns() - t0
