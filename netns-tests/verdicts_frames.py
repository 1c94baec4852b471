"""The IPv4 frames of the verdict table (test_verdicts.py), apart from its world: the Internet
checksum (RFC 1071) rewritten frames are verified with, where a frame keeps its fields (Parsed),
the builders of client frames (Ethernet[/802.1Q]/IPv4/TCP or UDP from CLIENT_MAC to ROUTER_MAC,
checksums by scapy), the byte edits that break them, flow.h's flow hash as the data path computes
it, and the frame a row expects after a NAT rewrite. Knows no service or backend: the world
(addresses, services, the loaded programs) is verdicts.py's, which re-exports these names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from ipaddress import IPv4Address

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Dot1Q, Ether

from controlplane.maps.records import hash_mix  # flow.h's, checked against it by test_vip_filter

ROUTER_MAC, CLIENT_MAC = "02:00:00:00:00:01", "02:00:00:00:00:02"
CLIENT_PORT = 40000  # the client's source port, unless a row says otherwise

# ---------------------------------------------------------------- checksums, frames


def inet_sum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of data: 0 when data holds a right one."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


@dataclass(frozen=True)
class Parsed:
    """Where an Ethernet/[802.1Q]/IPv4/TCP-or-UDP frame keeps its fields."""

    l3: int  # offset of the IPv4 header

    def ihl(self, f: bytes) -> int:
        return (f[self.l3] & 0xF) * 4

    def l4(self, f: bytes) -> int:
        return self.l3 + self.ihl(f)

    def proto(self, f: bytes) -> int:
        return f[self.l3 + 9]

    def ends(self, f: bytes) -> tuple[tuple[str, int], tuple[str, int]]:
        """((source address, port), (destination address, port))."""
        ip, l4 = self.l3, self.l4(f)
        src, dst = str(IPv4Address(f[ip + 12 : ip + 16])), str(IPv4Address(f[ip + 16 : ip + 20]))
        sport, dport = struct.unpack_from("!HH", f, l4)
        return (src, sport), (dst, dport)

    def ttl(self, f: bytes) -> int:
        return f[self.l3 + 8]

    def fields(self, f: bytes) -> dict:
        """What a rewrite may change, for a readable failure: MACs, ends, TTL, both checksums (for
        ICMP, the ends' ports are its type and code and its checksum)."""
        l4 = self.l4(f)
        csum_off = l4 + {6: 16, 17: 6}.get(self.proto(f), 2)
        return {
            "dmac": f[0:6].hex(":"),
            "smac": f[6:12].hex(":"),
            "ends": self.ends(f),
            "ttl": self.ttl(f),
            "ip_csum": f[self.l3 + 10 : self.l3 + 12].hex(),
            "l4_csum": f[csum_off : csum_off + 2].hex(),
            "length": len(f),
        }

    def checksums_ok(self, f: bytes) -> bool:
        """IPv4 header and L4 (or ICMP) checksums verify (a UDP checksum of 0 is "none")."""
        ip, l4 = self.l3, self.l4(f)
        tot_len = struct.unpack_from("!H", f, ip + 2)[0]
        seg = f[l4 : ip + tot_len]
        pseudo = f[ip + 12 : ip + 20] + struct.pack("!BBH", 0, self.proto(f), len(seg))
        if self.proto(f) == 17 and struct.unpack_from("!H", f, l4 + 6)[0] == 0:
            return inet_sum(f[ip:l4]) == 0
        if self.proto(f) == 1:  # ICMP: no pseudo header
            return inet_sum(f[ip:l4]) == 0 and inet_sum(seg) == 0
        return inet_sum(f[ip:l4]) == 0 and inet_sum(pseudo + seg) == 0


def parsed(f: bytes) -> Parsed:
    return Parsed(18 if f[12:14] == b"\x81\x00" else 14)


def tcp(
    src,
    dst,
    flags="A",
    *,
    sport=CLIENT_PORT,
    dport=80,
    seq=1000,
    ack=0,
    vlan=False,
    ttl=64,
    payload=b"",
    ip_flags=0,
    **ip,
) -> bytes:
    """An Ethernet/IPv4/TCP frame with right checksums (scapy's); ip: more IP() fields."""
    l2 = Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
    l2 = l2 / Dot1Q(vlan=7) if vlan else l2
    ack = ack or (1 if "A" in flags else 0)
    return bytes(
        l2
        / IP(src=str(src), dst=str(dst), ttl=ttl, flags=ip_flags, **ip)
        / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=64240)
        / payload
    )


