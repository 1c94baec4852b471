"""`tools/bench-probe --traffic`: edged's CPU with real client traffic to 1,000 backends, adaptive
probing off ("before": probe.relaxed_interval_ms = interval_ms), on ("after": the default), and
without probes ("none": what the rest of edged costs with that traffic; edged minus it is
what probing costs, including the steering steps that probe results wake). Phases change by a
reload of edged (the API), so the data path, its wire windows and the traffic carry on.

    client ──veth── router (XDP + tc, edged) ──veth── b0: 1,000 addresses 198.19.x.y/32 on its
                                                          veth, one listener on 0.0.0.0:PORT

The lab (controlplane.lab) builds the namespaces; the router routes the backends' block via b0.
Services of at most 63 backends on VIPs 198.18.255.1.., tcp probes every --hz. A client opens
short TCP connections round-robin over the VIPs at --traffic-rate, so every backend's handshakes
keep its wire signal fresh (weights.wire.window_ms / min_samples set here, see --wire-window-ms).
Per phase: edged's utime+stime (/proc/PID/stat) over --seconds, probes/s and fresh backends from
edged's status API (read outside the measured time), the client's connection rate. Everything
built is removed on exit, failure or Ctrl-C; processes are stopped by their pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

import _probe_traffic as pt
from controlplane.api.client import Client
from controlplane.lab.daemon import EdgedProc, env_with_package
from controlplane.lab.procs import read_line, terminate
from controlplane.lab.router import Router
from controlplane.lab.topo import Net, Topo

PORT = 8000
SERVERS = 2  # accept processes sharing the backends' port (SO_REUSEPORT)
RELAX_SETTLE_S = 3.0  # after the reload: edged's next pace_probes round, then one relaxed interval's start
HERE = Path(__file__).resolve().parent


NO_PROBES = -1  # relaxed_ms of the phase without probes


def service_doc(p: pt.Planned, hz: float, relaxed_ms: int | None, window_ms: int, min_samples: int) -> dict:
    """relaxed_ms: probe.relaxed_interval_ms (None: the default; NO_PROBES: no probe section)."""
    interval_ms = max(1, round(1000 / hz))
    probe = {"kind": "tcp", "interval_ms": interval_ms, "timeout_ms": max(1, interval_ms // 2)}
    if relaxed_ms is not None:
        probe["relaxed_interval_ms"] = relaxed_ms
    return {
        "name": p.name,
        "vip": str(p.vip),
        "port": PORT,
        "protocol": "tcp",
        "health": {"probe": probe} if relaxed_ms != NO_PROBES else {},
        "weights": {"wire": {"window_ms": window_ms, "min_samples": min_samples}},
        "backends": [{"name": f"b{i}", "address": str(pt.backend_address(i)), "port": PORT} for i in p.backends],
    }


def config_doc(services: list[pt.Planned], args, relaxed_ms: int | None, sock: str) -> dict:
    n = sum(len(p.backends) for p in services)
    node = {"api_socket": sock, "maglev_m": 65537, "max_services": max(16, len(services)), "max_backends": max(1024, n)}
    return Router.config(
        [service_doc(p, args.hz, relaxed_ms, args.wire_window_ms, args.min_samples) for p in services], node
    )


class Counted:
    """A child whose stdout gives one JSON line a second; keeps the last one."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.last: dict = {}
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.last = json.loads(line)
            except ValueError:
                pass


def ticks(pid: int) -> int:
    return pt.stat_ticks(Path(f"/proc/{pid}/stat").read_text())


def edged_view(sock: str) -> tuple[int, int, int]:
    """(probes done so far, fresh backends, backends) from edged's status."""
    with Client(sock, timeout_s=30.0) as c:
        snap = c.status()
    probes = fresh = total = 0
    for svc in snap["services"]:
        for b in svc["backends"]:
            e = b.get("edged") or {}
            total += 1
            probes += (e.get("probes_ok") or 0) + (e.get("probes_failed") or 0)
            fresh += bool((e.get("wire") or {}).get("fresh"))
    return probes, fresh, total


def measure(
    phase: str, relaxed_ms: int, edged: EdgedProc, client: Counted, servers: list, sock: str, seconds: float
) -> dict:
    clk = os.sysconf("SC_CLK_TCK")
    probes0, fresh0, total = edged_view(sock)
    t_status0 = time.monotonic()
    c0 = dict(client.last)
    es0 = pt.stat_user_sys(Path(f"/proc/{edged.proc.pid}/stat").read_text())[1]
    e0, cl0, sv0 = ticks(edged.proc.pid), ticks(client.proc.pid), sum(ticks(p.pid) for p in servers)
    w0 = time.monotonic()
    time.sleep(seconds)
    e1, cl1, sv1 = ticks(edged.proc.pid), ticks(client.proc.pid), sum(ticks(p.pid) for p in servers)
    w1 = time.monotonic()
    es1 = pt.stat_user_sys(Path(f"/proc/{edged.proc.pid}/stat").read_text())[1]
    c1 = dict(client.last)
    probes1, fresh1, _ = edged_view(sock)
    t_status1 = time.monotonic()
    wall = w1 - w0
    return {
        "phase": phase,
        "relaxed_ms": relaxed_ms,
        "seconds": wall,
        "backends": total,
        "edged_cpu_pct": pt.cpu_pct(e0, e1, wall, clk),
        "edged_sys_pct": pt.cpu_pct(es0, es1, wall, clk),
        "probes_per_s": pt.rate(probes0, probes1, t_status1 - t_status0),
        "fresh": min(fresh0, fresh1),
        "fresh_start": fresh0,
        "fresh_end": fresh1,
        "conns_per_s": pt.rate(c0.get("ok", 0), c1.get("ok", 0), c1.get("t", 0) - c0.get("t", 0)),
        "conns_failed": c1.get("failed", 0) - c0.get("failed", 0),
        "client_cpu_pct": pt.cpu_pct(cl0, cl1, wall, clk),
        "servers_cpu_pct": pt.cpu_pct(sv0, sv1, wall, clk),
    }


