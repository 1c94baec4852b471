"""The IPv6 side of the apply transaction (bpf/include/abi.h, struct addr6): which map of the two
families an endpoint's reverse NAT, a heartbeat registration and a VIP address's count go to, and
edge_vip_addrs6. Part of the
maps package; mixed into Writer."""

from __future__ import annotations

import struct

from controlplane import abi
from controlplane.config import Config
from controlplane.maps.records import PROTOS, be16, be32, is6, put_addr


class Family6:
    """Family-dependent keys and the IPv6 VIP address counts (mixed into Writer)."""

    def _rnat_key_of(self, address, port: int, protocol: str):
        """The reverse-NAT key of an endpoint, in edge_rnat or edge_rnat6 by its family."""
        k = self.t[abi.MAP_RNAT if address.version == 4 else abi.MAP_RNAT6].Key()
        put_addr(k, "addr", address)
        k.port, k.proto = be16(port), PROTOS[protocol]
        return k

    def _hb_key_of(self, address, port: int, hb_port: int):
        """(map name, key) of a backend's heartbeat registration: edge_hb or edge_hb6 by its family."""
        name = abi.MAP_HB if address.version == 4 else abi.MAP_HB6
        k = self.t[name].Key()
        put_addr(k, "addr", address)
        k.port, k.hb_port = be16(port), be16(hb_port)
        return name, k

    def _rnat_table(self, key):
        return self.t[abi.MAP_RNAT6 if is6(key) else abi.MAP_RNAT]

    def _write_vip_addrs6(self, cfg: Config) -> None:
        """edge_vip_addrs6: _write_vip_addrs for IPv6 VIPs (no filter: the IPv6 ingress has no shortcut)."""
        t = self.t[abi.MAP_VIP_ADDRS6]
        want: dict[bytes, tuple] = {}
        for s in cfg.services:
            if s.vip.version == 6:
                k = self._vip_addr_key(s.vip)
                want[bytes(k)] = (k, want.get(bytes(k), (k, 0))[1] + 1)
        if len({bytes(k) for k in t.keys()} | set(want)) > self._capacity(abi.MAP_VIP_ADDRS6):
            vips = self.t[abi.MAP_VIPS6]
            for k in list(vips.keys()):
                if bytes(k.addr) not in want:
                    self._delete_vip(k)
        self._make_room(abi.MAP_VIP_ADDRS6, set(want))
        for k, n in want.values():
            self._put_changed(t, k, t.Leaf(n))

    def _vip_addr_key(self, address):
        """The edge_vip_addrs or edge_vip_addrs6 key of a VIP address."""
        if address.version == 4:
            return self.t[abi.MAP_VIP_ADDRS].Key(be32(address))
        k = self.t[abi.MAP_VIP_ADDRS6].Key()
        self._put_addr6(k, address)
        return k

    @staticmethod
    def _put_addr6(a, address) -> None:
        """Fills a struct addr6 (abi.h) with an IPv6 address."""
        for i, w in enumerate(struct.unpack("=4I", address.packed)):
            a.w[i] = w


def named_vip(v) -> tuple:
    """The VIP key a service_cfg names: (IPv4 address, IPv6 address words, port, protocol)."""
    return (v.vip_addr, tuple(v.vip_addr6.w), v.vip_port, v.vip_proto)


def vip_of(key) -> tuple:
    """A VIP key (edge_vips or edge_vips6) as named_vip gives it."""
    if is6(key):
        return (0, tuple(key.addr.w), key.port, key.proto)
    return (key.addr, (0, 0, 0, 0), key.port, key.proto)


def set_vip(v, key) -> None:
    """Names VIP key `key` in service_cfg v (None: none)."""
    addr, words, v.vip_port, v.vip_proto = vip_of(key) if key is not None else (0, (0, 0, 0, 0), 0, 0)
    v.vip_addr = addr
    for i, w in enumerate(words):
        v.vip_addr6.w[i] = w
