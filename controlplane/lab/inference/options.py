"""sim-inference's options and run-time knobs (POST /sim/degrade), each checked with an
error naming it, and the edge-heartbeat command line run beside a server. Pure."""

from __future__ import annotations

import ipaddress
import json
import math
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from controlplane import agent, limits

PROG = "sim-inference"


class UsageError(ValueError):
    """A bad option or knob value; the message names the option or the knob."""


class KnobError(UsageError):
    def __init__(self, knob: str, message: str):
        super().__init__(f"{knob}: {message}")
        self.knob = knob
        self.reason = message


def _number(knob: str, value: Any, lo: float, hi: Optional[float], what: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < lo or (hi is not None and value > hi):
        bound = f"in {lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
        raise KnobError(knob, f"{json.dumps(value)} is not {what} {bound}")
    return float(value)


def _integer(knob: str, value: Any, lo: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise KnobError(knob, f"{json.dumps(value)} is not an integer >= {lo}")
    return value


def _flag(knob: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise KnobError(knob, f"{json.dumps(value)} is not true or false")
    return value


@dataclass
class Knobs:
    """What POST /sim/degrade changes at run time (see the module docstring for the model)."""

    added_latency_ms: float = 0.0  # before every response but /sim/*
    tpot_factor: float = 1.0  # every token after the first takes tpot x this (a thermal throttle: 3)
    fill_queue: int = 0  # phantom waiting requests
    kv_usage: Optional[float] = None  # 0..1 overrides the modelled KV-cache use; None models it
    hang: bool = False  # engine frozen: no tokens, no admission; health still 200
    not_ready: bool = False  # /v2/health/ready answers 503
    metrics_off: bool = False  # /metrics answers 404
    die: bool = False  # close everything and end (the process exits 0)

    @staticmethod
    def checked(changes: Any) -> dict[str, Any]:
        """Validate a /sim/degrade body (any subset of the knobs); return the typed values."""
        if not isinstance(changes, dict):
            raise KnobError("body", "is not a JSON object of knobs")
        out: dict[str, Any] = {}
        for knob, value in changes.items():
            if knob == "added_latency_ms":
                out[knob] = _number(knob, value, 0, None, "a number of milliseconds")
            elif knob == "tpot_factor":
                out[knob] = _number(knob, value, 0.01, 1000, "a factor")
            elif knob == "fill_queue":
                out[knob] = _integer(knob, value, 0)
            elif knob == "kv_usage":
                out[knob] = None if value is None else _number(knob, value, 0, 1, "null or a number")
            elif knob in ("hang", "not_ready", "metrics_off", "die"):
                out[knob] = _flag(knob, value)
            else:
                known = ", ".join(f.name for f in fields(Knobs))
                raise KnobError(str(knob), f"is not a knob (knobs: {known})")
        return out


@dataclass(frozen=True)
class Options:
    """What a server runs with; check() says what is wrong, naming the option."""

    name: str = "sim"
    host: str = "127.0.0.1"
    port: int = 0  # 0: the OS picks
    model: str = "sim-model"
    max_running: int = 4
    max_waiting: int = 1000
    ttft_ms: float = 20.0
    tpot_ms: float = 5.0
    kv_capacity_tokens: int = 8192
    knobs: Knobs = field(default_factory=Knobs)  # the knobs at start
    heartbeat: Optional[str] = None  # ROUTER[:PORT]: run edge-heartbeat beside this server
    token: Optional[str] = None  # the backend's heartbeat token, decimal or 0x hex
    hb_interval_ms: float = 1.0

    def check(self) -> "Options":
        if not self.name:
            raise UsageError("--name: is empty")
        if not limits.is_port(self.port, zero=True):
            raise UsageError(f"--listen: port {self.port} is not in 0..{limits.PORT_MAX}")
        for flag, value, lo in (
            ("--max-running", self.max_running, 1),
            ("--max-waiting", self.max_waiting, 0),
            ("--kv-capacity-tokens", self.kv_capacity_tokens, 1),
        ):
            if not isinstance(value, int) or value < lo:
                raise UsageError(f"{flag}: {value!r} is not an integer >= {lo}")
        for flag, value in (("--ttft-ms", self.ttft_ms), ("--tpot-ms", self.tpot_ms)):
            if not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise UsageError(f"{flag}: {value!r} is not a number of milliseconds >= 0")
        if self.knobs.die:
            raise UsageError("die: can only be set at run time (POST /sim/degrade)")
        try:
            Knobs.checked(asdict(self.knobs))
        except KnobError as e:
            raise UsageError(f"--{e.knob.replace('_', '-')}: {e.reason}") from None
        if (self.heartbeat is None) != (self.token is None):
            raise UsageError("--heartbeat and --token: give both or neither")
        if self.heartbeat is not None:
            try:
                agent.parse_router(self.heartbeat)
                agent.parse_token(str(self.token))
                agent.parse_ms(f"{self.hb_interval_ms}", "--hb-interval-ms")
            except agent.UsageError as e:
                raise UsageError(str(e).replace("--router", "--heartbeat").replace("--token-file", "--token")) from None
            try:
                ipaddress.IPv4Address(self.host)
            except ValueError:
                raise UsageError(
                    f"--listen: {self.host!r} is not an IPv4 address (heartbeats are sent from it)"
                ) from None
        return self


def heartbeat_command(opts: Options, port: int, token_file: str) -> list[str]:
    """The edge-heartbeat command line for a server of opts bound to port: it sends from the
    listening address (unless that is 0.0.0.0) while GET /health answers 2xx, with the token
    opts.token that the caller wrote to token_file."""
    check_host = "127.0.0.1" if opts.host == "0.0.0.0" else opts.host
    cmd = [
        sys.executable,
        "-m",
        "controlplane.agent",
        "--router",
        str(opts.heartbeat),
        "--service-port",
        str(port),
        "--token-file",
        token_file,
        "--interval-ms",
        f"{opts.hb_interval_ms:g}",
        "--check",
        "http",
        "--check-url",
        f"http://{check_host}:{port}/health",
    ]
    if opts.host != "0.0.0.0":
        cmd += ["--source", opts.host]
    return cmd
