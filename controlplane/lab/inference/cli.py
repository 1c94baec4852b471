"""sim-inference's command line (python -m controlplane.lab.inference), and
degrade_from(), the client of POST /sim/degrade for tests, the demo and benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import urllib.request
from typing import Sequence

from controlplane import limits
from controlplane.lab.inference.options import PROG, Knobs, Options, UsageError
from controlplane.lab.inference.server import serve


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, as every error of this program
        print(f"{PROG}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    d = Options()
    p = _Parser(
        prog=PROG,
        description="A simulated vLLM / KServe-v2 inference server: "
        "POST /v1/completions and /v1/chat/completions (JSON or stream), GET /health, "
        "/v2/health/live, /v2/health/ready, /metrics (vllm:* names), /v1/models; any other GET "
        'answers {"backend": NAME, "peer": ...}. Knobs change at run time with POST /sim/degrade '
        "(a JSON object of added_latency_ms, fill_queue, kv_usage, hang, not_ready, metrics_off, "
        "die) and read with GET /sim/state. Prints 'listening NAME ADDR:PORT' once bound; exits 0 on "
        "SIGTERM, SIGINT or die.",
    )
    p.add_argument("--name", required=True, help='backend name put in every answer (the "backend" field)')
    p.add_argument(
        "--listen",
        default=f"{d.host}:{d.port}",
        metavar="ADDR:PORT",
        help="where to listen; port 0 picks a free one (default: %(default)s)",
    )
    p.add_argument(
        "--model", default=d.model, help="model name served, the metrics' model_name label (default: %(default)s)"
    )
    p.add_argument(
        "--max-running",
        type=int,
        default=d.max_running,
        metavar="N",
        help="requests generating at once; the rest wait in FIFO order (default: %(default)s)",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=d.max_waiting,
        metavar="N",
        help="requests waiting (fill_queue's included) beyond which new ones get 503 (default: %(default)s)",
    )
    p.add_argument(
        "--ttft-ms",
        type=float,
        default=d.ttft_ms,
        metavar="MS",
        help="time to first token once running (default: %(default)s)",
    )
    p.add_argument(
        "--tpot-ms",
        type=float,
        default=d.tpot_ms,
        metavar="MS",
        help="time per further output token (default: %(default)s)",
    )
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=d.kv_capacity_tokens,
        metavar="N",
        help="KV cache size: vllm:kv_cache_usage_perc is running requests' tokens over this (default: %(default)s)",
    )
    knobs = p.add_argument_group("knobs at start (POST /sim/degrade changes them later; die is run time only)")
    knobs.add_argument(
        "--added-latency-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="delay before every response but /sim/* (a slow or far host)",
    )
    knobs.add_argument(
        "--tpot-factor",
        type=float,
        default=1.0,
        metavar="X",
        help="every token after the first takes tpot x X (a thermal throttle: 3)",
    )
    knobs.add_argument(
        "--fill-queue",
        type=int,
        default=0,
        metavar="N",
        help="phantom waiting requests: counted as waiting; each real request first waits N x ttft",
    )
    knobs.add_argument(
        "--kv-usage", type=float, metavar="FRACTION", help="report this KV-cache use (0..1) instead of modelling it"
    )
    knobs.add_argument(
        "--hang", action="store_true", help="start hung: health 200, but no request is admitted and no token produced"
    )
    knobs.add_argument("--not-ready", action="store_true", help="/v2/health/ready answers 503")
    knobs.add_argument("--metrics-off", action="store_true", help="/metrics answers 404")
    hb = p.add_argument_group("heartbeats (runs edge-heartbeat as a child process)")
    hb.add_argument(
        "--heartbeat",
        metavar="ROUTER[:PORT]",
        help="send the router heartbeats from the --listen address while GET /health "
        "answers 2xx: a hung server keeps sending, as a real one would; an added "
        "latency beyond the agent's check timeout (20 ms at a 1 ms interval) stops it",
    )
    hb.add_argument("--token", metavar="TOKEN", help="this backend's heartbeat token (decimal or 0x hex)")
    hb.add_argument(
        "--hb-interval-ms",
        type=float,
        default=d.hb_interval_ms,
        metavar="MS",
        help="heartbeat interval (default: %(default)s)",
    )
    return p


def options(args: argparse.Namespace) -> Options:
    """Parsed arguments -> checked Options."""
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not limits.is_port(int(port), zero=True):
        raise UsageError(f"--listen: {args.listen!r} is not ADDR:PORT")
    knobs = Knobs(
        added_latency_ms=args.added_latency_ms,
        tpot_factor=args.tpot_factor,
        fill_queue=args.fill_queue,
        kv_usage=args.kv_usage,
        hang=args.hang,
        not_ready=args.not_ready,
        metrics_off=args.metrics_off,
    )
    return Options(
        name=args.name,
        host=host.strip("[]"),
        port=int(port),
        model=args.model,
        max_running=args.max_running,
        max_waiting=args.max_waiting,
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        kv_capacity_tokens=args.kv_capacity_tokens,
        knobs=knobs,
        heartbeat=args.heartbeat,
        token=args.token,
        hb_interval_ms=args.hb_interval_ms,
    ).check()


async def _run(opts: Options) -> None:
    server = await serve(opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.close_soon)
    try:
        print(f"listening {server.name} {server.address[0]}:{server.address[1]}", flush=True)
        await server.wait_closed()
    finally:
        await server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        opts = options(args)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(opts))
    except OSError as e:
        print(
            f"{PROG} {opts.name}: {os.strerror(e.errno).lower() if e.errno else e} ({opts.host}:{opts.port})",
            file=sys.stderr,
        )
        return 1
    return 0


def degrade_from(ns, address, port: int, **values) -> dict:
    """POST /sim/degrade to the server at address:port from network namespace ns (a testbed
    Ns); returns the server's state. For tests, the demo and benchmarks."""
    req = urllib.request.Request(
        f"http://{address}:{port}/sim/degrade",
        data=json.dumps(values).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with ns.enter():
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())
