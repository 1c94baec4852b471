"""`tools/bench-probe --scale` (root): edged probing thousands of backends, and edged's API meanwhile.
edged in lab namespaces with the real data path, --backends addresses on one backend namespace
(services of 63, tcp probes every 1 / --hz s, no client traffic, so no backend is relaxed), the
probe budget node.probe_budget from --budget (absent: the config's default; 0: none). Over
--seconds it measures: the probes run a second (the backends' accepts, counted by the two
accept processes per backend address, so edged's own counters are not needed) against the
configured rate, how evenly they spread (backends probed in the window; the slowest backend's
and the median backend's probes a second), edged's CPU (and its children's: the prober's), and the API's latency meanwhile: a
weight pin and its clear (SetWeight) and the health check every second, a status every 5 s
(--no-status-calls: none in the window; the status calls before and after it are timed too).
Then status once (outside the window): the budget, the demand and the shortfall edged reports.

    client ──veth── router (XDP + tc, edged) ──veth── b0: N addresses 198.19.x.y/32, accept processes

--gc-log times edged's cyclic collections (a gc.callbacks hook in a sitecustomize put first on
edged's path for the run only, not in the product): the collections of 1 ms and more in the window,
by generation (count, total and longest ms); and its loop's callbacks of 50 ms and more (wall
time: waits for the interpreter and collections included), the longest by name.

--package-root DIR runs edged from another checkout (before/after on one lab recipe); edged
from a checkout without node.probe_budget needs --budget left out. Everything built is removed
on exit, failure or Ctrl-C; processes are stopped by their pid. This file is also the accept
process (`python tools/_probe_scale.py serve --port P --seconds S`): it accepts and closes, and
on SIGUSR1 prints one JSON line {"t", "accepts", "per": {address: accepts}}.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PORT = 8000
SERVERS = 2  # accept processes sharing the backends' port (SO_REUSEPORT)
HERE = Path(__file__).resolve().parent
STATUS_EVERY_S = 5.0  # status calls of the API probe (each walks every backend)
# --gc-log: edged's (and its children's) collections of GC_LOG_MIN_MS and more, a line each:
# "monotonic_s pid generation ms"
GC_LOG_MIN_MS = 1.0
# and with it, edged's loop callbacks (a task's step, a handle) of LOOP_LOG_MIN_MS and more:
# "monotonic_s pid ms name" (a task's coroutine and the line it waits at after the step)
LOOP_LOG_MIN_MS = 50.0
GC_HOOK = """import gc, os, time
_path = os.environ.get("EDGE_BENCH_GCLOG")
if _path:
    _out, _t0 = open(_path, "a", buffering=1), [0]

    def _timed(phase, info):
        if phase == "start":
            _t0[0] = time.perf_counter_ns()
            return
        ms = (time.perf_counter_ns() - _t0[0]) / 1e6
        if ms >= %r:
            _out.write(f"{time.monotonic():.3f} {os.getpid()} {info['generation']} {ms:.1f}\\n")

    gc.callbacks.append(_timed)
_loop_path = os.environ.get("EDGE_BENCH_LOOPLOG")
if _loop_path:
    import asyncio.events

    _loop_out, _run = open(_loop_path, "a", buffering=1), asyncio.events.Handle._run

    def _named(cb):
        task = getattr(cb, "__self__", None)
        coro = task.get_coro() if hasattr(task, "get_coro") else None
        if coro is not None and getattr(coro, "cr_frame", None) is not None:
            return f"{coro.__qualname__}:{coro.cr_frame.f_lineno}"
        return getattr(coro, "__qualname__", None) or getattr(cb, "__qualname__", None) or type(cb).__name__

    def _timed_run(self):
        t0 = time.perf_counter_ns()
        _run(self)
        ms = (time.perf_counter_ns() - t0) / 1e6
        if ms >= %r:
            _loop_out.write(f"{time.monotonic():.3f} {os.getpid()} {ms:.1f} {_named(self._callback)}\\n")

    asyncio.events.Handle._run = _timed_run
