"""The prober's check kinds, one schedule of one target each: TCP connect (the kernel's
tcpi_rtt), HTTP GET of a health path or a metrics page on a kept-alive connection (the
answer's kernel receive time; read with probe.http), and grpc.health.v1 Check. Each turns a
round into a Sample (or a Load for a scrape); the engine (probe.engine) drives them. The
gRPC kind lives in probe.grpccheck."""

from __future__ import annotations

import asyncio
import errno
import random
import socket
import struct
import time
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Hashable, Optional, Protocol

from controlplane.probe.http import Response
from controlplane.probe.metrics import MetricsError, load_from, parse_metrics
from controlplane.probe.sockets import (  # noqa: F401 (re-exported: engine, grpccheck, tests)
    _EPOLLIN,
    _EPOLLOUT,
    _ONESHOT,
    _SO_TIMESTAMPNS,
    _TCP_INFO_LEN,
    _TCP_SYN_SENT,
    _TCPI_RTT,
    _TS_ANCILLARY,
    SLOW_GRID_NS,
    _disconnect,
    _errno_word,
    _monotonic_ns,
    _new_socket,
    _rtt_if_connected,
    look_at,
)
from controlplane.samples import Load, Sample

if TYPE_CHECKING:
    from controlplane.probe.engine import _Backend

PROBE_RESPONSE_MAX = 65536  # a health answer longer than this is a failure ("too large")
METRICS_RESPONSE_MAX = 8 << 20  # likewise a metrics page
USER_AGENT = "edge-prober"

# ---------------------------------------------------------------- what a check asks of its prober


class Host(Protocol):
    """All a check may ask of the prober running it (engine.Prober implements it): the timer
    wheel, the relaxed state of its target, epoll, the shared receive buffer and the loop."""

    recv_view: memoryview  # one buffer for every check's reads
    stretch: float  # every interval is run this many times longer (the probe budget; 1: none)

    def at(self, t_ns: int, check: _Check) -> None:
        """Call check.tick() at the first tick at or after t_ns (monotonic)."""

    def relaxed_until(self, key: Hashable) -> int:
        """Until when (monotonic ns) the target key is relaxed; 0: not relaxed."""

    def watch(self, fd: int, on_event: Callable[[int], None]) -> None:
        """Call on_event(events) for fd's epoll events."""

    def register(self, fd: int, events: int) -> None:
        """Arm fd in epoll for the first time."""

    def modify(self, fd: int, events: int) -> None:
        """Arm fd again."""

    def drop(self, fd: int, sock: socket.socket) -> None:
        """Forget fd and close sock (after the event batch being dispatched, if any)."""

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task:
        """The coroutine as a task on the prober's loop."""

    def report(self, message: str, e: BaseException) -> None:
        """A bug in a check: reported; probing goes on."""


# ---------------------------------------------------------------- the kinds


