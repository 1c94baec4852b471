"""The README's demo: what the router is for, in a minute or two.

A client, the router and three simulated inference servers (controlplane.lab.inference)
in network namespaces, 1, 5 and 15 ms slow; edged probes them, scrapes their load and steers
new flows by latency and GPU load. A GPU's queue fills and its share drops; an engine hangs
and is drained while the connections it already has stay where they are; edgectl status and
the Prometheus endpoint show what edged sees; edged stops and the data path keeps forwarding.
It ends with a short failover drill (controlplane/drill/): one backend's heartbeats stop
under a stream of new flows. Everything is removed again, also on an error or Ctrl-C.
Run it as root through tools/demo (which bootstraps)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from controlplane import drill  # noqa: E402
from controlplane.config import parse_config  # noqa: E402
from controlplane.errors import EdgeError  # noqa: E402
from controlplane.lab.daemon import EdgedProc  # noqa: E402
from controlplane.lab.inference import degrade_from  # noqa: E402
from controlplane.lab.router import EdgectlError, Router  # noqa: E402
from controlplane.lab.topo import Net, Topo  # noqa: E402
from controlplane.lab.traffic import backends_seen, close_all, http_get, open_connections  # noqa: E402

PORT = 8000
METRICS_LISTEN = "127.0.0.1:9470"  # edged's Prometheus endpoint, inside the router namespace
NAMES = ["b0", "b1", "b2"]  # the servers' names as the testbed gives them
LEGEND = {"b0": "h100-a", "b1": "h100-b", "b2": "h100-c"}
ADDED_MS = [1, 5, 15]
# As in netns-tests/test_steering.py: plain EWMA over a second and 25 % hysteresis, so that
# weights settle although a Python prober's RTTs on a small, busy machine are noisy.
PROBE = {"kind": "http", "path": "/health", "interval_ms": 100, "timeout_ms": 80, "window": 10}
METRICS = {"path": "/metrics", "interval_ms": 100, "stale_ms": 1000}
WEIGHTS = {
    "policy": "latency_inverse",
    "max_ratio": 50,
    "hysteresis_pct": 25,
    "slow_start_ms": 0,
    "hung_ms": 1000,
    "smoothing": "ewma",
    "decay_ms": 1000,
}
SIM_FLAGS = ["--max-running", "4", "--ttft-ms", "5", "--tpot-ms", "1"]
CONCURRENCY = 16  # flows in flight: gentle enough that the count barely moves the RTTs it is steered by
METRIC_LINES = ("edge_backend_weight{", "edge_backend_rtt_seconds_count{", "edge_backend_queue_waiting{")

T0 = time.monotonic()


class DemoError(Exception):
    """Something the demo waited for did not happen in time; the message says what."""


def say(line: str = "") -> None:
    print(line, flush=True)


def section(title: str) -> None:
    say(f"\n== [{time.monotonic() - T0:5.1f}s] {title}")


def bar(
    counts: Counter,
    names: list[str],
    total: int,
    weights: dict[str, int] | None = None,
    table: dict[str, float] | None = None,
) -> None:
    """One line per backend: its weight and share of the table (if given), its flows and their
    share of total, as a bar."""
    for name in names:
        n = counts.get(name, 0)
        share = 100 * n / total if total else 0
        label = f"{name} {LEGEND.get(name, '')}".strip()
        cols = f"{weights.get(name, 0):>6}  " if weights is not None else ""
        cols += f"{100 * table.get(name, 0):10.1f}%  " if table is not None else ""
        say(f"    {label:<10} {cols}{n:>6}  {share:5.1f}%  {'#' * round(share / 2)}".rstrip())
    errors = sum(v for k, v in counts.items() if str(k).startswith("error"))
    if errors:
        say(f"    errors     {errors:>6}  {dict((k, v) for k, v in counts.items() if str(k).startswith('error'))}")


# ---------------------------------------------------------------- the simulated servers


def knobs(net: Net, i: int, **values) -> dict:
    """POST /sim/degrade to backend i, from the router namespace (where edged probes from)."""
    return degrade_from(net.router, net.backend_addr(i), PORT, **values)


def stuck_requests(net: Net, i: int, n: int) -> list[socket.socket]:
    """n completion requests sent straight to backend i (not through the VIP), left open:
    work outstanding that a hung engine never finishes."""
    body = json.dumps({"prompt": "hello", "max_tokens": 8}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {NAMES[i]}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    socks: list[socket.socket] = []
    with net.router.enter():
        try:
            for _ in range(n):
                s = socket.create_connection((str(net.backend_addr(i)), PORT), timeout=5)
                socks.append(s)
                s.sendall(request)
        except BaseException:
            for s in socks:
                s.close()
            raise
    return socks


def answers(socks: list[socket.socket], timeout_s: float = 5.0) -> list[str]:
    """The status line each of socks got back (Connection: close: read to the end), or why none."""
    out = []
    for s in socks:
        s.settimeout(timeout_s)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError as e:
            out.append(f"no answer ({e})")
            continue
        out.append(data.split(b"\r\n", 1)[0].decode(errors="replace") or "closed without an answer")
    return out


def status(router: Router, sock_path: str) -> str:
    """`edgectl status` as edged's API answers it; if edged cannot answer, what edged last wrote
    to the pinned maps (the same RTT, load and probe columns), saying so."""
    done = router.edgectl("status", "--iface", router.iface, "--socket", sock_path, timeout_s=30.0)
    if done.returncode == 0:
        say(f"    $ edgectl status --iface {router.iface} --socket {sock_path}")
        return done.stdout
    say(f"    (through edged's API it failed: {done.stderr.strip()};")
    say("     so here is what edged wrote to the pinned maps in the last second instead)")
    done = router.edgectl("status", "--iface", router.iface, "--maps", timeout_s=120.0)
    if done.returncode != 0:
        raise DemoError(f"edgectl status --maps failed: {done.stderr.strip()}")
    say(f"    $ edgectl status --iface {router.iface} --maps")
    return done.stdout


def scrape(net: Net) -> list[str]:
    """edged's /metrics, read from inside the router namespace."""
    with net.router.enter():
        with urllib.request.urlopen(f"http://{METRICS_LISTEN}/metrics", timeout=5) as resp:
            return resp.read().decode().splitlines()


