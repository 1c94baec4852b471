"""The short ways of maps.apply, for changes that keep every service, VIP and name (changed.py
decides which applies): a weights-only change writes the changed services' backends, lists and
tables; a change of members (backends added or removed in services without heartbeats) adds the
new backends' reverse NAT and records, flips the changed services, then clears what went. Both
run inside apply()'s journaled transaction and keep _write's order (writer.py): nothing a table
names is missing, nothing goes before the tables stop naming it. Part of the maps package."""

from __future__ import annotations

from controlplane import desired
from controlplane.config import Config, Service
from controlplane.maps.records import be16, put_addr


class Quick:
    """The weights-only and members-only writes (mixed into Writer)."""

    def _write_changed(self, services: list[Service], p: desired.Plan) -> None:
        """The weights-only apply: for each service, its backends' records and configured
        weights, then its list and table in the inactive half and the flip (step 4 of _write)."""
        for s in services:
            vid = p.svc_ids[s.name]
            for b in s.backends:
                self._write_backend(p.be_ids[(s.name, b.name)], vid, b, p.health_ids[(b.address, b.port)])
            self._write_config_weights((s,), p)
            self._flip_in_place(s, vid, p)

    def _flip_in_place(self, s: Service, vid: int, p: desired.Plan) -> None:
        k = self._vip_key(s)
        self._flip(s, vid, p, {vid: (k, self._vip_table(k)[k])})

    def _rnat_key(self, s: Service, b):
        return self._rnat_key_of(b.address, b.port, s.protocol)

    def _claimed_by_another(self, pairs: list[tuple[Service, Service]], p: desired.Plan) -> bool:
        """Whether an endpoint of a changed service replies for another backend id now (the full
        apply orders that hand-over)."""
        for _, s in pairs:
            for b in s.backends:
                k = self._rnat_key(s, b)
                try:
                    owner = self._rnat_table(k)[k].backend_id
                except KeyError:
                    continue
                if owner != p.be_ids[(s.name, b.name)]:
                    return True
        return False

    def _write_members(self, cfg: Config, pairs: list[tuple[Service, Service]], p: desired.Plan) -> bool:
        """The members-only apply (changed.member_plan); False, having written nothing, when an
        endpoint changes owner: then the full apply."""
        if self._claimed_by_another(pairs, p):
            return False
        self._clean_new_ids(p)
        new = set(p.new_backends)
        for _, s in pairs:  # reverse NAT of the new endpoints, before any table names them
            for b in s.backends:
                if (s.name, b.name) in new:
                    k = self._rnat_key(s, b)
                    rnat = self._rnat_table(k)
                    v = rnat.Leaf()
                    put_addr(v, "vip_addr", s.vip)
                    v.vip_port = be16(s.port)
                    v.backend_id, v.vip_id = p.be_ids[(s.name, b.name)], p.svc_ids[s.name]
                    rnat[k] = v
        if new:
            self.rnat_changed()
        self._write_changed([s for _, s in pairs], p)
        for bid in p.removed_backends.values():  # what went, now that no table names it
            self._clear_backend(bid)
        self._drop_lost_endpoints(pairs)
        return True

    def _drop_lost_endpoints(self, pairs: list[tuple[Service, Service]]) -> None:
        """edge_rnat entries of endpoints the changed services lost: no other service has them, as an
        endpoint and protocol are in one service only (config.py checks it, desired.with_leaving keeps it)."""
        lost = {(a.name, b.name): (a, b) for a, _ in pairs for b in a.backends}
        for _, s in pairs:
            for b in s.backends:
                lost.pop((s.name, b.name), None)
        if not lost:
            return
        kept = {(b.address, b.port) for _, s in pairs for b in s.backends}
        dropped = False
        for s, b in lost.values():
            if (b.address, b.port) in kept:  # renamed in the same service
                continue
            k = self._rnat_key(s, b)
            rnat = self._rnat_table(k)
            try:
                rnat[k]
            except KeyError:
                continue
            del rnat[k]
            dropped = True
        if dropped:
            self.rnat_changed()
