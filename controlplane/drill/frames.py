"""The frames a drill sends: one new flow each (a TCP SYN or a UDP datagram), built by scapy once
and varied in the source port (and its checksum) only, so thousands are ready before the clock starts.
"""

from __future__ import annotations

import struct
from ipaddress import IPv4Address

from controlplane.drill.plan import FIRST_SPORT

ETH_HLEN = 14


def csum_replace16(csum: int, old: int, new: int) -> int:
    """Internet checksum after a 16-bit word changed from old to new (RFC 1624, eqn. 3)."""
    s = (~csum & 0xFFFF) + (~old & 0xFFFF) + new
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def build_frames(
    protocol: str, src_mac: str, dst_mac: str, src: IPv4Address, dst: IPv4Address, dport: int, n: int
) -> list[bytes]:
    """n frames of new flows to dst:dport, flow k from source port FIRST_SPORT + k.

    scapy builds the first; the others differ in the source port and its checksum only.
    """
    from scapy.layers.inet import IP, TCP, UDP  # imported here: importing the drill stays fast
    from scapy.layers.l2 import Ether

    l4 = (
        TCP(sport=FIRST_SPORT, dport=dport, flags="S", seq=0x5EED0000, window=64240, options=[("MSS", 1460)])
        if protocol == "tcp"
        else UDP(sport=FIRST_SPORT, dport=dport) / b"edge-drill"
    )
    template = bytearray(bytes(Ether(src=src_mac, dst=dst_mac) / IP(src=str(src), dst=str(dst), ttl=64) / l4))
    l4_off = ETH_HLEN + (template[ETH_HLEN] & 0x0F) * 4
    csum_off = l4_off + (16 if protocol == "tcp" else 6)
    (csum0,) = struct.unpack_from("!H", template, csum_off)
    frames = []
    for k in range(n):
        sport = FIRST_SPORT + k
        csum = csum_replace16(csum0, FIRST_SPORT, sport)
        if protocol == "udp" and csum == 0:
            csum = 0xFFFF  # 0 means "no checksum" in UDP
        struct.pack_into("!H", template, l4_off, sport)
        struct.pack_into("!H", template, csum_off, csum)
        frames.append(bytes(template))
    return frames
