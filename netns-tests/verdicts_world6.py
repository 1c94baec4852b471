"""The IPv6 services of verdicts.py's world beyond web6, kept here so verdicts.py stays short:
hb6, two IPv6 backends judged by heartbeats (verdicts_hb6.py's rows), dsr6, one IPv6 backend
answering clients directly in IPv6-in-IPv6 (verdicts_dsr6.py's rows), and udp6, a UDP service with
one IPv6 backend (verdicts_malformed6.py's rows on zero UDP checksums). Imports nothing of the
world's, so verdicts.py can take them in."""

from __future__ import annotations

from ipaddress import IPv6Address

HB_PORT, HB_TIMEOUT_MS = 7946, 300  # of every heartbeat service of the world (verdicts.py's hb too)
TOKENS6 = {"g0": 0x6EED0001, "g1": 0x6EED0002}
G0, G1 = (IPv6Address("2001:2:0:1::4"), 8000), (IPv6Address("2001:2:0:1::5"), 8000)
DSR6_VIP, F0 = IPv6Address("2001:2:0:ff::3"), (IPv6Address("2001:2:0:1::6"), 80)
UDP6_VIP, UDP6_PORT, U0 = IPv6Address("2001:2:0:ff::4"), 53, (IPv6Address("2001:2:0:1::7"), 5353)

SERVICES6 = [
    {
        "name": "hb6",
        "vip": "2001:2:0:ff::2",
        "port": 80,
        "protocol": "tcp",
        "health": {"heartbeat": {"port": HB_PORT, "timeout_ms": HB_TIMEOUT_MS, "interval_ms": 100}},
        "backends": [
            {"name": n, "address": str(a), "port": p, "token": hex(TOKENS6[n])}
            for n, (a, p) in (("g0", G0), ("g1", G1))
        ],
    },
    {
        "name": "dsr6",
        "vip": str(DSR6_VIP),
        "port": 80,
        "protocol": "tcp",
        "forwarding": "dsr",
        "backends": [{"name": "f0", "address": str(F0[0]), "port": F0[1]}],
    },
    {
        "name": "udp6",
        "vip": str(UDP6_VIP),
        "port": UDP6_PORT,
        "protocol": "udp",
        "backends": [{"name": "u0", "address": str(U0[0]), "port": U0[1]}],
    },
]
