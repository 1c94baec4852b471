"""Namespace topology for tests, the demo and benchmarks: Topo describes, Net builds and removes.

        client ──veth── router ──veth── b0
                           ├────veth── b1
                           └────veth── b2 …

Addresses (all from 198.18.0.0/15): client 198.18.0.2/24, router 198.18.0.1/24 on its
client side; backend i 198.18.{i+1}.2/24, router 198.18.{i+1}.1/24 facing it. The VIP
(198.18.255.1) is on no interface: the client routes 198.18.255.0/24 and 198.18.0.0/15
via the router, backends route everything via their router-side address. IPv6 the same
way, from 2001:2::/48: client 2001:2::2/64, router 2001:2::1/64; backend i
2001:2:0:{i+1:x}::2/64, router ...::1/64; the IPv6 VIP 2001:2:0:ffff::1, routed like the
IPv4 one (DAD is off in every namespace; the router forwards IPv6).

Owns building and removing exactly those things (plus processes started through Ns.popen;
names: see Net); it knows nothing about the router program.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Interface
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from controlplane.lab.procs import read_line, terminate
from controlplane.lab.topo6 import TEST_RANGE6, Topo6
from controlplane.lab.traffic import wait_until

TEST_RANGE = IPv4Network("198.18.0.0/15")
IFNAME_MAX_LENGTH = 15  # IFNAMSIZ - 1
CLIENT, ROUTER = "c", "rt"
NETNS_DIR = Path(netns.NETNS_RUN_DIR)

# Errors that mean "what we wanted to remove is already gone".
GONE = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH})

_VALID_IFNAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_VALID_PREFIX = re.compile(r"^[a-z0-9]{1,5}$")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def check_ifname(name: str) -> str:
    """Return name if the kernel accepts it as an interface name, else raise ValueError."""
    if len(name) > IFNAME_MAX_LENGTH:
        raise ValueError(f"interface name {name!r} is longer than {IFNAME_MAX_LENGTH} characters")
    if not _VALID_IFNAME.match(name):
        raise ValueError(f"interface name {name!r} may hold only letters, digits, '_', '.', '-'")
    return name


def backend_role(i: int) -> str:
    return f"b{i}"


@dataclass(frozen=True)
class Topo(Topo6):
    """What to build. Pure data: printable and testable without root."""

    backends: int = 3
    vip: IPv4Address = IPv4Address("198.18.255.1")

    def __post_init__(self) -> None:
        object.__setattr__(self, "vip", IPv4Address(self.vip))
        if not 1 <= self.backends <= 254:
            raise ValueError(f"backends: {self.backends} is not in 1..254")
        if self.vip not in TEST_RANGE:
            raise ValueError(f"vip: {self.vip} is not in {TEST_RANGE}")
        for net in self.link_networks():
            if self.vip_route.overlaps(net):
                raise ValueError(f"vip: {self.vip_route} overlaps link network {net}")

    @property
    def client_addr(self) -> IPv4Interface:
        return IPv4Interface("198.18.0.2/24")

    @property
    def router_client_addr(self) -> IPv4Interface:
        return IPv4Interface("198.18.0.1/24")

    def backend_addr(self, i: int) -> IPv4Interface:
        self._check_backend(i)
        return IPv4Interface(f"198.18.{i + 1}.2/24")

    def router_backend_addr(self, i: int) -> IPv4Interface:
        self._check_backend(i)
        return IPv4Interface(f"198.18.{i + 1}.1/24")

    @property
    def vip_route(self) -> IPv4Network:
        """The /24 holding the VIP, which the client routes via the router."""
        return IPv4Network(f"{self.vip}/24", strict=False)

    def link_networks(self) -> list[IPv4Network]:
        nets = [self.client_addr.network]
        nets += [IPv4Network(f"198.18.{i + 1}.0/24") for i in range(self.backends)]
        return nets

    def roles(self) -> list[str]:
        return [CLIENT, ROUTER] + [backend_role(i) for i in range(self.backends)]

    def _check_backend(self, i: int) -> None:
        if not 0 <= i < self.backends:
            raise IndexError(f"backend {i} is not in 0..{self.backends - 1}")


def is_gone(e: BaseException) -> bool:
    """True for errors saying the object to remove no longer exists."""
    if isinstance(e, NetlinkError):
        return e.code in GONE
    return isinstance(e, OSError) and e.errno in GONE


def ignore_gone(fn: Callable[..., object], *args: object, **kw: object) -> None:
    """Call fn(*args, **kw), ignoring only 'already gone' errors."""
    try:
        fn(*args, **kw)
    except (NetlinkError, OSError) as e:
        if not is_gone(e):
            raise


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class Ns:
    """One network namespace of a Net: run commands in it, or move the current thread into it."""

    def __init__(self, name: str, role: str, on_popen: Callable[[subprocess.Popen], None]):
        self.name = name
        self.role = role
        self._on_popen = on_popen

    def __repr__(self) -> str:
        return f"Ns({self.name!r})"

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net={self.path}", *map(str, argv)]

    def run(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside this namespace; defaults: check, text, captured output, 30 s timeout."""
        kw.setdefault("check", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 30.0)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        return subprocess.run(self._argv(argv), **kw)

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """subprocess.Popen(argv) inside this namespace; the Net terminates it on close()."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        # nsenter execs argv after setns (no fork for a net namespace), so the pid is argv's.
        proc = subprocess.Popen(self._argv(argv), **kw)
        self._on_popen(proc)
        return proc

    @contextmanager
    def enter(self) -> Iterator["Ns"]:
        """Move the current thread into this namespace; sockets made inside stay there after."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(self.path, os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield self
            finally:
                _setns(home)
        finally:
            os.close(home)

    def iproute(self) -> IPRoute:
        """A netlink socket bound to this namespace (close it, or use it in `with`)."""
        with self.enter():
            return IPRoute()

    def sysctl(self, key: str, value: object | None = None) -> str:
        """Read (and first write, if value is given) net sysctl `key`, e.g. "net.ipv4.ip_forward"."""
        path = Path("/proc/sys", *key.split("."))
        with self.enter():
            if value is not None:
                path.write_text(f"{value}\n")
            return path.read_text().strip()

    def offloads(self, ifname: str) -> dict[str, str]:
        """`ethtool -k ifname` as {feature: "on"|"off"} (a trailing "[fixed]" dropped)."""
        out = self.run(["ethtool", "-k", ifname]).stdout
        features = {}
        for line in out.splitlines()[1:]:
            key, sep, value = line.strip().partition(":")
            if sep and value.strip():
                features[key] = value.split()[0]
        return features


