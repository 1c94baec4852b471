"""The harness of test_verdicts.py: the data path compiled once, its programs loaded (not attached)
and fed one frame at a time through BPF_PROG_TEST_RUN, in this process's network namespace, with
no interface made and no packet sent. It owns the world the table's rows start from (services,
backends, the caches that stand in for bpf_fib_lookup), the heartbeats of its backends and the
counters' deltas. The IPv4 frame builders, the Internet checksum rewritten frames are verified
with and flow.h's hash are verdicts_frames.py's (re-exported here). It decides no verdict: the
rows (verdicts_v4.py, verdicts6.py, ...) say what each program must do.

Everything the FIB would answer comes from the data path's own caches, filled here: the forward
next hop per backend (edge_nexthop) and the reply hop per (client, VIP) (edge_reply_hop). Their
freshness is measured in jiffies, which user space cannot read cheaply, so the programs are
compiled with EDGE_NEXTHOP_TTL_JIFFIES (nat.h's knob) so long that a hop written here stays fresh
for the whole run; nothing else of bpf/ is changed.
"""

from __future__ import annotations

import secrets
import struct
import time
from ipaddress import IPv4Address
from pathlib import Path
from typing import Callable

from verdicts_frames import (  # noqa: F401  (re-exported: the rows import them from here)
    CLIENT_MAC,
    CLIENT_PORT,
    ROUTER_MAC,
    Parsed,
    as_loaded,
    broken_ip_csum,
    broken_tcp_csum,
    hash_flow,
    inet_sum,
    parsed,
    rewritten,
    set_bytes,
    tcp,
    udp,
)
from verdicts_world6 import (  # noqa: F401  (re-exported)
    DSR6_VIP,
    F0,
    G0,
    G1,
    HB_PORT,
    HB_TIMEOUT_MS,
    SERVICES6,
    TOKENS6,
    U0,
)

from controlplane import abi, loader
from controlplane.config import parse_config
from controlplane.maps import Maps, be16, be32, slot_counts
from controlplane.maps.records import hash_mix  # flow.h's, checked against it by test_vip_filter

XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = 1, 2, 3, 4
TC_ACT_UNSPEC, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0xFFFFFFFF, 0, 2, 7  # retval is a u32

BPFFS = Path("/sys/fs/bpf")
PARAMS = loader.Params(maglev_m=1009, max_services=16, max_backends=16, ct_size=1024)
HOP_TTL_JIFFIES = 1 << 41  # -DEDGE_NEXTHOP_TTL_JIFFIES: see the module's docstring
HOP_EXPIRES = 1 << 40  # jiffies64 starts near 2^32 and grows by HZ a second: fresh for decades

# Interface indexes. The XDP programs' test runs arrive on lo (the kernel wants a real device
# there, and lo is 1 in every namespace); the return path's arrive on BACKEND_IF (tc does not
# look it up). Both are written into the maps as the node's interfaces; redirects are not
# carried out by a test run, so CLIENT_IF and BACKEND_IF need not exist.
LO = 1
BACKEND_IF = 2  # where heartbeats must arrive (edge_hb.ifindex), tc's ingress
CLIENT_IF = 3  # the client-facing interface: edge_node.ingress_ifindex, the reply hop's
HOP_SMAC, HOP_DMAC = bytes.fromhex("02000000aa01"), bytes.fromhex("02000000aa02")  # towards backends
REPLY_SMAC, REPLY_DMAC = bytes.fromhex("02000000bb01"), bytes.fromhex("02000000bb02")  # towards clients
TO_BACKEND = (HOP_DMAC, HOP_SMAC)  # the MACs of the cached next hop towards the backends, as a frame has them
TO_CLIENT = (REPLY_DMAC, REPLY_SMAC)  # the MACs of the cached reply hop
MTU = 1500