# ---------------------------------------------------------------- edged and its events


def start_edged(net: Net, router: Router, sock_path: str) -> EdgedProc:
    service = router.service("chat")
    service["health"] = {"probe": PROBE, "metrics": METRICS}
    service["weights"] = WEIGHTS
    doc = router.config([service], node={"api_socket": sock_path, "metrics_listen": METRICS_LISTEN})
    return EdgedProc.start(net.router, doc, router.iface, wait_deployed=False)


def fmt_weights(w: dict[str, int]) -> str:
    return "  ".join(f"{n} {w.get(n, 0):>5}" for n in NAMES)


class Watch:
    """Prints edged's events as they come (one line each, seconds since the demo started) while
    the demo waits for one of them; every wait is bounded."""

    def __init__(self, edged: EdgedProc):
        self.edged = edged
        self.shown = 0

    def show(self) -> None:
        events = self.edged.events
        while self.shown < len(events):
            e = events[self.shown]
            self.shown += 1
            when = e.get("seen_monotonic", time.monotonic()) - T0
            if e["kind"] == "weights":
                text = f"weights  {fmt_weights(e['weights'])}   (pushed in {e.get('took_ms', 0):.1f} ms)"
            else:
                text = str(e.get("text", ""))
                if not text.startswith(e["kind"]):
                    text = f"{e['kind']:<8} {text}"
            say(f"    [{when:5.1f}s] edged: {text}")

    @property
    def mark(self) -> int:
        return len(self.edged.events)

    def until(self, pred: Callable[[dict], bool], timeout_s: float, what: str, after: int = 0) -> dict:
        deadline = time.monotonic() + timeout_s
        i = after
        while True:
            self.show()
            events = self.edged.events
            while i < len(events):
                if pred(events[i]):
                    return events[i]
                i += 1
            if self.edged.proc.poll() is not None:
                self.show()
                raise DemoError(
                    f"waiting for {what}: edged exited with {self.edged.proc.returncode}; "
                    f"its last lines: {self.edged.other_lines[-5:]}"
                )
            if time.monotonic() >= deadline:
                raise DemoError(f"{what}: not seen within {timeout_s:g} s")
            time.sleep(0.05)

    def weights_where(
        self, pred: Callable[[dict[str, int]], bool], timeout_s: float, what: str, after: int = 0
    ) -> dict[str, int]:
        return self.until(lambda e: e["kind"] == "weights" and pred(e["weights"]), timeout_s, what, after)["weights"]

    def settle(self, quiet_s: float = 1.0, timeout_s: float = 15.0) -> dict[str, int]:
        """The weights once edged has pushed nothing for quiet_s. RTTs here are noisy: if they
        keep moving, say so and go on with the latest ones rather than fail the demo."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            n = self.mark
            quiet_until = time.monotonic() + quiet_s
            while time.monotonic() < quiet_until:
                self.show()
                if self.edged.proc.poll() is not None:
                    raise DemoError(f"edged exited with {self.edged.proc.returncode} ({self.edged.other_lines[-5:]})")
                time.sleep(0.05)
            if not any(e["kind"] == "weights" for e in self.edged.events[n:]):
                say(f"    settled: no push for {quiet_s:g} s ({time.monotonic() - t0:.1f} s)")
                return self.current()
        say(f"    (weights still moving after {timeout_s:g} s: noisy RTTs; going on with the latest)")
        return self.current()

    def current(self) -> dict[str, int]:
        w = self.edged.latest_weights("chat")
        if w is None:
            raise DemoError("edged has pushed no weights")
        return w


def table_shares(watch: "Watch", start: dict[str, int], mark: int, t0: float, t1: float) -> dict[str, float]:
    """Each backend's share of the table (0..1), averaged over [t0, t1]: edged may push during a count."""
    spans: list[tuple[float, dict[str, int]]] = [(t0, start)]
    for e in watch.edged.events[mark:]:
        if e["kind"] == "weights" and t0 < e.get("seen_monotonic", t1) < t1:
            spans.append((e["seen_monotonic"], e["weights"]))
    avg = Counter()
    for k, (t, w) in enumerate(spans):
        until = spans[k + 1][0] if k + 1 < len(spans) else t1
        total = sum(w.values()) or 1
        for n in NAMES:
            avg[n] += (until - t) / max(t1 - t0, 1e-9) * w.get(n, 0) / total
    return {n: avg[n] for n in NAMES}


