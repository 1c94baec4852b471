"""The open-connection counts new_flows two_choices and least_loaded choose by (edge_inflight)
held to conntrack: pure logic, no maps. The data path counts a TCP connection from its SYN to its
first FIN or RST, so a conntrack entry the LRU evicts while open is never counted closed, and its
backend's count stays one too high for good. edged (controlplane/edged/openfix.py) counts the
open entries in conntrack now and then (maps/opencounts.py) and hands both figures to Reconciler,
which says what the data path should subtract (the count's fix). One census races the traffic
(a connection opened or closed while conntrack is walked is in one figure and not the other),
so a fix moves only by what two censuses in a row agree on: the smaller residual of two of one
sign. A leak persists from one census to the next; a race's residual does not."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reconciler:
    """Per backend id: the residual of the last census, waiting for a second of its sign."""

    pending: dict[int, int] = field(default_factory=dict)

    def step(self, counts: dict[int, tuple[int, int]], walked: dict[int, int]) -> dict[int, int]:
        """counts: backend id -> (the data path's count, its fix now); walked: backend id -> open
        entries in conntrack (absent: none). Returns the fixes to write (backend id -> new fix)."""
        out: dict[int, int] = {}
        for bid, (count, fix) in counts.items():
            residual = count - fix - walked.get(bid, 0)
            last = self.pending.pop(bid, 0)
            if residual and last and (residual > 0) == (last > 0):
                out[bid] = fix + (min(residual, last) if residual > 0 else max(residual, last))
            elif residual:
                self.pending[bid] = residual
        return out
