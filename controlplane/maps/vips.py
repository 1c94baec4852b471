"""The VIP entries of the apply transaction: edge_vips/edge_vips6 (the flip: one hash update
per service), the VIP key each service's edge_svc_cfg names (set only once the VIP entry is the
service's, cleared before it goes or changes owner), edge_vip_addrs (how many VIPs an address
carries) and edge_vip_filter (its bits set before a VIP comes, cleared after it goes). The order
of those writes is writer.py's; the IPv6 address counts are family6.py's. Part of the maps
package; mixed into Writer."""

from __future__ import annotations

from controlplane import abi
from controlplane.config import Config, Service
from controlplane.maps.family6 import named_vip, set_vip, vip_of
from controlplane.maps.records import be32, vip_filter_words


class Vips:
    """The VIP entries and the service configs' names of them (mixed into Writer)."""

    def _write_vip(self, s: Service, vid: int, half: int, old) -> None:
        k = self._vip_key(s)
        t = self._vip_table(k)
        v = t.Leaf()
        v.id, v.table = vid, half
        v.flags = abi.VIP_F_KEEP_FLOWS if s.existing_flows == "keep" else 0
        try:
            owner = t[k].id
        except KeyError:
            owner = vid
        if owner != vid:  # taken over: the other service's established flows look the VIP up again
            self._forget_service_vip(owner, k)
        t[k] = v  # one hash update: the flip
        self._name_service_vip(vid, k)
        if old and bytes(old[0]) != bytes(k):  # the service moved to a new VIP
            try:
                if self._vip_table(old[0])[old[0]].id == vid:  # not taken over by another service meanwhile
                    self._delete_vip(old[0])
            except KeyError:  # made room for the new one already
                pass

    def _write_vip_addrs(self, cfg: Config) -> None:
        """How many VIPs each address carries (added and changed; apply() drops the rest last)."""
        self._write_vip_addrs6(cfg)
        t = self.t[abi.MAP_VIP_ADDRS]
        want: dict[int, int] = {}
        for s in cfg.services:
            if s.vip.version == 4:
                want[be32(s.vip)] = want.get(be32(s.vip), 0) + 1
        present = {k.value for k in t.keys()}
        self._write_vip_filter(present | set(want))  # apply() narrows it to want last
        if len(present | set(want)) > self._capacity(abi.MAP_VIP_ADDRS):  # full: VIPs moving off an address go first
            vips = self.t[abi.MAP_VIPS]
            for k in list(vips.keys()):
                if k.addr not in want:
                    self._delete_vip(k)
        self._make_room(abi.MAP_VIP_ADDRS, {bytes(t.Key(a)) for a in want})
        for addr, n in want.items():
            self._put_changed(t, t.Key(addr), t.Leaf(n))

    def _write_vip_filter(self, addrs: set[int]) -> None:
        """edge_vip_filter with the bits of these VIP addresses (be32 values): the fast path
        skips the conntrack lookup of traffic to an address whose bit is clear (and looks it up
        after all when the VIP lookup finds one), so every VIP's bit is set before its entry is
        written and cleared only after it is gone, or its flows pay a third lookup."""
        t = self.t[abi.MAP_VIP_FILTER]
        words = vip_filter_words(addrs)
        v = t[t.Key(0)]
        if list(v.bits) != words:
            for i, w in enumerate(words):
                v.bits[i] = w
            t[t.Key(0)] = v

    def _name_service_vip(self, vid: int, key) -> None:
        """Names VIP key `key` in service vid's config once that VIP entry is vid's: a conntrack
        hit to it is then forwarded without the edge_vips lookup (edge_xdp.c, established; an IPv6
        VIP's address goes in vip_addr6: ingress6.h, established6)."""
        t = self.t[abi.MAP_SVC_CFG]
        v = t[t.Key(vid)]
        if named_vip(v) == vip_of(key):
            return
        set_vip(v, key)
        t[t.Key(vid)] = v

    def _delete_vip(self, key) -> None:
        """Deletes VIP entry `key`, after the config of the service it names stops naming it."""
        t = self._vip_table(key)
        self._forget_service_vip(t[key].id, key)
        del t[key]

    def _forget_service_vip(self, vid: int, key) -> None:
        """Clears VIP key `key` from service vid's config (if it names it) before that VIP
        entry goes: conntrack hits to that address then take the edge_vips lookup again,
        which finds it gone."""
        t = self.t[abi.MAP_SVC_CFG]
        if vid >= self.max_services:
            return
        v = t[t.Key(vid)]
        if named_vip(v) != vip_of(key):
            return
        set_vip(v, None)
        t[t.Key(vid)] = v