def udp(src, dst, *, sport=CLIENT_PORT, dport=53, payload=b"q" * 8, ttl=64, zero_csum=False) -> bytes:
    frame = bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IP(src=str(src), dst=str(dst), ttl=ttl)
        / UDP(sport=sport, dport=dport)
        / payload
    )
    return frame[:40] + b"\0\0" + frame[42:] if zero_csum else frame


def set_bytes(f: bytes, off: int, value: bytes) -> bytes:
    return f[:off] + value + f[off + len(value) :]


def broken_ip_csum(f: bytes) -> bytes:
    return set_bytes(f, 24, struct.pack("!H", struct.unpack_from("!H", f, 24)[0] ^ 0x5555))


def broken_tcp_csum(f: bytes) -> bytes:
    return set_bytes(f, 50, struct.pack("!H", struct.unpack_from("!H", f, 50)[0] ^ 0x5555))


# ---------------------------------------------------------------- the flow hash (flow.h)


def as_loaded(addr: IPv4Address) -> int:
    """An address as the data path holds it in a register: network-order bytes, read as a u32."""
    return int.from_bytes(addr.packed, "little")


def hash_flow(src: IPv4Address, dst: IPv4Address, sport: int, dport: int, proto: int) -> int:
    """flow.h's hash_flow of a client 5-tuple (ports as loaded: network order read as u16)."""

    def port(p: int) -> int:
        return int.from_bytes(p.to_bytes(2, "big"), "little")

    h = 0x9E3779B9  # EDGE_HASH_SEED
    h = hash_mix(h ^ as_loaded(src))
    h = hash_mix(h ^ as_loaded(dst))
    h = hash_mix(h ^ ((port(sport) << 16) | port(dport)))
    return hash_mix(h ^ proto)


# ---------------------------------------------------------------- expected frames


def rewritten(frame: bytes, *, src=None, dst=None, hop: tuple[bytes, bytes] | None = None) -> bytes:
    """frame with its source and/or destination (address, port) replaced and, when hop (destination
    MAC, source MAC) is given, those MACs and the TTL one lower; both checksums computed anew here
    (a UDP checksum of 0, "none", stays 0; one that computes to 0 is sent as 0xffff)."""
    p = parsed(frame)
    f = bytearray(frame)
    ip, l4 = p.l3, p.l4(frame)
    for ends, a_off, p_off in ((src, 12, 0), (dst, 16, 2)):
        if ends is not None:
            f[ip + a_off : ip + a_off + 4] = IPv4Address(ends[0]).packed
            f[l4 + p_off : l4 + p_off + 2] = struct.pack("!H", ends[1])
    if hop is not None:
        f[0:6], f[6:12] = hop
        f[ip + 8] -= 1
    f[ip + 10 : ip + 12] = b"\0\0"
    f[ip + 10 : ip + 12] = struct.pack("!H", inet_sum(bytes(f[ip:l4])))
    csum_off = l4 + (16 if p.proto(frame) == 6 else 6)
    if p.proto(frame) == 17 and frame[csum_off : csum_off + 2] == b"\0\0":
        return bytes(f)
    f[csum_off : csum_off + 2] = b"\0\0"
    seg = bytes(f[l4 : ip + struct.unpack_from("!H", f, ip + 2)[0]])
    c = inet_sum(bytes(f[ip + 12 : ip + 20]) + struct.pack("!BBH", 0, p.proto(frame), len(seg)) + seg)
    f[csum_off : csum_off + 2] = struct.pack("!H", c or (0xFFFF if p.proto(frame) == 17 else 0))
    return bytes(f)
