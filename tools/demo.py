"""The README's demo: a client, the router and three simulated inference
backends in network namespaces; deploy the router, send requests through the
VIP, show who served them, drain one backend while connections stay up, and
tear everything down. It ends with a short failover drill (controlplane/drill.py):
one backend's heartbeats stop under a stream of new flows. Run it as root
through tools/demo (which bootstraps)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402

from controlplane import drill  # noqa: E402
from controlplane.config import parse_config  # noqa: E402
from controlplane.errors import EdgeError  # noqa: E402
from controlplane.testbed.topo import Net, Topo  # noqa: E402
from controlplane.testbed.traffic import backends_seen, open_connections, close_all  # noqa: E402

PORT = 8000


def say(line: str = "") -> None:
    print(line, flush=True)


def bar(counts: Counter, names: list[str], total: int) -> None:
    for name in names:
        n = counts.get(name, 0)
        share = 100 * n / total if total else 0
        say(f"    {name:<8} {n:>6}  {share:5.1f}%  {'#' * round(share / 2)}")
    errors = sum(v for k, v in counts.items() if str(k).startswith("error"))
    if errors:
        say(f"    errors   {errors:>6}  {dict((k, v) for k, v in counts.items() if str(k).startswith('error'))}")


def edgectl(net: Net, *args: str) -> str:
    cmd = [sys.executable, "-m", "controlplane", "-q", *args]
    res = net.router.run(cmd, check=False)
    if res.returncode != 0:
        raise SystemExit(f"demo: edgectl {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def config(net: Net, weights: list[int]) -> dict:
    return {
        "version": 1,
        "services": [{
            "name": "chat",
            "vip": str(net.vip),
            "port": PORT,
            "protocol": "tcp",
            "backends": [
                {"name": f"h100-{chr(ord('a') + i)}", "address": str(net.backend_addr(i)), "port": PORT, "weight": w}
                for i, w in enumerate(weights)
            ],
        }],
    }


def deploy(net: Net, cfg: dict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    try:
        edgectl(net, "deploy", "--iface", net.router_client_iface, "--config", f.name)
    finally:
        os.unlink(f.name)


def failover_drill(rate: int, duration_s: float) -> None:
    """Heartbeats every 1 ms, down after 5 ms: stop h100-b's and watch its new flows move."""
    cfg = parse_config({"version": 1, "services": [{
        "name": "chat", "vip": "198.18.255.1", "port": PORT, "protocol": "tcp",
        "health": {"heartbeat": {"interval_ms": 1, "timeout_ms": 5, "rise": 3}},
        "backends": [{"name": f"h100-{c}", "address": f"198.18.{i + 1}.2", "port": PORT, "token": hex(0x5EED0001 + i)}
                     for i, c in enumerate("abc")],
    }]}, "demo")
    plan = drill.Plan(backend="h100-b", mode="heartbeat", rate=rate, duration_s=duration_s)
    try:
        report = drill.failover(cfg, plan, progress=lambda line: say(f"    {line}"))
    except EdgeError as e:
        raise SystemExit(f"demo: failover drill: {e}")
    for line in drill.format_table(report).splitlines():
        say("    " + line)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flows", type=int, default=3000, help="new connections per round (default %(default)s)")
    p.add_argument("--keep", type=int, default=100, help="long-lived connections held across the drain")
    p.add_argument("--drill-rate", type=int, default=2000, help="new flows/s of the closing failover drill; 0 skips it")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("demo: run as root (namespaces, XDP)")

    with Net(Topo(backends=3)) as net:
        say(f"== topology {net.prefix}: client -> router -> 3 backends; VIP {net.vip}:{PORT}")
        net.build()
        net.start_backends(port=PORT)
        names = [f"h100-{c}" for c in "abc"]
        # The testbed's backends answer with their namespace role (b0, b1, b2).
        role = {f"b{i}": n for i, n in enumerate(names)}

        say(f"== deploy the router on {net.router_client_iface} with weights 1:2:1")
        deploy(net, config(net, [1, 2, 1]))
        try:
            say(f"== {args.flows} new HTTP connections through the VIP")
            seen = backends_seen(net.client, net.vip, PORT, args.flows)
            bar(Counter({role.get(k, k): v for k, v in seen.items()}), names, args.flows)

            say(f"== hold {args.keep} long-lived connections, then drain h100-b (weight 0)")
            conns = open_connections(net.client, net.vip, PORT, args.keep)
            before = {id(c): c.request().backend for c in conns}
            deploy(net, config(net, [1, 0, 1]))
            moved = sum(1 for c in conns if c.request().backend != before[id(c)])
            held_on_b = sum(1 for v in before.values() if v == "b1")
            say(f"    {args.keep} connections still answered, {moved} changed backend "
                f"({held_on_b} of them stay on the draining h100-b until they close)")
            close_all(conns)
            seen = backends_seen(net.client, net.vip, PORT, args.flows)
            say(f"    new connections after the drain:")
            bar(Counter({role.get(k, k): v for k, v in seen.items()}), names, args.flows)

            say("== edgectl status (inside the router namespace)")
            for line in edgectl(net, "status").splitlines():
                say("    " + line)
            snap = json.loads(edgectl(net, "status", "--json"))[0]
            say(f"== counters: {snap['verdicts']}, drops {snap['drops']}")
        finally:
            edgectl(net, "undeploy", "--iface", net.router_client_iface)
            say("== undeployed; removing the namespaces")

    if args.drill_rate:
        say(f"== failover drill: h100-b's heartbeats stop under {args.drill_rate} new flows/s "
            f"(a testbed of its own; edgectl drill failover does the same from a config)")
        failover_drill(args.drill_rate, 1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
