"""The pure part of tools/bench-e2e: test frames, NAPI thread names, /proc parsing, the per-packet
arithmetic, the table and the report. No root, no kernel, no bcc (controlplane/tests/test_bench_e2e.py).
"""

from __future__ import annotations

import statistics
import struct
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

FRAME_SIZE = 64  # on the wire without FCS: 14 Ethernet + 20 IPv4 + 8 UDP + 22 payload (IPv6: 40 + 8 + 2)
COMM_LEN = 15  # TASK_COMM_LEN - 1: what /proc/PID/comm keeps of a kthread's name


def ipv4_checksum(header: bytes) -> int:
    """RFC 1071 checksum of an IPv4 header whose checksum field is zero."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(
    dst_mac: bytes, src_mac: bytes, src: IPv4Address, dst: IPv4Address, sport: int, dport: int, size: int = FRAME_SIZE
) -> bytes:
    """An Ethernet/IPv4/UDP frame of size bytes; UDP checksum 0 (none, valid for IPv4)."""
    payload = size - 14 - 20 - 8
    if payload < 0:
        raise ValueError(f"size {size} is below the 42 bytes of the headers")
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 8 + payload, 0, 0x4000, 64, 17, 0, src.packed, dst.packed)
    ip = ip[:10] + struct.pack("!H", ipv4_checksum(ip)) + ip[12:]
    udp = struct.pack("!HHHH", sport, dport, 8 + payload, 0)
    return dst_mac + src_mac + b"\x08\x00" + ip + udp + bytes(payload)


def udp6_frame(
    dst_mac: bytes, src_mac: bytes, src: IPv6Address, dst: IPv6Address, sport: int, dport: int, size: int = FRAME_SIZE
) -> bytes:
    """An Ethernet/IPv6/UDP frame of size bytes, its UDP checksum right for these ports (the
    generator's other client ports leave it stale: the sinks do not check it)."""
    payload = size - 14 - 40 - 8
    if payload < 0:
        raise ValueError(f"size {size} is below the 62 bytes of the headers")
    length = 8 + payload
    udp = struct.pack("!HHHH", sport, dport, length, 0) + bytes(payload)
    pseudo = src.packed + dst.packed + struct.pack("!IxxxB", length, 17)
    data = pseudo + udp + (b"\0" if len(udp) % 2 else b"")
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    check = (~total & 0xFFFF) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", check) + udp[8:]
    ip = struct.pack("!IHBB16s16s", 6 << 28, length, 17, 64, src.packed, dst.packed)
    return dst_mac + src_mac + b"\x86\xdd" + ip + udp


def napi_comm(ifname: str) -> str:
    """What /proc/PID/comm shows for the threaded-NAPI kthread of ifname ("napi/<dev>-<id>", cut to 15)."""
    return f"napi/{ifname}-"[:COMM_LEN]


def schedstat_ns(text: str) -> int:
    """Time on CPU (ns) from /proc/PID/schedstat: "<on-cpu ns> <waiting ns> <timeslices>"."""
    fields = text.split()
    if len(fields) != 3:
        raise ValueError(f"schedstat: expected 3 fields, got {text!r}")
    return int(fields[0])


def per_packet_ns(cpu_ns: int, packets: int) -> float:
    """Router CPU per delivered packet; ValueError when nothing was delivered."""
    if packets <= 0:
        raise ValueError(f"no packet delivered ({packets}); the path under test forwards nothing")
    return cpu_ns / packets


@dataclass(frozen=True)
class Path:
    """One row of the table: a direction through one configuration of the router namespace."""

    key: str  # e.g. "fwd/router"
    direction: str  # "forward" (client -> backend) or "reply" (backend -> client)
    label: str


@dataclass(frozen=True)
class Summary:
    min: float
    median: float
    runs: int
    delivered: float  # median share of the sent frames that reached the sink


def summarize(samples: list[float], delivered: list[float]) -> Summary:
    if not samples:
        raise ValueError("no samples")
    return Summary(min(samples), statistics.median(samples), len(samples), statistics.median(delivered))


def ratio(numerator: Summary | None, denominator: Summary | None) -> str:
    """median/median as "1.23x", or "-" when a side is missing."""
    if numerator is None or denominator is None or denominator.median <= 0:
        return "-"
    return f"{numerator.median / denominator.median:.2f}x"


def table(paths: list[Path], results: dict[str, Summary]) -> list[str]:
    """The printed table: one line per measured path, ns per delivered packet."""
    lines = [f"  {'direction':<8} {'path':<44} {'min ns':>8} {'median ns':>10} {'runs':>5} {'delivered':>10}"]
    for path in paths:
        s = results.get(path.key)
        if s is None:
            continue
        lines.append(
            f"  {path.direction:<8} {path.label:<44} {s.min:>8,.0f} {s.median:>10,.0f} {s.runs:>5} {s.delivered:>9.0%}"
        )
    return lines


def report(paths: list[Path], results: dict[str, Summary], rounds: int, packets: int, flows: int) -> list[str]:
    """bench-e2e's printout: the table, then the ratios of medians against their targets (issue 11)."""
    r = results.get
    lines = [
        f"bench-e2e: router CPU per delivered packet (ns), 64 B UDP, {flows} flows, "
        f"{packets:,} delivered per run, {rounds} rounds",
        *table(paths, results),
    ]
    lines.append("  ratios (medians):")
    lines.append(f"    forward  router / bare XDP   {ratio(r('fwd/router'), r('fwd/bare')):>7}   (target <= 1.2x)")
    lines.append(f"    forward  router DSR / bare XDP {ratio(r('fwd/router-dsr'), r('fwd/bare')):>5}")
    lines.append(f"    forward  router DSR6 / bare6  {ratio(r('fwd/router-dsr6'), r('fwd/bare6')):>6}")
    lines.append(f"    forward  router6 / bare6     {ratio(r('fwd/router6'), r('fwd/bare6')):>7}")
    lines.append(f"    forward  router6 / router    {ratio(r('fwd/router6'), r('fwd/router')):>7}")
    lines.append(f"    reply    router6 / router    {ratio(r('rep/router6'), r('rep/router')):>7}")
    lines.append(
        f"    reply    router XDP6 / bare XDP6 {ratio(r('rep/router-xdp6'), r('rep/bare-xdp6')):>3}   (target <= 1.2x)"
    )
    lines.append(f"    reply    router XDP6 / router XDP {ratio(r('rep/router-xdp6'), r('rep/router-xdp')):>2}")
    lines.append(f"    reply    router / bare tc    {ratio(r('rep/router'), r('rep/bare-tc')):>7}   (target <= 1.2x)")
    lines.append(f"    reply    router / bare XDP   {ratio(r('rep/router'), r('rep/bare-xdp')):>7}")
    lines.append(
        f"    reply    router XDP / bare XDP {ratio(r('rep/router-xdp'), r('rep/bare-xdp')):>5}   (target <= 1.2x)"
    )
    lines.append(f"    reply    bare tc / bare XDP  {ratio(r('rep/bare-tc'), r('rep/bare-xdp')):>7}")
    lines.append(f"    forward  kernel / router     {ratio(r('fwd/kernel'), r('fwd/router')):>7}")
    lines.append(f"    reply    kernel / router     {ratio(r('rep/kernel'), r('rep/router')):>7}")
    lines.append(f"    reply    kernel / router XDP {ratio(r('rep/kernel'), r('rep/router-xdp')):>7}   (target >= 3x)")
    return lines
