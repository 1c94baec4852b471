"""tools/_e2e.py, the pure part of tools/bench-e2e: frames, NAPI thread names, /proc parsing and
the per-packet arithmetic. No root."""

from __future__ import annotations

import sys
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import _e2e  # noqa: E402

MAC_A, MAC_B = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")


def test_a_frame_is_64_bytes_of_ethernet_ipv4_udp_with_a_valid_header_checksum():
    frame = _e2e.udp_frame(MAC_A, MAC_B, IPv4Address("198.18.0.2"), IPv4Address("198.18.255.1"), 10000, 8000)

    assert len(frame) == _e2e.FRAME_SIZE
    assert frame[:6] == MAC_A and frame[6:12] == MAC_B and frame[12:14] == b"\x08\x00"
    ip = frame[14:34]
    assert ip[0] == 0x45 and ip[9] == 17  # IPv4 without options, UDP
    assert ip[12:16] == IPv4Address("198.18.0.2").packed and ip[16:20] == IPv4Address("198.18.255.1").packed
    assert _e2e.ipv4_checksum(ip) == 0  # a header with its checksum in sums to 0xffff
    # bench_bare.c's generator writes the client port at offset 34 (source) or 36 (destination)
    assert int.from_bytes(frame[34:36], "big") == 10000 and int.from_bytes(frame[36:38], "big") == 8000
    assert int.from_bytes(frame[38:40], "big") == 64 - 34  # UDP length: header + payload


def test_a_frame_smaller_than_its_headers_is_refused():
    with pytest.raises(ValueError):
        _e2e.udp_frame(MAC_A, MAC_B, IPv4Address("198.18.0.2"), IPv4Address("198.18.0.1"), 1, 2, size=41)


def test_the_ipv4_checksum_is_rfc_1071s():
    # the example header of RFC 1071's usual illustration (wikipedia "IPv4 header checksum")
    header = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert _e2e.ipv4_checksum(header) == 0xB861


def test_napi_thread_names_are_cut_like_proc_comm():
    assert _e2e.napi_comm("e3f9a-rt-c") == "napi/e3f9a-rt-c"
    assert _e2e.napi_comm("e3f9a-rt-b0") == "napi/e3f9a-rt-b"
    assert _e2e.napi_comm("eth0") == "napi/eth0-"
    assert len(_e2e.napi_comm("a-very-long-name")) == _e2e.COMM_LEN


def test_schedstat_gives_the_on_cpu_nanoseconds():
    assert _e2e.schedstat_ns("199692120 25544795 647\n") == 199692120
    with pytest.raises(ValueError):
        _e2e.schedstat_ns("1 2\n")


def test_per_packet_divides_by_delivered_and_refuses_nothing_delivered():
    assert _e2e.per_packet_ns(3_000_000, 10_000) == 300.0
    with pytest.raises(ValueError):
        _e2e.per_packet_ns(3_000_000, 0)


def test_summary_ratio_and_table():
    router = _e2e.summarize([300.0, 500.0, 400.0], [0.9, 1.0, 0.8])
    bare = _e2e.summarize([200.0, 250.0], [1.0, 1.0])
    assert (router.min, router.median, router.runs, router.delivered) == (300.0, 400.0, 3, 0.9)
    assert _e2e.ratio(router, bare) == "1.78x"  # 400 / 225
    assert _e2e.ratio(router, None) == "-"
    paths = [
        _e2e.Path("fwd/router", "forward", "this router"),
        _e2e.Path("fwd/bare", "forward", "bare"),
        _e2e.Path("rep/kernel", "reply", "kernel forwarding"),
    ]
    lines = _e2e.table(paths, {"fwd/router": router, "fwd/bare": bare})
    assert len(lines) == 3  # header + the two measured paths; the unmeasured one is left out
    assert lines[1].split()[-4:] == ["300", "400", "3", "90%"]
    with pytest.raises(ValueError):
        _e2e.summarize([], [])


def test_the_ipv6_frame_is_64_bytes_with_a_right_udp_checksum():
    from scapy.layers.inet import UDP
    from scapy.layers.l2 import Ether

    src, dst = IPv6Address("2001:2::2"), IPv6Address("2001:2:0:ffff::1")
    frame = _e2e.udp6_frame(MAC_A, MAC_B, src, dst, 10000, 8001)
    assert len(frame) == _e2e.FRAME_SIZE and frame[12:14] == b"\x86\xdd"
    p = Ether(frame)
    sent = p[UDP].chksum
    del p[UDP].chksum
    assert Ether(bytes(p))[UDP].chksum == sent
    assert (p[UDP].sport, p[UDP].dport, p["IPv6"].plen) == (10000, 8001, 10)


def test_the_report_sets_ipv6s_xdp_reply_against_its_own_bare_redirect():
    paths = [_e2e.Path("rep/bare-xdp6", "reply", "bare6"), _e2e.Path("rep/router-xdp6", "reply", "router6")]
    results = {
        "rep/bare-xdp6": _e2e.summarize([200.0, 200.0], [1.0, 1.0]),
        "rep/router-xdp6": _e2e.summarize([250.0, 250.0], [1.0, 1.0]),
    }
    lines = _e2e.report(paths, results, rounds=2, packets=1000, flows=16)
    assert "16 flows" in lines[0] and "1,000 delivered" in lines[0]
    (xdp6,) = [line for line in lines if "router XDP6 / bare XDP6" in line]
    assert "1.25x" in xdp6
    (v4,) = [line for line in lines if "router XDP / bare XDP" in line]
    assert v4.split()[-4] == "-"  # a path not measured has no ratio
