"""Verdict rows of new_flows least_loaded weighed by slots (select.h, open_cost): a new flow
takes the candidate with the fewest open connections times its scale (edge_inflight's third
part, which edged writes from each engine's learned slots), not the fewest connections alone.
The 5-against-2 row tells a scale of 2 (right) from one of 3 (the extra taken as the scale).
Rows of the IPv6 service web6 (two backends, e0 and e1), made by verdicts_v4.py's row()
(test_verdicts.py registers them)."""

from __future__ import annotations

from typing import Callable

from verdicts import PARAMS, XDP_REDIRECT, World
from verdicts6 import E0, E1, dnat6
from verdicts_state6 import W, open_conns, picking, svc_flags6

from controlplane import abi

LEAST = svc_flags6(abi.SVC_F_LEAST_LOADED)
HALF = abi.OPEN_SCALE_ONE  # the extra of an engine with half the largest slots: scale 2 x OPEN_SCALE_ONE


def scales(**by_name: int) -> Callable[[World], None]:
    """edge_inflight's scale slot (2 x max_backends + id) of each named backend: the extra over
    abi.OPEN_SCALE_ONE, as edged writes it (loadweights.open_extras; World.reset zeroes them)."""

    def setup(w: World) -> None:
        t = w.t[abi.MAP_INFLIGHT]
        for name, s in by_name.items():
            t[t.Key(2 * PARAMS.max_backends + w.bid(name))] = t.Leaf(s)

    return setup


def rows(row) -> list:
    ING = abi.PROG_INGRESS
    # fmt: off
    return [
        row("IPv6 SYN, least_loaded, no scales: the fewest open connections (e1's 2 against its pick e0's 3)", ING,
            picking("e0", "S"), XDP_REDIRECT, dnat6(E1), {"redirect": 1}, LEAST, open_conns(e0=3, e1=2), svc=W),
        row("IPv6 SYN, least_loaded, e1 half e0's slots: 2 there weigh 4, its pick e0 with 3 keeps the flow", ING,
            picking("e0", "S"), XDP_REDIRECT, dnat6(E0), {"redirect": 1}, LEAST, open_conns(e0=3, e1=2), scales(e1=HALF),
            svc=W),
        row("IPv6 SYN, least_loaded, e1 half e0's slots: 2 there (weigh 4) against e0's 5, e1 takes it", ING,
            picking("e0", "S"), XDP_REDIRECT, dnat6(E1), {"redirect": 1}, LEAST, open_conns(e0=5, e1=2), scales(e1=HALF),
            svc=W),
        row("IPv6 SYN, least_loaded, e0 half e1's slots: its pick e0 with 2 (weighs 4) against e1's 3 goes", ING,
            picking("e0", "S"), XDP_REDIRECT, dnat6(E1), {"redirect": 1}, LEAST, open_conns(e0=2, e1=3), scales(e0=HALF),
            svc=W),
    ]
    # fmt: on
