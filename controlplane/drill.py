"""Failover drills: silence one backend of a service inside a namespace testbed and measure, from
real packets, how fast the data path moves new flows off it, what was lost and what came late.

Owns the experiment end to end: a testbed for one service of a config (testbed.topo), backend
servers and heartbeat agents (testbed.heartbeats), the router (`edgectl deploy` in the router
namespace), a paced stream of new flows, a capture on every backend, the analysis, the table, the
JSON and the plot. It reads the router only through `edgectl status --json`; it never touches maps
or bpf/. Needs root: `edgectl drill failover --help`, or failover(cfg, Plan(...)) from Python.

The testbed. The service keeps its name, port, protocol, existing_flows, health and weights, and
its backends their names, weights, standby, tokens and order; the addresses are the testbed's (the
config's VIP if it fits the testbed's plan, else 198.18.255.1; backend i at 198.18.{i+1}.2), every
backend serves on the first backend's port (each has a namespace of its own), and of the node
section only the table sizes and xdp_mode are kept. Agents send from SCHED_FIFO threads, with a
tcp check of their server, none in kill mode (so that heartbeats go on while the server is dead).

What is measured. Flow k is one TCP SYN (UDP datagram) from client source port 10000 + k, sent
at s_k; a_k is when its first packet reached a backend's veth (kernel timestamp), or it reached
none (lost). t0, "silenced", is the silenced backend's last heartbeat as it left (heartbeat mode),
the last frame its veth carried before `ip link set down` returned (link; the call takes ms), or
its killed server's first RST (kill: heartbeats go on; the process closes its sockets ms after
SIGKILL). The router's hash is its own, so which flow "belonged" to the dead backend is inferred:
before t0 it took one flow every `spacing` ms. The dead run is the flows the router still gave
it from t0 on (they reached it, or were lost: a dead link swallows them), ended by a gap longer
than max(20 spacings, 20 ms); L is its last flow.
  detection_ms   t0 -> the router marks the backend unusable, estimated as a_L (for a lost L,
                 s_L + median latency) + spacing/2 - t0: the switch came after a_L and before
                 the dead backend's next flow, due one spacing later on average; resolution_ms
                 (spacing/2) is the typical error of the estimate, not a bound.
  failover_ms    t0 -> the first rerouted flow: the dead backend's next flow after L, expected
                 one spacing after s_L.
  lost           flows that reached no backend: in the dead run (link mode), while every other
                 backend missed heartbeats (the router had none usable), or unexplained.
  late           flows the router gave the dead backend after the last heartbeat (kill: t0)
                 + timeout + 1 ms.
  after_detect   flows the dead backend got after the dead run; in kill mode those after its
                 passive ejection ran out are counted apart, as readmissions.
"""

from __future__ import annotations

import ctypes
import errno
import json
import multiprocessing
import os
import selectors
import signal
import socket
import statistics
import struct
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from controlplane.config import Config, Service
from controlplane.deploy import Progress, quiet
from controlplane.errors import EdgeError

if TYPE_CHECKING:
    from controlplane.testbed.topo import Net

MODES = ("heartbeat", "link", "kill")
DEFAULT_RATE = 2000
DEFAULT_DURATION_S = 2.0
MAX_FLOWS = 50_000
FIRST_SPORT = 10_000  # flow k uses client source port FIRST_SPORT + k
MAX_RATE = 50_000
SILENCE_AT = 1 / 3  # of the duration
GRACE_S = 0.3  # capture goes on this long after the last flow was sent
LEAD_S = 0.05  # the first flow leaves this long after the capture said it is ready
UP_TIMEOUT_S = 60.0  # every backend "up" in edgectl status (each status compiles the data path)
RT_PRIORITY = 10  # SCHED_FIFO priority of the heartbeat agents' and the sender's sending threads
LATE_MARGIN_MS = 1.0  # "late": after last heartbeat + timeout + this
RUN_GAP_SPACINGS = 20  # a gap of this many spacings (and >= RUN_GAP_MIN_MS) ends the dead run
RUN_GAP_MIN_MS = 20.0

ETH_P_ALL = 0x0003
ETH_HLEN = 14
PACKET_OUTGOING = 4  # sll_pkttype (linux/if_packet.h)
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30  # include/uapi/linux/prctl.h
CAPTURE_RCVBUF = 64 << 20
TCP_SYN, TCP_RST, TCP_ACK = 0x02, 0x04, 0x10
PROTO = {"tcp": 6, "udp": 17}


class DrillError(EdgeError):
    """The drill cannot run (bad arguments, a missing tool) or its testbed failed."""


# ------------------------------------------------------------ plan


@dataclass(frozen=True)
class Plan:
    """What one drill does; check_plan() holds it against the config before anything is built."""

    backend: str
    mode: str
    rate: int = DEFAULT_RATE
    duration_s: float = DEFAULT_DURATION_S
    service: str | None = None  # default: the config's first

    @property
    def n_flows(self) -> int:
        return max(1, round(self.rate * self.duration_s))


def pick_service(cfg: Config, name: str | None) -> Service:
    if name is None:
        return cfg.services[0]
    for s in cfg.services:
        if s.name == name:
            return s
    raise DrillError(f"--service: no service {name!r} in the config (have: {', '.join(s.name for s in cfg.services)})")