def add_backends(net: Net, n: int) -> None:
    """Backend addresses /32 on b0's veth; the router routes their block via b0."""
    with net.backends[0].iproute() as ipr:
        index = ipr.link_lookup(ifname=net.backend_peer_iface(0))[0]
        for i in range(n):
            ipr.addr("add", index=index, address=str(pt.backend_address(i)), prefixlen=32)
    with net.router.iproute() as ipr:
        ipr.route("add", dst=str(pt.backend_route(n)), gateway=str(net.backend_addr(0)))


def run(args) -> int:
    if os.geteuid() != 0:
        print("bench-probe --traffic: must run as root (namespaces, XDP)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the teardown too
    services = pt.plan(args.backends)
    vips = [str(p.vip) for p in services]
    interval_ms = max(1, round(1000 / args.hz))
    lifetime_s = 2 * args.seconds + args.traffic_warmup + RELAX_SETTLE_S + 240  # the children end by themselves
    sock = os.path.join(tempfile.gettempdir(), f"bench-probe-{os.getpid()}.sock")
    load0 = os.getloadavg()
    print(
        f"{args.backends} backends in {len(services)} services (VIPs {vips[0]}..{vips[-1]}), tcp probes every "
        f"{interval_ms} ms; client {args.traffic_rate:g} conn/s; weights.wire window_ms {args.wire_window_ms}, "
        f"min_samples {args.min_samples}; {args.seconds:g} s measured per phase; load average "
        f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    results = []
    with Net(Topo(backends=1), prefix=args.prefix) as net:
        net.build()
        add_backends(net, args.backends)
        router = Router(net)
        env = env_with_package()
        child = [sys.executable, str(HERE / "_probe_traffic.py")]
        servers = []
        for _ in range(SERVERS):
            proc = net.backends[0].popen(
                [*child, "serve", "--port", str(PORT), "--seconds", str(lifetime_s)], stdout=subprocess.PIPE, env=env
            )
            servers.append(proc)
            read_line(proc, 10.0)
        edged = None
        try:
            t0 = time.monotonic()
            edged = EdgedProc.start(net.router, config_doc(services, args, interval_ms, sock), router.iface)
            print(f"edged (pid {edged.proc.pid}) deployed in {time.monotonic() - t0:.0f} s", flush=True)
            client = Counted(
                net.client.popen(
                    [
                        *child,
                        "connect",
                        "--vips",
                        ",".join(vips),
                        "--port",
                        str(PORT),
                        "--rate",
                        str(args.traffic_rate),
                        "--seconds",
                        str(lifetime_s),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
            time.sleep(args.traffic_warmup)  # the wire windows fill; the loops settle
            print(pt.HEADER, flush=True)
            results.append(measure("before", interval_ms, edged, client, servers, sock, args.seconds))
            print(pt.row(results[-1]), flush=True)
            relaxed_ms = args.relaxed_ms or max(interval_ms, min(10 * interval_ms, 2000))  # else Probe's default
            phases = [("after", args.relaxed_ms, relaxed_ms)] + (
                [("none", NO_PROBES, "-")] if args.no_probes_phase else []
            )
            for phase, key, shown in phases:
                with Client(sock, timeout_s=60.0) as c:
                    c.reload(yaml.safe_dump(config_doc(services, args, key, sock), sort_keys=False))
                time.sleep(RELAX_SETTLE_S + relaxed_ms / 1000)
                results.append(measure(phase, shown, edged, client, servers, sock, args.seconds))
                print(pt.row(results[-1]), flush=True)
            terminate(client.proc)
        finally:
            if edged is not None:
                edged.stop()
                router.undeploy(check=False)
            for proc in servers:
                terminate(proc)
    base = next((r for r in results if r["phase"] == "none"), None)
    for r in results:
        if r is base:
            continue
        if base is not None:
            r["probing_cpu_pct"] = r["edged_cpu_pct"] - base["edged_cpu_pct"]
            print(
                f"probing's share of edged {r['phase']} (edged minus edged without probes): "
                f"{pt.verdict(r['probing_cpu_pct'])}"
            )
        print(
            f"target <= {pt.TARGET_CPU_PCT:g}% of one core, edged {r['phase']} (relaxed {r['relaxed_ms']} ms, "
            f"{r['fresh']}/{r['backends']} fresh): {pt.verdict(r['edged_cpu_pct'])}"
        )
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        text = json.dumps(
            {"load_average_before": load0, "load_average_after": load1, "cpus": os.cpu_count(), "results": results},
            indent=2,
        )
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0
