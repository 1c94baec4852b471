"""The pure part of `tools/bench-probe --traffic` (the lab run is tools/_probe_lab.py): the
address and service plan, /proc CPU arithmetic, the table and the verdict; and the two small
child processes it starts in namespaces: `serve` (one listener on 0.0.0.0:PORT for every
backend address, accept and close) and `connect` (short TCP connections to the VIPs at a
steady rate, closed with an RST). Standard library only; no root for the pure part
(controlplane/tests/test_bench_probe_traffic.py).

    python tools/_probe_traffic.py serve --port 8000 --seconds 300
    python tools/_probe_traffic.py connect --vips 198.18.255.1,... --port 8000 --rate 600 --seconds 120
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

BACKEND_BLOCK = IPv4Network("198.19.0.0/16")  # backend addresses; clear of the lab's 198.18.x link nets
PER_BLOCK = 250  # addresses .1 .. .250 of each /24 of the block
FIRST_VIP = IPv4Address("198.18.255.1")  # the lab's VIP /24 (topo.Topo.vip_route)
PER_SERVICE = 63  # backends per service of the probe bench (the data path takes up to 1,024)
TARGET_CPU_PCT = 10.0


def backend_address(i: int) -> IPv4Address:
    """Backend i's address: 198.19.(i // 250).(i % 250 + 1); never a .0 or .255."""
    if not 0 <= i < PER_BLOCK * 256:
        raise IndexError(f"backend {i} is not in 0..{PER_BLOCK * 256 - 1}")
    return BACKEND_BLOCK.network_address + 256 * (i // PER_BLOCK) + i % PER_BLOCK + 1


def backend_route(n: int) -> IPv4Network:
    """The smallest network holding backends 0..n-1 (the router routes it to the backend namespace)."""
    last = backend_address(n - 1)
    for prefix in range(32, BACKEND_BLOCK.prefixlen - 1, -1):
        net = IPv4Network(f"{BACKEND_BLOCK.network_address}/{prefix}")
        if last in net:
            return net
    raise AssertionError("unreachable: backend_address stays in BACKEND_BLOCK")


@dataclass(frozen=True)
class Planned:
    """One service of the plan: its name, VIP and backend indices."""

    name: str
    vip: IPv4Address
    backends: tuple[int, ...]


def plan(n: int, per_service: int = PER_SERVICE) -> list[Planned]:
    """n backends over ceil(n / per_service) services of as equal sizes as can be, one VIP each."""
    if n < 1 or not 1 <= per_service <= 64:
        raise ValueError(f"{n} backends, {per_service} per service")
    count = math.ceil(n / per_service)
    if count > 254:
        raise ValueError(f"{count} services do not fit the VIP /24")
    out, start = [], 0
    for k in range(count):
        size = n // count + (1 if k < n % count else 0)
        out.append(Planned(f"s{k}", FIRST_VIP + k, tuple(range(start, start + size))))
        start += size
    return out


def stat_user_sys(text: str) -> tuple[int, int]:
    """(utime, stime) in clock ticks from the text of /proc/PID/stat (the name may hold ')' and spaces)."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def stat_ticks(text: str) -> int:
    """utime + stime (clock ticks) from the text of /proc/PID/stat."""
    return sum(stat_user_sys(text))


def cpu_pct(ticks0: int, ticks1: int, wall_s: float, clk_tck: int) -> float:
    """CPU used between two stat_ticks readings wall_s apart, in % of one core."""
    if wall_s <= 0:
        raise ValueError(f"wall time {wall_s} s")
    return 100.0 * (ticks1 - ticks0) / clk_tck / wall_s


def rate(count0: int, count1: int, wall_s: float) -> float:
    return (count1 - count0) / wall_s if wall_s > 0 else 0.0


def verdict(pct: float, target: float = TARGET_CPU_PCT) -> str:
    return f"{'met' if pct <= target else 'NOT met'} ({pct:.1f}% of one core; target <= {target:g}%)"


HEADER = (
    f"{'phase':<7} {'relaxed ms':>10} {'edged cpu%':>10} {'sys%':>5} {'probes/s':>8} {'fresh':>9} "
    f"{'conns/s':>7} {'failed':>6} {'client%':>7} {'servers%':>8}"
)


def row(r: dict) -> str:
    """One line of the table for a phase's result (see _probe_lab.measure)."""
    return (
        f"{r['phase']:<7} {r['relaxed_ms']:>10} {r['edged_cpu_pct']:>10.1f} {r['edged_sys_pct']:>5.1f} "
        f"{r['probes_per_s']:>8.0f} "
        f"{r['fresh']:>4}/{r['backends']:<4} {r['conns_per_s']:>7.0f} {r['conns_failed']:>6} "
        f"{r['client_cpu_pct']:>7.1f} {r['servers_cpu_pct']:>8.1f}"
    )


# ---------------------------------------------------------------- children (in namespaces)


def serve(port: int, seconds: float) -> None:
    """Accept and close on 0.0.0.0:port (SO_REUSEPORT: several may share it) until seconds pass."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4096)
    s.settimeout(1.0)
    print(f"listening 0.0.0.0:{port}", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # bounded even if the parent dies without stopping us
        try:
            conn, _ = s.accept()
        except (socket.timeout, ConnectionError):
            continue
        conn.close()


_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST (no TIME_WAIT)


def connect(
    vips: list[str], port: int, per_s: float, seconds: float, timeout_s: float = 1.0, max_open: int = 4000
) -> None:
    """Open per_s connections a second round-robin over vips for seconds (at most per_s * seconds),
    never more than max_open at once; each is closed with an RST once it is established. Prints
    one JSON line a second: {"t": monotonic, "ok": n, "failed": n, "skipped": n}, cumulative."""
    ep = select.epoll()
    open_: dict[int, tuple[socket.socket, float]] = {}
    ok = failed = skipped = sent = 0
    tick_s = 0.01
    start = time.monotonic()
    end, total = start + seconds, int(per_s * seconds)
    next_report, k = start + 1.0, 0
    print(json.dumps({"t": start, "ok": 0, "failed": 0, "skipped": 0}), flush=True)
    while True:  # bounded: ends at `end`, and opens at most `total`
        now = time.monotonic()
        if now >= end:
            break
        due = min(total, int((now - start) * per_s))
        while sent < due:
            sent += 1
            if len(open_) >= max_open:
                skipped += 1
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
            code = sock.connect_ex((vips[k % len(vips)], port))
            k += 1
            if code not in (0, errno.EINPROGRESS):
                failed += 1
                sock.close()
                continue
            open_[sock.fileno()] = (sock, now + timeout_s)
            ep.register(sock.fileno(), select.EPOLLOUT)
        for fd, _ in ep.poll(tick_s):
            sock, _ = open_.pop(fd)
            ep.unregister(fd)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                ok += 1
            else:
                failed += 1
            sock.close()
        if now >= next_report:
            for fd, (sock, deadline) in list(open_.items()):
                if deadline < now:
                    del open_[fd]
                    ep.unregister(fd)
                    sock.close()
                    failed += 1
            print(json.dumps({"t": now, "ok": ok, "failed": failed, "skipped": skipped}), flush=True)
            next_report += 1.0
    for sock, _ in open_.values():
        sock.close()
    ep.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, required=True)
    c = sub.add_parser("connect")
    c.add_argument("--vips", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--rate", type=float, required=True)
    c.add_argument("--seconds", type=float, required=True)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.what == "serve":
        serve(args.port, args.seconds)
    else:
        connect(args.vips.split(","), args.port, args.rate, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
