"""sd_notify without libsystemd: one datagram per message to the unix socket $NOTIFY_SOCKET names.

Owns the notify protocol (READY=1, STATUS=, WATCHDOG=1, STOPPING=1, RELOADING=1)
and the watchdog ping loop. It decides nothing: edged says when it is ready and
whether it is healthy. Without $NOTIFY_SOCKET (edged not started by systemd)
every call is a no-op, and no call ever raises: a failed send is logged once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from typing import Callable, Mapping, Optional


def _stderr(line: str) -> None:
    print(f"sdnotify: {line}", file=sys.stderr, flush=True)


def _address(value: str) -> Optional[str]:
    """The socket address $NOTIFY_SOCKET names: a path, or '@name' in the abstract namespace."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # systemd also knows vsock:… addresses; edged runs on the host, never in a VM guest


class Notifier:
    """Messages to the service manager; enabled only when $NOTIFY_SOCKET names a socket.

    environ: where NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID are read (os.environ).
    log: called with one line on the first failed send (stderr).
    """

    def __init__(self, environ: Mapping[str, str] | None = None, log: Callable[[str], None] = _stderr):
        env = os.environ if environ is None else environ
        self._log = log
        self._logged = False
        self._sock: Optional[socket.socket] = None
        raw = env.get("NOTIFY_SOCKET", "")
        self.address = _address(raw) if raw else None
        if raw and self.address is None:
            self._log_once(f"NOTIFY_SOCKET={raw!r} is neither an absolute path nor @abstract; not notifying")
        self._watchdog_usec = env.get("WATCHDOG_USEC", "")
        self._watchdog_pid = env.get("WATCHDOG_PID", "")

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def ready(self, status: str | None = None) -> bool:
        """Startup (or a reload) is done; Type=notify units count as started from here."""
        return self.send("READY=1", *([_status(status)] if status is not None else []))

    def status(self, text: str) -> bool:
        """One line for `systemctl status`."""
        return self.send(_status(text))

    def reloading(self) -> bool:
        """A reload began; call ready() when it is done. MONOTONIC_USEC is what Type=notify-reload needs."""
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> bool:
        """Shutdown began."""
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        """Still alive: resets WatchdogSec's timer."""
        return self.send("WATCHDOG=1")

    def watchdog_interval_s(self) -> Optional[float]:
        """How often to ping: half of $WATCHDOG_USEC, or None when no watchdog is meant for this process."""
        if not self.enabled:
            return None
        try:
            usec = int(self._watchdog_usec)
        except ValueError:
            return None
        if usec <= 0:
            return None
        if self._watchdog_pid:
            try:
                if int(self._watchdog_pid) != os.getpid():
                    return None  # the variables were inherited from the process systemd watches
            except ValueError:
                return None
        return usec / 2 / 1e6

    def send(self, *assignments: str) -> bool:
        """Sends 'KEY=value' lines as one datagram; False when disabled or the send failed."""
        if self.address is None:
            return False
        data = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                # Non-blocking: a full receive queue must not stall the event loop.
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto(data, self.address)
        except OSError as e:
            shown = self.address.replace("\0", "@", 1)
            self._log_once(f"cannot notify the service manager on {shown}: {e.strerror or e}")
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _log_once(self, line: str) -> None:
        if not self._logged:
            self._logged = True
            self._log(line)


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.splitlines())  # one message line per assignment


async def watchdog_loop(notifier: Notifier, healthy: Callable[[], bool], interval_s: float | None = None) -> None:
    """Pings every interval_s (default notifier.watchdog_interval_s()) while healthy() is true.

    An unhealthy daemon, or a wedged event loop that never runs this, stops
    pinging, and systemd restarts it after WatchdogSec; so does a healthy()
    that raises, since that ends the loop. Returns at once when there is no
    watchdog; otherwise runs until cancelled.
    """
    interval = interval_s if interval_s is not None else notifier.watchdog_interval_s()
    if interval is None or not notifier.enabled:
        return
    while True:
        if healthy():
            notifier.watchdog()
        await asyncio.sleep(interval)