def shares(net: Net, watch: "Watch", flows: int) -> Counter:
    """flows new connections through the VIP; their split next to the table's."""
    start, mark, t0 = watch.current(), watch.mark, time.monotonic()
    seen = backends_seen(net.client, net.vip, PORT, flows, concurrency=CONCURRENCY)
    t1 = time.monotonic()
    watch.show()  # pushes that came during the count
    pushes = sum(1 for e in watch.edged.events[mark:] if e["kind"] == "weights")
    say(
        f"    {flows} new connections through the VIP (one GET each) in {t1 - t0:.1f} s"
        + (
            f"; edged pushed {pushes}x meanwhile (weight: at the start; table share: averaged over the count)"
            if pushes
            else ""
        )
    )
    say(f"    {'':<10} {'weight':>6}  {'table share':>11}  {'flows':>6}  share")
    bar(seen, NAMES, flows, start, table_shares(watch, start, mark, t0, t1))
    return seen


# ---------------------------------------------------------------- the story


def steer(net: Net, router: Router, args: argparse.Namespace, sock_path: str) -> None:
    section(f"start edged on {router.iface}: probe GET /health every 100 ms, scrape /metrics, weights latency_inverse")
    say("    (edged compiles and attaches the XDP data path first: a few seconds)")
    edged = start_edged(net, router, sock_path)
    watch = Watch(edged)

    def step(title: str) -> None:
        watch.show()  # what edged did since the last line, before the next part
        section(title)

    try:
        watch.until(lambda e: e["kind"] == "deployed", 120.0, "edged to deploy the data path")
        watch.weights_where(lambda w: True, 15.0, "edged's first weight push")
        w = watch.settle()

        step("new flows follow the weights: the faster GPU gets more")
        shares(net, watch, args.flows)

        step(f"a GPU's queue fills: {LEGEND['b0']} (b0) reports 20 requests waiting")
        before = w["b0"]
        mark = watch.mark
        knobs(net, 0, fill_queue=20)
        t = time.monotonic()
        w = watch.weights_where(lambda w: w["b0"] * 2 < before, 10.0, "b0's weight dropping", after=mark)
        say(f"    b0's weight {before} -> {w['b0']} {time.monotonic() - t:.1f} s after its queue filled")
        w = watch.settle()
        shares(net, watch, args.flows)

        step("the queue drains again")
        queued, mark = w["b0"], watch.mark
        knobs(net, 0, fill_queue=0)
        watch.weights_where(lambda w: w["b0"] > 2 * queued, 10.0, "b0's weight coming back", after=mark)
        w = watch.settle()

        step(f"an engine hangs: {LEGEND['b0']} (b0) stops producing tokens with work queued; /health still answers 200")
        conns = open_connections(net.client, net.vip, PORT, args.keep)
        stuck: list[socket.socket] = []
        try:
            placed = [c.request().backend for c in conns]
            spread = Counter(placed)
            say(
                f"    {args.keep} keep-alive connections opened through the VIP first: "
                + ", ".join(f"{n} {spread.get(n, 0)}" for n in NAMES)
            )
            mark = watch.mark
            knobs(net, 0, hang=True)
            stuck = stuck_requests(net, 0, 3)
            t = time.monotonic()
            say("    b0 hangs; 3 completion requests sent straight to it never finish")
            watch.until(
                lambda e: e["kind"] == "state" and e.get("backend") == "b0" and e.get("new") == "hung",
                15.0,
                "edged reporting b0 hung",
                after=mark,
            )
            w = watch.weights_where(lambda w: w["b0"] <= 1, 5.0, "b0 weighted down to the floor", after=mark)
            say(f"    drained {time.monotonic() - t:.1f} s after the hang (hung_ms 1000)")
            w = watch.settle()
            shares(net, watch, args.flows)
            moved = sum(1 for c, b in zip(conns, placed) if c.request().backend != b)
            say(
                f"    {moved} of {args.keep} connections moved; the {spread.get('b0', 0)} on b0 are still "
                f"answered there (established flows are never rebalanced)"
            )

            step("what the operator sees while b0 hangs: edgectl status, through edged's API")
            for line in status(router, sock_path).splitlines():
                say("    " + line)

            step(f"and Prometheus: http://{METRICS_LISTEN}/metrics in the router namespace (a few lines)")
            for line in scrape(net):
                if line.startswith(METRIC_LINES):
                    say("    " + line)

            step("b0's engine recovers")
            mark = watch.mark
            knobs(net, 0, hang=False)
            say(f"    the 3 requests that waited on b0 finish: {', '.join(answers(stuck))}")
            watch.weights_where(lambda w: w["b0"] > 1, 10.0, "b0 weighted up again", after=mark)
            w = watch.settle()
        finally:
            close_all(conns)
            for s in stuck:
                s.close()

        step("stop edged: the data path keeps forwarding with the last weights")
        code = edged.stop()
        watch.show()
        say(f"    edged exited with {code}")
        reply = http_get(net.client, net.vip, PORT)
        say(
            f"    GET http://{net.vip}:{PORT}/ with edged stopped -> {reply.backend} "
            f"({LEGEND.get(reply.backend or '', '?')}), HTTP {reply.status}"
        )
    finally:
        edged.stop()