@dataclass
class Server:
    """A process serving on address:port in one namespace (a backend, usually)."""

    name: str
    ns: Ns
    address: IPv4Address
    port: int
    proc: subprocess.Popen = field(repr=False)

    def stop(self, timeout_s: float = 3.0) -> None:
        """Terminate the server; idempotent."""
        terminate(self.proc, timeout_s)


class Net:
    """Everything one Topo built. close() removes exactly that, newest first, also after a failed build.

    Names, for a Net with prefix "e3f9a" (5 hex chars, unique per Net):
      namespaces  {prefix}-{role}             e3f9a-c, e3f9a-rt, e3f9a-b0, e3f9a-b1 …
      interfaces  {prefix}-{here}-{there}     the veth end living in namespace `here`, facing `there`:
                  e3f9a-rt-c  router → client (router_client_iface: where the XDP router goes)
                  e3f9a-c-rt  client → router
                  e3f9a-rt-b0 router → b0     (backend_iface(0))
                  e3f9a-b0-rt b0 → router
    Every name starts with "{prefix}-", so whatever a Net made is greppable and unique on the host.
    """

    def __init__(self, topo: Topo = Topo(), prefix: str | None = None):
        self.topo = topo
        self.prefix = prefix if prefix is not None else unique_prefix()
        if not _VALID_PREFIX.match(self.prefix):
            raise ValueError(f"prefix {self.prefix!r} must be 1-5 lowercase letters or digits")
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self.namespaces: dict[str, Ns] = {role: Ns(f"{self.prefix}-{role}", role, self._adopt) for role in topo.roles()}
        self.servers: list[Server] = []
        for role in topo.roles():
            if role != ROUTER:
                check_ifname(self.ifname(ROUTER, role))
                check_ifname(self.ifname(role, ROUTER))

    # names and addresses

    def ifname(self, here: str, there: str) -> str:
        """Name of the veth end in namespace role `here` facing role `there`."""
        return f"{self.prefix}-{here}-{there}"

    @property
    def client(self) -> Ns:
        return self.namespaces[CLIENT]

    @property
    def router(self) -> Ns:
        return self.namespaces[ROUTER]

    @property
    def backends(self) -> list[Ns]:
        return [self.namespaces[backend_role(i)] for i in range(self.topo.backends)]

    @property
    def vip(self) -> IPv4Address:
        return self.topo.vip

    @property
    def router_client_iface(self) -> str:
        """The router's client-facing interface: where the XDP router is deployed."""
        return self.ifname(ROUTER, CLIENT)

    @property
    def client_iface(self) -> str:
        return self.ifname(CLIENT, ROUTER)

    def backend_iface(self, i: int) -> str:
        """The router's interface facing backend i."""
        self.topo._check_backend(i)
        return self.ifname(ROUTER, backend_role(i))

    def backend_peer_iface(self, i: int) -> str:
        """Backend i's own interface (facing the router)."""
        self.topo._check_backend(i)
        return self.ifname(backend_role(i), ROUTER)

    def backend_addr(self, i: int) -> IPv4Address:
        return self.topo.backend_addr(i).ip

    # building

    def build(self, timeout_s: float = 5.0) -> "Net":
        """Create namespaces, veths, addresses, routes and offload settings; wait until every link is up.

        On any failure, undo what was made and re-raise.
        """
        try:
            self._build(timeout_s)
        except BaseException as e:
            try:
                self.close()
            except Exception as cleanup_error:  # report both; the build error comes first
                e.add_note(f"cleanup after the failed build also failed: {cleanup_error!r}")
            raise
        return self

    def _build(self, timeout_s: float) -> None:
        self._push("remove veths left in the root namespace", self._sweep_root_links)
        for ns in self.namespaces.values():
            netns.create(ns.name)
            self._push(f"remove netns {ns.name}", lambda ns=ns: ignore_gone(netns.remove, ns.name))
        for ns in self.namespaces.values():
            self._configure_ns(ns)
        self._add_veths()
        self._set_offloads()
        self._address_and_route()
        self._wait_links_up(timeout_s)

    def _configure_ns(self, ns: Ns) -> None:
        # Before any veth exists: new interfaces copy the namespace's "default" settings.
        for scope in ("all", "default"):
            ns.sysctl(f"net.ipv6.conf.{scope}.accept_dad", 0)
            if ns.role == ROUTER:
                ns.sysctl(f"net.ipv4.conf.{scope}.rp_filter", 0)
        if ns.role == ROUTER:
            ns.sysctl("net.ipv4.ip_forward", 1)
            ns.sysctl("net.ipv6.conf.all.forwarding", 1)  # bpf_fib_lookup of IPv6 needs it too
        with ns.iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")

    def _add_veths(self) -> None:
        with self.router.iproute() as ipr:
            peers = [(role, ns) for role, ns in self.namespaces.items() if role != ROUTER]
            for k, (role, ns) in enumerate(peers):
                here = self.ifname(ROUTER, role)
                # The kernel delays a link's carrier-up by up to 1 s unless its ifindex differs from
                # its peer's (linkwatch_urgent_event); in fresh namespaces both ends would often be
                # 2. The far ends get 2 (the first after lo), so number the router ends from 1000.
                peer = {"ifname": self.ifname(role, ROUTER), "net_ns_fd": ns.name}
                ipr.link("add", ifname=here, index=1000 + k, kind="veth", peer=peer)
                self._push(f"delete veth {here}", lambda here=here: self._del_link(self.router, here))

    def recreate_client_link(self, timeout_s: float = 5.0) -> None:
        """Deletes the client-router veth and makes it again as build() did: same names,
        addresses and offloads, new ifindexes (a NIC that went away and came back)."""
        topo = self.topo
        self._recreate_link(CLIENT, 1100, topo.router_client_addr, topo.client_addr, timeout_s)
        with self.client.iproute() as ipr:
            for dst in (topo.vip_route, TEST_RANGE):
                ipr.route("add", dst=str(dst), gateway=str(topo.router_client_addr.ip))

    def recreate_backend_link(self, i: int, timeout_s: float = 5.0) -> None:
        """The same for the veth between the router and backend i (a backend-facing NIC)."""
        topo = self.topo
        self._recreate_link(backend_role(i), 1110 + i, topo.router_backend_addr(i), topo.backend_addr(i), timeout_s)
        with self.backends[i].iproute() as ipr:
            ipr.route("add", dst="0.0.0.0/0", gateway=str(topo.router_backend_addr(i).ip))

    def _recreate_link(
        self, role: str, index: int, here_addr: IPv4Interface, there_addr: IPv4Interface, timeout_s: float
    ) -> None:
        """Deletes the router's veth to role and adds it again with the router end at index
        (other than the old one and its peer's), both ends addressed, up and offloads as build()."""
        peer = self.namespaces[role]
        here, there = self.ifname(ROUTER, role), self.ifname(role, ROUTER)
        self._del_link(self.router, here)
        with self.router.iproute() as ipr:
            ipr.link("add", ifname=here, index=index, kind="veth", peer={"ifname": there, "net_ns_fd": peer.name})
        for ns, ifname, addr in ((self.router, here, here_addr), (peer, there, there_addr)):
            with ns.iproute() as ipr:
                found = ipr.link_lookup(ifname=ifname)[0]
                ipr.addr("add", index=found, address=str(addr.ip), prefixlen=addr.network.prefixlen)
                ipr.link("set", index=found, state="up")
        self.router.sysctl(f"net.ipv4.conf.{here}.rp_filter", 0)
        peer.run(["ethtool", "-K", there, "tx", "off", "gro", "on"])
        self._wait_links_up(timeout_s)

    def _del_link(self, ns: Ns, ifname: str) -> None:
        try:
            with ns.iproute() as ipr:
                for index in ipr.link_lookup(ifname=ifname):
                    ignore_gone(ipr.link, "del", index=index)
        except (NetlinkError, OSError) as e:
            if not is_gone(e):
                raise

    def _address_and_route(self) -> None:
        topo = self.topo
        plan: dict[str, list[tuple[str, IPv4Interface | IPv6Interface]]] = {
            ROUTER: [(self.router_client_iface, topo.router_client_addr)],
            CLIENT: [(self.client_iface, topo.client_addr)],
        }
        for i in range(topo.backends):
            plan[ROUTER].append((self.backend_iface(i), topo.router_backend_addr(i)))
            plan[backend_role(i)] = [(self.backend_peer_iface(i), topo.backend_addr(i))]
        plan[ROUTER].append((self.router_client_iface, topo.router_client_addr6))
        plan[CLIENT].append((self.client_iface, topo.client_addr6))
        for i in range(topo.backends):
            plan[ROUTER].append((self.backend_iface(i), topo.router_backend_addr6(i)))
            plan[backend_role(i)].append((self.backend_peer_iface(i), topo.backend_addr6(i)))
        for role, entries in plan.items():
            with self.namespaces[role].iproute() as ipr:
                for ifname, addr in entries:
                    index = ipr.link_lookup(ifname=ifname)[0]
                    ipr.addr("add", index=index, address=str(addr.ip), prefixlen=addr.network.prefixlen)
                    ipr.link("set", index=index, state="up")
                    if role == ROUTER and addr.version == 4:
                        ns = self.namespaces[role]
                        ns.sysctl(f"net.ipv4.conf.{ifname}.rp_filter", 0)
        gateway = str(topo.router_client_addr.ip)
        with self.client.iproute() as ipr:
            for dst in (topo.vip_route, TEST_RANGE):
                ipr.route("add", dst=str(dst), gateway=gateway)
            for dst6 in (topo.vip6_route, TEST_RANGE6):
                ipr.route("add", dst=str(dst6), gateway=str(topo.router_client_addr6.ip))
        for i in range(topo.backends):
            with self.backends[i].iproute() as ipr:
                ipr.route("add", dst="0.0.0.0/0", gateway=str(topo.router_backend_addr(i).ip))
                ipr.route("add", dst="::/0", gateway=str(topo.router_backend_addr6(i).ip))

    def _set_offloads(self) -> None:
        # Native XDP cannot fix partial checksums, so senders fill them in (tx off); XDP_REDIRECT
        # into a veth is dropped unless its peer runs XDP or has GRO on (README.md, Troubleshooting).
        ends = [(self.client, self.client_iface)]
        ends += [(self.backends[i], self.backend_peer_iface(i)) for i in range(self.topo.backends)]
        for ns, ifname in ends:
            ns.run(["ethtool", "-K", ifname, "tx", "off", "gro", "on"])
            got = ns.offloads(ifname)
            want = {"tx-checksumming": "off", "generic-receive-offload": "on"}
            if {k: got.get(k) for k in want} != want:
                raise RuntimeError(
                    f"ethtool on {ns.name}/{ifname}: wanted {want}, got { {k: got.get(k) for k in want} }"
                )

    def link_states(self) -> dict[str, str]:
        """{ifname: operstate} of every veth end this Net made."""
        states = {}
        for ns in self.namespaces.values():
            with ns.iproute() as ipr:
                for link in ipr.get_links():
                    name = link.get("ifname")
                    if name.startswith(f"{self.prefix}-"):
                        states[name] = link.get("operstate")
        return states

    def _wait_links_up(self, timeout_s: float) -> None:
        # Until linkwatch marks a veth UP it has no working qdisc and drops what is sent.
        n_ends = 2 * (len(self.namespaces) - 1)

        def all_up() -> bool:
            states = self.link_states()
            return len(states) == n_ends and all(s == "UP" for s in states.values())

        wait_until(all_up, timeout_s, "every veth end operstate UP", observe=self.link_states)

    # processes

    def _adopt(self, proc: subprocess.Popen) -> None:
        self._push(f"terminate pid {proc.pid}", lambda: terminate(proc))

    def start_backends(self, port: int = 8000, timeout_s: float = 5.0) -> list[Server]:
        """Start controlplane.lab.backend in every backend namespace; return once each said 'listening'."""
        return self._start_servers("controlplane.lab.backend", port, (), (), timeout_s)

    def start_inference(
        self,
        port: int = 8000,
        per_backend: Sequence[Sequence[str]] = (),
        common: Sequence[str] = (),
        timeout_s: float = 5.0,
    ) -> list[Server]:
        """Start the simulated inference server (controlplane.lab.inference) in every backend
        namespace instead of the plain backend; per_backend[i] are extra flags for backend i
        (e.g. ["--added-latency-ms", "5"]), common are flags for all."""
        return self._start_servers("controlplane.lab.inference", port, per_backend, common, timeout_s)

    def _start_servers(
        self, module: str, port: int, per_backend: Sequence[Sequence[str]], common: Sequence[str], timeout_s: float
    ) -> list[Server]:
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        started = []
        for i, ns in enumerate(self.backends):
            addr = self.backend_addr(i)
            extra = list(per_backend[i]) if i < len(per_backend) else []
            argv = [
                sys.executable,
                "-m",
                module,
                "--name",
                backend_role(i),
                "--listen",
                f"{addr}:{port}",
                *(["--listen6", str(self.topo.backend_addr6(i).ip)] if module == "controlplane.lab.backend" else []),
                *common,
                *extra,
            ]
            proc = ns.popen(argv, stdout=subprocess.PIPE, env=env)
            started.append(Server(backend_role(i), ns, addr, port, proc))
        for server in started:
            line = read_line(server.proc, timeout_s)
            if not line.startswith(f"listening {server.name} "):
                raise RuntimeError(f"{server.name}: expected 'listening ...', got {line!r}")
        self.servers.extend(started)
        return started

    # teardown

    def _push(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))

    def close(self) -> None:
        """Undo everything, newest first. Every step runs; the first unexpected error is re-raised."""
        first: BaseException | None = None
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as e:
                if is_gone(e):
                    continue
                if first is None:
                    first = e
                    e.add_note(f"while trying to {what}")
        if first is not None:
            raise first

    def _sweep_root_links(self) -> None:
        with IPRoute() as ipr:
            for link in ipr.get_links():
                if link.get("ifname", "").startswith(f"{self.prefix}-"):
                    ignore_gone(ipr.link, "del", index=link["index"])

    def __enter__(self) -> "Net":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def unique_prefix() -> str:
    """5 hex chars no namespace or root-namespace interface on this host starts with."""
    taken = set(netns.listnetns())
    with IPRoute() as ipr:
        taken |= {link.get("ifname", "") for link in ipr.get_links()}
    for _ in range(100):
        prefix = secrets.token_hex(3)[:5]
        if not any(name.startswith(f"{prefix}-") for name in taken):
            return prefix
    raise RuntimeError("no free 5-hex-char prefix after 100 tries")
