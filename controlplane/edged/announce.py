"""Which VIPs this node announces over BGP, and the loop that keeps the speaker in line.

decide() is pure: a NodeState (what edged knows of the node) in, the VIPs to
announce and why each other one is withdrawn out. It is the whole policy, so a
fleet (or a test) can compute it from any node's state. Announcer runs it on
edged's loop and hands changes to a speaker (edged/bird.py); it holds no
policy and knows nothing of BGP.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Callable, Iterable, Protocol

from controlplane.errors import EdgeError

POLL_S = 0.05  # how often the node's state is looked at; changes by edged poke() at once


@dataclass(frozen=True)
class ServiceState:
    """One service as the announcement sees it."""

    name: str
    vip: IPv4Address
    usable_backends: int  # backends that would get a new flow now (up, not drained, not down by probes)


@dataclass(frozen=True)
class NodeState:
    """What decides the announcements: plain data, no handles."""

    attached: bool  # the XDP data path is deployed and attached
    serving: bool  # edged is running and says SERVING (False while starting or stopping)
    drained: bool  # `edgectl drain-node` is in force
    services: tuple[ServiceState, ...] = ()
    problem: str = ""  # why the data path is not whole (edged says NOT_SERVING), '' while it is


@dataclass(frozen=True)
class Decision:
    announce: frozenset[IPv4Address]
    withdrawn: dict[IPv4Address, str] = field(default_factory=dict)  # VIP -> why it is not announced


def decide(state: NodeState) -> Decision:
    """A VIP is announced while the data path is attached, edged serves, the node is not drained
    and at least one service on that VIP has a usable backend; else it is withdrawn, with why."""
    vips: dict[IPv4Address, int] = {}
    for s in state.services:
        vips[s.vip] = vips.get(s.vip, 0) + max(0, s.usable_backends)
    if not state.attached:
        node_reason = "data path not attached"
    elif state.problem:
        node_reason = f"not serving: {state.problem}"
    elif not state.serving:
        node_reason = "edged not serving"
    elif state.drained:
        node_reason = "node drained"
    else:
        node_reason = ""
    announce, withdrawn = set(), {}
    for vip, usable in vips.items():
        if node_reason:
            withdrawn[vip] = node_reason
        elif usable == 0:
            withdrawn[vip] = "no usable backend"
        else:
            announce.add(vip)
    return Decision(frozenset(announce), withdrawn)


def describe_change(old: frozenset[IPv4Address], d: Decision) -> str:
    """One line for the event log: what was announced and withdrawn, and why."""
    parts = []
    added = sorted(d.announce - old)
    if added:
        parts.append("announced " + ", ".join(map(str, added)))
    gone = sorted(old - d.announce)
    if gone:
        parts.append("withdrew " + ", ".join(f"{v} ({d.withdrawn.get(v, 'no longer configured')})" for v in gone))
    return "; ".join(parts) or "no change"


class Speaker(Protocol):
    async def announce(self, vips: Iterable[IPv4Address]) -> None: ...


class Announcer:
    """Applies decide(state()) to a speaker whenever the decision changes.

    state: called on the loop, returns the node's NodeState now.
    emit(kind, text, **fields): edged's event log.
    """

    def __init__(self, speaker: Speaker, state: Callable[[], NodeState],
                 emit: Callable[..., object], poll_s: float = POLL_S):
        self.speaker = speaker
        self.state = state
        self.emit = emit
        self.poll_s = poll_s
        self.announced: frozenset[IPv4Address] = frozenset()
        self.last: Decision | None = None  # the latest decision; None before the first
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    def poke(self) -> None:
        """Decide again now rather than at the next poll."""
        self._wake.set()

    async def sync(self, state: NodeState | None = None) -> Decision:
        """Decides once and tells the speaker if the decision changed; returns the decision."""
        async with self._lock:
            d = decide(state if state is not None else self.state())
            self.last = d
            if d.announce != self.announced:
                await self.speaker.announce(d.announce)
                text = describe_change(self.announced, d)
                self.announced = d.announce
                self.emit("bgp", f"bgp: {text}", announced=sorted(map(str, d.announce)),
                          withdrawn={str(k): v for k, v in d.withdrawn.items()})
            return d

    async def run(self) -> None:
        """sync() every poll_s or when poked, until cancelled. A speaker that fails is reported
        (once per distinct error) and tried again at the next poll."""
        failing = ""
        while True:
            self._wake.clear()
            try:
                await self.sync()
                failing = ""
            except EdgeError as e:
                if str(e) != failing:
                    failing = str(e)
                    self.emit("error", f"bgp: {e}")
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def withdraw_all(self, why: str) -> None:
        """Withdraws every VIP (edged is stopping) whatever the state says."""
        async with self._lock:
            if self.announced:
                await self.speaker.announce(())
                self.emit("bgp", f"bgp: withdrew {', '.join(map(str, sorted(self.announced)))} ({why})",
                          announced=[], withdrawn={str(v): why for v in self.announced})
                self.announced = frozenset()