CLIENT = IPv4Address("198.18.0.2")  # from port CLIENT_PORT, MAC CLIENT_MAC (verdicts_frames.py)
ROUTER = IPv4Address("198.18.0.1")
VIP, HB_VIP = IPv4Address("198.18.255.1"), IPv4Address("198.18.255.2")
B0, D0 = (IPv4Address("198.18.1.2"), 8000), (IPv4Address("198.18.1.3"), 5353)
H0, H1 = (IPv4Address("198.18.1.4"), 8000), (IPv4Address("198.18.1.5"), 8000)
PAS_VIP = IPv4Address("198.18.255.3")
P0, P1 = (IPv4Address("198.18.1.6"), 8000), (IPv4Address("198.18.1.7"), 8000)
SBY_VIP = IPv4Address("198.18.255.4")
S0, S1 = (IPv4Address("198.18.1.8"), 8000), (IPv4Address("198.18.1.9"), 8000)
DSR_VIP, X0 = IPv4Address("198.18.255.5"), (IPv4Address("198.18.1.10"), 80)
ROUTER_B = IPv4Address("198.18.1.1")  # the router's address towards the backends (DSR's outer source)
TOKENS = {"h0": 0x5EED0001, "h1": 0x5EED0002, **TOKENS6}

# web: plain TCP NAT to one backend; dns: UDP; hb: two backends judged by heartbeats; pas: two
# backends under passive detection (three failures in a row eject); sby: a primary and a standby,
# whose flows stay on their backend when it becomes unusable (existing_flows: keep); dsr: one
# backend answering clients directly (forwarding: dsr, IPIP); web6: IPv6 (verdicts6.py's rows);
# hb6: two IPv6 backends judged by heartbeats (verdicts_hb6.py's rows); dsr6: one IPv6 backend
# answering clients directly (IPv6-in-IPv6, verdicts_dsr6.py's rows).
CONFIG = {
    "version": 1,
    "node": {
        "maglev_m": PARAMS.maglev_m,
        "max_services": PARAMS.max_services,
        "max_backends": PARAMS.max_backends,
        "ct_size": PARAMS.ct_size,
    },
    "services": [
        {
            "name": "web",
            "vip": str(VIP),
            "port": 80,
            "protocol": "tcp",
            "backends": [{"name": "b0", "address": str(B0[0]), "port": B0[1]}],
        },
        {
            "name": "dns",
            "vip": str(VIP),
            "port": 53,
            "protocol": "udp",
            "backends": [{"name": "d0", "address": str(D0[0]), "port": D0[1]}],
        },
        {
            "name": "hb",
            "vip": str(HB_VIP),
            "port": 80,
            "protocol": "tcp",
            "health": {"heartbeat": {"port": HB_PORT, "timeout_ms": HB_TIMEOUT_MS, "interval_ms": 100}},
            "backends": [
                {"name": n, "address": str(a), "port": p, "token": hex(TOKENS[n])}
                for n, (a, p) in (("h0", H0), ("h1", H1))
            ],
        },
        {
            "name": "sby",
            "vip": str(SBY_VIP),
            "port": 80,
            "protocol": "tcp",
            "existing_flows": "keep",
            "backends": [
                {"name": "s0", "address": str(S0[0]), "port": S0[1]},
                {"name": "s1", "address": str(S1[0]), "port": S1[1], "standby": True},
            ],
        },
        {
            "name": "pas",
            "vip": str(PAS_VIP),
            "port": 80,
            "protocol": "tcp",
            "health": {"passive": {"consecutive": 3, "syn_timeout_ms": 200, "ejection_ms": 1000}},
            "backends": [{"name": n, "address": str(a), "port": p} for n, (a, p) in (("p0", P0), ("p1", P1))],
        },
        {
            "name": "web6",
            "vip": "2001:2:0:ff::1",
            "port": 80,
            "protocol": "tcp",
            "backends": [
                {"name": n, "address": a, "port": 8000} for n, a in (("e0", "2001:2:0:1::2"), ("e1", "2001:2:0:1::3"))
            ],
        },
        *SERVICES6,  # hb6, dsr6, udp6 (verdicts_world6.py)
        {
            "name": "dsr",
            "vip": str(DSR_VIP),
            "port": 80,
            "protocol": "tcp",
            "forwarding": "dsr",
            "backends": [{"name": "x0", "address": str(X0[0]), "port": X0[1]}],
        },
    ],
}