def failover_drill(rate: int, duration_s: float) -> None:
    """Heartbeats every 1 ms, down after 5 ms: stop h100-b's and watch its new flows move."""
    cfg = parse_config(
        {
            "version": 1,
            "services": [
                {
                    "name": "chat",
                    "vip": "198.18.255.1",
                    "port": PORT,
                    "protocol": "tcp",
                    "health": {"heartbeat": {"interval_ms": 1, "timeout_ms": 5, "rise": 3}},
                    "backends": [
                        {
                            "name": f"h100-{c}",
                            "address": f"198.18.{i + 1}.2",
                            "port": PORT,
                            "token": hex(0x5EED0001 + i),
                        }
                        for i, c in enumerate("abc")
                    ],
                }
            ],
        },
        "demo",
    )
    plan = drill.Plan(backend="h100-b", mode="heartbeat", rate=rate, duration_s=duration_s)
    try:
        report = drill.failover(cfg, plan, progress=lambda line: say(f"    {line}"))
    except EdgeError as e:
        raise SystemExit(f"demo: failover drill: {e}") from e
    for line in drill.format_table(report).splitlines():
        say("    " + line)


def terminated(signum, _frame) -> None:
    raise SystemExit(128 + signum)  # unwind like Ctrl-C, so that everything is removed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flows", type=int, default=2000, help="new connections per round (default %(default)s)")
    p.add_argument(
        "--keep", type=int, default=20, help="keep-alive connections held while an engine hangs (default %(default)s)"
    )
    p.add_argument("--drill-rate", type=int, default=2000, help="new flows/s of the closing failover drill; 0 skips it")
    p.add_argument("--skip-drill", action="store_true", help="leave out the closing failover drill")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("demo: run as root (namespaces, XDP)")
    if args.flows < 1 or args.keep < 1:
        raise SystemExit("demo: --flows and --keep must be at least 1")
    signal.signal(signal.SIGTERM, terminated)

    try:
        with Net(Topo(backends=3)) as net, tempfile.TemporaryDirectory(prefix="edge-demo-") as tmp:
            section(f"testbed {net.prefix}: client -> router -> 3 simulated inference servers; VIP {net.vip}:{PORT}")
            net.build()
            net.start_inference(
                port=PORT, common=SIM_FLAGS, per_backend=[["--added-latency-ms", str(ms)] for ms in ADDED_MS]
            )
            for i, name in enumerate(NAMES):
                say(f"    {name} = {LEGEND[name]}  {net.backend_addr(i)}:{PORT}  +{ADDED_MS[i]} ms per response")
            router = Router(net)
            try:
                steer(net, router, args, os.path.join(tmp, "edged.sock"))
            finally:
                done = router.undeploy(check=False)  # edged is stopped by now; removes the data path
                if done.returncode != 0:
                    say(f"demo: undeploy failed: {done.stderr.strip()}")
            section("undeployed; removing the namespaces")
    except (DemoError, EdgectlError, TimeoutError) as e:
        raise SystemExit(f"demo: {e} (everything it started is removed again)") from e
    except KeyboardInterrupt:
        say("\ndemo: interrupted; everything it started is removed again")
        return 130

    if args.drill_rate and not args.skip_drill:
        section(
            f"failover drill: h100-b's heartbeats stop under {args.drill_rate} new flows/s "
            f"(a testbed of its own; edgectl drill failover does the same from a config)"
        )
        try:
            failover_drill(args.drill_rate, 1.0)
        except KeyboardInterrupt:
            say("\ndemo: interrupted; the drill removed its testbed")
            return 130
    say(f"\n== done in {time.monotonic() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
