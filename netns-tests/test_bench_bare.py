"""tools/bench_bare.c, the floor programs and the generator of tools/bench-e2e: they compile through
loader.compile_standalone, each does what the benchmark's figures assume (BPF_PROG_TEST_RUN on
crafted frames), and the generator's frame really crosses a veth into the sink:

        client ns: bare_gen_xdp (live frames) --redirect--> c-rt ==veth== rt-c: bare_sink_xdp
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Iterator

import pytest

from controlplane import loader
from controlplane.lab.router import link_mac
from controlplane.lab.topo import Net, Topo
from controlplane.lab.traffic import wait_until

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
import _e2e  # noqa: E402  (tools/_e2e.py: the benchmark's frames)

BARE_C = TOOLS / "bench_bare.c"
XDP_DROP, XDP_PASS, XDP_REDIRECT = 1, 2, 4
TC_ACT_OK, TC_ACT_REDIRECT = 0, 7
DST_MAC, SRC_MAC = bytes.fromhex("0a0b0c0d0e0f"), bytes.fromhex("121314151617")
CLIENT, VIP = IPv4Address("198.18.0.2"), IPv4Address("198.18.255.1")
UDP_FRAME = _e2e.udp_frame(bytes(6), bytes(6), CLIENT, VIP, 10000, 8000)
ARP_FRAME = bytes(6) + bytes(6) + b"\x08\x06" + bytes(28)


def macs(hi_lo: bytes) -> tuple[int, int]:
    return int.from_bytes(hi_lo[:2], "big"), int.from_bytes(hi_lo[2:], "big")


@pytest.fixture(scope="module")
def bare() -> Iterator[loader.Standalone]:
    (dh, dl), (sh, sl) = macs(DST_MAC), macs(SRC_MAC)
    obj = loader.compile_standalone(
        BARE_C,
        {"BARE_IFINDEX": 7, "BARE_DST_MAC_HI": dh, "BARE_DST_MAC_LO": dl, "BARE_SRC_MAC_HI": sh, "BARE_SRC_MAC_LO": sl},
    )
    try:
        yield obj
    finally:
        obj.close()


@dataclass(frozen=True)
class Case:
    description: str
    func: str
    kind: str
    frame: bytes
    verdict: int
    rewritten: bool  # MACs written, everything else as sent


CASES = [
    Case("XDP redirect of a UDP frame writes both MACs", "bare_redirect_xdp", "xdp", UDP_FRAME, XDP_REDIRECT, True),
    Case("XDP redirect passes ARP untouched", "bare_redirect_xdp", "xdp", ARP_FRAME, XDP_PASS, False),
    Case("tc redirect of a UDP frame writes both MACs", "bare_redirect_tc", "tc", UDP_FRAME, TC_ACT_REDIRECT, True),
    Case("tc redirect passes ARP untouched", "bare_redirect_tc", "tc", ARP_FRAME, TC_ACT_OK, False),
    Case("the sink drops UDP", "bare_sink_xdp", "xdp", UDP_FRAME, XDP_DROP, False),
    Case("the sink passes ARP", "bare_sink_xdp", "xdp", ARP_FRAME, XDP_PASS, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.description)
def test_bare_program_verdicts(bare: loader.Standalone, case: Case) -> None:
    run = loader.prog_test_run(bare.load(case.func, case.kind).fd, case.frame)

    assert run.retval == case.verdict
    if case.verdict in (XDP_DROP,):
        return
    expected = DST_MAC + SRC_MAC + case.frame[12:] if case.rewritten else case.frame
    assert run.data_out == expected


def test_the_sink_counts_what_it_drops(bare: loader.Standalone) -> None:
    sink, table = bare.load("bare_sink_xdp", "xdp"), bare.table("bare_sink")
    before = table.sum(table.Key(0)).value

    loader.prog_test_run(sink.fd, UDP_FRAME, repeat=10)
    loader.prog_test_run(sink.fd, ARP_FRAME, repeat=5)

    assert table.sum(table.Key(0)).value - before == 10  # the UDP frames; ARP passed uncounted


@pytest.fixture
def net() -> Iterator[Net]:
    net = Net(Topo(backends=1))
    try:
        net.build()
        yield net
    finally:
        net.close()


def test_generated_frames_cross_a_veth_into_the_sink_with_a_port_per_flow(net: Net) -> None:
    """bare_gen_xdp in the client namespace writes its template over each live frame, gives it the
    next of 4 source ports (its counter) and redirects it to the client's veth; the router end's sink counts 8."""
    with net.client.iproute() as ipr:
        c_rt = ipr.link_lookup(ifname=net.client_iface)[0]
    gen = loader.compile_standalone(
        BARE_C, {"BARE_IFINDEX": c_rt, "BARE_GEN_PORT_OFF": 34, "BARE_GEN_FIRST_PORT": 10000, "BARE_GEN_FLOWS": 4}
    )
    sink = loader.compile_standalone(BARE_C)
    flags = None
    try:
        gen_fn, sink_fn = gen.load("bare_gen_xdp", "xdp"), sink.load("bare_sink_xdp", "xdp")
        with net.router.enter():
            flags = loader.attach_xdp(net.router_client_iface, sink_fn, "native", replace=False)
        tmpl, counted = gen.table("bare_tmpl"), sink.table("bare_sink")
        frame = _e2e.udp_frame(
            bytes.fromhex(link_mac(net.router, net.router_client_iface).replace(":", "")),
            bytes(6),
            CLIENT,
            VIP,
            1,
            8000,
        )
        leaf = tmpl.Leaf()
        ctypes.memmove(ctypes.addressof(leaf), frame, len(frame))
        tmpl[tmpl.Key(0)] = leaf

        with net.client.enter():
            loader.prog_test_run(gen_fn.fd, b"\0" * len(frame), repeat=8, flags=loader.BPF_F_TEST_XDP_LIVE_FRAMES)

        wait_until(
            lambda: counted.sum(counted.Key(0)).value == 8,
            2.0,
            "8 frames at the sink",
            observe=lambda: counted.sum(counted.Key(0)).value,
        )
        flows = gen.table("bare_gen")
        assert flows.sum(flows.Key(0)).value == 8  # the next-flow counter moved once per frame
    finally:
        if flags is not None:
            with net.router.enter():
                loader.detach_xdp(net.router_client_iface, flags)
        gen.close()
        sink.close()
