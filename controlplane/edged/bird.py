"""BIRD 2 as edged's BGP speaker: its config text (pure), and the one bird process edged runs.

render() turns node.bgp and the VIPs to announce into a whole bird.conf: one eBGP session per
peer (hold timer, BFD), a static protocol per family holding a blackhole /32 per IPv4 VIP and a
/128 per IPv6 VIP, and an export filter that lets only those out. A session carries the channel
of its peer's family: IPv4 VIPs go to IPv4 peers, IPv6 VIPs to IPv6 peers (their next hop is then
the session's own address, on the shared link). Nothing is imported, nothing goes into the
kernel's tables.

Bird runs as edged's child (`bird -f`) and dies with it (PR_SET_PDEATHSIG): a dead edged is a
dead speaker, and the upstream's BFD or hold timer withdraws the node. Every change rewrites the
file and runs `birdc configure`; BIRD keeps its sessions up across that and sends only the
difference. When to announce is announce.py's business, not this file's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from ipaddress import IPv4Address, IPv6Address
from typing import Iterable, Sequence

from controlplane.config import Bgp
from controlplane.errors import ConfigError, SpeakerError
from controlplane.tasks import within

STATIC = "edge_vips"  # the static protocol holding the announced /32s
STATIC6 = "edge_vips_v6"  # the one holding the announced IPv6 /128s
STATICS = f'"{STATIC}*"'  # birdc's pattern naming both
START_TIMEOUT_S = 10.0
BIRDC_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1
_LOG = "log stderr { info, remote, warning, error, auth, fatal, bug };"


def render(bgp: Bgp, vips: Iterable[IPv4Address | IPv6Address], header: str = "node.bgp") -> str:
    """The complete bird.conf announcing exactly vips (sorted, so equal inputs give equal text)."""
    out = [f"# Written by edged from {header}; rewritten on every change, edits are lost.", _LOG]
    if bgp.router_id is not None:
        out.append(f"router id {bgp.router_id};")
    out.append("protocol device { scan time 10; }")
    if bgp.bfd:
        out.append(bfd_protocol(bgp.bfd_interval_ms, bgp.bfd_multiplier))
    vips = set(vips)
    for name, channel, length in ((STATIC, "ipv4", 32), (STATIC6, "ipv6", 128)):
        out.append(f"protocol static {name} {{")
        out.append(f"\t{channel};")
        out += [f"\troute {vip}/{length} blackhole;" for vip in sorted(v for v in vips if v.max_prefixlen == length)]
        out.append("}")
    for i, peer in enumerate(bgp.peers):
        six = peer.address.version == 6
        out.append(
            bgp_protocol(
                f"edge_peer{i}",
                bgp.local_as,
                peer.address,
                peer.remote_as,
                bgp.hold_time_s,
                bgp.bfd,
                import_="none",
                export=f'where proto = "{STATIC6 if six else STATIC}"',
                channel="ipv6" if six else "ipv4",
            )
        )
    return "\n".join(out) + "\n"


def bfd_protocol(interval_ms: int, multiplier: int) -> str:
    return (
        f'protocol bfd edge_bfd {{\n\tinterface "*" {{\n\t\tmin rx interval {interval_ms} ms;\n'
        f"\t\tmin tx interval {interval_ms} ms;\n\t\tmultiplier {multiplier};\n\t}};\n}}"
    )


def bgp_protocol(
    name: str,
    local_as: int,
    neighbor: IPv4Address | IPv6Address,
    remote_as: int,
    hold_time_s: int,
    bfd: bool,
    import_: str,
    export: str,
    channel: str = "ipv4",
) -> str:
    """One directly connected eBGP session with one channel (ipv4 or ipv6); retries every second
    after a failure."""
    lines = [
        f"protocol bgp {name} {{",
        f"\tlocal as {local_as};",
        f"\tneighbor {neighbor} as {remote_as};",
        f"\thold time {hold_time_s};",
        f"\tkeepalive time {max(1, hold_time_s // 3)};",
        "\tconnect delay time 1;",
        "\tconnect retry time 1;",
        "\terror wait time 1, 5;",
    ]
    if bfd:
        lines.append("\tbfd on;")
    lines += [f"\t{channel} {{ import {import_}; export {export}; }};", "}"]
    return "\n".join(lines)


def write_atomically(path: str, text: str) -> None:
    """Replaces path's contents in one rename, so bird never reads half a file."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full file system: no half-written temporary left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


