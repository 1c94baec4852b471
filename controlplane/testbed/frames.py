"""Raw Ethernet frames in testbed namespaces: send crafted frames out of an interface, and
capture the IPv4 frames that arrive at interfaces, to prove what got through and what did not.

Both use AF_PACKET sockets made inside the namespace through Ns.enter(), so no process is
started. Frames are bytes (the tests build them, with scapy); this module knows nothing of
their contents or of the router. Sending and capturing are bounded in count.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from controlplane.testbed.topo import Ns

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
