"""Wire-signal rows of IPv6 flows for test_verdicts.py's table (wire6.h, wire.h): the service "web6" of
verdicts.py's world (VIP6:80 -> e0, e1). An IPv6 connection is counted opened and closed per backend
(edge_wire, edge_inflight), its handshake timed from the SYN to the backend's SYN-ACK and its first
request to the backend's first reply payload, as IPv4's are; the edge_ct6 entry carries the same
EDGE_CT_F_* marks and wire_ns. Each row zeroes e0's and e1's wire counts first (the world's reset
leaves them) and checks what moved. One more row holds tc's reverse NAT of IPv6 (rnat6.h: the address
change as one checksum difference) to UDP's rule that a checksum computing to 0 is sent as 0xffff.
rows(row) builds them with verdicts_v4.py's row()."""

from __future__ import annotations

import struct
import time
from typing import Callable

from scapy.layers.inet import TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from verdicts import CLIENT_MAC, CLIENT_PORT, ROUTER_MAC, TC_ACT_OK, XDP_PASS, XDP_REDIRECT, World
from verdicts6 import CLIENT6, E0, E1, SAME, VIP6, dnat6, hop6, snat6, tcp6
from verdicts_malformed6 import pinned_udp6, snat_udp6
from verdicts_world6 import U0, UDP6_VIP

from controlplane import abi
from controlplane.maps.records import be16, put_addr

ING, RET, REP = abi.PROG_INGRESS, abi.PROG_RETURN, abi.PROG_REPLY
W = "web6"
SYN, OPEN = abi.CT_F_SYN, abi.CT_F_OPEN
HS, REQ, RESP = abi.CT_F_HS_WAIT, abi.CT_F_REQ_WAIT, abi.CT_F_RESP_WAIT
STARTED_AGO_NS = 1_000_000  # the timed step of a set-up flow happened 1 ms before the row


def answer6(flags: str, payload: bytes = b"", hlim: int = 1) -> bytes:
    """e0's segment to the client's connection to VIP6:80; hop limit 1: tc leaves the reverse-NATed
    frame to the stack (TC_ACT_OK), so the row compares it with snat6's."""
    seg = TCP(sport=E0[1], dport=CLIENT_PORT, flags=flags, seq=5000, ack=1001)
    return bytes(
        Ether(dst=ROUTER_MAC, src=CLIENT_MAC)
        / IPv6(src=str(E0[0]), dst=str(CLIENT6), hlim=hlim)
        / (seg / Raw(payload) if payload else seg)
    )


def udp_reply_summing_to_zero() -> bytes:
    """u0's answer to the client, hop limit 1, whose UDP checksum after the reverse NAT to
    UDP6_VIP:53 computes to 0 (sent as 0xffff): the last two payload bytes are chosen for that."""

    def frame(x: int) -> bytes:
        u = UDP(sport=U0[1], dport=CLIENT_PORT) / Raw(b"answer" + struct.pack("!H", x))
        return bytes(Ether(dst=ROUTER_MAC, src=CLIENT_MAC) / IPv6(src=str(U0[0]), dst=str(CLIENT6), hlim=1) / u)

    after = Ether(snat_udp6(frame(0)))
    seg = bytearray(bytes(after[UDP]))
    seg[6:8] = b"\0\0"
    pseudo = UDP6_VIP.packed + CLIENT6.packed + struct.pack("!IxxxB", len(seg), 17)
    data = pseudo + bytes(seg)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return frame(0xFFFF - total)  # the sum becomes 0xffff: the checksum, its complement, 0


def _key(w: World, table: str = abi.MAP_CT6):
    t = w.t[table]
    k = t.Key()
    put_addr(k, "src", CLIENT6)
    put_addr(k, "dst", VIP6)
    k.sport, k.dport, k.proto = be16(CLIENT_PORT), be16(80), 6
    return t, k


def flow6(backend: str, flags: int, started: bool = True) -> Callable[[World], None]:
    """edge_ct6 pins the client's connection to VIP6:80 to backend, with these marks; its SYN had
    sequence number 1000, and what it times started STARTED_AGO_NS ago (started)."""

    def setup(w: World) -> None:
        t, k = _key(w)
        v = t.Leaf()
        v.backend_id, v.vip_id, v.flags, v.syn_seq = w.bid(backend), w.vid(W), flags, 1000
        v.wire_ns = time.monotonic_ns() - STARTED_AGO_NS if started else 0
        t[k] = v
        w.wire6_started = v.wire_ns

    return setup


def zeroed(*backends: str, open_: int = 0) -> Callable[[World], None]:
    """backends' wire statistics on every CPU zeroed, and open_ connections counted open each."""

    def setup(w: World) -> None:
        for b in backends:
            w.percpu(abi.MAP_WIRE, w.bid(b))
            t = w.t[abi.MAP_INFLIGHT]
            t[t.Key(w.bid(b))] = t.Leaf(open_)

    return setup


def entry(w: World):
    """The connection's edge_ct6 entry, else the flow_info of its edge_half_open6 entry (where
    a SYN's waits for the handshake's end, state6.h), else None."""
    t, k = _key(w)
    e = t.get(k)
    if e is None:
        t, k = _key(w, abi.MAP_HALF_OPEN6)
        ho = t.get(k)
        e = ho.ct if ho is not None else None
    return e


