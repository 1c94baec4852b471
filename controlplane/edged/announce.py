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
from ipaddress import IPv4Address, IPv6Address
from typing import Callable, Iterable, Protocol

from controlplane.errors import SpeakerError
from controlplane.tasks import within

Vip = IPv4Address | IPv6Address
POLL_S = 0.05  # how often the node's state is looked at; changes by edged poke() at once
RESTART_EVERY_S = 1.0  # a speaker that died is started again at most this often


@dataclass(frozen=True)
class ServiceState:
    """One service as the announcement sees it."""

    name: str
    vip: Vip
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
    announce: frozenset[Vip]
    withdrawn: dict[Vip, str] = field(default_factory=dict)  # VIP -> why it is not announced


def decide(state: NodeState) -> Decision:
    """A VIP is announced while the data path is attached, edged serves, the node is not drained
    and at least one service on that VIP has a usable backend; else it is withdrawn, with why."""
    vips: dict[Vip, int] = {}
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


def in_order(vips: Iterable[Vip]) -> list[Vip]:
    """vips sorted, IPv4 before IPv6 (addresses of two families do not compare)."""
    return sorted(vips, key=lambda v: (v.version, v))


def describe_change(old: frozenset[Vip], d: Decision) -> str:
    """One line for the event log: what was announced and withdrawn, and why."""
    parts = []
    added = in_order(d.announce - old)
    if added:
        parts.append("announced " + ", ".join(map(str, added)))
    gone = in_order(old - d.announce)
    if gone:
        parts.append("withdrew " + ", ".join(f"{v} ({d.withdrawn.get(v, 'no longer configured')})" for v in gone))
    return "; ".join(parts) or "no change"


class Speaker(Protocol):
    pid: int | None

    async def announce(self, vips: Iterable[Vip]) -> None: ...

    def exited(self) -> int | None:
        """The exit status of a speaker process that ended by itself; None while it runs."""

    async def restart(self) -> None:
        """Starts the speaker again, announcing nothing; raises SpeakerError."""

    async def withdraw_safely(self) -> str:
        """Withdraws everything without the config file (it may be what failed): says how."""


