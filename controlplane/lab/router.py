"""The edge router of a testbed Net, driven the way an operator drives it: `edgectl` in the router namespace.

Router(net) writes a config for the net's backends, runs `python -m controlplane` through
`nsenter --net=` (never `ip netns exec`, which hides bpffs) and reads `status --json`. It also
answers, over netlink from inside the router namespace, what is attached to an interface, so
tests can check that deploy and undeploy leave interfaces as they were. It owns no topology
(topo.py) and no traffic (traffic.py), and never touches the maps itself.

    router = Router(net)
    router.deploy([router.service("web", weights=[1, 2, 1])])
    router.status()["services"][0]["new_flows"]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import yaml

from controlplane import abi, maps
from controlplane.config import Node

if TYPE_CHECKING:
    from controlplane.lab.topo import Net, Ns

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
BACKEND_PORT = 8000  # the port Net.start_backends serves on in the tests
DEPLOY_TIMEOUT_S = 120.0  # bcc compiles the data path on deploy (and the map declarations on status)
TC_INGRESS_PARENT = 0xFFFFFFF2  # clsact ingress (ffff:fff2)


class EdgectlError(RuntimeError):
    """edgectl exited non-zero where the caller expected success."""


@dataclass(frozen=True)
class TcFilter:
    """One tc filter on clsact ingress, as netlink shows it."""

    kind: str
    prio: int
    name: str | None  # TCA_BPF_NAME of a bpf filter


@dataclass(frozen=True)
class IfaceState:
    """What deploy may change on one interface: its XDP program and its clsact qdisc and filters."""

    xdp_prog_id: int | None
    clsact: bool
    ingress_filters: tuple[TcFilter, ...]


class Router:
    """edgectl for the router namespace of one Net, deployed on its client-facing interface."""

    def __init__(self, net: "Net", iface: str | None = None):
        self.net = net
        self.iface = iface if iface is not None else net.router_client_iface

    # ------------------------------------------------------------ config

    def service(
        self,
        name: str = "web",
        *,
        backends: int | Sequence[int] | None = None,
        weights: Sequence[int] | None = None,
        standby: Iterable[int] = (),
        protocol: str = "tcp",
        port: int = BACKEND_PORT,
        vip: str | None = None,
        backend_port: int = BACKEND_PORT,
        **extra: object,
    ) -> dict:
        """A service dict for the net's backends (b0..bN at net.backend_addr(i)).

        backends: how many (the first n) or which indices; default all.
        weights: one per chosen backend; default the config's default (1).
        standby: indices (of the net) that are standby.
        extra: more service keys, passed through as they are (e.g. existing_flows).
        """
        if backends is None:
            chosen = list(range(self.net.topo.backends))
        elif isinstance(backends, int):
            chosen = list(range(backends))
        else:
            chosen = list(backends)
        if weights is not None and len(weights) != len(chosen):
            raise ValueError(f"weights: {len(weights)} given for {len(chosen)} backends")
        standby = set(standby)
        entries = []
        for k, i in enumerate(chosen):
            entry: dict = {"name": f"b{i}", "address": str(self.net.backend_addr(i)), "port": backend_port}
            if weights is not None:
                entry["weight"] = weights[k]
            if i in standby:
                entry["standby"] = True
            entries.append(entry)
        return {
            "name": name,
            "vip": str(vip if vip is not None else self.net.vip),
            "port": port,
            "protocol": protocol,
            **extra,
            "backends": entries,
        }

    @staticmethod
    def config(services: list[dict], node: dict | None = None) -> dict:
        """The whole config document for services (and an optional node section)."""
        doc: dict = {"version": 1}
        if node:
            doc["node"] = dict(node)
        doc["services"] = services
        return doc

    # ------------------------------------------------------------ edgectl

    def edgectl(self, *args: object, timeout_s: float = DEPLOY_TIMEOUT_S) -> subprocess.CompletedProcess:
        """`python -m controlplane ARGS` in the router namespace; never raises on a non-zero exit."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
        return self.net.router.run(
            [sys.executable, "-m", "controlplane", *map(str, args)], check=False, env=env, timeout=timeout_s
        )

    def deploy(
        self, services: list[dict], node: dict | None = None, iface: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        """`edgectl -q deploy` of services on iface (default: the client-facing one).

        The config goes through a temporary file, removed again before returning.
        check: raise EdgectlError (with edgectl's stderr) on a non-zero exit.
        """
        return self.deploy_document(self.config(services, node), iface=iface, check=check)

    def deploy_document(self, doc: object, iface: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Like deploy(), with any YAML document (also invalid ones) as the config."""
        fd, path = tempfile.mkstemp(prefix="edge-test-", suffix=".yaml")
        try:
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(doc, f, sort_keys=False)
            done = self.edgectl("-q", "deploy", "--iface", iface or self.iface, "--config", path)
        finally:
            os.unlink(path)
        if check and done.returncode != 0:
            raise EdgectlError(f"edgectl deploy exited {done.returncode}: {done.stderr.strip()}")
        return done

    def undeploy(self, iface: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """`edgectl -q undeploy`; exit 0 also when nothing is deployed (it says so)."""
        done = self.edgectl("-q", "undeploy", "--iface", iface or self.iface)
        if check and done.returncode != 0:
            raise EdgectlError(f"edgectl undeploy exited {done.returncode}: {done.stderr.strip()}")
        return done

    def status_all(self) -> list[dict]:
        """`edgectl status --json --full` with no --iface: every instance in the router namespace."""
        done = self.edgectl("status", "--json", "--conntrack", "--full")
        if done.returncode != 0:
            raise EdgectlError(f"edgectl status exited {done.returncode}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def status(self, iface: str | None = None) -> dict:
        """The `edgectl status --json --full` instance deployed on iface (default: the client-facing one)."""
        iface = iface or self.iface
        done = self.edgectl("status", "--iface", iface, "--json", "--conntrack", "--full")
        if done.returncode != 0:
            raise EdgectlError(f"edgectl status exited {done.returncode}: {done.stderr.strip()}")
        found = [snap for snap in json.loads(done.stdout) if snap["iface"] == iface]
        if len(found) != 1:
            raise EdgectlError(f"edgectl status --iface {iface}: {len(found)} instances on {iface}")
        return found[0]

    def counters(self) -> dict[str, dict[str, int]]:
        """{"verdicts": {name: n}, "drops": {name: n}} summed over CPUs, read from the pinned maps.

        The kernel's view through bpftool, in milliseconds, where `status` compiles the data path
        first (seconds): for tests that poll counters or read them per case. The names are those
        of `status --json`.
        """
        return maps.counts_from_dump(self._pinned_dump(abi.MAP_SVC_COUNTS))

    def _pinned_dump(self, map_name: str) -> list[dict]:
        done = subprocess.run(
            ["bpftool", "-j", "map", "dump", "pinned", str(self.pin_path / map_name)],
            capture_output=True,
            text=True,
            timeout=10.0,
        )
        if done.returncode != 0:
            raise EdgectlError(f"bpftool map dump {map_name}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    # ------------------------------------------------------------ what is on the node

    @property
    def pin_path(self) -> Path:
        """Where deploy pins this instance's maps: <pin_dir>/v<ABI>/<iface>-<netns inode> (DESIGN.md)."""
        return self.pin_path_of(self.iface)

    def pin_path_of(self, iface: str) -> Path:
        return _pin_base() / f"{iface}-{self._netns_inode()}"

    def pinned_ifaces(self) -> list[str]:
        """Interfaces of the router namespace that have an instance pinned (deployed or left over)."""
        base, suffix = _pin_base(), f"-{self._netns_inode()}"
        if not base.is_dir():
            return []
        return sorted(p.name[: -len(suffix)] for p in base.iterdir() if p.name.endswith(suffix))

    def _netns_inode(self) -> int:
        return os.stat(self.net.router.path).st_ino  # the bind mount shows the namespace's inode

    def iface_state(self, ifname: str) -> IfaceState:
        """XDP program and clsact ingress filters of a router interface, read over netlink in its namespace."""
        return iface_state(self.net.router, ifname)

    def ifaces(self) -> list[str]:
        """Every interface of the router namespace but lo."""
        with self.net.router.iproute() as ipr:
            return [link.get("ifname") for link in ipr.get_links() if link.get("ifname") != "lo"]

    def mac(self, ifname: str | None = None) -> str:
        """MAC address of a router interface (default: the client-facing one)."""
        return link_mac(self.net.router, ifname or self.iface)


def node_state(router: Router) -> dict:
    """Everything deploy may change: per interface XDP and tc state, ip_forward, pins."""
    return {
        "ifaces": {name: router.iface_state(name) for name in router.ifaces()},
        "ip_forward": router.net.router.sysctl("net.ipv4.ip_forward"),
        "pins": router.pinned_ifaces(),
    }


@contextmanager
def ip_forward_off(router: Router) -> Iterator[None]:
    """net.ipv4.ip_forward = 0 on the router while inside (the testbed's 1 again after)."""
    router.net.router.sysctl("net.ipv4.ip_forward", 0)
    try:
        yield
    finally:
        router.net.router.sysctl("net.ipv4.ip_forward", 1)


def _pin_base() -> Path:
    return Path(Node().pin_dir) / f"v{abi.ABI_VERSION}"


def link_mac(ns: "Ns", ifname: str) -> str:
    """MAC of ifname in ns, over netlink (/sys/class/net does not follow setns)."""
    with ns.iproute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        return ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")


def iface_state(ns: "Ns", ifname: str) -> IfaceState:
    """XDP program id, clsact presence and clsact-ingress filters of ifname in ns."""
    with ns.iproute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        link = ipr.get_links(index)[0]
        xdp = link.get_attr("IFLA_XDP")
        prog_id = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp is not None else None
        clsact = any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))
        filters = []
        if clsact:
            for f in ipr.get_filters(index=index, parent=TC_INGRESS_PARENT):
                if not f["handle"]:  # the dump's header entry of a priority, not a filter
                    continue
                opts = f.get_attr("TCA_OPTIONS")
                name = None
                if f.get_attr("TCA_KIND") == "bpf" and opts is not None:
                    name = opts.get_attr("TCA_BPF_NAME")
                if f.get_attr("TCA_KIND"):
                    filters.append(TcFilter(f.get_attr("TCA_KIND"), f["info"] >> 16, name))
    return IfaceState(prog_id or None, clsact, tuple(filters))
