"""What edged's parts share, as one object: State (config, the maps handle, the services it
steers, the operator's marks, what a reload left draining, the locks, the event log, the
optional BGP announcer and fleet member) and Steered (one service as edged drives it).
Built in one place, State.new(); the parts (steering, status, operations, changes) receive
it in their constructor. It holds data and handles, no behaviour beyond failed(), the one
way a loop reports that a step failed. An optional part is None here, never probed for.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from controlplane import deploy, desired, loader, weights, wiresignals
from controlplane.config import Config, Service
from controlplane.edged import announce, metrics, sdnotify
from controlplane.edged.events import Events
from controlplane.errors import EdgeError, MapError
from controlplane.maps import Maps

if TYPE_CHECKING:  # the fleet (aetcd, its etcd client) is imported only with node.fleet
    from controlplane.fleet import member as fleet_member

Key = tuple[str, str]  # (service, backend)


def _set_event() -> asyncio.Event:
    e = asyncio.Event()
    e.set()
    return e


@dataclass
class Steered:
    """One service as edged drives it."""

    service: Service
    trackers: dict[str, weights.Tracker] = field(default_factory=dict)
    pushed: Optional[dict[str, int]] = None  # weights in the active table
    states: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    pushes: int = 0
    passed: set[str] = field(default_factory=set)  # backends whose probe passed since the last step
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # new signals since the last decision
    wire: Optional[wiresignals.Windows] = None  # the data path's wire signals over weights.wire.window_ms
    wire_read_ns: int = 0
    wire_fresh: set[str] = field(default_factory=set)  # backends whose wire signal was fresh at the last step
    wire_applied: bool = False  # the trackers' wire_rtt_s and wire_fresh follow wire_signals
    open_extras: dict[int, int] = field(default_factory=dict)  # least_loaded's scales written (backend id -> extra)

    @property
    def wire_signals(self) -> dict[str, wiresignals.Signal]:
        """Backend name -> its wire signal as of the last read (worked out when first asked)."""
        return self.wire.signals() if self.wire is not None else {}

    @property
    def computed(self) -> bool:
        return self.service.weights.policy != "static"


@dataclass(eq=False)
class State:
    """One edged's shared state. Who changes what once edged runs: changes.py cfg, static_cfg,
    leaving and (with a redeploy) maps, held, reply_ifindex; steer.py services and wire_fresh;
    operations.py drained, overrides, node_drained; daemon.py the rest (not_serving, tasks,
    announcer, fleet), and at start what it deployed and adopted from before a restart."""

    iface: str
    instance: str  # the data path's instance name (loader.instance_name(iface))
    pin_path: Path  # where its maps are pinned
    config_path: Optional[str]  # the file a reload reads; None: only config text from the API
    events: Events
    notify: sdnotify.Notifier
    node_lock: deploy.NodeLock  # held from start to close: no edgectl deploy while edged runs
    write_lock: deploy.NodeLock  # held while the data path changes: no edgectl undeploy midway
    cfg: Config  # what runs: static_cfg plus what discovery found
    static_cfg: Config  # the config file's (or the API's text)
    observer: metrics.Observer = field(default_factory=metrics.Observer)
    maps: Optional[Maps] = None  # None before start() and after close()
    held: Optional[loader.Pinned] = None  # the open data path (deploy with hold=True), None as maps
    reply_ifindex: tuple[int, ...] = ()  # where deploy put the XDP fast path of replies
    services: dict[str, Steered] = field(default_factory=dict)
    drained: set[Key] = field(default_factory=set)  # operator drains (API), kept across restarts
    overrides: dict[Key, int] = field(default_factory=dict)  # operator weights (API)
    leaving: dict[Key, desired.Leaving] = field(default_factory=dict)  # removed by a reload, draining out
    # (service, backend) whose wire signal was fresh at its service's last step (adaptive probing)
    wire_fresh: set[Key] = field(default_factory=set)
    apply_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one change of the maps at a time
    # clear while an apply writes the maps on a worker thread (changes.apply_off_loop): the loop's
    # writers (steps, operator actions, the status record) wait for it; readers (status, metrics) do not
    maps_idle: asyncio.Event = field(default_factory=_set_event)
    tasks: list[asyncio.Task] = field(default_factory=list)  # edged's loops, for healthy() and close()
    walks: set[asyncio.Future] = field(default_factory=set)  # status walks, for close() to wait for
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    not_serving: str = ""  # why the data path is not whole ('' while it is): edged says NOT_SERVING
    node_drained: bool = False  # `edgectl drain-node`: every VIP withdrawn from BGP
    announcer: Optional[announce.Announcer] = None  # with node.bgp: VIPs over BGP
    fleet: Optional[fleet_member.Member] = None  # with node.fleet: the fleet's shared weights

    @classmethod
    def new(cls, cfg: Config, iface: str, events: Events | None = None, config_path: str | None = None) -> State:
        """The state of an edged on iface before start(): nothing deployed, nothing adopted."""
        events = events or Events()
        instance = loader.instance_name(iface)
        return cls(
            iface=iface,
            instance=instance,
            pin_path=loader.instance_dir(cfg.node.pin_dir, instance),
            config_path=config_path,
            events=events,
            notify=sdnotify.Notifier(log=lambda line: events.emit("error", f"sd_notify: {line}")),
            node_lock=deploy.NodeLock(instance, iface),
            write_lock=deploy.NodeLock(instance, iface, "write", deploy.WRITE_WAIT_S),
            cfg=cfg,
            static_cfg=cfg,
        )

    @property
    def applying(self) -> bool:
        """An apply is writing the maps on a worker thread: nothing on the loop may write them."""
        return not self.maps_idle.is_set()

    def failed(self, text: str, e: EdgeError, before: str | None, **fields) -> str:
        """A loop's step failed and the loop goes on: counted every time when a map is to
        blame (edge_map_errors_total), an error event when the text is new to this loop
        (before: the loop's last text). Returns text, the loop's new last text."""
        where = e.map if isinstance(e, MapError) else None
        if where:
            self.observer.map_error(where)
            fields["map"] = where
        if text != before:
            self.events.emit("error", text, **fields)
        return text