class Announcer:
    """Applies decide(state()) to a speaker whenever the decision changes.

    state: called on the loop, returns the node's NodeState now.
    emit(kind, text, **fields): edged's event log.
    """

    def __init__(
        self, speaker: Speaker, state: Callable[[], NodeState], emit: Callable[..., object], poll_s: float = POLL_S
    ):
        self.speaker = speaker
        self.state = state
        self.emit = emit
        self.poll_s = poll_s
        self.announced: frozenset[Vip] = frozenset()
        self.last: Decision | None = None  # the latest decision; None before the first
        self.problem = ""  # why the speaker is not announcing the decision ('' while it is)
        self.restarts = 0  # times a dead speaker was started again
        self._restarted_at = float("-inf")
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    def poke(self) -> None:
        """Decide again now rather than at the next poll."""
        self._wake.set()

    def view(self) -> dict | None:
        """For status: what the speaker announces, and why every other VIP is withdrawn (the
        decision's reason, or the speaker's failure where the decision would announce)."""
        if self.last is None:
            return None
        withdrawn = {str(k): v for k, v in self.last.withdrawn.items()}
        for vip in self.last.announce - self.announced:
            withdrawn[str(vip)] = f"BGP speaker failed: {self.problem or 'not told yet'}"
        out = {"announced": sorted(map(str, self.announced)), "withdrawn": withdrawn}
        if self.problem:
            out["speaker_problem"] = self.problem
        return out

    async def sync(self, state: NodeState | None = None) -> Decision:
        """Decides once and tells the speaker if the decision changed (or the speaker failed
        before); returns the decision. Any error telling it is a speaker failure: everything is
        withdrawn without the config file (withdraw_safely) and SpeakerError raised."""
        async with self._lock:
            d = decide(state if state is not None else self.state())
            self.last = d
            if d.announce != self.announced or self.problem:
                try:
                    await self.speaker.announce(d.announce)
                except Exception as e:  # a full /run (OSError) as much as birdc's refusal
                    await self._failed(e)
                    raise SpeakerError(self.problem) from e
                text = describe_change(self.announced, d)
                self.announced = d.announce
                if self.problem:
                    self.emit("bgp-speaker", f"bgp: the speaker works again (was: {self.problem})", ok=True)
                    self.problem = ""
                self.emit(
                    "bgp",
                    f"bgp: {text}",
                    announced=sorted(map(str, d.announce)),
                    withdrawn={str(k): v for k, v in d.withdrawn.items()},
                )
            return d

    async def _failed(self, e: BaseException) -> None:
        """The speaker failed (e): withdraw everything it may still announce, by a way that needs
        no config file; one bgp-speaker event per distinct failure."""
        why = " ".join(str(e).split())[:200] or type(e).__name__
        if isinstance(e, OSError) and not isinstance(e, SpeakerError):
            why = f"node.bgp.config_file: {e.strerror or why}"
        try:
            how = await self.speaker.withdraw_safely()
        except Exception as w:  # noqa: BLE001 - nothing more can be done from here
            how = f"and withdrawing failed too: {w}"
        was, self.announced = self.announced, frozenset()
        if why != self.problem:
            self.emit(
                "bgp-speaker",
                f"bgp: the speaker failed: {why}; withdrew "
                f"{', '.join(map(str, in_order(was))) or 'nothing announced'} ({how})",
                ok=False,
                error=why,
                withdrawn=sorted(map(str, was)),
            )
        self.problem = why

    async def keep_speaker(self, now: float) -> None:
        """A speaker process that died (killed, crashed) announces nothing: says so, and starts
        it again (at most every RESTART_EVERY_S); sync() then announces what is decided."""
        status = self.speaker.exited()
        if status is None or now - self._restarted_at < RESTART_EVERY_S:
            return
        self._restarted_at = now
        was, self.announced = self.announced, frozenset()
        why = f"bird (pid {self.speaker.pid}) exited with status {status}"
        if why != self.problem:
            self.emit(
                "bgp-speaker",
                f"bgp: {why}; the upstream withdraws {', '.join(map(str, in_order(was))) or 'nothing'}; restarting it",
                ok=False,
                error=why,
                withdrawn=sorted(map(str, was)),
            )
        self.problem = why
        await self.speaker.restart()
        self.restarts += 1
        self.emit(
            "bgp-speaker",
            f"bgp: bird restarted (pid {self.speaker.pid}, restart {self.restarts})",
            ok=True,
            pid=self.speaker.pid,
            restarts=self.restarts,
        )

    async def run(self) -> None:
        """keep_speaker() and sync() every poll_s or when poked, until cancelled. Any error is
        reported (once per distinct error) and the next poll tries again: this task never ends
        on a fault, so a VIP is never left announced by a loop that stopped looking."""
        failing = ""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                await self.keep_speaker(loop.time())
                await self.sync()
                failing = ""
            except Exception as e:  # noqa: BLE001 - see the docstring
                if str(e) != failing:
                    failing = str(e)
                    self.emit("error", f"bgp: {e}")
            try:
                await within(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def withdraw_all(self, why: str) -> None:
        """Withdraws every VIP (edged is stopping) whatever the state says."""
        async with self._lock:
            if self.announced:
                try:
                    await self.speaker.announce(())
                except Exception as e:  # noqa: BLE001 - withdrawn all the same, another way
                    await self._failed(e)
                    raise SpeakerError(self.problem) from e
                self.emit(
                    "bgp",
                    f"bgp: withdrew {', '.join(map(str, in_order(self.announced)))} ({why})",
                    announced=[],
                    withdrawn={str(v): why for v in self.announced},
                )
                self.announced = frozenset()