def check_plan(cfg: Config, plan: Plan) -> tuple[Service, int]:
    """The service and the index of the backend to silence; DrillError naming what does not fit."""
    if plan.mode not in MODES:
        raise DrillError(f"--mode: {plan.mode!r} is not one of {', '.join(MODES)}")
    if not 1 <= plan.rate <= MAX_RATE:
        raise DrillError(f"--rate: {plan.rate} is not in 1..{MAX_RATE} flows/s")
    if not 0.1 <= plan.duration_s <= 60:
        raise DrillError(f"--duration: {plan.duration_s} is not in 0.1..60 s")
    if plan.n_flows > MAX_FLOWS:
        raise DrillError(f"--rate x --duration: {plan.n_flows} flows; at most {MAX_FLOWS} (one source port each)")
    svc = pick_service(cfg, plan.service)
    names = [b.name for b in svc.backends]
    if plan.backend not in names:
        raise DrillError(f"--backend: no backend {plan.backend!r} in service {svc.name} (have: {', '.join(names)})")
    dead = names.index(plan.backend)
    b = svc.backends[dead]
    if b.standby or b.weight == 0:
        raise DrillError(f"--backend: {b.name} is {'standby' if b.standby else 'draining (weight 0)'}: "
                         f"it gets no new flows, so there is nothing to fail over")
    if not any(i != dead and (x.standby or x.weight > 0) for i, x in enumerate(svc.backends)):
        raise DrillError(f"service {svc.name}: no other backend takes new flows, so there is nowhere to fail over to")
    hb = svc.health.heartbeat if svc.health else None
    if plan.mode == "heartbeat" and hb is None:
        raise DrillError(f"--mode heartbeat: service {svc.name} has no health.heartbeat section, so there are "
                         f"no heartbeats to stop")
    return svc, dead


def testbed_document(cfg: Config, svc: Service, net: "Net") -> dict:
    """The config deployed in the testbed: svc with the testbed's addresses (see the module docstring)."""
    port = svc.backends[0].port
    backends = []
    for i, b in enumerate(svc.backends):
        entry: dict = {"name": b.name, "address": str(net.backend_addr(i)), "port": port, "weight": b.weight}
        if b.standby:
            entry["standby"] = True
        if b.token is not None:
            entry["token"] = hex(b.token)
        backends.append(entry)
    service: dict = {"name": svc.name, "vip": str(net.vip), "port": svc.port, "protocol": svc.protocol,
                     "existing_flows": svc.existing_flows}
    if svc.health is not None:
        service["health"] = {k: v for k, v in asdict(svc.health).items() if v is not None}
    service["weights"] = asdict(svc.weights)
    service["backends"] = backends
    node = {k: getattr(cfg.node, k) for k in ("maglev_m", "max_services", "max_backends", "ct_size", "xdp_mode")}
    return {"version": 1, "node": node, "services": [service]}


def testbed_topo(svc: Service):
    """A Topo with one backend namespace per backend, and the service's VIP when the plan allows it."""
    from controlplane.testbed.topo import Topo

    try:
        return Topo(backends=len(svc.backends), vip=svc.vip)
    except ValueError:
        return Topo(backends=len(svc.backends))


# ------------------------------------------------------------ frames


def csum_replace16(csum: int, old: int, new: int) -> int:
    """Internet checksum after a 16-bit word changed from old to new (RFC 1624, eqn. 3)."""
    s = (~csum & 0xFFFF) + (~old & 0xFFFF) + new
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def build_frames(protocol: str, src_mac: str, dst_mac: str, src: IPv4Address, dst: IPv4Address,
                 dport: int, n: int) -> list[bytes]:
    """n frames of new flows to dst:dport, flow k from source port FIRST_SPORT + k.

    scapy builds the first; the others differ in the source port and its checksum only.
    """
    try:
        from scapy.layers.inet import IP, TCP, UDP
        from scapy.layers.l2 import Ether
    except ImportError as e:
        raise DrillError(f"the drill builds its packets with scapy, which is not installed ({e}); "
                         f"install the project's test extras") from e
    l4 = (TCP(sport=FIRST_SPORT, dport=dport, flags="S", seq=0x5eed0000, window=64240, options=[("MSS", 1460)])
          if protocol == "tcp" else UDP(sport=FIRST_SPORT, dport=dport) / b"edge-drill")
    template = bytearray(bytes(Ether(src=src_mac, dst=dst_mac) / IP(src=str(src), dst=str(dst), ttl=64) / l4))
    l4_off = ETH_HLEN + (template[ETH_HLEN] & 0x0F) * 4
    csum_off = l4_off + (16 if protocol == "tcp" else 6)
    (csum0,) = struct.unpack_from("!H", template, csum_off)
    frames = []
    for k in range(n):
        sport = FIRST_SPORT + k
        csum = csum_replace16(csum0, FIRST_SPORT, sport)
        if protocol == "udp" and csum == 0:
            csum = 0xFFFF  # 0 means "no checksum" in UDP
        struct.pack_into("!H", template, l4_off, sport)
        struct.pack_into("!H", template, csum_off, csum)
        frames.append(bytes(template))
    return frames


# ------------------------------------------------------------ capture (a child process)


@dataclass
class Seen:
    """What the capture saw on one backend's veth, times in time.monotonic_ns()."""

    first: dict[int, int] = field(default_factory=dict)  # client source port -> arrival of its first packet
    refused: dict[int, int] = field(default_factory=dict)  # client source port -> the backend's RST to it
    heartbeats: list[int] = field(default_factory=list)  # departures of the backend's heartbeats
    dropped: int = 0  # frames the kernel dropped for the capture socket
    frames: int = 0
    down: bool = False  # the interface went down (link mode)


@dataclass
class Captured:
    backends: list[Seen]
    clock_error_ns: int  # uncertainty of the realtime -> monotonic conversion of kernel timestamps