def wire(w: World, backend: str) -> dict[str, int]:
    """backend's wire statistics summed over the CPUs: handshakes, first bytes, opened, closed, open."""
    values = w.t[abi.MAP_WIRE][w.t[abi.MAP_WIRE].Key(w.bid(backend))]
    t = w.t[abi.MAP_INFLIGHT]
    return {
        "handshakes": sum(sum(v.handshake) for v in values),
        "first_bytes": sum(sum(v.first_byte) for v in values),
        "opened": sum(v.opened for v in values),
        "closed": sum(v.closed for v in values),
        "open": t[t.Key(w.bid(backend))].value,
    }


def counts(backend: str, **want: int) -> tuple[str, Callable[[World], bool]]:
    """backend's wire statistics are want in the fields named, 0 in the others."""
    full = {"handshakes": 0, "first_bytes": 0, "opened": 0, "closed": 0, "open": 0} | want
    return (f"{backend}'s wire counts are {full}", lambda w: wire(w, backend) == full)


def marks(backend: str, flags: int) -> tuple[str, Callable[[World], bool]]:
    """The entry is backend's and carries exactly these marks."""

    def holds(w: World) -> bool:
        e = entry(w)
        return e is not None and e.backend_id == w.bid(backend) and e.flags == flags

    return (f"the IPv6 entry is {backend}'s with flags {flags:#x}", holds)


def restarted() -> tuple[str, Callable[[World], bool]]:
    """wire_ns was taken anew by the row's packet (later than the set-up's)."""
    return ("the entry's timer restarted", lambda w: (e := entry(w)) is not None and e.wire_ns > w.wire6_started)


def new_flow_opened() -> tuple[str, Callable[[World], bool]]:
    """A new entry, of either backend, counted open there with its handshake timed."""

    def holds(w: World) -> bool:
        e = entry(w)
        if e is None or e.flags & (OPEN | HS) != OPEN | HS or not e.wire_ns:
            return False
        picked = next(b for b in ("e0", "e1") if w.bid(b) == e.backend_id)
        other = "e1" if picked == "e0" else "e0"
        return wire(w, picked) == {"handshakes": 0, "first_bytes": 0, "opened": 1, "closed": 0, "open": 1} and not any(
            wire(w, other).values()
        )

    return ("the new entry counts one open connection of its backend, its handshake timed", holds)


def rows(row) -> list:
    """The rows, made by verdicts_v4.py's row()."""
    z = zeroed("e0", "e1")
    # fmt: off
    return [
        row("IPv6 SYN, new flow: counted open, its handshake timed", ING, tcp6(), XDP_REDIRECT, None,
            {"redirect": 1}, z, after=[new_flow_opened()], svc=W),
        row("IPv6 SYN-ACK answering the timed SYN: one handshake sample, the first request awaited", RET,
            answer6("SA"), TC_ACT_OK, snat6, {"return_nat": 1}, zeroed("e0", open_=1), zeroed("e1"),
            flow6("e0", SYN | OPEN | HS), after=[counts("e0", handshakes=1, open=1), marks("e0", SYN | OPEN | REQ)],
            svc=W),
        row("IPv6 first request payload: timed until the first reply byte", ING, tcp6(flags="PA", payload=b"GET /"),
            XDP_REDIRECT, dnat6(E0), {"redirect": 1}, z, flow6("e0", OPEN | REQ),
            after=[marks("e0", OPEN | RESP), restarted(), counts("e0")], svc=W),
        row("IPv6 ACK without payload while the request is awaited: nothing timed", ING, tcp6(flags="A"),
            XDP_REDIRECT, dnat6(E0), {"redirect": 1}, z, flow6("e0", OPEN | REQ),
            after=[marks("e0", OPEN | REQ), counts("e0")], svc=W),
        row("IPv6 first reply payload: one first-byte sample", RET, answer6("PA", b"HTTP/1.1 200"), TC_ACT_OK, snat6,
            {"return_nat": 1}, z, flow6("e0", OPEN | RESP),
            after=[counts("e0", first_bytes=1), marks("e0", OPEN)], svc=W),
        row("IPv6 reply while a wire sample is pending: to tc", REP, answer6("A", b"x", hlim=64), XDP_PASS, SAME, {},
            z, flow6("e0", OPEN | RESP), hop6()),
        row("IPv6 client FIN of an open connection: counted closed", ING, tcp6(flags="FA"), XDP_REDIRECT, dnat6(E0),
            {"redirect": 1}, zeroed("e0", open_=1), zeroed("e1"), flow6("e0", OPEN | REQ),
            after=[counts("e0", closed=1), marks("e0", 0)], svc=W),
        row("IPv6 backend RST of an open connection: counted closed", RET, answer6("RA"), TC_ACT_OK, snat6,
            {"return_nat": 1}, zeroed("e0", open_=1), zeroed("e1"), flow6("e0", OPEN | RESP),
            after=[counts("e0", closed=1), marks("e0", 0)], svc=W),
        row("IPv6 SYN of a connection whose backend went: closed there, opened on e1, handshake timed", ING, tcp6(),
            XDP_REDIRECT, dnat6(E1), {"redirect": 1}, zeroed("e0", open_=1), zeroed("e1"), flow6("e0", OPEN),
            lambda w: w.set_flags("e0", 0),
            after=[counts("e0", closed=1), counts("e1", opened=1, open=1), marks("e1", SYN | abi.CT_F_SYN_PENDING | OPEN | HS),
                   restarted()], svc=W),
        row("IPv6 UDP reply whose checksum computes to 0 after the reverse NAT (tc): sent as 0xffff", RET,
            udp_reply_summing_to_zero(), TC_ACT_OK, snat_udp6, {"return_nat": 1}, pinned_udp6, svc="udp6"),
    ]
    # fmt: on
