"""edge-heartbeat's command line: the options, each checked with a one-line error naming it
(UsageError), and their defaults. Pure but for --token-secret-file (a file read, a route
looked up)."""

from __future__ import annotations

import argparse
import math
import socket
import sys
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Optional
from urllib.parse import urlsplit

from controlplane import __version__, limits

PROG = "edge-heartbeat"
DEFAULT_ROUTER_PORT = 7946  # config.Heartbeat.port's default; test_heartbeat compares them
DEFAULT_INTERVAL_MS = 100.0  # config.Heartbeat.interval_ms's default
MIN_CHECK_INTERVAL_MS = 5.0  # default checks: every heartbeat interval, but at most 200 a second
MIN_CHECK_TIMEOUT_MS = 20.0
DEFAULT_CHECK_PATH = "/v2/health/ready"  # Open Inference Protocol (Triton, KServe); vLLM/TGI: /health
MIN_INTERVAL_MS = 0.05
MAX_INTERVAL_MS = 3_600_000.0  # one hour, config.MAX_MS
TOKEN_MAX = 2**128 - 1


class UsageError(ValueError):
    """A bad option value; the message names the option."""


def parse_ip(text: str, what: str) -> IPv4Address | IPv6Address:
    try:
        return ip_address(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not an IPv4 or IPv6 address") from None


def parse_port(text: str, what: str) -> int:
    if not text.isdigit() or not limits.is_port(int(text)):
        raise UsageError(f"{what}: {text!r} is not a port ({limits.PORTS})")
    return int(text)


def parse_router(text: str) -> tuple[IPv4Address | IPv6Address, int]:
    """`ADDR[:PORT]` -> (address, port), an IPv6 address with a port in brackets (`[ADDR]:PORT`);
    the port defaults to DEFAULT_ROUTER_PORT."""
    if text.startswith("["):
        addr, sep, port = text[1:].partition("]")
        if not sep or (port and not port.startswith(":")) or ":" not in addr:
            raise UsageError(f"--router: {text!r} is not [IPv6 address] with an optional :PORT")
        sep, port = port[:1], port[1:]
    elif text.count(":") > 1:  # a bare IPv6 address: no port
        addr, sep, port = text, "", ""
    else:
        addr, sep, port = text.partition(":")
    return (parse_ip(addr, "--router"), parse_port(port, "--router port") if sep else DEFAULT_ROUTER_PORT)


def parse_token(text: str) -> int:
    """A token (heartbeat key, up to 128 bits), decimal or 0x hex, as the config writes it (never 0, as the config)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise UsageError("--token-file: the token is not an integer (e.g. 0x5eed0001)") from None
    if not 0 < value <= TOKEN_MAX:
        raise UsageError("--token-file: the token is out of range 1..2**128-1")
    return value


def read_token_file(path: str) -> int:
    """The token in the file at path: one line, decimal or 0x hex. A token is a secret, so it is
    read from a file, never taken from the command line (which every local user can read)."""
    try:
        with open(path, "rb") as f:
            text = f.read(100).decode("ascii", "replace").strip()
    except OSError as e:
        raise UsageError(f"--token-file: cannot read {path}: {e.strerror or e}") from None
    return parse_token(text)


def parse_number(text: str, what: str, lo: float, hi: float, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:  # also false for nan
        raise UsageError(f"{what}: {text!r} is not a number of {unit} in {lo:g}..{hi:g}")
    return value


def parse_ms(text: str, what: str) -> float:
    return parse_number(text, what, MIN_INTERVAL_MS, MAX_INTERVAL_MS, "milliseconds")


@dataclass(frozen=True)
class Target:
    """Where the health check goes: an HTTP URL split up, or host and port for tcp."""

    host: str
    port: int
    path: str = "/"

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.hostport}{self.path}"


def parse_check_url(text: str) -> Target:
    """An http:// URL -> Target; the port defaults to 80, the path to /."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise UsageError(f"--check-url: {text!r}: {e}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--check-url: {text!r} is not an http://HOST[:PORT]/PATH URL")
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    return Target(parts.hostname, port if port is not None else 80, path)


@dataclass(frozen=True)
class Options:
    """Everything the agent runs with, checked and with defaults filled in."""

    router: IPv4Address | IPv6Address
    router_port: int
    source: Optional[IPv4Address | IPv6Address]
    service_port: int
    token: int
    interval_ms: float
    check: str  # none | tcp | http
    target: Optional[Target]  # None for check none
    check_interval_ms: float
    check_timeout_ms: float
    duration_s: Optional[float]
    rt_priority: int  # 0: normal scheduling
    quiet: bool


def secret_token(
    path: str,
    source: Optional[IPv4Address | IPv6Address],
    router: IPv4Address | IPv6Address,
    router_port: int,
    service_port: int,
) -> int:
    """The token the router derives for this backend (a discovered one) from the service secret:
    keyed by this backend's address (--source, else the one the kernel sends to the router from)."""
    from controlplane.discovery.tokens import derive_token, read_secret
    from controlplane.errors import ConfigError

    try:
        secret = read_secret(path, "--token-secret-file")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if source is None:
        with socket.socket(socket.AF_INET if router.version == 4 else socket.AF_INET6, socket.SOCK_DGRAM) as s:
            try:
                s.connect((str(router), router_port))  # no packet: only the route is looked up
            except OSError as e:
                raise UsageError(f"--router: no route to {router}: {e.strerror}") from None
            source = ip_address(s.getsockname()[0])
    return derive_token(secret, source, service_port)


def warn_secret_file() -> None:
    """--token-secret-file hands this agent the service secret, from which every backend's key
    follows: still accepted (older set-ups), with a warning naming the replacement."""
    print(
        "edge-heartbeat: warning: --token-secret-file gives this agent every backend's key; "
        "give it only its own: --token-file with the output of `edgectl heartbeat-key`",
        file=sys.stderr,
    )


def options(args: argparse.Namespace) -> Options:
    """Turn parsed arguments into Options, filling the defaults that depend on others."""
    router, router_port = parse_router(args.router)
    source = parse_ip(args.source, "--source") if args.source is not None else None
    if source is not None and source.version != router.version:
        raise UsageError(f"--source: {source} is IPv{source.version} but --router {router} is IPv{router.version}")
    service_port = parse_port(args.service_port, "--service-port")
    interval_ms = parse_ms(args.interval_ms, "--interval-ms")
    check_interval_ms = (
        parse_ms(args.check_interval_ms, "--check-interval-ms")
        if args.check_interval_ms is not None
        else max(interval_ms, MIN_CHECK_INTERVAL_MS)
    )
    check_timeout_ms = (
        parse_ms(args.check_timeout_ms, "--check-timeout-ms")
        if args.check_timeout_ms is not None
        else max(2 * check_interval_ms, MIN_CHECK_TIMEOUT_MS)
    )
    duration_s = None
    if args.duration_s is not None:
        duration_s = parse_number(args.duration_s, "--duration-s", 0.0, MAX_INTERVAL_MS / 1000, "seconds")
    if not 0 <= args.rt_priority <= 99:
        raise UsageError(f"--rt-priority: {args.rt_priority} is not in 0..99")
    target = None
    if args.check != "none":
        if args.check_url is not None:
            target = parse_check_url(args.check_url)
        else:  # where the router sends traffic, unless told otherwise
            target = Target(str(source or "127.0.0.1"), service_port, DEFAULT_CHECK_PATH)
        if args.check == "tcp" and args.check_url is None:
            target = Target(target.host, service_port)
    elif args.check_url is not None:
        raise UsageError("--check-url: given with --check none")
    if (args.token_file is None) == (args.token_secret_file is None):
        raise UsageError("--token-file: give exactly one of --token-file, --token-secret-file")
    if args.token_file is not None:
        token = read_token_file(args.token_file)
    else:
        warn_secret_file()
        token = secret_token(args.token_secret_file, source, router, router_port, service_port)
    return Options(
        router,
        router_port,
        source,
        service_port,
        token,
        interval_ms,
        args.check,
        target,
        check_interval_ms,
        check_timeout_ms,
        duration_s,
        args.rt_priority,
        args.quiet,
    )


def fmt_ms(ms: float) -> str:
    return f"{ms:g} ms"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, as every error of this program
        print(f"{PROG}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Send the edge router UDP heartbeats for one backend while "
        "its inference server's health check passes, and none while it fails. Exits 0 on "
        "SIGTERM or SIGINT.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument(
        "--router",
        required=True,
        metavar="ADDR[:PORT]",
        help=f"the router's IPv4 or IPv6 address on this backend's link, and the service's "
        f"health.heartbeat.port (default {DEFAULT_ROUTER_PORT}); an IPv6 address with a port in brackets: "
        f"[2001:2::1]:{DEFAULT_ROUTER_PORT}",
    )
    p.add_argument(
        "--source",
        metavar="ADDR",
        help="send from this address: the backend's address in the router's config "
        "(heartbeats from any other address are rejected); default: the kernel's choice",
    )
    p.add_argument(
        "--service-port",
        required=True,
        metavar="PORT",
        help="the backend's service port in the router's config, written into each heartbeat",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the backend's heartbeat key: its token in the router's config, or "
        "for a discovered backend what `edgectl heartbeat-key` prints; decimal or 0x hex "
        "(a file, not an argument: command lines are readable by every local user)",
    )
    p.add_argument(
        "--token-secret-file",
        metavar="FILE",
        help="deprecated: the service's secret (discovery.token_secret_file), from which this "
        "agent derives its key, and could derive every other backend's; use --token-file",
    )
    p.add_argument(
        "--interval-ms",
        default=f"{DEFAULT_INTERVAL_MS:g}",
        metavar="MS",
        help="heartbeat interval, the service's health.heartbeat.interval_ms; fractions allowed (default: %(default)s)",
    )
    p.add_argument(
        "--check",
        choices=("none", "tcp", "http"),
        default="http",
        help="how to tell the server is ready: an http GET answering 2xx, a tcp connect, "
        "or none: always send (default: %(default)s)",
    )
    p.add_argument(
        "--check-url",
        metavar="URL",
        help=f"http: the health endpoint (vLLM and TGI: /health); tcp: its host and port "
        f"are connected to. Default: http://SOURCE:SERVICE_PORT{DEFAULT_CHECK_PATH} "
        f"(SOURCE 127.0.0.1 without --source)",
    )
    p.add_argument(
        "--check-interval-ms",
        metavar="MS",
        help=f"how often to check; default: the heartbeat interval, at least {MIN_CHECK_INTERVAL_MS:g} ms",
    )
    p.add_argument(
        "--check-timeout-ms",
        metavar="MS",
        help=f"a check not answered within this fails; default: twice the check interval, "
        f"at least {MIN_CHECK_TIMEOUT_MS:g} ms",
    )
    p.add_argument(
        "--duration-s", metavar="S", help="stop after this many seconds (tests); default: run until signalled"
    )
    p.add_argument(
        "--rt-priority",
        type=int,
        default=0,
        metavar="N",
        help="run the sender and the checker as SCHED_FIFO threads of this priority "
        "(1..99, needs CAP_SYS_NICE) for low jitter on a busy host; 0: normal scheduling "
        "(default)",
    )
    p.add_argument(
        "--dsr-vip",
        metavar="VIP",
        help="this backend serves VIP by direct server return: at start, check it is set up "
        "for it (tools/dsr-backend) and exit 1 with one line naming what is missing",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p
