"""edged's command line: its options, the interface it deploys on, and serve(),
which runs one Daemon under systemd's eye (signal handlers, READY=1, the
watchdog, the API server) until SIGTERM. The daemon itself is daemon.py.

    edged --config /etc/edge/edge.yaml [--iface eth0]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import signal
import sys
import traceback
from typing import Callable

from controlplane import __version__, loader
from controlplane.api import server as api_server
from controlplane.config import Config, load_config
from controlplane.edged import Daemon, sdnotify
from controlplane.edged.events import LEVELS, PROG, Events
from controlplane.errors import CompileError, ConfigError, EdgeError

# Exit statuses a restart cannot fix, edged.service's RestartPreventExitStatus: the data path
# cannot be compiled (kernel headers missing after a kernel change), and the config is invalid
# (78 is sysexits' EX_CONFIG). Any other failure exits 1 and systemd retries.
EXIT_CANNOT_COMPILE = 3
EXIT_CONFIG = 78


def pick_iface(cfg: Config, given: str | None) -> str:
    """--iface, else node.iface, else the one router already deployed here."""
    if given:
        return given
    if cfg.node.iface:
        return cfg.node.iface
    loader.check_bpffs(cfg.node.pin_dir)
    here = loader.instances_here(cfg.node.pin_dir)
    if len(here) == 1:
        return here[0].rsplit("-", 1)[0]
    raise ConfigError("node.iface: not set, and no --iface given (edged needs the interface to deploy on)")


async def serve(
    cfg: Config,
    iface: str,
    events: Events | None = None,
    config_path: str | None = None,
    ready: Callable[[Daemon], None] | None = None,
) -> int:
    """Runs edged until SIGTERM/SIGINT, telling systemd (NOTIFY_SOCKET) how it goes."""
    daemon = Daemon(cfg, iface, events, config_path)
    notify = daemon.state.notify
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop)
    loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(_reload_logged(daemon)))
    watchdog = api = None
    try:
        notify.status(f"deploying on {iface}")
        await daemon.start()  # compiles the data path: before READY=1, so the watchdog is not armed yet
        if not daemon.stopping:  # a SIGTERM while starting: straight to close()
            api = await api_server.start(daemon, cfg.node)
            daemon.on_serving = api.set_serving
            daemon.events.emit(
                "api",
                f"API on {cfg.node.api_socket}" + (f" and {cfg.node.api_listen} (mTLS)" if cfg.node.api_listen else ""),
            )
            if ready:
                ready(daemon)
            notify.ready(f"steering {len(cfg.services)} services on {iface}")
            watchdog = asyncio.create_task(sdnotify.watchdog_loop(notify, daemon.healthy))
            await daemon.run()
    finally:
        notify.stopping()
        if watchdog is not None:
            watchdog.cancel()
        if api is not None:
            await api.stop(grace_s=1.0)
        await daemon.close()
        notify.close()
    daemon.events.emit("stopped", "stopped; the data path keeps forwarding with the last weights")
    return 0


async def _reload_logged(daemon: Daemon) -> None:
    """SIGHUP: reload; a bad config was already reported by reload() and changed nothing."""
    try:
        await daemon.reload()
    except EdgeError:
        pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="The edge router's daemon: deploys (or adopts) the data path, probes every backend "
        "and steers new flows by latency and GPU load. Runs in the foreground; stop it with "
        "SIGTERM. The data path keeps forwarding while edged is down.",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="YAML config (see edge/edge.yaml)")
    p.add_argument("--iface", help="client-facing interface (default: node.iface, or the one deployed here)")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="stderr lines: text, or one JSON event per line (default %(default)s)",
    )
    p.add_argument(
        "--log-level",
        choices=tuple(LEVELS),
        default="info",
        help="leave out lines less severe than this; notice leaves out routine ones such as "
        "weight pushes (default %(default)s). Under systemd each line carries its level "
        "for journald (journalctl -p err)",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks on errors")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _fatal(events: Events, e: EdgeError, debug: bool) -> int:
    """Logs why edged ends (one line, level error) and returns its exit status."""
    if debug:
        traceback.print_exc()
    events.emit("fatal", str(e))
    if isinstance(e, CompileError):
        return EXIT_CANNOT_COMPILE
    return EXIT_CONFIG if isinstance(e, ConfigError) else 1


_M_ARENA_MAX = -8  # mallopt(3)


def _few_arenas() -> None:
    """At most two glibc malloc arenas: edged's threads (netlink, map walks, gRPC) would each get
    one of their own, memory edged holds but never uses again (tools/bench-rss)."""
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):  # not glibc
        pass


def main(argv: list[str] | None = None) -> int:
    _few_arenas()  # before any thread
    args = parser().parse_args(argv)
    events = Events(json_lines=args.log_format == "json", level=LEVELS[args.log_level])
    try:
        cfg = load_config(args.config)
        iface = pick_iface(cfg, args.iface)
        return asyncio.run(serve(cfg, iface, events, args.config))
    except EdgeError as e:
        return _fatal(events, e, args.debug)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
