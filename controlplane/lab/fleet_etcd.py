"""A fleet over a real etcd in namespaces: FleetNet's routers (controlplane/lab/fleet.py),
each with the XDP data path and an edged in node.fleet, two shared backends, and etcd (Debian's
etcd-server, controlplane/lab/registry.py) on the backend LAN's bridge, which every router
reaches. The upstream has a static route to one router at a time (get_through), no BGP.

        client ── upstream ─┬─ r0 (XDP, edged) ─┐
                            ├─ r1               ─┼─ sw (bridge, etcd 198.18.64.250) ─┬─ b0
                            └─ r2               ─┘                                  └─ b1

Owns starting and stopping exactly this (edged by pid, etcd by pid) and the measurements the
test and tools/bench-fleet share: a weight change reaching every node, a leader failover, and an
operator's fleet-wide drain reaching every node. EtcdFleet(ipv6=True) adds a service "web6" on
the IPv6 VIP over the same backends' IPv6 addresses (fleet6.py), in the same fleet.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from controlplane.api.client import Client
from controlplane.lab import fleet6
from controlplane.lab.daemon import EdgedProc, env_with_package
from controlplane.lab.ecmp import _RouterNet
from controlplane.lab.fleet import SWITCH, FleetNet, FleetTopo
from controlplane.lab.registry import Etcd
from controlplane.lab.router import Router
from controlplane.lab.traffic import http_get

ETCD_ADDR = "198.18.64.250"
ETCD_PORT = 2379
PORT = 8000


class EtcdFleet:
    """routers routers with edged in one fleet, two backends, etcd on the LAN."""

    def __init__(self, routers: int = 3, probe_ms: int = 50, lease_ttl_s: int = 2, ipv6: bool = False):
        self.probe_ms, self.lease_ttl_s = probe_ms, lease_ttl_s
        self.net = FleetNet(FleetTopo(routers=routers, backends=2, ipv6=ipv6)).build()
        self.edgeds: list[EdgedProc] = []
        self.etcd: Etcd | None = None
        try:
            self.net.start_backends(PORT)
            sw = self.net.ns[SWITCH]
            sw.run(["ip", "addr", "add", f"{ETCD_ADDR}/24", "dev", f"{self.net.prefix}-br"])
            (self.net.tmp / "etcd").mkdir()
            self.etcd = Etcd(sw, self.net.tmp / "etcd", ETCD_PORT, host=ETCD_ADDR).start()
            # each edged compiles its data path: start them all, then wait
            self.edgeds = [
                EdgedProc.start(self.net.router(i), self.config(i), self.net.router_iface(i), wait_deployed=False)
                for i in range(routers)
            ]
            for e in self.edgeds:
                e.wait_for(lambda ev: ev["kind"] == "deployed", 240.0, "edged to deploy")
        except BaseException:
            self.close()
            raise

    def config(self, i: int) -> dict:
        """Router i's edged config: one service over both backends (and "web6" on the IPv6 VIP
        with ipv6), http probes every probe_ms (fall 2), computed weights, node.fleet pointing at
        the LAN's etcd."""
        health = {
            "probe": {
                "kind": "http",
                "path": "/health",
                "interval_ms": self.probe_ms,
                "timeout_ms": min(40, self.probe_ms),
                "fall": 2,
            }
        }
        weights = {"policy": "latency_inverse"}
        services = [self.net.service("web", PORT, health=health, weights=weights)]
        if self.net.topo.ipv6:
            services.append(self.net.service6("web6", PORT, health=health, weights=weights))
        doc = self.net.edged_config(i, services)
        del doc["node"]["bgp"]
        doc["node"]["fleet"] = {
            "etcd": [f"{ETCD_ADDR}:{ETCD_PORT}"],
            "name": f"r{i}",
            "lease_ttl_s": self.lease_ttl_s,
            "report_ms": 500,
            "stale_ms": 3000,
            "timeout_ms": 1000,
            "retry_ms": 200,
        }
        return doc

    @property
    def routers(self) -> int:
        return self.net.topo.routers

    def alive(self) -> list[int]:
        return [i for i, e in enumerate(self.edgeds) if e.proc.poll() is None]

    def marks(self) -> list[int]:
        return [len(e.events) for e in self.edgeds]

    def applied(self, i: int, pred=lambda e: True, after: int = 0, timeout_s: float = 30.0) -> dict:
        """Router i's first `fleet` event (a snapshot applied) from index after that pred accepts."""
        return self.edgeds[i].wait_for(
            lambda e: e["kind"] == "fleet" and pred(e), timeout_s, f"r{i} to apply a snapshot", after=after
        )

    def leader(self) -> int:
        """The router every living edged last named leader."""
        names = set()
        for i in self.alive():
            ev = [x for x in self.edgeds[i].events if x["kind"] == "fleet-leader"]
            names.add(ev[-1]["leader"] if ev else None)
        if len(names) != 1 or None in names:
            raise AssertionError(f"the nodes do not agree on a leader: {names}")
        return int(names.pop()[1:])

    def freeze_backend(self, j: int) -> None:
        """Backend j's server stops answering (SIGSTOP): the kernel still accepts connections,
        HTTP probes time out."""
        self.net.servers[j].proc.send_signal(signal.SIGSTOP)

    def thaw_backend(self, j: int) -> None:
        self.net.servers[j].proc.send_signal(signal.SIGCONT)

    def fleet_status(self, i: int) -> dict:
        """`edgectl fleet status --json` in router i's namespace."""
        out = self.net.router(i).run(
            [sys.executable, "-m", "controlplane", "fleet", "status", "--etcd", f"{ETCD_ADDR}:{ETCD_PORT}", "--json"],
            env=env_with_package(),
        )
        return json.loads(out.stdout)

    def edgectl(self, i: int, *args: str):
        """`edgectl ARGS --socket SOCK` in router i's namespace, against router i's edged."""
        sock = self.config(i)["node"]["api_socket"]
        return Router(_RouterNet(self.net.router(i)), self.net.router_iface(i)).edgectl(*args, "--socket", sock)

    def backends(self, i: int, service: str = "web") -> dict[str, dict]:
        """Router i's status of service's backends (edged's view), by name."""
        with Client(self.config(i)["node"]["api_socket"]) as c:
            snap = c.status()
        return {b["name"]: b for s in snap["services"] if s["name"] == service for b in s["backends"]}

    def get_through(self, i: int):
        """One GET to the VIP from the client, routed by the upstream through router i."""
        net = self.net
        net.upstream.run(["ip", "route", "replace", f"{net.vip}/32", "via", str(net.topo.router_up_addr(i).ip)])
        return http_get(net.client, net.vip, PORT)

    def get_through6(self, i: int):
        """One GET to the IPv6 VIP from the client, routed by the upstream through router i."""
        via = str(fleet6.router_up_addr6(i).ip)
        self.net.upstream.run(["ip", "-6", "route", "replace", f"{fleet6.VIP6}/128", "via", via])
        return http_get(self.net.client, fleet6.VIP6, PORT)

    # ------------------------------------------------------------ measurements

    def _same_version(self, nodes: list[int], pred, marks: list[int], timeout_s: float) -> list[dict]:
        """Waits until every node applied a version pred accepts, then returns each node's event
        for the newest such version (all nodes must reach it)."""
        got = [self.applied(i, pred, after=marks[i], timeout_s=timeout_s) for i in nodes]
        version = max(g["version"] for g in got)
        return [self.applied(i, lambda e: e["version"] == version, after=marks[i], timeout_s=10.0) for i in nodes]

    def weight_change(self, j: int = 1, timeout_s: float = 30.0, service: str = "web") -> dict:
        """Backend j stops answering; every node must apply the snapshot that gives it weight 0 in
        service, with the same weights and table digest; then it answers again and the same.
        Returns the figures of the first change."""
        nodes = self.alive()
        name, other = f"b{j}", f"b{1 - j}"
        marks = self.marks()
        t0 = time.time()
        self.freeze_backend(j)
        try:
            got = [
                self.applied(
                    i,
                    lambda e: e["weights"][service][name] == 0 and e["weights"][service][other] > 0,
                    after=marks[i],
                    timeout_s=timeout_s,
                )
                for i in nodes
            ]
        finally:
            self.thaw_backend(j)
        finals = self._same_version(nodes, lambda e: e["weights"][service][name] == 0, marks, timeout_s)
        applied = [g["applied_t"] for g in got]
        first = min(got, key=lambda g: g["version"])
        figures = {
            "nodes": len(nodes),
            "probe_interval_ms": self.probe_ms,
            "report_to_applied_on_all_ms": round((max(applied) - first["trigger_t"]) * 1000, 1),
            "published_to_applied_on_all_ms": round((max(applied) - first["published_t"]) * 1000, 1),
            "backend_stopped_to_applied_on_all_ms": round((max(applied) - t0) * 1000, 1),
            "same_weights": len({json.dumps(f["weights"], sort_keys=True) for f in finals}) == 1,
            "same_table": len({f["tables"][service] for f in finals}) == 1,
            "version": finals[0]["version"],
            "weights": finals[0]["weights"][service],
        }
        marks = self.marks()
        back = self._same_version(nodes, lambda e: e["weights"][service][name] > 0, marks, timeout_s)
        figures["same_table_after_return"] = len({f["tables"][service] for f in back}) == 1
        return figures

    def operator_drain(self, i: int = 1, backend: str = "b1", timeout_s: float = 30.0) -> dict:
        """`edgectl drain web BACKEND` on router i (fleet-wide): every living node must apply a
        snapshot with BACKEND at weight 0 and the same table; then `edgectl undrain` and the same
        with its weight back. Returns the figures (times from the command's start)."""
        nodes = self.alive()
        marks = self.marks()
        t0 = time.time()
        out = self.edgectl(i, "drain", "web", backend)
        if out.returncode != 0:
            raise AssertionError(f"edgectl drain: {out.stderr.strip()}")
        drained = self._same_version(
            nodes,
            lambda e: e["weights"]["web"][backend] == 0 and e["operator"].get("web", {}).get(backend),
            marks,
            timeout_s,
        )
        status_marks = self.fleet_status(nodes[0]).get("operator", [])
        recorded_t = max((m["t"] for m in status_marks if m["backend"] == backend), default=t0)
        figures = {
            "nodes": len(nodes),
            "said": out.stdout.strip(),
            "drain_to_applied_on_all_ms": round((max(d["applied_t"] for d in drained) - t0) * 1000, 1),
            "recorded_to_applied_on_all_ms": round((max(d["applied_t"] for d in drained) - recorded_t) * 1000, 1),
            "same_table": len({d["tables"]["web"] for d in drained}) == 1,
            "version": drained[0]["version"],
            "slots": {f"r{n}": self.backends(n)[backend]["slots"] for n in nodes},
            "fleet_drained": {f"r{n}": self.backends(n)[backend]["edged"]["fleet_drained"] for n in nodes},
            "fleet_status_marks": status_marks,
        }
        marks = self.marks()
        t1 = time.time()
        out = self.edgectl(i, "undrain", "web", backend)
        if out.returncode != 0:
            raise AssertionError(f"edgectl undrain: {out.stderr.strip()}")
        back = self._same_version(
            nodes, lambda e: e["weights"]["web"][backend] > 0 and not e["operator"], marks, timeout_s
        )
        figures.update(
            {
                "undrain_to_applied_on_all_ms": round((max(b["applied_t"] for b in back) - t1) * 1000, 1),
                "same_table_after_undrain": len({b["tables"]["web"] for b in back}) == 1,
                "has_slots_after_undrain": {f"r{n}": self.backends(n)[backend]["slots"] > 0 for n in nodes},
            }
        )
        return figures

    def kill_leader(self) -> dict:
        """SIGKILLs the leader's edged (by pid); returns the time until every survivor names the same
        new leader."""
        old = self.leader()
        marks = self.marks()
        t0 = time.time()
        self.edgeds[old].signal(signal.SIGKILL)
        self.edgeds[old].proc.wait(10)
        others = self.alive()
        took = [
            self.edgeds[i].wait_for(
                lambda e: e["kind"] == "fleet-leader" and e["leader"] != f"r{old}",
                self.lease_ttl_s * 5,
                f"r{i} to see a new leader",
                after=marks[i],
            )
            for i in others
        ]
        leaders = sorted({t["leader"] for t in took})
        return {
            "killed": f"r{old}",
            "new_leader": leaders[0] if len(leaders) == 1 else leaders,
            "agree": len(leaders) == 1,
            "failover_ms": round((max(t["t"] for t in took) - t0) * 1000, 1),
            "lease_ttl_s": self.lease_ttl_s,
            "survivors": others,
        }

    def close(self) -> None:
        try:
            for j in range(len(self.net.servers)):
                self.thaw_backend(j)
            for e in self.edgeds:
                e.stop()
            for i in range(self.net.topo.routers):
                Router(_RouterNet(self.net.router(i)), self.net.router_iface(i)).undeploy(check=False)
            if self.etcd is not None:
                self.etcd.stop()
        finally:
            self.net.close()

    def __enter__(self) -> "EtcdFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
