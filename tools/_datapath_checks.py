"""The checks tools/bench-datapath makes before it times anything, that each IPv4 case takes the
path it claims: (a) makes no conntrack entry after its first packet, (b) and (f) one per
repetition, (c) passes the frame unchanged, the NATed frames carry the backend's (or the
client's) address, port and MACs, TTL 63 and right checksums, and (l) avoids the dead backend.
A failed check raises EdgeError("check: ..."). The IPv6 cases' checks are _datapath_v6.py's.
"""

from __future__ import annotations

import struct
from ipaddress import IPv4Address
from typing import Callable

from scapy.utils import checksum

import _datapath_many as many
from _datapath_cases import BACKENDS, CLIENT, EXTRA, VIP, VIP_PORT, checksums_ok
from controlplane import abi
from controlplane.errors import EdgeError


def fail(what: str) -> None:
    raise EdgeError(f"check: {what}")


def check_frame(what: str, out: bytes, macs: tuple[bytes, bytes], wanted: Callable[[tuple, tuple], bool]) -> tuple:
    """A rewritten frame: its (address, port) ends are wanted, it carries the MACs bpf_fib_lookup
    gives (destination, source), TTL 63 and right checksums. Returns its destination."""
    src, dst = (
        (str(IPv4Address(out[a : a + 4])), struct.unpack("!H", out[p : p + 2])[0]) for a, p in ((26, 34), (30, 36))
    )
    if not wanted(src, dst):
        fail(f"{what} went {src[0]}:{src[1]} -> {dst[0]}:{dst[1]}")
    if (out[0:6], out[6:12]) != macs:
        fail(f"{what} does not carry the MACs bpf_fib_lookup should have given")
    if out[22] != 63 or not checksums_ok(out):
        fail(f"{what} has TTL {out[22]} (want 63) or wrong checksums after NAT")
    return dst


def check_paths(runner, cases: dict, bench, repeat: int) -> dict:
    """Before timing: each case takes its path, (a) creates no conntrack entry, (b) one per
    repetition, and the NATed frame is right (backend address and MAC, TTL, checksums)."""
    ct0, nf0 = runner.state()
    backends = {(str(a), p) for _, a, p in BACKENDS}
    dst = check_frame(
        "(a)", runner.run(cases["established"], 1).data_out, bench.macs["backend"], lambda _, dst: dst in backends
    )
    ct1, nf1 = runner.state()
    runner.run(cases["established"], repeat)
    ct2, nf2 = runner.state()
    out_new = runner.run(cases["new_flow"], repeat).data_out
    ct3, nf3 = runner.state()
    if checksum(out_new[14:34]) != 0:  # its TCP checksum does not cover the counter in the payload
        fail("(b) has a wrong IPv4 checksum after NAT")
    passed = runner.run(cases["pass"], repeat).data_out
    runner.run(cases["reference"], 1)
    runner.run(cases["floor"], 1)
    ct4, _ = runner.state()
    runner.run(cases["floor_new"], repeat)
    ct5, _ = runner.state()
    if ct5 - ct4 != repeat:
        fail(f"{repeat} (f) packets made {ct5 - ct4} conntrack entries")
    if (ct1 - ct0, nf1 - nf0) != (1, 1):
        fail(f"the first (a) packet made {ct1 - ct0} conntrack entries and {nf1 - nf0} new flows, not 1")
    if (ct2, nf2) != (ct1, nf1):
        fail(f"{repeat} (a) packets changed conntrack entries {ct1} -> {ct2}, new flows {nf1} -> {nf2}")
    if (ct3 - ct2, nf3 - nf2) != (repeat, repeat):
        fail(f"{repeat} (b) packets made {ct3 - ct2} conntrack entries and {nf3 - nf2} new flows")
    if passed != cases["pass"].template:
        fail("(c) changed the frame it passed")
    return {
        "repetitions": repeat,
        "established_backend": f"{dst[0]}:{dst[1]}",
        # at the start, after one (a), after (a) x repeat, after (b) x repeat
        "conntrack_entries": [ct0, ct1, ct2, ct3],
        "new_flows": [nf0, nf1, nf2, nf3],
        "nat_frame_ok": True,
        "pass_frame_unchanged": True,
    }


def kill_one(maps, loaded, runner, case) -> str:
    """Ejects backend many.DEAD for good (its health entry, as passive detection would), names it
    to case (l)'s wrapper, and checks one (l) packet goes to another backend."""
    t = loaded.tables()
    meta, backends, health = (t[name] for name in (abi.MAP_BE_META, abi.MAP_BACKENDS, abi.MAP_HEALTH))
    dead = loaded.table("bench_dead")
    bid = next(i for i in range(len(meta)) if meta[meta.Key(i)].name == many.DEAD.encode())
    hid = backends[backends.Key(bid)].health_id
    h = health[health.Key(hid)]
    h.ejected_until_ns = 1 << 62
    health[health.Key(hid)] = h
    dead[dead.Key(1)] = dead.Leaf(bid)
    out = runner.run(case, 1).data_out
    dst = str(IPv4Address(out[30:34]))
    if dst == str(dict((n, a) for n, a, _ in BACKENDS + EXTRA)[many.DEAD]):
        fail(f"(l) went to the dead backend {many.DEAD}")
    return f"{many.DEAD} (id {bid}) ejected; (l) went to {dst}"


def check_reply(runner, cases: dict, bench, client_port: int) -> None:
    """Before timing: (i) and (g) give the reply the VIP back as its source and send it to the
    client (MACs, TTL, checksums); (j) and (h) take their redirect (both lookups hit)."""
    ends = ((str(VIP), VIP_PORT), (str(CLIENT), client_port))
    for key, name in (("reply_xdp", "(i)"), ("reply", "(g)")):
        check_frame(name, runner.run(cases[key], 1).data_out, bench.macs["client"], lambda src, dst: (src, dst) == ends)
    runner.run(cases["reply_xdp_floor"], 1)
    runner.run(cases["reply_floor"], 1)