def heartbeat(backend: str, *, seq=1, token=None, epoch=None, src=None) -> bytes:
    """A heartbeat of backend (h0, h1) from its address to the router's heartbeat port."""
    addr, port = {"h0": H0, "h1": H1}[backend]
    payload = abi.heartbeat(
        port,
        seq,
        TOKENS[backend] if token is None else token,
        int(time.clock_gettime(time.CLOCK_TAI)) if epoch is None else epoch,
    )
    return udp(src or addr, ROUTER, sport=40001, dport=HB_PORT, payload=payload)


# ---------------------------------------------------------------- the world


class World:
    """The compiled data path, its programs and maps, and the state every row starts from."""

    def __init__(self) -> None:
        loader.check_bpffs(str(BPFFS))
        self.pin_path = BPFFS / f"edge-verdicts-{secrets.token_hex(3)}"
        self.pin_path.mkdir()
        self.loaded = None
        self.maps: Maps | None = None

    def build(self) -> None:
        """Compiles and loads the programs, writes the services and the node record (close()
        undoes whatever of it was done)."""
        text = f"#define EDGE_NEXTHOP_TTL_JIFFIES {HOP_TTL_JIFFIES}ULL\n" + loader.source_text()
        self.loaded = loader.compile_datapath(self.pin_path, PARAMS, text=text)
        self.fds = {
            name: self.loaded.load(name, kind).fd
            for name, kind in ((abi.PROG_INGRESS, "xdp"), (abi.PROG_RETURN, "tc"), (abi.PROG_REPLY, "xdp"))
        }
        self.t = self.loaded.tables()
        self.maps = Maps(self.t, self.loaded.map_fd(abi.MAP_MAGLEV), PARAMS.maglev_m, PARAMS.max_services)
        self.cfg = parse_config(CONFIG, "test_verdicts")
        self.maps.apply(self.cfg, {a: BACKEND_IF for a, _ in (B0, D0, H0, H1, P0, P1, S0, S1, X0, G0, G1, F0, U0)})
        self.node()
        self.ids = {s.name: self.maps.ids(s.name) for s in self.cfg.services}
        backends = self.t[abi.MAP_BACKENDS]
        self._backends = {bid: backends[backends.Key(bid)] for _, ids in self.ids.values() for bid in ids.values()}
        self._backends = {bid: type(v).from_buffer_copy(v) for bid, v in self._backends.items()}
        cfgs = self.t[abi.MAP_SVC_CFG]  # restored by reset: a row may change a service's flags
        self._svc_cfg = {
            vid: type(v).from_buffer_copy(v) for vid, v in ((vid, cfgs[cfgs.Key(vid)]) for vid, _ in self.ids.values())
        }
        self._hb = [
            (name, type(k).from_buffer_copy(k), type(v).from_buffer_copy(v))
            for name in (abi.MAP_HB, abi.MAP_HB6)
            for k, v in self.t[name].items()
        ]

    def node(self, *, answer_ping: bool = True) -> None:
        """The node record deploy writes (node.answer_ping as given)."""
        self.maps.write_node(
            maglev_m=PARAMS.maglev_m,
            max_services=PARAMS.max_services,
            max_backends=PARAMS.max_backends,
            ct_size=PARAMS.ct_size,
            ingress_ifindex=CLIENT_IF,
            xdp_flags=0,
            ip_forward_was=None,
            return_ifindex=[BACKEND_IF],
            return_clsact_added=[False],
            answer_ping=answer_ping,
        )

    def close(self) -> None:
        if self.maps is not None:
            self.maps.close()
        if self.loaded is not None:
            self.loaded.close()
        loader.remove_pins(self.pin_path)

    # ------------------------------------------------------------ names

    def bid(self, backend: str) -> int:
        """The id apply gave a backend (backend names are unique across this world's services)."""
        return next(ids[backend] for _, ids in self.ids.values() if backend in ids)

    def vid(self, service: str) -> int:
        return self.ids[service][0]

    # ------------------------------------------------------------ the state every row starts from

    def reset(self) -> None:
        """No connections, every heartbeat backend alive and risen, budgets unspent, backends as
        configured, next hops and reply hops cached."""
        # the heartbeats' second for this row (abi.heartbeat: the sender's CLOCK_TAI): taken per
        # row, so the window check sees a current epoch however late in a long run the row runs
        self.epoch = int(time.clock_gettime(time.CLOCK_TAI))
        for name in (abi.MAP_CT, abi.MAP_HALF_OPEN, abi.MAP_DIRECT, abi.MAP_CT6, abi.MAP_HALF_OPEN6, abi.MAP_DIRECT6):
            self.t[name].clear()
        backends = self.t[abi.MAP_BACKENDS]
        for bid, v in self._backends.items():
            backends[backends.Key(bid)] = v
        cfgs, inflight = self.t[abi.MAP_SVC_CFG], self.t[abi.MAP_INFLIGHT]
        for vid, v in self._svc_cfg.items():
            cfgs[cfgs.Key(vid)] = v
        for bid in self._backends:  # open-connection counts (wire.h): none, as two_choices rows expect; no scales
            inflight[inflight.Key(bid)] = inflight.Leaf(0)
            inflight[inflight.Key(2 * PARAMS.max_backends + bid)] = inflight.Leaf(0)
        for name, k, v in self._hb:
            self.t[name][k] = v
        for name in ("h0", "h1", "g0", "g1"):
            self.set_health(name, last_seen_ns=time.monotonic_ns(), rise_count=100)
        for name in ("p0", "p1"):
            self.set_health(name)
        self.percpu(abi.MAP_CT_BUDGET, 0, window_ns=0, used=0)
        for k, v in getattr(self, "rnat6_saved", None) or ():  # a row's edge_rnat6 change (verdicts6.py)
            self.t[abi.MAP_RNAT6][k] = v
            self.maps.rnat_changed()
        self.rnat6_saved = None
        if getattr(self, "hop6_slot", None) is not None:  # a row's IPv6 reply hop (verdicts6.py, hop6)
            self.percpu(abi.MAP_REPLY_HOP6, self.hop6_slot, expires=0, ifindex=0)
        for bid in self._backends:
            self.percpu(
                abi.MAP_NEXTHOP,
                bid,
                expires=HOP_EXPIRES,
                ifindex=BACKEND_IF,
                smac=HOP_SMAC,
                dmac=HOP_DMAC,
                src=as_loaded(ROUTER_B),
                mtu=MTU,
            )
        for vip in (VIP, HB_VIP, PAS_VIP):
            self.reply_hop(CLIENT, vip, CLIENT_IF)
        if not self.maps.node()["answer_ping"]:
            self.node()

    def percpu(self, name: str, index: int, **fields) -> None:
        """Every CPU's entry index of a per-CPU array: zeroed, then fields set."""
        t = self.t[name]
        v = t.Leaf()
        for cpu in range(len(v)):
            for field, value in fields.items():
                setattr(v[cpu], field, _c(getattr(v[cpu], field), value))
        t[t.Key(index)] = v

    def reply_hop(self, client: IPv4Address, vip: IPv4Address, ifindex: int) -> None:
        """The cached hop of replies from vip to client (nat.h, reply_hop_at: its slot)."""
        slot = hash_mix(as_loaded(client) ^ as_loaded(vip)) & (abi.REPLY_HOP_SLOTS - 1)
        self.percpu(
            abi.MAP_REPLY_HOP,
            slot,
            expires=HOP_EXPIRES,
            client=as_loaded(client),
            vip=as_loaded(vip),
            ifindex=ifindex,
            smac=REPLY_SMAC,
            dmac=REPLY_DMAC,
            mtu=MTU,
        )

    # ------------------------------------------------------------ set-ups the rows name

    def set_health(self, backend: str, **fields) -> None:
        t = self.t[abi.MAP_HEALTH]
        hid = self._backends[self.bid(backend)].health_id
        v = t.Leaf()
        for field, value in fields.items():
            setattr(v, field, value)
        t[t.Key(hid)] = v

    def hb_interface(self, backend: str, ifindex: int) -> None:
        """backend's heartbeats are registered as arriving on ifindex (edge_hb, edge_hb6)."""
        for t in (self.t[abi.MAP_HB], self.t[abi.MAP_HB6]):
            for k, v in list(t.items()):
                if v.health_id == self._backends[self.bid(backend)].health_id:
                    v.ifindex = ifindex
                    t[k] = v

    def health(self, backend: str):
        t = self.t[abi.MAP_HEALTH]
        return t[t.Key(self._backends[self.bid(backend)].health_id)]

    def connect(
        self, backend: str, *, client=CLIENT, sport=CLIENT_PORT, vip=VIP, dport=80, proto=6, flags=0, syn_seq=0
    ) -> None:
        """A conntrack entry: client:sport -> vip:dport pinned to backend."""
        t, bid = self.t[abi.MAP_CT], self.bid(backend)
        k = t.Key()
        k.src, k.dst, k.sport, k.dport, k.proto = be32(client), be32(vip), be16(sport), be16(dport), proto
        v = t.Leaf()
        v.backend_id, v.vip_id, v.flags = bid, self._backends[bid].vip_id, flags
        v.syn_seq = struct.unpack("=I", struct.pack("!I", syn_seq))[0]  # network order, as the SYN carried it
        t[k] = v

    def _flow_key(self, t, client, sport, vip, dport, proto):
        k = t.Key()
        k.src, k.dst, k.sport, k.dport, k.proto = be32(client), be32(vip), be16(sport), be16(dport), proto
        return k

    def connection(self, *, client=CLIENT, sport=CLIENT_PORT, vip=VIP, dport=80, proto=6, half_open=False):
        """The backend id conntrack (half_open: the half-open table) pins this connection to, or None."""
        t = self.t[abi.MAP_HALF_OPEN if half_open else abi.MAP_CT]
        try:
            v = t[self._flow_key(t, client, sport, vip, dport, proto)]
        except KeyError:
            return None
        return v.ct.backend_id if half_open else v.backend_id

    def half_open(
        self, backend: str, *, answered_seq: int | None = None, client=CLIENT, sport=CLIENT_PORT, vip=VIP, dport=80
    ) -> None:
        """A half-open TCP connection pinned to backend whose SYN (seq 1000) went through the VIP;
        answered_seq: the backend's SYN-ACK with that sequence number was seen."""
        t, bid = self.t[abi.MAP_HALF_OPEN], self.bid(backend)
        v = t.Leaf()
        v.ct.backend_id, v.ct.vip_id, v.ct.flags = bid, self._backends[bid].vip_id, abi.CT_F_SYN
        v.ct.syn_seq = struct.unpack("=I", struct.pack("!I", 1000))[0]
        if answered_seq is not None:
            v.ack_seq = struct.unpack("=I", struct.pack("!I", answered_seq + 1))[0]
            v.flags = abi.HO_F_ANSWERED
        t[self._flow_key(t, client, sport, vip, dport, 6)] = v

    def answered(self, *, client=CLIENT, sport=CLIENT_PORT, vip=VIP, dport=80) -> int | None:
        """The sequence number + 1 of the SYN-ACK the half-open connection saw, or None."""
        t = self.t[abi.MAP_HALF_OPEN]
        try:
            v = t[self._flow_key(t, client, sport, vip, dport, 6)]
        except KeyError:
            return None
        return struct.unpack("!I", struct.pack("=I", v.ack_seq))[0] if v.flags & abi.HO_F_ANSWERED else None

    def direct(self, backend: str, *, client=CLIENT, sport=CLIENT_PORT) -> None:
        """client:sport's connection to backend's own address is a direct one (edge_direct)."""
        t = self.t[abi.MAP_DIRECT]
        addr, port = next((b.address, b.port) for s in self.cfg.services for b in s.backends if b.name == backend)
        k = t.Key()
        k.backend, k.client, k.backend_port, k.client_port = be32(addr), be32(client), be16(port), be16(sport)
        t[k] = t.Leaf(1)

    def is_direct(self, backend: str, *, client=CLIENT, sport=CLIENT_PORT) -> bool:
        t = self.t[abi.MAP_DIRECT]
        addr, port = next((b.address, b.port) for s in self.cfg.services for b in s.backends if b.name == backend)
        k = t.Key()
        k.backend, k.client, k.backend_port, k.client_port = be32(addr), be32(client), be16(port), be16(sport)
        try:
            t[k]
        except KeyError:
            return False
        return True

    def spend_budget(self) -> None:
        """This second's conntrack budget for TCP packets other than SYNs is used up (flow.h; its
        window starts now on CLOCK_MONOTONIC, which the coarse clock it is compared with trails)."""
        self.percpu(abi.MAP_CT_BUDGET, 0, window_ns=time.monotonic_ns(), used=1 << 20)

    def set_flags(self, backend: str, flags: int) -> None:
        t, bid = self.t[abi.MAP_BACKENDS], self.bid(backend)
        v = type(self._backends[bid]).from_buffer_copy(self._backends[bid])
        v.flags = flags
        t[t.Key(bid)] = v

    def port_picking(
        self, service: str, backend: str, *, vip: IPv4Address, dport: int = 80, client: IPv4Address = CLIENT
    ) -> int:
        """A client port whose TCP flow's first Maglev pick (flow.h, select.h) is backend."""
        t = self.t[abi.MAP_VIPS]
        k = t.Key()
        k.addr, k.port, k.proto = be32(vip), be16(dport), 6
        table = self.maps.read_table(self.vid(service), t[k].table)
        want = self.bid(backend)
        return next(
            p
            for p in range(CLIENT_PORT, CLIENT_PORT + 1000)
            if table[hash_flow(client, vip, p, dport, 6) % PARAMS.maglev_m] == want
        )

    # ------------------------------------------------------------ running

    def counters(self) -> dict[tuple[str, str], int]:
        """Every verdict and drop counter of edge_svc_counts, summed over CPUs, as
        (service, name) -> n: service "" for the slot of packets no service is known for, names
        abi.py's as the readers show them (drops as drop:NAME; records.slot_counts)."""
        values = self.maps.counter_values()
        slots = {vid: name for name, (vid, _) in self.ids.items()} | {PARAMS.max_services: ""}
        out = {}
        for slot, service in slots.items():
            counts = slot_counts(values, slot)
            out |= {(service, k): n for k, n in counts["verdicts"].items() if k != "return_nat"}
            out[(service, "return_nat")] = counts["verdicts"]["return_nat"] - counts["verdicts"]["return_xdp"]
            out |= {(service, f"drop:{k}"): n for k, n in counts["drops"].items()}
        return out

    def run(self, prog: str, frame: bytes) -> tuple[int, bytes, dict[str, int], dict[str, dict[str, int]]]:
        """(verdict, frame out, counters that changed and by how much, the same by service) of
        one test run; counters are the data path's own (return_nat: tc's alone)."""
        before = self.counters()
        ctx = _sk_buff(BACKEND_IF, LO) if prog == abi.PROG_RETURN else _xdp_md(len(frame), LO)
        if prog not in self.fds:  # a tail program run on its own (edge_tails holds the same one)
            self.fds[prog] = self.loaded.load(prog, "xdp").fd
        done = loader.prog_test_run(self.fds[prog], frame, ctx=ctx)
        after = self.counters()
        moved: dict[str, dict[str, int]] = {}
        for (service, name), n in after.items():
            if n != before[(service, name)]:
                moved.setdefault(service, {})[name] = n - before[(service, name)]
        node: dict[str, int] = {}
        for counts in moved.values():
            for name, n in counts.items():
                node[name] = node.get(name, 0) + n
        return done.retval, done.data_out, node, moved


def _c(current, value):
    """value in the shape of a ctypes field: bytes into a byte array, else as is."""
    if isinstance(value, bytes):
        arr = type(current)()
        for i, b in enumerate(value):
            arr[i] = b
        return arr
    return value


def _xdp_md(length: int, ingress_ifindex: int) -> bytes:
    """struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex."""
    return struct.pack("=6I", 0, length, 0, ingress_ifindex, 0, 0)


def _sk_buff(ingress_ifindex: int, ifindex: int) -> bytes:
    """struct __sk_buff up to ifindex: arriving on ingress_ifindex, through device ifindex."""
    return struct.pack("=11I", *([0] * 9), ingress_ifindex, ifindex)


SetUp = Callable[[World], None]
