"""A lower-MTU hop between the client and the router, and bulk transfers across it (path MTU tests).

        client ──veth── hop ──veth── router ── backends
      198.18.254.2   .254.1 │ 198.18.0.2    198.18.0.1
  2001:2:0:fe::2  fe::1     │ 2001:2::2     2001:2::1
                  MTU 1400 ─┘ (the hop's side towards the client)

with_mtu_hop moves the client's end of the client-router veth into a new namespace `{prefix}-hp`
(which takes over the client's address there, 198.18.0.2) and links the client to it through a
new veth whose hop end has the smaller MTU; both families (the hop takes the client's IPv6 address
too, 2001:2::2, and forwards IPv6). The client keeps its 1500-byte link, so it announces a full MSS;
a backend's full-size segments then reach the hop, which drops them and sends "fragmentation needed"
(ICMPv6: "packet too big") to their source, the VIP. On exit the veth end goes back to the client namespace (so the
router's end stays for undeploy) and the hop namespace and its veth are removed.

BulkServers: TCP servers (sockets made in the backend namespaces, served by threads of this
process, IPv4 or with family 6 IPv6) that send a fixed number of bytes to every connection and close it (bulk_get reads one
such response in the client), or with upload read what the client sends and answer its count
(bulk_put); over IPv6 with ipv6. Everything is bounded in count and time.
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from ipaddress import IPv4Interface, IPv6Interface
from typing import Iterator

from pyroute2 import netns

from controlplane.lab.topo import TEST_RANGE, Net, Ns, ignore_gone
from controlplane.lab.topo6 import TEST_RANGE6
from controlplane.lab.traffic import family

HOP = "hp"
HOP_CLIENT_SIDE = IPv4Interface("198.18.254.1/24")
CLIENT_BEHIND_HOP = IPv4Interface("198.18.254.2/24")
HOP_CLIENT_SIDE6 = IPv6Interface("2001:2:0:fe::1/64")
CLIENT_BEHIND_HOP6 = IPv6Interface("2001:2:0:fe::2/64")
MAX_CONNECTIONS = 1000


def _addr_up(
    ns: Ns, ifname: str, addr: IPv4Interface, mtu: int | None = None, addr6: IPv6Interface | None = None
) -> None:
    with ns.iproute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.addr("add", index=index, address=str(addr.ip), prefixlen=addr.network.prefixlen)
        if addr6 is not None:
            ipr.addr("add", index=index, address=str(addr6.ip), prefixlen=addr6.network.prefixlen)
        ipr.link("set", index=index, state="up", **({"mtu": mtu} if mtu else {}))


def _move(ifname: str, src: Ns, dst_name: str) -> None:
    with src.iproute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], net_ns_fd=dst_name)


@contextmanager
def with_mtu_hop(net: Net, mtu: int = 1400) -> Iterator[Ns]:
    """Put a hop namespace with an MTU of mtu towards the client between client and router."""
    hop = Ns(f"{net.prefix}-{HOP}", HOP, lambda proc: None)
    moved = False
    client_side, hop_side = net.ifname(net.client.role, HOP), net.ifname(HOP, net.client.role)
    netns.create(hop.name)
    try:
        for key, value in (
            ("net.ipv4.ip_forward", 1),
            ("net.ipv4.conf.all.rp_filter", 0),
            ("net.ipv4.conf.default.rp_filter", 0),
            ("net.ipv6.conf.all.forwarding", 1),
            ("net.ipv6.conf.all.accept_dad", 0),  # else addresses stay tentative for a second
            ("net.ipv6.conf.default.accept_dad", 0),
        ):
            hop.sysctl(key, value)
        _move(net.client_iface, net.client, hop.name)
        moved = True
        _addr_up(hop, net.client_iface, net.topo.client_addr, addr6=net.topo.client_addr6)
        with hop.iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            ipr.link("add", ifname=hop_side, kind="veth", peer={"ifname": client_side, "net_ns_fd": net.client.name})
            ipr.route("add", dst="0.0.0.0/0", gateway=str(net.topo.router_client_addr.ip))
            ipr.route("add", dst="::/0", gateway=str(net.topo.router_client_addr6.ip))
        _addr_up(hop, hop_side, HOP_CLIENT_SIDE, mtu=mtu, addr6=HOP_CLIENT_SIDE6)
        _addr_up(net.client, client_side, CLIENT_BEHIND_HOP, addr6=CLIENT_BEHIND_HOP6)
        # native XDP on the router cannot fix partial checksums: senders fill them in
        net.client.run(["ethtool", "-K", client_side, "tx", "off"])
        with net.client.iproute() as ipr:
            for dst in (net.topo.vip_route, TEST_RANGE):
                ipr.route("add", dst=str(dst), gateway=str(HOP_CLIENT_SIDE.ip))
            for dst6 in (net.topo.vip6_route, TEST_RANGE6):
                ipr.route("add", dst=str(dst6), gateway=str(HOP_CLIENT_SIDE6.ip))
        with net.router.iproute() as ipr:
            ipr.route("add", dst=str(CLIENT_BEHIND_HOP.network), gateway=str(net.topo.client_addr.ip))
            ipr.route("add", dst=str(CLIENT_BEHIND_HOP6.network), gateway=str(net.topo.client_addr6.ip))
        yield hop
    finally:
        if moved:
            ignore_gone(_move, net.client_iface, hop, net.client.name)
        ignore_gone(netns.remove, hop.name)  # takes the hop's veth (and the client's end) with it


class BulkServers:
    """On entry, one listening TCP socket per backend at its address and port; each connection
    gets size bytes and is closed. Threads stop and sockets close on exit."""

    def __init__(
        self, net: Net, port: int, size: int, any_address: bool = False, upload: bool = False, ipv6: bool = False
    ):
        self.net, self.port, self.size = net, port, size
        self.any_address, self.upload, self.ipv6 = any_address, upload, ipv6
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def __enter__(self) -> "BulkServers":
        try:
            for i, ns in enumerate(self.net.backends):
                with ns.enter():
                    sock = socket.socket(socket.AF_INET6 if self.ipv6 else socket.AF_INET, socket.SOCK_STREAM)
                self._socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.ipv6:
                    sock.bind(("::" if self.any_address else str(self.net.topo.backend_addr6(i).ip), self.port))
                else:
                    sock.bind(("0.0.0.0" if self.any_address else str(self.net.backend_addr(i)), self.port))
                sock.listen(64)
                sock.settimeout(0.2)
                thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
                self._threads.append(thread)
                thread.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _serve(self, sock: socket.socket) -> None:
        body = b"x" * self.size
        for _ in range(MAX_CONNECTIONS):
            if self._stop.is_set():
                return
            try:
                conn, _ = sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(6.0)
                try:
                    conn.sendall(_count_upload(conn) if self.upload else body)
                except OSError:
                    pass

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5.0)
        for sock in self._socks:
            sock.close()


def _count_upload(conn: socket.socket) -> bytes:
    """Read conn until the client shuts its side; the byte count, as ASCII digits."""
    got = 0
    while chunk := conn.recv(65536):
        got += len(chunk)
    return str(got).encode()


def bulk_put(ns: Ns, addr: str, port: int, size: int, timeout_s: float = 5.0) -> int:
    """Send size bytes from ns to addr:port (BulkServers with upload) and return the count the server
    read, or -1 when the transfer or its answer does not complete within timeout_s of silence."""
    with ns.enter():
        sock = socket.socket(family(addr), socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((addr, port))
            sock.sendall(b"u" * size)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(64):
                answer += chunk
            return int(answer)
        except (socket.timeout, OSError, ValueError):
            return -1


def bulk_get(ns: Ns, addr: str, port: int, timeout_s: float = 5.0) -> int:
    """Connect from ns to addr:port and read until the server closes or timeout_s of silence;
    the number of bytes received."""
    with ns.enter():
        sock = socket.socket(family(addr), socket.SOCK_STREAM)
    got = 0
    with sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((addr, port))
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
        except (socket.timeout, OSError):
            pass
    return got
