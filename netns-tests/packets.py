"""Test-only traffic in testbed namespaces: crafted Ethernet frames sent out of an interface and
the IPv4 frames captured at interfaces (AF_PACKET, to prove what got through and what did not),
one ICMP echo and one UDP query. Sockets are made inside the namespace through Ns.enter(), so no
process is started; everything is bounded in count and time. Frames are bytes (the tests build
them with scapy); nothing here knows the router.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from scapy.layers.inet import ICMP

from controlplane.lab.traffic import Addr, _hostport

if TYPE_CHECKING:
    from controlplane.lab.topo import Ns

ETH_P_IP = 0x0800
PACKET_OUTGOING = 4  # sll_pkttype of frames the interface sent (linux/if_packet.h)
MAX_SEND = 10_000
MAX_CAPTURE = 10_000  # frames kept per interface
FRAME_BYTES = 65536


def send_frames(ns: "Ns", ifname: str, frames: Sequence[bytes]) -> None:
    """Transmit each frame as it is (Ethernet header included) out of ifname in ns."""
    if len(frames) > MAX_SEND:
        raise ValueError(f"{len(frames)} frames: at most {MAX_SEND} per call")
    with ns.enter():
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
    with sock:
        sock.bind((ifname, 0))
        for frame in frames:
            sent = sock.send(frame)
            if sent != len(frame):
                raise OSError(f"{ifname}: sent {sent} of {len(frame)} bytes")


class Capture:
    """IPv4 frames arriving at some interfaces (not those they send), from entering until exit.

    with Capture([(net.backends[0], net.backend_peer_iface(0))]) as cap:
        ...
        frames = cap.take()   # {ifname: [frame, ...]} so far
    """

    def __init__(self, where: Iterable[tuple["Ns", str]]):
        self.where = list(where)
        self._socks: list[tuple[str, socket.socket]] = []
        self._frames: dict[str, list[bytes]] = {ifname: [] for _, ifname in self.where}

    def __enter__(self) -> "Capture":
        try:
            for ns, ifname in self.where:
                with ns.enter():
                    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
                self._socks.append((ifname, sock))
                sock.bind((ifname, ETH_P_IP))  # CPython converts the protocol to network order
                sock.setblocking(False)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self) -> dict[str, list[bytes]]:
        """Read what has arrived so far (without waiting) and return every frame since entering."""
        for ifname, sock in self._socks:
            kept = self._frames[ifname]
            while len(kept) < MAX_CAPTURE:
                try:
                    data, addr = sock.recvfrom(FRAME_BYTES)
                except BlockingIOError:
                    break
                # Until bind() a socket sees every interface of its namespace; keep only ifname.
                if addr[0] == ifname and addr[2] != PACKET_OUTGOING:
                    kept.append(data)
        return {ifname: list(frames) for ifname, frames in self._frames.items()}

    def close(self) -> None:
        while self._socks:
            self._socks.pop()[1].close()


@dataclass(frozen=True)
class UdpReply:
    backend: str
    server_addr: str  # "ip:port" the datagram came from


def udp_query(ns: Ns, addr: Addr, port: int, payload: bytes = b"who", timeout_s: float = 1.0) -> UdpReply:
    """Send one datagram from ns to addr:port and return the first answer (the backend echoes its name)."""
    with ns.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.settimeout(timeout_s)
        sock.sendto(payload, (str(addr), port))
        data, src = sock.recvfrom(2048)
    return UdpReply(data.decode(errors="replace"), _hostport(src))


def ping(ns: Ns, addr: Addr, timeout_s: float = 1.0, seq: int = 1) -> float:
    """One ICMP echo from ns to addr; return the round trip in seconds, raise TimeoutError without answer."""
    ident = random.getrandbits(16)
    packet = bytes(ICMP(type="echo-request", id=ident, seq=seq) / b"edge-testbed")  # scapy fills the checksum
    with ns.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    with sock:
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        sock.sendto(packet, (str(addr), 0))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"ping {addr} from {ns.name}: no echo reply within {timeout_s}s")
            sock.settimeout(left)
            try:
                data, src = sock.recvfrom(2048)
            except socket.timeout:
                continue
            ihl = (data[0] & 0x0F) * 4
            icmp_type, _, _, got_id, got_seq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
            if icmp_type == 0 and (got_id, got_seq) == (ident, seq) and src[0] == str(addr):
                return time.monotonic() - t0
