"""An ECMP fleet in namespaces: an upstream router running BIRD with multipath routes and L4
hashing, in front of several edge routers that share one VIP and the same backends.

        client ── upstream (bird, ECMP) ─┬─ r0 (XDP, edged + bird) ─┐
                                         ├─ r1 (XDP, edged + bird) ─┼─ sw (bridge) ─┬─ b0
                                         └─ r2 ...                 ─┘               ├─ b1 …

Addresses (198.18.0.0/15): client 198.18.0.2/24, upstream 198.18.0.1 on its side; router i
198.18.{32+i}.2/24 towards the upstream (198.18.{32+i}.1); the backend LAN 198.18.64.0/24 with
router i at .{1+i} and backend j at .{101+j}. The VIP is announced by each router's edged over
BGP (router AS 65001, upstream AS 65000) and reaches the upstream's kernel as one route with a
next hop per router. Backends send each reply back through the router its request came from
(nftables marks the connection with the last router's MAC; one routing table per router).
FleetTopo(ipv6=True) adds IPv6 beside it all (fleet6.py): addresses, sessions, an IPv6 VIP.

Names follow topo.py: namespaces {prefix}-{role}, veth ends {prefix}-{here}-{there}. Owns
building and removing exactly this (through topo.py's Ns and undo list) and the upstream's bird.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path
from typing import Callable

from pyroute2 import netns

from controlplane.edged import bird
from controlplane.lab import fleet6
from controlplane.lab.daemon import env_with_package
from controlplane.lab.procs import read_line
from controlplane.lab.topo import Net, Ns, Server, check_ifname, ignore_gone, unique_prefix
from controlplane.lab.traffic import wait_until

CLIENT, UPSTREAM, SWITCH = "c", "up", "sw"
UPSTREAM_AS, EDGE_AS = 65000, 65001
LAN_TABLE_BASE = 100  # backend routing table of router i: 100 + i


@dataclass(frozen=True)
class FleetTopo:
    """What to build. Pure data."""

    routers: int = 3
    backends: int = 3
    vip: IPv4Address = IPv4Address("198.18.255.1")
    ipv6: bool = False  # IPv6 beside IPv4 on every link, an IPv6 BGP session per router (fleet6.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vip", IPv4Address(self.vip))
        if not 1 <= self.routers <= 16 or not 1 <= self.backends <= 100:
            raise ValueError(f"routers {self.routers} (1..16), backends {self.backends} (1..100)")

    client_addr = IPv4Interface("198.18.0.2/24")
    upstream_client_addr = IPv4Interface("198.18.0.1/24")

    def upstream_addr(self, i: int) -> IPv4Interface:
        return IPv4Interface(f"198.18.{32 + i}.1/24")

    def router_up_addr(self, i: int) -> IPv4Interface:
        return IPv4Interface(f"198.18.{32 + i}.2/24")

    def router_lan_addr(self, i: int) -> IPv4Interface:
        return IPv4Interface(f"198.18.64.{1 + i}/24")

    def backend_addr(self, j: int) -> IPv4Interface:
        return IPv4Interface(f"198.18.64.{101 + j}/24")

    def roles(self) -> list[str]:
        return (
            [CLIENT, UPSTREAM, SWITCH]
            + [f"r{i}" for i in range(self.routers)]
            + [f"b{j}" for j in range(self.backends)]
        )


def upstream_bird_config(topo: FleetTopo, bfd_interval_ms: int, hold_time_s: int) -> str:
    """The upstream's bird.conf: a session per edge router, their routes merged into one
    multipath kernel route (ECMP)."""
    out = [
        f"router id {topo.upstream_client_addr.ip};",
        bird._LOG,
        "protocol device { scan time 10; }",
        bird.bfd_protocol(bfd_interval_ms, 3),
        "protocol kernel { ipv4 { import none; export all; }; merge paths on; }",
    ]
    for i in range(topo.routers):
        out.append(
            bird.bgp_protocol(
                f"edge_r{i}",
                UPSTREAM_AS,
                topo.router_up_addr(i).ip,
                EDGE_AS,
                hold_time_s,
                True,
                import_="all",
                export="none",
            )
        )
    if topo.ipv6:
        out += fleet6.upstream_bird6(topo.routers, hold_time_s)
    return "\n".join(out) + "\n"


class FleetNet:
    """Everything one FleetTopo built; close() removes exactly that, newest first."""

    def __init__(self, topo: FleetTopo = FleetTopo(), prefix: str | None = None):
        self.topo = topo
        # topo.py's Net owns the undo list and process adoption; its own topology stays unbuilt
        self._net = Net(prefix=prefix if prefix is not None else unique_prefix())
        self.prefix = self._net.prefix
        self.ns: dict[str, Ns] = {role: Ns(f"{self.prefix}-{role}", role, self._net._adopt) for role in topo.roles()}
        self.tmp = Path(tempfile.mkdtemp(prefix=f"edge-fleet-{self.prefix}-"))
        self._push("remove the temporary directory", self._remove_tmp)
        self.servers: list[Server] = []
        self.upstream_bird: subprocess.Popen | None = None

    # names

    def ifname(self, here: str, there: str) -> str:
        return check_ifname(f"{self.prefix}-{here}-{there}")

    def router(self, i: int) -> Ns:
        return self.ns[f"r{i}"]

    def router_iface(self, i: int) -> str:
        """Router i's upstream-facing interface: where its XDP data path goes."""
        return self.ifname(f"r{i}", UPSTREAM)

    @property
    def client(self) -> Ns:
        return self.ns[CLIENT]

    @property
    def upstream(self) -> Ns:
        return self.ns[UPSTREAM]

    @property
    def vip(self) -> IPv4Address:
        return self.topo.vip

    # building

    def _push(self, what: str, undo: Callable[[], None]) -> None:
        self._net._push(what, undo)

    def build(self, timeout_s: float = 10.0) -> "FleetNet":
        try:
            self._build(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _build(self, timeout_s: float) -> None:
        topo = self.topo
        for ns in self.ns.values():
            netns.create(ns.name)
            self._push(f"remove netns {ns.name}", lambda ns=ns: ignore_gone(netns.remove, ns.name))
            for scope in ("all", "default"):
                ns.sysctl(f"net.ipv6.conf.{scope}.accept_dad", 0)
                ns.sysctl(f"net.ipv4.conf.{scope}.rp_filter", 0)
            ns.run(["ip", "link", "set", "lo", "up"])
        for role in (UPSTREAM, *[f"r{i}" for i in range(topo.routers)]):
            self.ns[role].sysctl("net.ipv4.ip_forward", 1)
        # L4 hashing: each TCP connection keeps one next hop, connections spread over all
        self.upstream.sysctl("net.ipv4.fib_multipath_hash_policy", 1)

        self._veth(CLIENT, UPSTREAM, topo.client_addr, topo.upstream_client_addr)
        for i in range(topo.routers):
            self._veth(UPSTREAM, f"r{i}", topo.upstream_addr(i), topo.router_up_addr(i))
        bridge = check_ifname(f"{self.prefix}-br")
        self.ns[SWITCH].run(["ip", "link", "add", bridge, "type", "bridge", "stp_state", "0"])
        self.ns[SWITCH].run(["ip", "link", "set", bridge, "up"])
        for i in range(topo.routers):
            self._veth(f"r{i}", SWITCH, topo.router_lan_addr(i), None, bridge)
        for j in range(topo.backends):
            self._veth(f"b{j}", SWITCH, topo.backend_addr(j), None, bridge)

        self.client.run(["ip", "route", "add", "198.18.0.0/15", "via", str(topo.upstream_client_addr.ip)])
        for i in range(topo.routers):
            self.router(i).run(["ip", "route", "add", "default", "via", str(topo.upstream_addr(i).ip)])
        self._backend_return_routes()
        if topo.ipv6:
            fleet6.build6(self)
        self._offloads()
        wait_until(self._all_up, timeout_s, "every veth end operstate UP")

    def _veth(
        self, a: str, b: str, addr_a: IPv4Interface | None, addr_b: IPv4Interface | None, bridge: str | None = None
    ) -> None:
        """A veth between roles a and b (made in a's namespace); b's end joins bridge if given."""
        end_a, end_b = self.ifname(a, b), self.ifname(b, a)
        ns_a, ns_b = self.ns[a], self.ns[b]
        ns_a.run(["ip", "link", "add", end_a, "type", "veth", "peer", "name", end_b, "netns", ns_b.name])
        self._push(f"delete veth {end_a}", lambda: ns_a.run(["ip", "link", "del", end_a], check=False))
        for ns, end, addr in ((ns_a, end_a, addr_a), (ns_b, end_b, addr_b)):
            if addr is not None:
                ns.run(["ip", "addr", "add", str(addr), "dev", end])
            ns.run(["ip", "link", "set", end, "up"])
        if bridge is not None:
            ns_b.run(["ip", "link", "set", end_b, "master", bridge])

    def _backend_return_routes(self) -> None:
        """Each backend answers through the router its request came from: the connection is marked
        with the sending router's MAC on every packet in, replies are routed by that mark."""
        topo = self.topo
        macs = [self._mac(self.router(i), self.ifname(f"r{i}", SWITCH)) for i in range(topo.routers)]
        for j in range(topo.backends):
            ns, dev = self.ns[f"b{j}"], self.ifname(f"b{j}", SWITCH)
            ns.run(["ip", "route", "add", "default", "via", str(topo.router_lan_addr(0).ip)])
            marks = "\n".join(f"\t\tether saddr {mac} ct mark set {i + 1}" for i, mac in enumerate(macs))
            rules = (
                "table ip edge_return {\n"
                "\tchain pre {\n\t\ttype filter hook prerouting priority mangle;\n" + marks + "\n\t}\n"
                "\tchain out {\n\t\ttype route hook output priority mangle;\n"
                "\t\tct mark != 0 meta mark set ct mark\n\t}\n}\n"
            )
            ns.run(["nft", "-f", "-"], input=rules)
            for i in range(topo.routers):
                table = str(LAN_TABLE_BASE + i)
                ns.run(
                    [
                        "ip",
                        "route",
                        "add",
                        "default",
                        "via",
                        str(topo.router_lan_addr(i).ip),
                        "dev",
                        dev,
                        "table",
                        table,
                    ]
                )
                ns.run(["ip", "rule", "add", "fwmark", str(i + 1), "lookup", table, "pref", str(1000 + i)])

    def _offloads(self) -> None:
        # As topo.py: senders fill checksums in (native XDP cannot), and an XDP_REDIRECT into a
        # veth needs GRO (or XDP) on its peer: the bridge ports facing the routers.
        ends = [(self.client, self.ifname(CLIENT, UPSTREAM), "off")]
        ends += [(self.upstream, self.ifname(UPSTREAM, f"r{i}"), "off") for i in range(self.topo.routers)]
        ends += [(self.ns[SWITCH], self.ifname(SWITCH, f"r{i}"), "on") for i in range(self.topo.routers)]
        ends += [(self.ns[f"b{j}"], self.ifname(f"b{j}", SWITCH), "off") for j in range(self.topo.backends)]
        for ns, dev, _ in ends:
            ns.run(["ethtool", "-K", dev, "tx", "off", "gro", "on"])

    @staticmethod
    def _mac(ns: Ns, dev: str) -> str:
        with ns.iproute() as ipr:
            return ipr.get_links(ipr.link_lookup(ifname=dev)[0])[0].get_attr("IFLA_ADDRESS")

    def _all_up(self) -> bool:
        for ns in self.ns.values():
            with ns.iproute() as ipr:
                for link in ipr.get_links():
                    name = link.get("ifname")
                    if (
                        name.startswith(f"{self.prefix}-")
                        and name != f"{self.prefix}-br"
                        and link.get("operstate") != "UP"
                    ):
                        return False
        return True

    # processes

    def start_backends(self, port: int = 8000, timeout_s: float = 5.0) -> list[Server]:
        """The testbed HTTP backend in every backend namespace, answering with its name."""
        env = env_with_package()
        for j in range(self.topo.backends):
            addr = self.topo.backend_addr(j).ip
            argv = [sys.executable, "-m", "controlplane.lab.backend", "--name", f"b{j}", "--listen", f"{addr}:{port}"]
            if self.topo.ipv6:
                argv += ["--listen6", str(fleet6.backend_addr6(j).ip)]
            proc = self.ns[f"b{j}"].popen(argv, stdout=subprocess.PIPE, env=env)
            self.servers.append(Server(f"b{j}", self.ns[f"b{j}"], addr, port, proc))
        for server in self.servers:
            line = read_line(server.proc, timeout_s)
            if not line.startswith(f"listening {server.name} "):
                raise RuntimeError(f"{server.name}: expected 'listening ...', got {line!r}")
        return self.servers

    def start_upstream_bird(self, bfd_interval_ms: int = 50, hold_time_s: int = 3) -> subprocess.Popen:
        """BIRD in the upstream namespace, its config and control socket in this net's temp dir."""
        conf, sock = self.tmp / "upstream.conf", self.tmp / "upstream.ctl"
        conf.write_text(upstream_bird_config(self.topo, bfd_interval_ms, hold_time_s))
        self.upstream_bird = self.upstream.popen(
            ["bird", "-f", "-c", str(conf), "-s", str(sock)], stderr=subprocess.DEVNULL
        )
        wait_until(
            lambda: self.upstream.run(["birdc", "-s", str(sock), "show", "status"], check=False).returncode == 0,
            10.0,
            "the upstream's bird to answer",
        )
        return self.upstream_bird

    def edged_config(self, i: int, services: list[dict], bfd_interval_ms: int = 50, bfd: bool = True) -> dict:
        """edged's config for router i: node.bgp towards the upstream, files in the temp dir."""
        topo = self.topo
        d = self.tmp / f"r{i}"
        d.mkdir(exist_ok=True)
        return {
            "version": 1,
            "node": {
                "iface": self.router_iface(i),
                "api_socket": str(d / "edged.sock"),
                "bgp": {
                    "local_as": EDGE_AS,
                    "router_id": str(topo.router_up_addr(i).ip),
                    "peers": [{"address": str(topo.upstream_addr(i).ip), "remote_as": UPSTREAM_AS}]
                    + ([{"address": str(fleet6.upstream_addr6(i).ip), "remote_as": UPSTREAM_AS}] if topo.ipv6 else []),
                    "hold_time_s": 3,
                    "bfd": bfd,
                    "bfd_interval_ms": bfd_interval_ms,
                    "config_file": str(d / "bird.conf"),
                    "control_socket": str(d / "bird.ctl"),
                },
            },
            "services": services,
        }

    def service(self, name: str = "web", port: int = 8000, **extra: object) -> dict:
        """One service on the VIP over every backend, the same on every router (static weights:
        identical Maglev tables)."""
        return {
            "name": name,
            "vip": str(self.vip),
            "port": port,
            **extra,
            "backends": [
                {"name": f"b{j}", "address": str(self.topo.backend_addr(j).ip), "port": port}
                for j in range(self.topo.backends)
            ],
        }

    def service6(self, name: str = "web6", port: int = 8000, **extra: object) -> dict:
        """service() on the IPv6 VIP with the backends' IPv6 addresses (FleetTopo(ipv6=True))."""
        svc = {**self.service(name, port, **extra), "vip": str(fleet6.VIP6)}
        for j, b in enumerate(svc["backends"]):
            b["address"] = str(fleet6.backend_addr6(j).ip)
        return svc

    # looking at the upstream

    def vip_next_hops(self) -> set[IPv4Address]:
        """The routers the upstream's kernel sends the VIP to now."""
        with self.upstream.iproute() as ipr:
            routes = ipr.get_routes(table=254, family=2)  # a dump: `route get` shows one path
        hops = set()
        for r in routes:
            if r.get_attr("RTA_DST") != str(self.vip) or r["dst_len"] != 32:
                continue
            if r.get_attr("RTA_GATEWAY"):
                hops.add(IPv4Address(r.get_attr("RTA_GATEWAY")))
            for nh in r.get_attr("RTA_MULTIPATH") or []:
                if nh.get_attr("RTA_GATEWAY"):
                    hops.add(IPv4Address(nh.get_attr("RTA_GATEWAY")))
        return hops

    def wait_next_hops(self, want: set[int], timeout_s: float) -> float:
        """Waits until the upstream routes the VIP to exactly routers `want`; returns when (monotonic)."""
        hops = {self.topo.router_up_addr(i).ip for i in want}
        wait_until(
            lambda: self.vip_next_hops() == hops,
            timeout_s,
            f"VIP next hops {sorted(map(str, hops))}",
            observe=self.vip_next_hops,
            interval_s=0.002,
        )
        return time.monotonic()

    def wait_next_hops6(self, want: set[int], timeout_s: float) -> float:
        """Waits until the upstream routes the IPv6 VIP to exactly routers `want`; returns when."""
        wait_until(
            lambda: fleet6.vip6_next_hops(self) == want,
            timeout_s,
            f"IPv6 VIP next hops {sorted(want)}",
            observe=lambda: fleet6.vip6_next_hops(self),
            interval_s=0.002,
        )
        return time.monotonic()

    def link_down(self, i: int) -> None:
        """Router i's upstream link loses carrier (its end goes down)."""
        self.router(i).run(["ip", "link", "set", self.router_iface(i), "down"])

    def blackhole(self, i: int) -> None:
        """Nothing arriving over router i's upstream link is taken in any more, at either end; the
        link stays up (nftables netdev ingress, policy drop: after XDP, so the router's data path
        still forwards what reaches it, but its answers die at the upstream)."""
        for ns, dev in ((self.router(i), self.router_iface(i)), (self.upstream, self.ifname(UPSTREAM, f"r{i}"))):
            ns.run(
                ["nft", "-f", "-"],
                input=f"table netdev edge_blackhole {{\n\tchain in {{ type filter hook "
                f'ingress device "{dev}" priority -500; policy drop; }}\n}}\n',
            )

    # teardown

    def _remove_tmp(self) -> None:
        for path in sorted(self.tmp.rglob("*"), reverse=True):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        self.tmp.rmdir()

    def close(self) -> None:
        self._net.close()

    def __enter__(self) -> "FleetNet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