""" % (GC_LOG_MIN_MS, LOOP_LOG_MIN_MS)


# ---------------------------------------------------------------- the accept process (child)


def serve(port: int, seconds: float) -> None:
    """Accept and close on 0.0.0.0:port until seconds pass; count accepts per local address."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", port))
    s.listen(65535)
    s.settimeout(0.5)
    per: dict[str, int] = {}
    wanted = []
    signal.signal(signal.SIGUSR1, lambda *_: wanted.append(1))
    print(json.dumps({"listening": port}), flush=True)
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:  # bounded even if the parent dies without stopping us
        if wanted:
            wanted.clear()
            print(json.dumps({"t": time.monotonic(), "accepts": total, "per": per}), flush=True)
        try:
            conn, _ = s.accept()
        except (socket.timeout, ConnectionError, InterruptedError):
            continue
        try:
            addr = conn.getsockname()[0]
        except OSError:
            addr = "?"
        conn.close()
        total += 1
        per[addr] = per.get(addr, 0) + 1


class Server:
    """One accept process; counts() asks it for its counts (SIGUSR1) and reads the answer."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[dict] = []
        self._cond = threading.Condition()
        first = proc.stdout.readline()
        if not first:
            raise RuntimeError(f"accept process {proc.pid} ended at start")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(json.loads(line))
                self._cond.notify_all()

    def counts(self, timeout_s: float = 10.0) -> dict:
        with self._cond:
            n = len(self.lines)
            os.kill(self.proc.pid, signal.SIGUSR1)
            if not self._cond.wait_for(lambda: len(self.lines) > n, timeout_s):
                raise TimeoutError(f"accept process {self.proc.pid} did not answer")
            return self.lines[-1]


def merged(parts: list[dict]) -> tuple[int, dict[str, int]]:
    total, per = 0, {}
    for p in parts:
        total += p["accepts"]
        for addr, n in p["per"].items():
            per[addr] = per.get(addr, 0) + n
    return total, per


def spread(before: dict[str, int], after: dict[str, int], addresses: list[str], wall_s: float) -> dict:
    """How evenly the window's probes went over the backends: backends probed, and the per-backend
    rates of the slowest, the 10th percentile and the median backend."""
    rates = sorted((after.get(a, 0) - before.get(a, 0)) / wall_s for a in addresses)
    n = len(rates)
    return {
        "probed": sum(r > 0 for r in rates),
        "min_hz": rates[0],
        "p10_hz": rates[n // 10],
        "median_hz": rates[n // 2],
    }


# ---------------------------------------------------------------- the API probe (a thread)


class ApiProbe:
    """Times edged's API calls until stop(): a weight pin and its clear and a health check every
    second, a status every STATUS_EVERY_S unless with_status is false (a status at thousands of
    backends holds edged's loop for seconds itself: without it, what the probes leave of the loop)."""

    def __init__(self, sock: str, service: str, backend: str, with_status: bool = True):
        self.with_status = with_status
        self.sock, self.service, self.backend = sock, service, backend
        self.ms: dict[str, list[float]] = {"pin": [], "clear": [], "health": [], "status": []}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _timed(self, what: str, call) -> None:
        t0 = time.monotonic()
        try:
            call()
        except Exception as e:  # an API error is a result here, not the bench's end
            self.errors.append(f"{what}: {e}")
            return
        self.ms[what].append((time.monotonic() - t0) * 1000)

    def _run(self) -> None:
        from controlplane.api.client import Client

        next_status = time.monotonic()
        with Client(self.sock, timeout_s=60.0) as c:
            while not self._stop.is_set():  # bounded: stop() ends it
                t0 = time.monotonic()
                self._timed("pin", lambda: c.set_weight(self.service, self.backend, 50))
                self._timed("clear", lambda: c.set_weight(self.service, self.backend, None))
                self._timed("health", lambda: c.health())
                if self.with_status and time.monotonic() >= next_status:
                    self._timed("status", lambda: c.status())
                    next_status = time.monotonic() + STATUS_EVERY_S
                self._stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=120)
        out = {}
        for what, ms in self.ms.items():
            ms = sorted(ms)
            out[what] = {"n": len(ms), "p50_ms": ms[len(ms) // 2] if ms else None, "max_ms": ms[-1] if ms else None}
        out["errors"] = self.errors[:5]
        return out


# ---------------------------------------------------------------- the run


def config_doc(services, hz: float, budget: int | None, sock: str) -> dict:
    import _probe_traffic as pt
    from controlplane.lab.router import Router

    interval_ms = max(1, round(1000 / hz))
    n = sum(len(p.backends) for p in services)
    node = {"api_socket": sock, "maglev_m": 4099, "max_services": max(16, len(services)), "max_backends": max(1024, n)}
    if budget is not None:
        node["probe_budget"] = budget
    probe = {"kind": "tcp", "interval_ms": interval_ms, "timeout_ms": max(1, interval_ms // 2)}
    docs = [
        {
            "name": p.name,
            "vip": str(p.vip),
            "port": PORT,
            "protocol": "tcp",
            "health": {"probe": dict(probe)},
            "backends": [{"name": f"b{i}", "address": str(pt.backend_address(i)), "port": PORT} for i in p.backends],
        }
        for p in services
    ]
    return Router.config(docs, node)


def _status(c) -> dict:
    """A status, tried up to 3 times: at 10,000 backends on a busy machine a walk can miss its deadline."""
    from controlplane.errors import EdgeError

    for attempt in range(3):
        try:
            return c.status()
        except EdgeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _probes_done(snap: dict) -> int:
    """Probes edged counts as done (passed or failed), over every backend."""
    return sum(
        (b.get("edged") or {}).get("probes_ok", 0) + (b.get("edged") or {}).get("probes_failed", 0)
        for svc in snap["services"]
        for b in svc["backends"]
    )


def _stat_ticks(pid: int) -> int:
    import _probe_traffic as pt

    return pt.stat_ticks(Path(f"/proc/{pid}/stat").read_text())


def _children(pid: int) -> list[int]:
    """pid's child processes (edged's prober child, probe.child, where it has one)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _ticks_with_children(pid: int) -> dict[int, int]:
    """CPU ticks of pid and of each of its children, by pid."""
    out = {}
    for p in [pid, *_children(pid)]:
        try:
            out[p] = _stat_ticks(p)
        except OSError:
            continue
    return out


def measure(args, edged, servers: list[Server], sock: str, addresses: list[str], first: str) -> dict:
    from controlplane.api.client import Client

    api = ApiProbe(sock, "s0", first, with_status=args.status_calls)
    clk = os.sysconf("SC_CLK_TCK")
    with Client(sock, timeout_s=120.0) as c:
        t = time.monotonic()
        done0, ts0 = _probes_done(_status(c)), time.monotonic()
        status_ms = [(ts0 - t) * 1000]
    total0, per0 = merged([s.counts() for s in servers])
    e0, w0 = _ticks_with_children(edged.proc.pid), time.monotonic()
    gc_t0 = w0
    api.start()
    time.sleep(args.seconds)
    latency = api.stop()
    total1, per1 = merged([s.counts() for s in servers])
    e1, w1 = _ticks_with_children(edged.proc.pid), time.monotonic()
    wall = w1 - w0
    gc_log = gc_summary(args.gc_log_path, edged.proc.pid, gc_t0, w1) if args.gc_log_path else None
    slow = loop_summary(args.gc_log_path + ".loop", edged.proc.pid, gc_t0, w1) if args.gc_log_path else None
    with Client(sock, timeout_s=120.0) as c:
        t = time.monotonic()
        snap = _status(c)
        done1, ts1 = _probes_done(snap), time.monotonic()
        status_ms.append((ts1 - t) * 1000)
        budget = snap.get("probe_budget")
    return {
        "backends": len(addresses),
        "hz": args.hz,
        "budget": args.budget,
        "seconds": wall,
        "configured_per_s": len(addresses) * args.hz,
        "probes_per_s": (total1 - total0) / wall,
        "edged_probes_per_s": (done1 - done0) / (ts1 - ts0),  # edged's own count, over a longer span
        "spread": spread(per0, per1, addresses, wall),
        "edged_cpu_pct": 100.0 * (e1[edged.proc.pid] - e0[edged.proc.pid]) / clk / wall,
        # its children (the prober's, probe.child) that ran over the whole window
        "children_cpu_pct": 100.0 * sum(e1[p] - e0[p] for p in e1 if p in e0 and p != edged.proc.pid) / clk / wall,
        "api": latency,
        "status_outside_ms": status_ms,  # the status calls before and after the window, probes running
        "reported": budget,
        "gc": gc_log,
        "slow_callbacks": slow,
    }


def gc_summary(path: str, pid: int, t0: float, t1: float) -> dict:
    """--gc-log: pid's collections between t0 and t1 (monotonic s), per generation."""
    out: dict[str, dict] = {}
    for line in Path(path).read_text().splitlines():
        t, p, gen, ms = line.split()
        if int(p) != pid or not t0 <= float(t) <= t1:
            continue
        g = out.setdefault(gen, {"n": 0, "total_ms": 0.0, "max_ms": 0.0})
        g["n"] += 1
        g["total_ms"] += float(ms)
        g["max_ms"] = max(g["max_ms"], float(ms))
    return out


def loop_summary(path: str, pid: int, t0: float, t1: float, top: int = 6) -> list[tuple[str, int, float]]:
    """--gc-log: pid's loop callbacks of LOOP_LOG_MIN_MS and more between t0 and t1, by name:
    (name, count, longest ms), longest first."""
    by: dict[str, list[float]] = {}
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            t, p, ms, name = line.split(maxsplit=3)
            if int(p) == pid and t0 <= float(t) <= t1:
                by.setdefault(name, []).append(float(ms))
    rows = sorted(((n, len(v), max(v)) for n, v in by.items()), key=lambda r: -r[2])
    return rows[:top]


def report(r: dict) -> None:
    s, api, rep = r["spread"], r["api"], r["reported"]
    print(
        f"probes/s {r['probes_per_s']:.0f} (edged counts {r['edged_probes_per_s']:.0f}) of {r['configured_per_s']:.0f} configured "
        f"({100 * r['probes_per_s'] / r['configured_per_s']:.0f}%); backends probed {s['probed']}/{r['backends']}, "
        f"per backend min {s['min_hz']:.2f} p10 {s['p10_hz']:.2f} median {s['median_hz']:.2f} Hz; "
        f"edged CPU {r['edged_cpu_pct']:.0f}% (+ its children {r.get('children_cpu_pct', 0):.0f}%)"
    )

    def ms(x):
        return "-" if x is None else f"{x:.0f}"

    print(
        "API ms (p50/max): "
        + ", ".join(f"{k} {ms(v['p50_ms'])}/{ms(v['max_ms'])} (n={v['n']})" for k, v in api.items() if k != "errors")
        + (f"; errors {api['errors']}" if api["errors"] else "")
        + f"; status before/after the window {r['status_outside_ms'][0]:.0f}/{r['status_outside_ms'][1]:.0f}"
    )
    if r.get("gc") is not None:
        print(
            f"edged's collections >= {GC_LOG_MIN_MS:g} ms in the window (generation: n, total/max ms): "
            + (
                ", ".join(f"{g}: {v['n']}, {v['total_ms']:.0f}/{v['max_ms']:.0f}" for g, v in sorted(r["gc"].items()))
                or "none"
            )
        )
        print(
            f"edged's loop callbacks >= {LOOP_LOG_MIN_MS:g} ms in the window (name: n, longest ms): "
            + ("; ".join(f"{n}: {c}, {m:.0f}" for n, c, m in r.get("slow_callbacks") or ()) or "none")
        )
    if rep:
        print(
            f"edged reports: budget {rep['budget_per_s']:.0f}/s, demand {rep['demand_per_s']:.0f}/s, "
            f"stretch {rep['stretch']:.2f}, shortfall {rep['shortfall_ratio']:.2f}, short {rep['short']}"
        )
    else:
        print("edged reports no probe budget (a checkout without it)")


def run(args) -> int:
    import _probe_lab
    import _probe_traffic as pt
    from controlplane.lab.daemon import EdgedProc, env_with_package
    from controlplane.lab.procs import terminate
    from controlplane.lab.router import Router
    from controlplane.lab.topo import Net, Topo

    if os.geteuid() != 0:
        print("bench-probe --scale: must run as root (namespaces, XDP)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the teardown too
    services = pt.plan(args.backends)
    addresses = [str(pt.backend_address(i)) for i in range(args.backends)]
    sock = os.path.join(tempfile.gettempdir(), f"bench-probe-scale-{os.getpid()}.sock")
    lifetime_s = args.seconds + args.warmup + 600
    load0 = os.getloadavg()
    print(
        f"{args.backends} backends in {len(services)} services, tcp probes at {args.hz:g} Hz, budget "
        f"{'default' if args.budget is None else args.budget}, {args.seconds:g} s after {args.warmup:g} s; "
        f"edged from {args.package_root or 'this checkout'}; load average {load0[0]:.2f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    env = env_with_package()
    edged_env = {"PYTHONPATH": str(Path(args.package_root).resolve())} if args.package_root else None
    hook_dir = tempfile.TemporaryDirectory(prefix="bench-probe-gc-") if args.gc_log else None
    args.gc_log_path = None
    if hook_dir is not None:  # first on edged's path: imported at its start (site), the product unchanged
        (Path(hook_dir.name) / "sitecustomize.py").write_text(GC_HOOK)
        args.gc_log_path = str(Path(hook_dir.name) / "gc.log")
        edged_env = {
            "PYTHONPATH": os.pathsep.join(
                [hook_dir.name, str(Path(args.package_root).resolve()) if args.package_root else env["PYTHONPATH"]]
            ),
            "EDGE_BENCH_GCLOG": args.gc_log_path,
            "EDGE_BENCH_LOOPLOG": args.gc_log_path + ".loop",
        }
    with Net(Topo(backends=1), prefix=args.prefix) as net:
        net.build()
        _probe_lab.add_backends(net, args.backends)
        router = Router(net)
        procs = []
        edged = None
        try:
            servers = []
            for _ in range(SERVERS):
                proc = net.backends[0].popen(
                    [
                        sys.executable,
                        str(HERE / "_probe_scale.py"),
                        "serve",
                        "--port",
                        str(PORT),
                        "--seconds",
                        str(lifetime_s),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                procs.append(proc)
                servers.append(Server(proc))
            t0 = time.monotonic()
            here = os.getcwd()
            if args.package_root:  # `python -m` puts the working directory first on edged's path
                os.chdir(args.package_root)
            try:
                edged = EdgedProc.start(
                    net.router, config_doc(services, args.hz, args.budget, sock), router.iface, env=edged_env
                )
            finally:
                os.chdir(here)
            print(f"edged (pid {edged.proc.pid}) deployed in {time.monotonic() - t0:.0f} s", flush=True)
            time.sleep(args.warmup)
            result = measure(args, edged, servers, sock, addresses, "b0")
            result["load_average"] = [load0[0], os.getloadavg()[0]]
            result["events"] = [e["text"] for e in edged.events if e.get("kind") == "probe-budget"]
            report(result)
            for text in result["events"]:
                print(f"event probe-budget: {text}")
        finally:
            if edged is not None:
                edged.stop()
                router.undeploy(check=False)
            for proc in procs:
                terminate(proc)
            if hook_dir is not None:
                hook_dir.cleanup()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


def add_arguments(parser) -> None:
    """--scale's own options of tools/bench-probe (--scale itself is there)."""
    parser.add_argument(
        "--budget", type=int, default=None, help="--scale: node.probe_budget (default: the config's; 0: none)"
    )
    parser.add_argument(
        "--no-status-calls",
        dest="status_calls",
        action="store_false",
        help="--scale: no status calls in the measured window (each holds edged's loop for seconds at 5,000+)",
    )
    parser.add_argument(
        "--gc-log",
        action="store_true",
        help="--scale: time edged's cyclic collections in the window (a gc hook on edged's path for the run)",
    )
    parser.add_argument(
        "--package-root", default=None, help="--scale: run edged from this checkout (a before/after comparison)"
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="accept process of bench-probe --scale")
    parser.add_argument("mode", choices=("serve",))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    serve(args.port, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