def _realtime_offset() -> tuple[int, int]:
    """(CLOCK_REALTIME - CLOCK_MONOTONIC in ns, uncertainty in ns), best of a few reads."""
    best = None
    for _ in range(20):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[1]:
            best = (r - (m0 + m1) // 2, m1 - m0)
    return best


@dataclass(frozen=True)
class _Match:
    """Which frames matter: flows from client to port/proto (arriving), heartbeats and RSTs (leaving)."""

    client_ip: bytes
    proto: int
    port: int
    hb_port: int | None
    offset_ns: int  # CLOCK_REALTIME - CLOCK_MONOTONIC


def _capture_main(conn, where: list[tuple[str, str]], client: str, proto: int, port: int, hb_port: int | None,
                  max_frames: int, deadline_s: float) -> None:
    """Child process: capture on each (netns path, ifname) until told to stop or deadline_s passes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    from controlplane.testbed.topo import _setns

    socks = []
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        for path, ifname in where:
            fd = os.open(path, os.O_RDONLY)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            _setns(home)
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, CAPTURE_RCVBUF)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.bind((ifname, ETH_P_ALL))
            sock.setblocking(False)
            socks.append(sock)
    finally:
        os.close(home)
    for sock in socks:  # before bind() a socket sees every interface of its namespace: forget that
        while True:
            try:
                sock.recv(1)
            except BlockingIOError:
                break
    offset, err = _realtime_offset()
    match = _Match(socket.inet_aton(client), proto, port, hb_port, offset)
    seen = [Seen() for _ in socks]
    sel = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        sel.register(sock, selectors.EVENT_READ, i)
    sel.register(conn, selectors.EVENT_READ, None)
    conn.send("ready")
    deadline = time.monotonic() + deadline_s
    stop = False
    while not stop and sum(b.frames for b in seen) < max_frames:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(min(left, 0.05)):
            if key.data is None:
                conn.recv()
                stop = True  # read once more below, then report
                continue
            _read(socks[key.data], seen[key.data], match)
            if seen[key.data].down:
                sel.unregister(socks[key.data])
    for sock, b in zip(socks, seen):
        if not b.down:
            _read(sock, b, match)
        _packets, b.dropped = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        sock.close()
    offset2, err2 = _realtime_offset()
    conn.send(Captured(seen, max(err, err2) + abs(offset2 - offset)))
    conn.close()


def _read(sock: socket.socket, seen: Seen, m: _Match) -> None:
    """Read what is queued on one backend's capture socket into seen."""
    while True:
        try:
            data, anc, _flags, addr = sock.recvmsg(128, socket.CMSG_SPACE(16))
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno == errno.ENETDOWN:  # link mode took the interface down: nothing more comes
                seen.down = True
                return
            raise
        seen.frames += 1
        if len(data) < ETH_HLEN + 20 + 8 or data[12:14] != b"\x08\x00":
            continue
        stamp = None
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", value[:16])
                stamp = sec * 1_000_000_000 + nsec - m.offset_ns
        if stamp is None:
            stamp = time.monotonic_ns()
        ip = ETH_HLEN
        l4 = ip + (data[ip] & 0x0F) * 4
        if len(data) < l4 + 14:
            continue
        sport, dport = struct.unpack_from("!HH", data, l4)
        proto = data[ip + 9]
        if addr[2] == PACKET_OUTGOING:
            if m.hb_port is not None and proto == 17 and dport == m.hb_port:
                seen.heartbeats.append(stamp)
            elif proto == 6 == m.proto and sport == m.port and data[l4 + 13] & TCP_RST:
                seen.refused.setdefault(dport, stamp)
            continue
        if proto != m.proto or dport != m.port or data[ip + 12:ip + 16] != m.client_ip:
            continue
        if proto == 6 and data[l4 + 13] & (TCP_SYN | TCP_ACK) != TCP_SYN:
            continue  # the client's RSTs and ACKs of a flow already seen
        seen.first.setdefault(sport, stamp)


class Capture:
    """The capture child process: started before the traffic, stopped and read after it."""

    def __init__(self, net: "Net", proto: int, port: int, hb_port: int | None, max_frames: int,
                 deadline_s: float):
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        where = [(str(ns.path), net.backend_peer_iface(i)) for i, ns in enumerate(net.backends)]
        self._proc = ctx.Process(target=_capture_main, name="edge-drill-capture", daemon=True,
                                 args=(child, where, str(net.topo.client_addr.ip), proto, port, hb_port,
                                       max_frames, deadline_s))
        self._proc.start()
        child.close()
        self._deadline_s = deadline_s

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        if not self._conn.poll(timeout_s):
            raise DrillError(f"capture process (pid {self._proc.pid}) not ready within {timeout_s}s")
        self._conn.recv()

    def finish(self, timeout_s: float = 30.0) -> Captured:
        """Tell the child to stop and return what it captured."""
        try:
            self._conn.send("stop")
            if not self._conn.poll(timeout_s):
                raise DrillError(f"capture process (pid {self._proc.pid}) sent nothing within {timeout_s}s")
            return self._conn.recv()
        except (EOFError, OSError) as e:
            raise DrillError(f"capture process (pid {self._proc.pid}) ended early "
                             f"(exit code {self._proc.exitcode}): {e}") from e

    def close(self) -> None:
        """End the child (by its pid, through multiprocessing) if it still runs."""
        self._conn.close()
        self._proc.join(timeout=2.0)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=2.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()


# ------------------------------------------------------------ traffic and silencing


@contextmanager
def realtime(priority: int) -> Iterator[bool]:
    """Run the calling thread SCHED_FIFO at priority with 1 ns timer slack; yield whether that worked.

    On a busy host a normal thread misses its deadlines by milliseconds, which the drill would
    report as the router's doing. The policy and slack are restored on exit.
    """
    old_policy, old_param = os.sched_getscheduler(0), os.sched_getparam(0)
    libc = ctypes.CDLL(None, use_errno=True)
    old_slack = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        ok = True
    except OSError:
        ok = False
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    try:
        yield ok
    finally:
        if old_slack > 0:
            libc.prctl(PR_SET_TIMERSLACK, old_slack, 0, 0, 0)
        if ok:
            os.sched_setscheduler(0, old_policy, old_param)


def send_paced(sock: socket.socket, frames: Sequence[bytes], rate: int, start_ns: int,
               spin_ns: int = 100_000) -> list[int]:
    """Send frame k at start_ns + k/rate (monotonic ns) and return when each actually left.

    spin_ns: sleep until this close to a deadline, then spin (a sleep may overshoot by that much).
    """
    period = 1_000_000_000 / rate
    sent = [0] * len(frames)
    for k, frame in enumerate(frames):
        due = start_ns + int(k * period)
        while True:
            left = due - time.monotonic_ns()
            if left <= 0:
                break
            if left > spin_ns:
                time.sleep((left - spin_ns) / 1e9)
        sent[k] = time.monotonic_ns()  # before send(): XDP and the backend may see it before send() returns
        sock.send(frame)
    return sent


class Silencer:
    """Silences one backend at a given time from a thread of its own; records when."""

    def __init__(self, net: "Net", dead: int, mode: str, agents: list, servers: list):
        self.net, self.dead, self.mode = net, dead, mode
        self.agents, self.servers = agents, servers
        self.started_ns = 0
        self.done_ns = 0
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def at(self, when_ns: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(when_ns,), name="edge-drill-silence", daemon=True)
        self._thread.start()

    def _run(self, when_ns: int) -> None:
        ipr = None
        try:
            if self.mode == "link":
                # pyroute2's IPRoute is used in the thread that made it; made now, not at the moment.
                ipr = self.net.backends[self.dead].iproute()
                index = ipr.link_lookup(ifname=self.net.backend_peer_iface(self.dead))[0]
            left = when_ns - time.monotonic_ns()
            if left > 0:
                time.sleep(left / 1e9)
            self.started_ns = time.monotonic_ns()
            if self.mode == "heartbeat":
                self.agents[self.dead].stop()
            elif self.mode == "link":
                ipr.link("set", index=index, state="down")
            else:
                proc = self.servers[self.dead].proc
                proc.kill()
                proc.wait(timeout=5.0)
            self.done_ns = time.monotonic_ns()
        except BaseException as e:  # reported by join() in the main thread
            self.error = e
        finally:
            if ipr is not None:
                ipr.close()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise DrillError(f"silencing ({self.mode}) did not finish within {timeout_s}s")
        if self.error is not None:
            raise DrillError(f"silencing ({self.mode}) failed: {self.error}") from self.error


# ------------------------------------------------------------ analysis (pure)


@dataclass
class Flow:
    sport: int
    sent_ns: int
    backend: int | None  # index of the backend that got its first packet; None: lost
    arrived_ns: int | None
    refused: bool = False  # that backend answered with a RST


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def down_windows(beats: Sequence[int], timeout_ns: float, rise: int) -> list[tuple[float, float | None]]:
    """When a backend was unusable for lack of heartbeats, from its heartbeat departures: after a gap
    longer than the timeout, from the last one + timeout until `rise` in a row (None: not again)."""
    out: list[tuple[float, float | None]] = []
    for k in range(1, len(beats)):
        if beats[k] - beats[k - 1] > timeout_ns:
            back = k + rise - 1
            out.append((beats[k - 1] + timeout_ns, beats[back] if back < len(beats) else None))
    return out


def _inside(t: float, windows: list[tuple[float, float | None]]) -> bool:
    return any(lo <= t and (hi is None or t < hi) for lo, hi in windows)


@dataclass(frozen=True)
class HealthSeen:
    """What the analysis needs of the service's health settings and of the captured heartbeats."""

    timeout_ms: int | None = None  # heartbeat timeout; None: no heartbeats
    rise: int = 1
    ejection_ms: int | None = None  # passive ejection; None: no passive detection
    beats: tuple[tuple[int, ...], ...] = ()  # per backend: heartbeat departures (monotonic ns)
    takes_new: tuple[bool, ...] = ()  # per backend: weight > 0


def analyse(flows: list[Flow], names: list[str], dead: int, mode: str, t0_ns: int,
            late_from_ns: int | None, health: HealthSeen) -> dict:
    """The drill's findings from per-flow observations (definitions: the module docstring).

    late_from_ns: flows the router gave the dead backend after this + timeout + LATE_MARGIN_MS are
    late (the last heartbeat; in kill mode, where heartbeats go on, t0).
    """
    before = [f for f in flows if f.sent_ns < t0_ns]
    dead_before = [f for f in before if f.backend == dead]
    if len(dead_before) >= 2:
        spacing_ns = (dead_before[-1].sent_ns - dead_before[0].sent_ns) / (len(dead_before) - 1)
    elif len(before) >= 2:
        spacing_ns = (before[-1].sent_ns - before[0].sent_ns) / (len(before) - 1) * len(names)
    else:
        spacing_ns = 1e6
    latencies = sorted(f.arrived_ns - f.sent_ns for f in flows if f.arrived_ns is not None)
    latency_ns = statistics.median(latencies) if latencies else 0

    def decided(f: Flow) -> float:
        """When the router picked a backend for f (arrival ~ pick; a lost flow: sent + median latency)."""
        return f.arrived_ns if f.arrived_ns is not None else f.sent_ns + latency_ns

    # The dead run: from the last flow the dead backend got before t0 on, the flows that reached it or
    # were lost, until a gap longer than max(RUN_GAP_SPACINGS spacings, RUN_GAP_MIN_MS).
    gap_ns = max(RUN_GAP_SPACINGS * spacing_ns, RUN_GAP_MIN_MS * 1e6)
    anchor = dead_before[-1] if dead_before else None
    run: list[Flow] = []
    last_ns = anchor.sent_ns if anchor else t0_ns
    for f in flows:
        if f.sent_ns < t0_ns or not (f.backend == dead or f.backend is None):
            continue
        if f.sent_ns - last_ns > gap_ns:
            break
        run.append(f)
        last_ns = f.sent_ns
    in_run = {f.sport for f in run}
    end_ns = flows[-1].sent_ns if flows else t0_ns
    last = run[-1] if run else anchor
    detected = last is not None and end_ns - last.sent_ns > gap_ns
    detection_ns = failover_ns = None
    if detected:
        detection_ns = decided(last) + spacing_ns / 2 - t0_ns
        failover_ns = last.sent_ns + spacing_ns - t0_ns

    # Flows the dead backend got after the run; in kill mode the router tries it again once its
    # passive ejection (ejection_ms, doubling on repeats) has run out: those are readmissions.
    after = [f for f in flows if f.backend == dead and last is not None and f.sent_ns > last.sent_ns]
    readmit_ns = None
    if mode == "kill" and health.ejection_ms is not None and detection_ns is not None:
        readmit_ns = t0_ns + detection_ns + health.ejection_ms * 1e6 - gap_ns
    readmitted = [f for f in after if readmit_ns is not None and f.sent_ns >= readmit_ns]
    after_detect = [f for f in after if readmit_ns is None or f.sent_ns < readmit_ns]

    timeout_ns = health.timeout_ms * 1e6 if health.timeout_ms is not None else None
    windows = [down_windows(b, timeout_ns, health.rise) if timeout_ns else [] for b in health.beats]
    while len(windows) < len(names):
        windows.append([])

    def all_others_down(t: float) -> bool:
        return all(not (health.takes_new[i] if health.takes_new else True) or _inside(t, windows[i])
                   for i in range(len(names)) if i != dead)

    lost = [f for f in flows if f.backend is None]
    lost_run = [f for f in lost if f.sport in in_run]
    lost_gaps = [f for f in lost if f.sport not in in_run and timeout_ns and all_others_down(decided(f))]

    late = deadline_ns = None
    if timeout_ns is not None and late_from_ns is not None:
        deadline_ns = late_from_ns + timeout_ns + LATE_MARGIN_MS * 1e6
        readmitted_ports = {f.sport for f in readmitted}
        late = [f for f in flows if (f.backend == dead or f.sport in in_run) and f.sent_ns >= t0_ns
                and decided(f) > deadline_ns and f.sport not in readmitted_ports]
    refused = [f for f in flows if f.backend == dead and f.refused] if mode == "kill" else None

    gaps = {}
    for i, name in enumerate(names):
        beats = health.beats[i] if i < len(health.beats) else ()
        if i == dead and mode != "kill":
            beats = tuple(t for t in beats if t <= t0_ns)
        if len(beats) >= 2 and timeout_ns:
            diffs = [beats[k] - beats[k - 1] for k in range(1, len(beats))]
            gaps[name] = {"heartbeats": len(beats), "max_gap_ms": _ms(max(diffs)),
                          "over_timeout": sum(1 for d in diffs if d > timeout_ns)}
    per_backend = {name: {"before": sum(1 for f in before if f.backend == i),
                          "after": sum(1 for f in flows if f.sent_ns >= t0_ns and f.backend == i)}
                   for i, name in enumerate(names)}
    share = len(dead_before) / len(before) if before else None
    expected_rerouted = None
    if detected and share is not None:
        expected_rerouted = round(share * sum(1 for f in flows if f.sent_ns > last.sent_ns))
    return {
        "spacing_ms": _ms(spacing_ns),
        "dead_share_before": None if share is None else round(share, 4),
        "median_latency_ms": _ms(latency_ns),
        "detected": detected,
        "detection_ms": _ms(detection_ns),
        "failover_ms": _ms(failover_ns),
        "resolution_ms": _ms(spacing_ns / 2),
        "last_to_dead_ms": _ms(decided(last) - t0_ns) if last is not None else None,
        "dead_run": len(run),
        "lost": len(lost),
        "lost_dead_run": len(lost_run),
        "lost_heartbeat_gaps": len(lost_gaps),
        "lost_unexplained": len(lost) - len(lost_run) - len(lost_gaps),
        "lost_flows_ms": [_ms(f.sent_ns - t0_ns) for f in lost][:100],
        "late": None if late is None else len(late),
        "late_deadline_ms": _ms(deadline_ns - t0_ns) if deadline_ns is not None else None,
        "after_detection": len(after_detect),
        "readmitted": len(readmitted) if readmit_ns is not None else None,
        "refused": None if refused is None else len(refused),
        "expected_rerouted": expected_rerouted,
        "heartbeat_gaps": gaps,
        "per_backend": per_backend,
    }


# ------------------------------------------------------------ the drill


def _wait_all_up(router, svc_name: str, names: list[str], timeout_s: float) -> dict:
    from controlplane.testbed.traffic import wait_until

    last: dict = {}

    def states() -> dict:
        snap = router.status()
        svc = next(s for s in snap["services"] if s["name"] == svc_name)
        last.clear()
        last.update({b["name"]: b["state"] for b in svc["backends"]})
        return last

    def all_up() -> bool:
        return set(states()) == set(names) and all(v == "up" for v in last.values())

    wait_until(all_up, timeout_s, "every backend up in edgectl status", observe=lambda: dict(last), interval_s=0.1)
    return dict(last)


def _check_agents(agents: list, names: list[str]) -> None:
    for name, agent in zip(names, agents):
        if not agent.running:
            said = agent.lines()
            raise DrillError(f"heartbeat agent of {name} (pid {agent.pid}) exited: {said[-1] if said else 'no output'}")


def failover(cfg: Config, plan: Plan, progress: Progress = quiet) -> dict:
    """Run one drill in a testbed of its own and return its report (see the module docstring).

    Everything it builds (namespaces, processes, the router) is gone again when it returns or raises.
    """
    svc, dead = check_plan(cfg, plan)
    if os.geteuid() != 0:
        raise DrillError("the drill needs root (network namespaces, XDP)")
    with _sigterm_unwinds():
        return _failover(cfg, plan, svc, dead, progress)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Make SIGTERM unwind like Ctrl-C (so the testbed is removed) while the drill runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, _frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _failover(cfg: Config, plan: Plan, svc: Service, dead: int, progress: Progress) -> dict:
    from controlplane.testbed.router import EdgectlError, Router, link_mac
    from controlplane.testbed.topo import Net

    hb = svc.health.heartbeat if svc.health else None
    names = [b.name for b in svc.backends]
    port = svc.backends[0].port
    net = Net(testbed_topo(svc))
    router = Router(net)
    agents: list = []
    deployed = False
    capture = silencer = None
    switch = sys.getswitchinterval()
    try:
        progress(f"testbed {net.prefix}: client, router, {len(names)} backends; VIP {net.vip}:{svc.port}/{svc.protocol}")
        net.build()
        servers = net.start_backends(port=port)
        if hb is not None:
            from controlplane.testbed.heartbeats import start_heartbeats

            for i, b in enumerate(svc.backends):
                agents.append(start_heartbeats(net, i, token=b.token, hb_port=hb.port, interval_ms=hb.interval_ms,
                                               check="none" if plan.mode == "kill" else "tcp",
                                               service_port=port, rt_priority=RT_PRIORITY))
        progress(f"deploying service {svc.name} on {net.router_client_iface}")
        deployed = True  # from here on undeploy (it says so and exits 0 when nothing got deployed)
        router.deploy_document(testbed_document(cfg, svc, net))
        try:
            _wait_all_up(router, svc.name, names, UP_TIMEOUT_S)
        finally:
            _check_agents(agents, names)

        frames = build_frames(svc.protocol, link_mac(net.client, net.client_iface), router.mac(),
                              net.topo.client_addr.ip, net.vip, svc.port, plan.n_flows)
        beats_per_s = 1000 / hb.interval_ms if hb else 0
        max_frames = 8 * plan.n_flows + int(2 * len(names) * beats_per_s * (plan.duration_s + 10))
        capture = Capture(net, PROTO[svc.protocol], port, hb.port if hb else None, max_frames,
                          deadline_s=plan.duration_s + 30.0)
        capture.wait_ready()
        silencer = Silencer(net, dead, plan.mode, agents, servers)
        with net.client.enter():
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
        with sock:
            sock.bind((net.client_iface, 0))
            progress(f"{plan.n_flows} new flows at {plan.rate}/s for {plan.duration_s:g}s; "
                     f"silencing {plan.backend} ({plan.mode}) at {plan.duration_s * SILENCE_AT:.3f}s")
            sys.setswitchinterval(0.0005)  # the silencing thread must not wait 5 ms for the sender
            with realtime(RT_PRIORITY) as rt:  # first: a busy host may keep a normal thread off the CPU
                start_ns = time.monotonic_ns() + int(LEAD_S * 1e9)
                silencer.at(start_ns + int(plan.duration_s * SILENCE_AT * 1e9))  # inherits SCHED_FIFO
                sent = send_paced(sock, frames, plan.rate, start_ns, spin_ns=50_000 if rt else 200_000)
            sys.setswitchinterval(switch)
        if not rt:
            progress("could not send from a SCHED_FIFO thread; the send times may wander")
        silencer.join(timeout_s=10.0)
        time.sleep(GRACE_S)  # the last flows are still on their way to the backends
        captured = capture.finish()
        snap = router.status()
        return _report(svc, plan, net, dead, start_ns, sent, captured, silencer, snap)
    except (EdgectlError, TimeoutError, RuntimeError) as e:  # the testbed's failures, as one line
        raise DrillError(f"testbed {net.prefix}: {e}") from e
    finally:
        sys.setswitchinterval(switch)
        if capture is not None:
            capture.close()
        for agent in agents:
            agent.stop()
        try:
            if deployed:
                router.undeploy(check=False)
        finally:
            net.close()


def _report(svc: Service, plan: Plan, net: "Net", dead: int, start_ns: int, sent: list[int],
            captured: Captured, silencer: Silencer, snap: dict) -> dict:
    names = [b.name for b in svc.backends]
    hb = svc.health.heartbeat if svc.health else None
    seen = captured.backends
    where: dict[int, tuple[int, int]] = {}
    for i, b in enumerate(seen):
        for sport, t in b.first.items():
            if sport not in where or t < where[sport][1]:
                where[sport] = (i, t)
    flows = []
    for k, t in enumerate(sent):
        sport = FIRST_SPORT + k
        i, arrived = where.get(sport, (None, None))
        flows.append(Flow(sport, t, i, arrived, i is not None and sport in seen[i].refused))

    dead_beats = [t for t in seen[dead].heartbeats if t <= silencer.done_ns]
    last_hb = max(dead_beats) if dead_beats else None
    after_hb = sum(1 for t in seen[dead].heartbeats if t > silencer.done_ns)
    first_refusal = min((t for t in seen[dead].refused.values() if t >= silencer.started_ns), default=None)
    if plan.mode == "heartbeat":
        t0 = last_hb if last_hb is not None else silencer.started_ns
    elif plan.mode == "link":
        # Setting a veth down takes milliseconds (the kernel waits for RCU and for its queues), and
        # the link carries frames until it is down: the last one it carried is the best estimate.
        carried = [t for t in [*seen[dead].heartbeats, *seen[dead].first.values()] if t <= silencer.done_ns]
        t0 = max([silencer.started_ns, *carried])
    else:
        t0 = first_refusal if first_refusal is not None else silencer.done_ns
    passive = svc.health.passive if svc.health and svc.protocol == "tcp" else None
    health = HealthSeen(timeout_ms=hb.timeout_ms if hb else None, rise=hb.rise if hb else 1,
                        ejection_ms=passive.ejection_ms if passive else None,
                        beats=tuple(tuple(b.heartbeats) for b in seen) if hb else (),
                        takes_new=tuple(b.weight > 0 for b in svc.backends))
    findings = analyse(flows, names, dead, plan.mode, t0, t0 if plan.mode == "kill" else last_hb, health)

    period_ns = 1e9 / plan.rate
    lateness = sorted(t - (start_ns + k * period_ns) for k, t in enumerate(sent))
    span_s = (sent[-1] - sent[0]) / 1e9 if len(sent) > 1 else 0.0
    rsvc = next(s for s in snap["services"] if s["name"] == svc.name)
    router = {
        "backends": {b["name"]: {"state": b["state"], "new_flows": b["new_flows"], "failovers": b["failovers"]}
                     for b in rsvc["backends"]},
        "failovers": sum(b["failovers"] for b in rsvc["backends"]),
        "drops": {k: v for k, v in snap["drops"].items() if v},
    }
    notes = []
    if not findings["detected"]:
        notes.append(f"{plan.backend} still got flows at the end of the run: not detected"
                     + (" (kill needs health.passive on a tcp service: heartbeats go on)" if plan.mode == "kill" else ""))
    if any(b.dropped for b in seen):
        notes.append(f"the capture lost frames {[b.dropped for b in seen]}: 'lost' counts are upper bounds")
    if plan.mode == "kill" and first_refusal is None:
        notes.append(f"{plan.backend} refused no flow after the kill; t0 is when its process was reaped")
    if plan.mode == "heartbeat" and last_hb is None:
        notes.append("no heartbeat of the silenced backend was captured; t0 is when its agent was stopped")
    if after_hb and plan.mode != "kill":
        notes.append(f"{after_hb} heartbeats of {plan.backend} left after it was silenced")
    spurious = {n: g["over_timeout"] for n, g in findings["heartbeat_gaps"].items() if g["over_timeout"]}
    if spurious:
        notes.append(f"heartbeat gaps longer than the timeout (the backend was briefly down, its flows went "
                     f"elsewhere): {spurious}")
    if findings["lost_unexplained"]:
        notes.append(f"{findings['lost_unexplained']} flows were lost outside the dead run and outside "
                     f"heartbeat gaps (router drops: {router['drops'] or 'none'})")
    rel = lambda t: None if t is None else round((t - t0) / 1e6, 3)  # noqa: E731
    return {
        "drill": "failover",
        "mode": plan.mode,
        "service": svc.name,
        "protocol": svc.protocol,
        "backend": plan.backend,
        "backends": names,
        "testbed": {"prefix": net.prefix, "vip": str(net.vip), "port": svc.port,
                    "addresses": {n: str(net.backend_addr(i)) for i, n in enumerate(names)}},
        "heartbeat": None if hb is None else {"interval_ms": hb.interval_ms, "timeout_ms": hb.timeout_ms,
                                               "rise": hb.rise},
        "passive": None if not (svc.health and svc.health.passive) else asdict(svc.health.passive),
        "traffic": {"flows": len(sent), "rate": plan.rate, "duration_s": plan.duration_s,
                    "achieved_rate": round((len(sent) - 1) / span_s, 1) if span_s else None,
                    "max_send_lag_ms": _ms(lateness[-1]),
                    "p99_send_lag_ms": _ms(lateness[int(0.99 * (len(lateness) - 1))])},
        "times_ms": {"t0": 0.0, "first_flow": rel(sent[0]), "last_flow": rel(sent[-1]),
                     "silence_started": rel(silencer.started_ns), "silence_done": rel(silencer.done_ns),
                     "last_heartbeat": rel(last_hb), "first_refusal": rel(first_refusal)},
        **findings,
        "router": router,
        "capture": {"frames": sum(b.frames for b in seen), "dropped": [b.dropped for b in seen],
                    "clock_error_us": round(captured.clock_error_ns / 1e3, 1)},
        "notes": notes,
        "flows": [{"sport": f.sport, "sent_ms": rel(f.sent_ns),
                   "backend": None if f.backend is None else names[f.backend],
                   "arrived_ms": rel(f.arrived_ns), "refused": f.refused} for f in flows],
    }


# ------------------------------------------------------------ output


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}{unit}"
    return f"{v}{unit}"