class _Check:
    """A probe or scrape schedule: starts every interval, fails at the timeout, never two at
    once. Subclasses implement begin() and may implement on_event(), last_look(), abort().
    A probe given adapt() starts every relaxed interval instead while the prober has its
    target relaxed (Prober.relax) and its last `rise` rounds passed; a failure ends that."""

    def __init__(self, prober: Host, backend: "_Backend", interval_ms: int, timeout_ms: int):
        self.prober = prober
        self.backend = backend
        self.addr = (backend.target.address, backend.target.port)
        self.interval_ns = interval_ms * 1_000_000
        self.timeout_ns = timeout_ms * 1_000_000
        self.busy = False
        self.stopped = False
        self.round = 0
        self.started_ns = 0
        self.relaxed_ns = 0  # the interval while relaxed; 0: never relaxed (scrapes)
        self.rise = 1
        self.passes = 0  # rounds in a row that passed
        self.slow = False  # next_ns was set at the relaxed interval
        self.slow_round = False  # this round was started as a relaxed one
        self.look_ns = 0  # when this round's result is to be looked at on the grid; 0: not
        self.deadline_ns = 0  # this round's timeout (on the grid for a relaxed round)
        self.extra_ns = 0  # when a confirmation round (confirm()) is to start; 0: none asked
        self.extra_round = False  # this round is a confirmation, off the schedule
        self.next_ns = _monotonic_ns() + int(random.random() * self.interval_ns * prober.stretch)
        prober.at(self.next_ns, self)

    def adapt(self, interval_ms: int, rise: int) -> None:
        """Let this probe slow down to interval_ms while its target is relaxed and its last
        rise rounds passed."""
        self.relaxed_ns = max(interval_ms * 1_000_000, self.interval_ns)
        self.rise = rise

    def confirm(self, delay_ns: int) -> bool:
        """One extra round delay_ns from now, off the schedule (the regular starts stay where
        they are), unless the next regular round starts about as soon (within half of delay_ns
        after it), one is asked already, or the schedule is relaxed. Whether it was taken."""
        at = _monotonic_ns() + delay_ns
        if self.stopped or self.slow or self.extra_ns or at > self.next_ns - delay_ns // 2:
            return False
        self.extra_ns = at
        self.prober.at(at, self)
        return True

    def interval_now_ns(self) -> int:
        """The interval this schedule asks for now, before the budget: relaxed or full rate."""
        return self.relaxed_ns if self.slow else self.interval_ns

    def tick(self, due_ns: int) -> None:
        """The wheel's call at due_ns for this check's deadline or next start (an entry for
        each; a call with nothing due does nothing)."""
        if self.stopped:
            return
        if self.busy:
            if self.started_ns + self.timeout_ns > due_ns:
                if self.look_ns and self.look_ns <= due_ns:
                    self.look_ns = 0
                    self._look()
                if self.busy:
                    return  # a start due before the deadline waits for the deadline's own call
            else:
                self._deadline()
        if self.next_ns <= due_ns:
            self.extra_ns = 0  # the regular round is the confirmation
            self._start()
        elif self.extra_ns and self.extra_ns <= due_ns and not self.busy:
            self.extra_ns = 0
            self._start(extra=True)

    def _start(self, extra: bool = False) -> None:
        now = _monotonic_ns()
        self.round += 1
        self.busy = True
        self.started_ns = now
        self.look_ns = 0
        self.slow_round = self.slow
        self.extra_round = extra
        deadline_ns = now + self.timeout_ns
        if self.slow:  # a relaxed round: a timeout up to one grid step late is still a timeout
            deadline_ns = -(-deadline_ns // SLOW_GRID_NS) * SLOW_GRID_NS
        self.deadline_ns = deadline_ns
        if not extra:
            self._next()
        try:
            self.begin()
        except OSError as e:  # no socket to be had (EMFILE, ENOBUFS): a failed probe too
            self.abort()
            self.fail(_errno_word(e.errno) if e.errno else str(e))
        except Exception as e:  # a bug here must not stop the other probes of this tick
            self._fault(e)
        # The deadline's call, for a round still going that no look will settle first: a round
        # that ended within begin() needs none, and a look that finds it unsettled places it.
        if self.busy and not self.look_ns:
            self.prober.at(deadline_ns, self)

    def _next(self) -> None:
        """Place the next regular start, one (relaxed, stretched) step on from this one."""
        now = self.started_ns
        step = self.interval_ns
        if self.relaxed_ns > step and self.passes >= self.rise and self.prober.relaxed_until(self.backend.key) > now:
            if not self.slow:  # targets relaxed together start their slow rounds spread out
                self.slow = True
                step += int(random.random() * (self.relaxed_ns - step))
            else:
                step = self.relaxed_ns
        else:
            self.slow = False
        stretch = self.prober.stretch
        if stretch != 1.0:  # the probe budget: every schedule by the same factor
            step = int(step * stretch)
        next_ns = self.next_ns + step
        if next_ns <= now:  # the loop was held up: skip the missed starts, never bunch them
            next_ns += ((now - next_ns) // step + 1) * step
        if self.slow:
            next_ns = -(-next_ns // SLOW_GRID_NS) * SLOW_GRID_NS
        self.next_ns = next_ns
        self.prober.at(next_ns, self)

    def _look(self) -> None:
        try:
            self.look()
        except Exception as e:
            self._fault(e)

    def _deadline(self) -> None:
        try:
            self.last_look()  # an answer the loop has not read yet still counts
        except Exception as e:
            self._fault(e)
        if self.busy:
            self.abort()
            self.fail("timeout")

    def _fault(self, e: Exception) -> None:
        self.prober.report(f"prober: {type(self).__name__} of {self.backend.target.key!r} failed", e)
        try:
            self.abort()
        except Exception:
            pass  # reported above; the round fails all the same
        if self.busy:
            self.fail(f"prober error: {type(e).__name__}")

    def finish(self, rtt_ns: int) -> None:
        """The probe succeeded with this RTT (a timeout if it is longer than the timeout)."""
        if rtt_ns > self.timeout_ns:
            self.fail("timeout")
            return
        self.busy = False
        self.passes += 1
        self._regular_due()
        self.backend.sample(Sample(self.started_ns, True, rtt_ns / 1e9, None, self.extra_round))

    def fail(self, error: str) -> None:
        self.busy = False
        self.passes = 0
        self.hurry()
        self._regular_due()
        self.backend.sample(Sample(self.started_ns, False, None, error, self.extra_round))

    def _regular_due(self) -> None:
        """A regular start that came due while a confirmation round ran starts at the next tick,
        not at that round's deadline."""
        if self.extra_round and not self.stopped and self.next_ns <= _monotonic_ns():
            self.prober.at(_monotonic_ns(), self)

    def hurry(self) -> None:
        """Back to the full rate at once: the next start one interval after the last one (the
        wheel's entry for the slow start stays and then finds nothing due)."""
        if not self.slow or self.stopped:
            return
        self.slow = False
        self.next_ns = max(self.started_ns + int(self.interval_ns * self.prober.stretch), _monotonic_ns())
        self.prober.at(self.next_ns, self)

    def begin(self) -> None:
        raise NotImplementedError

    def on_event(self, events: int) -> None:
        pass

    def last_look(self) -> None:
        pass

    def look(self) -> None:
        """The wheel's call at look_ns, set by begin() (a relaxed round's look on the grid);
        a round that it leaves going must place the deadline's call (_at(deadline_ns))."""

    def abort(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True
        self.busy = False
        self.abort()
        self.close()

    def close(self) -> None:
        pass


class _TcpCheck(_Check):
    """Connect, note tcpi_rtt, reset the connection; one socket reused when it can be.
    A round does not wait on epoll: its connection is looked at on the next step of the grid
    (SLOW_GRID_NS), one wake-up for the looks and starts of many targets, and only one still
    connecting then is handed to epoll (at the full rate with a timeout shorter than the
    grid's step, epoll from the start). The RTT is the kernel's either way, and a
    connection the server accepted and then reset counts as connected however late it is
    read (tcpi_rtt says the SYN-ACK came), so when it is read decides nothing."""

    def __init__(self, *args) -> None:
        self.sock: Optional[socket.socket] = None
        self.fd = -1
        self.armed_once = False
        self.t0 = 0
        super().__init__(*args)

    def begin(self) -> None:
        sock = self.sock
        if sock is None:
            sock = self.sock = _new_socket(self.addr)
            self.fd = sock.fileno()
            self.armed_once = False
            self.prober.watch(self.fd, self.on_event)
        self.t0 = _monotonic_ns()
        err = sock.connect_ex(self.addr)
        if err != errno.EINPROGRESS:
            self._connected(err)
            return
        look_ns = look_at(_monotonic_ns())
        if look_ns < self.deadline_ns:
            self.look_ns = look_ns
            self.prober.at(look_ns, self)
        elif not self.slow_round:  # a timeout shorter than the grid's step: epoll until it
            self._arm()
        # else the deadline's call looks

    def _arm(self) -> None:
        if self.armed_once:
            self.prober.modify(self.fd, _EPOLLOUT | _ONESHOT)
        else:
            self.prober.register(self.fd, _EPOLLOUT | _ONESHOT)
            self.armed_once = True

    def on_event(self, events: int) -> None:
        if self.busy:
            self._connected(0)

    def look(self) -> None:
        if self.sock is not None:
            self._connected(0)
            if self.busy:  # still connecting: now on epoll, and the deadline's call decides
                self.prober.at(self.deadline_ns, self)

    def last_look(self) -> None:
        if self.sock is not None:
            self._connected(0, waiting=True)

    def _connected(self, err: int, waiting: bool = False) -> None:
        info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        rtt_us = _rtt_if_connected(info)
        if rtt_us is not None:
            rtt_ns = rtt_us * 1000 or _monotonic_ns() - self.t0
            self._release()
            self.finish(rtt_ns)
            return
        if info[0] == _TCP_SYN_SENT and not err:
            if not waiting:  # woken or looked at without a result: wait on
                self._arm()
            return
        err = err or self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self._release()
        self.fail(_errno_word(err) if err else "closed")

    def _release(self) -> None:
        """Make the socket ready for the next connect, or drop it."""
        if _disconnect is None or _disconnect(self.fd) != 0:
            self.close()

    def abort(self) -> None:
        if self.sock is not None:
            self._release()

    def close(self) -> None:
        if self.sock is not None:
            self.prober.drop(self.fd, self.sock)
            self.sock = None
            self.fd = -1


class _HttpCheck(_Check):
    """GET path over a kept-alive connection: a health probe (2xx is ok) or, with scrape,
    a metrics scrape that ends in a Load."""

    def __init__(self, prober: Host, backend: "_Backend", interval_ms: int, timeout_ms: int, path: str, scrape: bool):
        target = backend.target
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {target.address}:{target.port}\r\n"
            f"User-Agent: {USER_AGENT}\r\nAccept: text/plain, */*\r\n\r\n"
        ).encode()
        self.scrape = scrape
        self.sock: Optional[socket.socket] = None
        self.fd = -1
        self.connecting = False
        self.stamps = False  # SO_TIMESTAMPNS is on: read with recvmsg for the receive time
        self.reused = False  # this round's request went on a connection an earlier round used
        self.reply = Response(METRICS_RESPONSE_MAX if scrape else PROBE_RESPONSE_MAX, keep_body=scrape)
        self.sent_ns = 0
        self.sent_real_ns = 0
        self.rx_real_ns = 0
        self.connections = 0  # made so far (tests check that they are reused)
        super().__init__(prober, backend, interval_ms, timeout_ms)

    # -- connection

    def begin(self) -> None:
        if self.sock is None:
            self._connect()
        else:
            self.reused = True
            self._send()

    def _connect(self) -> None:
        self.reused = False
        sock = self.sock = _new_socket(self.addr)
        self.fd = sock.fileno()
        self.connections += 1
        if not self.scrape:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.stamps = True
            except OSError:
                self.stamps = False
        self.prober.watch(self.fd, self.on_event)
        err = sock.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            self._lost(_errno_word(err))
            return
        self.connecting = True
        self.prober.register(self.fd, _EPOLLOUT)

    def on_event(self, events: int) -> None:
        if self.connecting:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err or not events & _EPOLLOUT:
                self._lost(_errno_word(err) if err else "closed")
                return
            self.connecting = False
            self.prober.modify(self.fd, _EPOLLIN)
            if self.busy:
                self._send()
            return
        self._read()

    def _send(self) -> None:
        self.reply.start()
        self.rx_real_ns = 0
        self.sent_real_ns = time.time_ns()  # the kernel stamps receptions on CLOCK_REALTIME
        self.sent_ns = _monotonic_ns()
        try:
            sent = self.sock.send(self.request)
        except OSError as e:
            self._broken(_errno_word(e.errno) if e.errno else "closed")
            return
        if sent != len(self.request):  # a few hundred bytes on an idle connection: never short
            self._lost("send blocked")

    def _read(self) -> None:
        view = self.prober.recv_view  # one buffer for all reads: recv(n) would malloc n bytes each time
        try:
            if self.stamps:
                size, ancillary, _, _ = self.sock.recvmsg_into((view,), _TS_ANCILLARY)
                if ancillary and len(ancillary[-1][2]) >= 16:
                    sec, nsec = struct.unpack_from("qq", ancillary[-1][2])
                    self.rx_real_ns = sec * 1_000_000_000 + nsec
            else:
                size = self.sock.recv_into(view)
            data = view[:size].tobytes()
        except BlockingIOError:
            return
        except OSError as e:
            self._broken(_errno_word(e.errno) if e.errno else "closed")
            return
        if not data:
            self._eof()
            return
        if not self.busy:  # bytes nobody asked for, or the late answer of a timed-out round
            self.close()
            return
        try:
            done = self.reply.feed(data)
        except ValueError as e:
            self._lost(str(e))
            return
        if done:
            self._answer()
        else:
            self._quickack()

    def last_look(self) -> None:
        if self.sock is not None and not self.connecting:
            self._read()

    # -- answers

    def _quickack(self) -> None:
        # A server that writes head and body apart with Nagle on waits for our ACK of the
        # head; Linux would delay that ACK by up to 40 ms. Ask for it now (rare path).
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass

    def _answer(self) -> None:
        now = _monotonic_ns()
        status, body = self.reply.status, self.reply.body
        if not self.reply.keep:
            self.close()
        if self.scrape:
            self._scraped(status, body)
            return
        rtt_ns = now - self.sent_ns
        if self.rx_real_ns:
            kernel_ns = self.rx_real_ns - self.sent_real_ns
            if 0 < kernel_ns <= rtt_ns:  # else the wall clock was stepped between: keep ours
                rtt_ns = kernel_ns
        if 200 <= status < 300:
            self.finish(rtt_ns)
        else:
            self.fail(f"HTTP {status}")

    def _scraped(self, status: int, body: bytes) -> None:
        self.busy = False
        if not 200 <= status < 300:
            load = Load(t_ns=self.started_ns, ok=False, error=f"HTTP {status}")
        else:
            try:
                load = load_from(parse_metrics(body), self.started_ns)
            except MetricsError as e:
                load = Load(t_ns=self.started_ns, ok=False, error=str(e))
        self.backend.load(load)

    # -- failures

    def _eof(self) -> None:
        if self.busy and self.reply.eof():
            self._answer()
        else:
            self._broken("closed")

    def _broken(self, error: str) -> None:
        """The connection died under a request: once more on a new one if the server may
        just have closed an idle kept-alive connection, else the round fails."""
        if self.busy and self.reused and not self.reply.begun:
            self.close()
            self._connect()
            return
        self._lost(error)

    def _lost(self, error: str) -> None:
        self.close()
        if self.busy:
            self.fail(error)

    def fail(self, error: str) -> None:
        if self.scrape:
            self.busy = False
            self.backend.load(Load(t_ns=self.started_ns, ok=False, error=error))
        else:
            super().fail(error)

    def abort(self) -> None:
        self.close()  # a late answer must not be read as the next round's

    def close(self) -> None:
        if self.sock is not None:
            self.prober.drop(self.fd, self.sock)
            self.sock = None
            self.fd = -1
            self.connecting = False
            self.reply.start()
