"""The prober in a child process of its own: a Prober (probe.engine) run by `python -m
controlplane.probe.child` on its own interpreter, so that its timer wheel, epoll batches and socket
work hold neither the caller's loop (edged's, which answers the API) nor its GIL. ChildProber is
the caller's side, with the calls of Prober. What crosses the socketpair between them, as
length-prefixed pickles (the two ends are this package's, on one host):

- results out, in batches: the child collects every Sample, Load and budget change of one pass of
  its loop and sends them in one frame, with the budget, stretch and shortfall when they changed
  and whether each sampled target is relaxed now; on the caller's loop they go into the target's
  Window (the Windows and last Loads live there: status reads them) and to on_sample / on_load /
  on_budget, in the order they came.
- calls in: set_targets and set_budget are sent and their answer waited for (the caller sees their
  effect, and their errors, on return); relax and confirm are posted (confirm says only that it
  was posted). Every ELSEWHERE_EVERY_S the caller posts the wall time its loop spent on results, so
  that the budget (probe.budget) still counts the probes with their steering.
- the child's life: it starts at the first set_targets() with a target. close() asks it to stop
  every probe and exit, and kills it if it does not within CLOSE_WITHIN_S. A child whose socket
  ends (its parent is gone, even killed with SIGKILL) or whose parent pid changes exits on its own.
  A child that dies is reported (on_restart, and the loop's exception handler when none) and
  started again after RESTART_S with the targets and budget of now; the Windows stay.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Optional

from controlplane.probe import budget as budgets
from controlplane.probe.engine import Target, by_key
from controlplane.samples import Load, Sample, Window

CALL_WITHIN_S = 30.0  # set_targets of tens of thousands of targets takes well under this
CLOSE_WITHIN_S = 5.0  # a child that has not exited this long after close() is killed
RESTART_S = 1.0  # a child that died is started again after this
ELSEWHERE_EVERY_S = 0.5  # how often the caller's share of the probes' handling is sent
PARENT_CHECK_S = 1.0  # how often the child looks whether its parent is still there
_HEAD = struct.Struct("!I")
_RECV = 1 << 20
# Results are handled on the caller's loop this long at a time (then the loop is given back and the
# rest follow): frames that piled up while the loop was busy were handled in one go, up to 338 ms
# at 10,000 backends with the steering's on_sample (tools/bench-probe --scale --gc-log)
DELIVER_SLICE_NS = 10_000_000
_CHUNK = 64  # a batch's results between two looks at the clock
_perf_ns = time.perf_counter_ns
_KINDS = {"s": "sample", "l": "load", "b": "budget"}
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(data)) + data


class ChildGone(RuntimeError):
    """The prober's child process ended while a call waited for it."""