async def birdc(socket_path: str, *command: str, timeout_s: float = BIRDC_TIMEOUT_S) -> list[str]:
    """Runs `birdc -s socket_path -v COMMAND`; its reply lines (with BIRD's numeric codes).
    Raises SpeakerError on a failure code (8xxx, 9xxx) or an unreachable socket."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "birdc",
            "-s",
            socket_path,
            "-v",
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except FileNotFoundError:
        raise SpeakerError("node.bgp.speaker: birdc not found (install bird2: tools/bootstrap)") from None
    try:
        out, _ = await within(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise SpeakerError(f"node.bgp.control_socket: birdc {' '.join(command)} took over {timeout_s}s") from None
    lines = out.decode(errors="replace").splitlines()
    failed = [ln for ln in lines if ln[:1] in ("8", "9") and ln[:4].isdigit()]
    if proc.returncode != 0 or failed:
        text = (failed or lines or [f"exit status {proc.returncode}"])[-1]
        raise SpeakerError(f"node.bgp.control_socket: birdc {' '.join(command)}: {text}")
    return lines


class Bird:
    """One bird process edged starts, reconfigures and stops; announce() is the Speaker API."""

    def __init__(self, bgp: Bgp, argv0: Sequence[str] = ("bird",)):
        self.bgp = bgp
        self.argv0 = list(argv0)
        self.proc: asyncio.subprocess.Process | None = None
        self.announced: frozenset[IPv4Address | IPv6Address] = frozenset()
        self._disabled = False  # withdraw_safely() disabled the VIPs' protocol

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        """Writes a config announcing nothing, starts bird and waits until birdc answers."""
        sock = self.bgp.control_socket
        if os.path.exists(sock):
            try:
                await birdc(sock, "show", "status", timeout_s=1.0)
            except SpeakerError:
                pass  # a stale socket: bird replaces it
            else:
                raise SpeakerError(f"node.bgp.control_socket: {sock} answers already (another bird?)")
        write_atomically(self.bgp.config_file, render(self.bgp, ()))
        os.makedirs(os.path.dirname(sock), mode=0o755, exist_ok=True)
        argv = [*self.argv0, "-f", "-c", self.bgp.config_file, "-s", sock]
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, preexec_fn=_die_with_parent
            )
        except FileNotFoundError:
            raise SpeakerError(f"node.bgp.speaker: {argv[0]} not found (install bird2: tools/bootstrap)") from None
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.returncode is not None:
                raise SpeakerError(
                    f"node.bgp: bird exited with status {self.proc.returncode} on start (config {self.bgp.config_file})"
                )
            try:
                await birdc(sock, "show", "status", timeout_s=1.0)
                return
            except SpeakerError:
                if time.monotonic() > deadline:
                    await self.stop()
                    raise SpeakerError(
                        f"node.bgp.control_socket: bird did not answer on {sock} within {START_TIMEOUT_S}s"
                    ) from None
            await asyncio.sleep(0.05)  # polling the socket bird is about to create

    async def announce(self, vips: Iterable[IPv4Address | IPv6Address]) -> None:
        """Makes bird announce exactly vips; raises SpeakerError or OSError (the old config stays
        in force). Enables the VIPs' protocol again after withdraw_safely() disabled it."""
        vips = frozenset(vips)
        write_atomically(self.bgp.config_file, render(self.bgp, vips))
        await birdc(self.bgp.control_socket, "configure")
        if self._disabled:
            await birdc(self.bgp.control_socket, "enable", STATICS)
            self._disabled = False
        self.announced = vips

    def exited(self) -> int | None:
        """bird's exit status when it ended without stop() (killed, crashed); None while it runs."""
        return self.proc.returncode if self.proc is not None else None

    async def restart(self) -> None:
        """Starts bird again after it died, announcing nothing (the dead one stays self.proc
        until a new one runs, so a failed restart is tried again)."""
        self.announced, self._disabled = frozenset(), False
        await self.start()

    async def withdraw_safely(self) -> str:
        """Withdraws every VIP without writing the config (a full /run may be why announce
        failed): `birdc disable` of the VIPs' static protocol; if bird does not answer, bird is
        stopped (its sessions close, or the peers' BFD and hold timers end them). Says how."""
        self.announced = frozenset()
        try:
            await birdc(self.bgp.control_socket, "disable", STATICS, timeout_s=2.0)
            self._disabled = True
            return f"birdc disable {STATICS}"
        except SpeakerError as e:
            proc = self.proc  # kept: exited() then says it ended, and the Announcer restarts it
            if proc is None or proc.returncode is not None:
                return f"bird is not running: {e}"
            proc.terminate()
            try:
                await within(proc.wait(), 1.0)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
            return f"bird (pid {proc.pid}) stopped: {e}"

    @staticmethod
    def check_change(old: Bgp | None, new: Bgp | None) -> None:
        """ConfigError unless a reload may go from old to new with the running bird (peers,
        AS numbers, timers and BFD may change; starting, stopping or moving bird may not)."""
        if (old is None) != (new is None):
            raise ConfigError(
                f"node.bgp: {'added' if new else 'removed'}; a reload cannot "
                f"{'start' if new else 'stop'} the BGP speaker (restart edged)"
            )
        for key in ("speaker", "config_file", "control_socket"):
            if old is not None and getattr(old, key) != getattr(new, key):
                raise ConfigError(
                    f"node.bgp.{key}: changed from {getattr(old, key)} to {getattr(new, key)}; "
                    f"a reload cannot move the running speaker (restart edged)"
                )

    async def reconfigure(self, bgp: Bgp) -> None:
        """New peers, timers or BFD for the running bird; announces what it announced."""
        self.bgp = bgp
        await self.announce(self.announced)

    async def stop(self, timeout_s: float = 3.0) -> None:
        """`birdc down` (a Cease to every peer: they drop our routes at once), then the process
        by its pid if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        try:
            await birdc(self.bgp.control_socket, "down", timeout_s=timeout_s)
        except SpeakerError:
            pass  # it is stopped by signal below
        try:
            await within(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            proc.terminate()
            try:
                await within(proc.wait(), timeout_s)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