def format_table(r: dict) -> str:
    """The report as a short human table (the JSON has everything)."""
    hb, t, times = r["heartbeat"], r["traffic"], r["times_ms"]
    t0 = {"heartbeat": "last heartbeat of the backend", "link": "its veth went down (last frame it carried)",
          "kill": "its killed server refused a flow first (heartbeats go on)"}[r["mode"]]
    if r["mode"] == "link" and times["last_heartbeat"] is not None:
        t0 += f"; last heartbeat at {times['last_heartbeat']:.2f} ms"
    rows = [
        ("traffic", f"{t['flows']} new flows at {t['rate']}/s (achieved {_fmt(t['achieved_rate'])}/s; "
                    f"send lag p99 {_fmt(t['p99_send_lag_ms'], ' ms')}, max {_fmt(t['max_send_lag_ms'], ' ms')})"),
        ("t0", t0),
        ("detection", f"{_fmt(r['detection_ms'], ' ms')}  (resolution ~{_fmt(r['resolution_ms'], ' ms')})"
                      + ("" if r["detected"] else "  NOT DETECTED")),
        ("failover", f"{_fmt(r['failover_ms'], ' ms')}  (t0 -> first rerouted flow)"),
        ("last to dead", f"{_fmt(r['last_to_dead_ms'], ' ms')}  ({r['dead_run']} flows given to it after t0)"),
        ("lost", f"{r['lost']}  ({r['lost_dead_run']} in the dead run, {r['lost_heartbeat_gaps']} while every "
                 f"other backend missed heartbeats, {r['lost_unexplained']} unexplained)"),
        ("late", _fmt(r["late"]) + (f"  (given to it after {'t0' if r['mode'] == 'kill' else 'last heartbeat'}"
                                    f" + timeout + 1 ms = {r['late_deadline_ms']:.2f} ms)"
                                    if r["late_deadline_ms"] is not None else "")),
        ("after detection", str(r["after_detection"])
         + (f"  ({r['readmitted']} more once its ejection ran out)" if r["readmitted"] else "")),
    ]
    if r["refused"] is not None:
        rows.append(("refused", f"{r['refused']}  (reached the killed server's port)"))
    moved = ", ".join(f"{n} {b['failovers']}" for n, b in r["router"]["backends"].items() if b["failovers"])
    rows.append(("router", f"failovers {r['router']['failovers']}" + (f" (to {moved})" if moved else "")
                 + f"; {r['backend']} is {r['router']['backends'][r['backend']]['state']}; "
                   f"drops {r['router']['drops'] or 'none'}"))
    head = (f"failover drill: {r['service']} ({r['protocol']}), {r['backend']} silenced by {r['mode']}"
            + (f"; heartbeat every {hb['interval_ms']} ms, timeout {hb['timeout_ms']} ms" if hb else "; no heartbeats"))
    lines = [head] + [f"  {k:<16} {v}" for k, v in rows]
    table = [("backend", "flows before t0", "after t0", "max heartbeat gap")]
    for name, c in r["per_backend"].items():
        gap = r["heartbeat_gaps"].get(name)
        table.append((name + (" (silenced)" if name == r["backend"] else ""), str(c["before"]), str(c["after"]),
                      "-" if gap is None else f"{gap['max_gap_ms']:.2f} ms" + (
                          f" ({gap['over_timeout']} over timeout)" if gap["over_timeout"] else "")))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        lines.append("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines)


T0_LABELS = {"heartbeat": "last heartbeat", "link": "link down", "kill": "first refusal"}


def write_json(r: dict, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(r, indent=1) + "\n")


def require_matplotlib() -> None:
    """DrillError (one line) when matplotlib is missing: check before a drill that is to be plotted."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise DrillError(f"--plot needs matplotlib ({e}); install the project's test extras") from e


def write_plot(r: dict, path: str | os.PathLike) -> None:
    """Timeline: which backend got each flow, by send time, with silencing and detection marked."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(r["backends"]) + ["lost"]
    y = {name: i for i, name in enumerate(rows)}
    xs = [f["sent_ms"] for f in r["flows"]]
    ys = [y[f["backend"] if f["backend"] is not None else "lost"] for f in r["flows"]]
    colors = ["tab:red" if f["backend"] is None else "tab:orange" if f["backend"] == r["backend"] else "tab:blue"
              for f in r["flows"]]
    det = r["detection_ms"]
    zoom_hi = max(30.0, (det or 0) + 25.0)
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1, 1.3]})
    for ax, lim, size in ((axes[0], None, 2), (axes[1], (-15.0, zoom_hi), 12)):
        ax.scatter(xs, ys, s=size, c=colors, marker="|" if lim is None else "o", linewidths=1)
        ax.axvline(0.0, color="black", linestyle="--", label=f"t0: {T0_LABELS[r['mode']]}")
        hb_line = r["times_ms"]["last_heartbeat"]
        if r["mode"] == "link" and hb_line is not None:
            ax.axvline(hb_line, color="grey", linestyle=":", label="last heartbeat")
        if r["late_deadline_ms"] is not None:
            ax.axvline(r["late_deadline_ms"], color="tab:purple", linestyle=":",
                       label=("t0" if r["mode"] == "kill" else "last heartbeat") + " + timeout + 1 ms")
        if det is not None:
            ax.axvline(det, color="tab:green", linestyle="-", label=f"detection ({det:.2f} ms)")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(rows)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        if lim is not None:
            ax.set_xlim(*lim)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_title(f"failover drill: {r['backend']} of {r['service']} silenced by {r['mode']} "
                      f"({r['traffic']['flows']} flows at {r['traffic']['rate']}/s)")
    axes[1].set_title("around the failover", fontsize=10)
    axes[1].set_xlabel("flow sent at (ms, relative to t0)")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