class ChildProber:
    """A Prober in a child process (module docstring); the child starts at the first
    set_targets() with a target, which binds the caller's loop (callbacks run there).
    on_restart(message): a child died and is started again."""

    def __init__(
        self,
        on_sample: Optional[Callable[[Hashable, Sample], None]] = None,
        on_load: Optional[Callable[[Hashable, Load], None]] = None,
        *,
        on_budget: Optional[Callable[[budgets.Budget], None]] = None,
        on_restart: Optional[Callable[[str], None]] = None,
        budget_per_s: float = 0,
    ):
        self.on_sample, self.on_load, self.on_budget, self.on_restart = on_sample, on_load, on_budget, on_restart
        self.restarts = 0  # children that died and were started again
        self._budget_per_s = budget_per_s
        self._targets: dict[Hashable, Target] = {}
        self._windows: dict[Hashable, Window] = {}
        self._loads: dict[Hashable, Load] = {}
        self._relaxed: set[Hashable] = set()
        self._budget, self._stretch, self._short = budgets.NO_BUDGET, 1.0, False
        self._home: Optional[asyncio.AbstractEventLoop] = None
        self._proc: Optional[subprocess.Popen] = None
        self._sock: Optional[socket.socket] = None
        self._inbuf = bytearray()
        self._outbuf = bytearray()
        self._writing = False
        # frames read and not handled yet (while a call waited for its answer, or past a slice)
        self._held: deque[tuple] = deque()
        self._seq = 0
        self._handoff_ns = 0  # wall time the caller's loop spent on results (budget.adapt)
        self._handoff_sent_ns = 0
        self._restart_timer: Optional[asyncio.TimerHandle] = None
        self._closed = False

    # -- what Prober offers

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Prober.set_targets, in the child, waited for; a changed target on the same address and
        port keeps its Window (resized) and its last Load, as there."""
        if self._closed:
            raise RuntimeError("prober is closed")
        wanted = by_key(targets)
        if self._proc is None and not wanted:  # no child until there is something to probe
            self._mirror(wanted)
            return
        if self._proc is None and self._restart_timer is None:
            self._start()
        if self._sock is not None:
            self._call("targets", list(wanted.values()))
        self._mirror(wanted)  # (without a child, the restart sends them)

    def set_budget(self, budget_per_s: float) -> None:
        self._budget_per_s = budget_per_s
        if self._sock is not None:
            self._call("budget", budget_per_s)

    def relax(self, keys: Iterable[Hashable], until_ns: int) -> None:
        """Prober.relax, posted (until_ns is CLOCK_MONOTONIC, the child's clock too)."""
        self._post(("relax", list(keys), until_ns))

    def confirm(self, key: Hashable, delay_ms: float) -> bool:
        """Posts Prober.confirm; True: posted (the child may still refuse it)."""
        return self._post(("confirm", key, delay_ms))

    def relaxed(self, key: Hashable) -> bool:
        return key in self._relaxed

    def window(self, key: Hashable) -> Optional[Window]:
        return self._windows.get(key)

    def last_load(self, key: Hashable) -> Optional[Load]:
        return self._loads.get(key)

    def keys(self) -> list[Hashable]:
        return list(self._targets)

    @property
    def budget(self) -> budgets.Budget:
        return self._budget

    @property
    def stretch(self) -> float:
        return self._stretch

    @property
    def short(self) -> bool:
        return self._short

    @property
    def running(self) -> bool:
        """Whether a child process is there (started and not yet ended)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    async def close(self) -> None:
        """The child stops every probe, closes every socket and exits (killed if it has not within
        CLOSE_WITHIN_S); results not yet delivered are dropped."""
        if self._closed:
            return
        self._closed = True
        if self._restart_timer is not None:
            self._restart_timer.cancel()
            self._restart_timer = None
        proc = self._proc
        if proc is None:
            return
        if self._sock is not None:
            try:
                self._send(_frame(("close",)), wait=True)
            except OSError:
                pass
        try:
            await asyncio.to_thread(proc.wait, CLOSE_WITHIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        self._drop_socket()

    # -- the child's life, on the caller's loop

    def _mirror(self, wanted: dict[Hashable, Target]) -> None:
        """The Windows and last Loads as the engine keeps them for these targets."""
        windows, loads = {}, {}
        for key, target in wanted.items():
            old = self._targets.get(key)
            same = old is not None and (old.address, old.port) == (target.address, target.port)
            if target.probe is not None:
                window = self._windows.get(key) if same else None
                if window is None:
                    window = Window(target.probe.window)
                window.resize(target.probe.window)
                windows[key] = window
            if same and target.metrics is not None and key in self._loads:
                loads[key] = self._loads[key]
        self._targets, self._windows, self._loads = wanted, windows, loads
        self._relaxed &= set(wanted)

    def _start(self) -> None:
        """A child, told the budget; then set_targets (or the restart) tells it the targets."""
        loop = asyncio.get_running_loop()
        if self._home is None:
            self._home = loop
        elif loop is not self._home:
            raise RuntimeError("prober used from another event loop")
        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "controlplane.probe.child", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock, self._inbuf, self._outbuf, self._held = mine, bytearray(), bytearray(), deque()
        mine.setblocking(False)
        loop.add_reader(mine.fileno(), self._readable)
        self._post(("call", 0, "budget", (self._budget_per_s,)))  # its answer is not waited for

    def _call(self, op: str, *args: Any) -> Any:
        """op(*args) in the child; waits for its answer (frames read meanwhile are delivered
        after it) and returns or raises what it did."""
        self._seq += 1
        seq, sock = self._seq, self._sock
        self._send(_frame(("call", seq, op, args)), wait=True)
        deadline = time.monotonic() + CALL_WITHIN_S
        try:
            sock.settimeout(CALL_WITHIN_S)
            while True:
                for msg in self._frames():
                    if msg[0] == "reply" and msg[1] == seq:
                        if self._held:
                            self._home.call_soon(self._deliver_held)
                        if msg[2] is not None:
                            raise msg[2]
                        return msg[3]
                    if msg[0] == "batch" and msg[2] is not None:  # the budget as the call left it, at once
                        self._budget, self._stretch, self._short = msg[2]
                        msg = ("batch", msg[1], None)
                    self._held.append(msg)
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(_RECV)
                if not data:
                    raise ChildGone("the prober's child process ended")
                self._inbuf += data
        except (ChildGone, OSError) as e:
            self._home.call_soon(self._lost, str(e) or type(e).__name__)
            if isinstance(e, ChildGone):
                raise
            raise ChildGone(f"the prober's child process did not answer: {e}") from e
        finally:
            if self._sock is sock:
                sock.setblocking(False)

    def _post(self, msg: tuple) -> bool:
        if self._sock is None or self._closed:
            return False
        try:
            self._send(_frame(msg))
        except OSError:
            return False
        return True

    def _send(self, data: bytes, wait: bool = False) -> None:
        """data after what is queued; wait: all of it sent before returning (blocking)."""
        self._outbuf += data
        sock = self._sock
        if wait:
            sock.settimeout(CALL_WITHIN_S)
            try:
                sock.sendall(self._outbuf)
                self._outbuf.clear()
            finally:
                sock.setblocking(False)
            return
        self._flush()

    def _flush(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            while self._outbuf:
                n = sock.send(self._outbuf)
                del self._outbuf[:n]
        except BlockingIOError:
            pass
        except OSError:
            self._outbuf.clear()  # the reader finds the end
        if self._outbuf and not self._writing:
            self._home.add_writer(sock.fileno(), self._flush)
            self._writing = True
        elif not self._outbuf and self._writing:
            self._home.remove_writer(sock.fileno())
            self._writing = False

    def _frames(self):
        buf = self._inbuf
        at = 0
        while len(buf) - at >= _HEAD.size:
            (n,) = _HEAD.unpack_from(buf, at)
            if len(buf) - at - _HEAD.size < n:
                break
            msg = pickle.loads(bytes(buf[at + _HEAD.size : at + _HEAD.size + n]))
            at += _HEAD.size + n
            del buf[:at]
            at = 0
            yield msg

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        ended = False
        try:
            while True:
                data = sock.recv(_RECV)
                if not data:
                    ended = True
                    break
                self._inbuf += data
        except BlockingIOError:
            pass
        except OSError:
            ended = True
        if ended:
            self._deliver_held(sliced=False)  # all of it before the end is reported
            self._lost("its socket ended")
        else:
            self._deliver_held()

    def _deliver_held(self, sliced: bool = True) -> None:
        """The frames held, then those read and not decoded yet, in the order read; sliced: for
        DELIVER_SLICE_NS, the rest after the loop has run its other callbacks (a batch is cut
        between two of its results for that; a frame is decoded when its turn comes)."""
        held, read = self._held, self._frames()
        until = _perf_ns() + DELIVER_SLICE_NS
        while held or self._inbuf:
            msg = held.popleft() if held else next(read, None)
            if msg is None:  # a frame not whole yet
                return
            if sliced and msg[0] == "batch" and len(msg[1]) > _CHUNK:
                held.appendleft(("batch", msg[1][_CHUNK:], None))
                msg = ("batch", msg[1][:_CHUNK], msg[2])
            self._handle(msg)
            if sliced and (held or self._inbuf) and _perf_ns() >= until:
                if self._home is not None and not self._home.is_closed():
                    self._home.call_soon(self._deliver_held)
                return

    def _handle(self, msg: tuple) -> None:
        if self._closed:
            return
        if msg[0] == "batch":
            self._deliver(msg[1], msg[2])
        elif msg[0] == "fault":
            self._home.call_exception_handler({"message": f"prober child: {msg[1]}"})
        elif msg[0] == "reply" and msg[2] is not None:  # of a call not waited for (a restart's)
            self._home.call_exception_handler({"message": "prober child: a call failed", "exception": msg[2]})

    def _deliver(self, batch: list[tuple], state: Optional[tuple]) -> None:
        t0 = _perf_ns()
        if state is not None:
            self._budget, self._stretch, self._short = state
        for kind, key, value, relaxed in batch:
            try:
                if kind == "s":
                    window = self._windows.get(key)
                    if window is not None and not value.extra:  # a confirmation is not a round of the window
                        window.add(value)
                    if relaxed:
                        self._relaxed.add(key)
                    else:
                        self._relaxed.discard(key)
                    if self.on_sample is not None:
                        self.on_sample(key, value)
                elif kind == "l":
                    if key in self._targets:
                        self._loads[key] = value
                    if self.on_load is not None:
                        self.on_load(key, value)
                elif self.on_budget is not None:
                    self.on_budget(value)
            except Exception as e:
                self._home.call_exception_handler({"message": f"prober: on_{_KINDS[kind]} failed", "exception": e})
        now = _perf_ns()
        self._handoff_ns += now - t0
        if now - self._handoff_sent_ns >= ELSEWHERE_EVERY_S * 1e9:
            self._handoff_sent_ns = now
            self._post(("elsewhere", self._handoff_ns))

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None and self._home is not None and not self._home.is_closed():
            self._home.remove_reader(sock.fileno())
            if self._writing:
                self._home.remove_writer(sock.fileno())
            self._writing = False
        if sock is not None:
            sock.close()

    def _lost(self, why: str) -> None:
        """The child's socket ended: unless closing, it is reported and started again."""
        proc = self._proc
        if self._closed or proc is None or self._sock is None:
            return
        self._drop_socket()
        try:
            rc = proc.wait(1.0)
        except subprocess.TimeoutExpired:  # its socket ended, the process did not: no half-prober
            proc.kill()
            rc = proc.wait()
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        self.restarts += 1
        message = f"prober: its child process {proc.pid} ended ({how}; {why}); starting another in {RESTART_S:g}s"
        if self.on_restart is not None:
            try:
                self.on_restart(message)
            except Exception as e:
                self._home.call_exception_handler({"message": "prober: on_restart failed", "exception": e})
        else:
            self._home.call_exception_handler({"message": message})
        self._proc = None
        self._restart_timer = self._home.call_later(RESTART_S, self._restart)

    def _restart(self) -> None:
        self._restart_timer = None
        if self._closed:
            return
        try:  # not waited for: edged's loop goes on while the child starts
            self._start()
            self._post(("call", 0, "targets", (list(self._targets.values()),)))
        except Exception as e:  # it is reported and tried again when it ends
            self._home.call_exception_handler({"message": "prober: starting its child process failed", "exception": e})
            if self._proc is None and not self._closed:
                self._restart_timer = self._home.call_later(RESTART_S, self._restart)


# ---------------------------------------------------------------- the child


class _Child:
    """The child's side: one Prober on this process's loop, served over the socket."""

    def __init__(self, sock: socket.socket, parent: int):
        from controlplane.probe.engine import Prober

        self.sock, self.parent = sock, parent
        self.elsewhere_ns = 0
        self.prober = Prober(self._took_sample, self._took_load, on_budget=self._took_budget, add_to_windows=False)
        self.prober.busy_elsewhere = lambda: self.elsewhere_ns
        self.out: list[tuple] = []
        self.sent_state: Optional[tuple] = None
        self.writer: Optional[asyncio.StreamWriter] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def run(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._fault)
        reader, self.writer = await asyncio.open_connection(sock=self.sock, limit=_RECV)
        loop.call_later(PARENT_CHECK_S, self._watch_parent)
        loop.call_later(budgets_every_s(), self._send_state)
        try:
            while True:
                try:
                    (n,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
                    msg = pickle.loads(await reader.readexactly(n))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the parent is gone
                if msg[0] == "close":
                    return
                self._do(msg)
        finally:
            await self.prober.close()
            self.writer.close()

    def _do(self, msg: tuple) -> None:
        op = msg[0]
        if op == "call":
            _, seq, what, args = msg
            try:
                if what == "targets":
                    result = self.prober.set_targets(args[0])
                elif what == "budget":
                    result = self.prober.set_budget(args[0])
                else:
                    raise ValueError(f"no call {what!r}")
                reply = ("reply", seq, None, result)
            except Exception as e:
                reply = ("reply", seq, e, None)
            self._hand_over()  # what those calls did to the budget, before the answer
            self.writer.write(_frame(reply))
        elif op == "relax":
            self.prober.relax(msg[1], msg[2])
        elif op == "confirm":
            self.prober.confirm(msg[1], msg[2])
        elif op == "elsewhere":
            self.elsewhere_ns = msg[1]

    def _took_sample(self, key: Hashable, sample: Sample) -> None:
        self._queue(("s", key, sample, False))

    def _took_load(self, key: Hashable, load: Load) -> None:
        self._queue(("l", key, load, False))

    def _took_budget(self, b: budgets.Budget) -> None:
        self._queue(("b", None, b, False))

    def _queue(self, item: tuple) -> None:
        """Collected until the end of this pass of the loop (call_soon runs after it)."""
        if not self.out:
            self.loop.call_soon(self._hand_over)
        self.out.append(item)

    def _state(self) -> Optional[tuple]:
        p = self.prober
        state = (p.budget, p.stretch, p.short)
        if state == self.sent_state:
            return None
        self.sent_state = state
        return state

    def _hand_over(self) -> None:
        batch, self.out = self.out, []
        relaxed = self.prober.relaxed
        batch = [(k, key, v, relaxed(key)) if k == "s" else (k, key, v, r) for k, key, v, r in batch]
        state = self._state()
        if (batch or state is not None) and self.writer is not None and not self.writer.is_closing():
            self.writer.write(_frame(("batch", batch, state)))

    def _send_state(self) -> None:
        self._hand_over()
        self.loop.call_later(budgets_every_s(), self._send_state)

    def _watch_parent(self) -> None:
        if os.getppid() != self.parent:  # the parent is gone and its socket lives on elsewhere
            os._exit(0)
        self.loop.call_later(PARENT_CHECK_S, self._watch_parent)

    def _fault(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        e = context.get("exception")
        text = context.get("message", "fault") + (f": {type(e).__name__}: {e}" if e is not None else "")
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(_frame(("fault", text)))


def budgets_every_s() -> float:
    from controlplane.probe.engine import REBUDGET_S

    return REBUDGET_S


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    fd, parent = int(argv[0]), int(argv[1])
    if os.getppid() != parent:
        return 0
    sock = socket.socket(fileno=fd)
    asyncio.run(_Child(sock, parent).run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
