"""edgectl's commands that edged serves over its API (controlplane.api.client): drain,
undrain, drain-node, undrain-node, weight, reload, events. The socket is --socket, else
$EDGE_API_SOCKET, else node.api_socket of the node's config (nodeconf)."""

from __future__ import annotations

import json
import signal
import time

from controlplane import configdiff, limits
from controlplane.cli import nodeconf
from controlplane.cli.exits import UsageError
from controlplane.cli.output import emit, progress
from controlplane.errors import EdgeError

WEIGHT_MAX = limits.WEIGHT_MAX


def client(args):
    """A client of the edged that --socket or --api (with --cert, --key, --ca) names."""
    from controlplane.api.client import Client, Tls

    if args.api:
        missing = [f"--{name}" for name in ("cert", "key", "ca") if not getattr(args, name)]
        if missing:
            raise UsageError(f"--api needs {', '.join(missing)} (edged serves TCP with mutual TLS only)")
        return Client(api=args.api, tls=Tls(args.cert, args.key, args.ca), timeout_s=args.timeout)
    if args.cert or args.key or args.ca:
        raise UsageError("--cert, --key and --ca go with --api (the unix socket needs no TLS)")
    return Client(nodeconf.api_socket(args), timeout_s=args.timeout)


def _scope(scope: str, local: bool) -> str:
    """How far an operator action reached, as edged answered: the fleet, or this node."""
    fleet = " on every node of the fleet (the leader's next snapshot applies it)"
    return fleet if scope == "fleet" else (" on this node only" if local else "")


def cmd_drain(args) -> int:
    with client(args) as edged:
        scope = edged.drain(args.service, args.backend, local=args.local)
    return emit(
        args,
        {"service": args.service, "backend": args.backend, "drained": True, "scope": scope},
        f"drained {args.service}/{args.backend}{_scope(scope, args.local)}: no new flows; established flows stay",
    )


def cmd_undrain(args) -> int:
    with client(args) as edged:
        scope = edged.undrain(args.service, args.backend, local=args.local)
    return emit(
        args,
        {"service": args.service, "backend": args.backend, "drained": False, "scope": scope},
        f"undrained {args.service}/{args.backend}{_scope(scope, args.local)}",
    )


def cmd_drain_node(args) -> int:
    with client(args) as edged:
        got = edged.drain_node(args.drain_node)
    lines = [f"{vip}: withdrawn ({why})" for vip, why in sorted(got["withdrawn"].items())]
    lines += [f"{vip}: announced" for vip in got["announced"]]
    return emit(args, got, "\n".join(lines) or "no VIPs")


def parse_weight(text: str | None) -> tuple[int | None, float | None]:
    """(weight, None) for 'N', (None, percent) for 'N%'; UsageError naming what is wrong."""
    if text is None:
        return None, None
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return None, pct
        weight = int(text)
    except ValueError:
        raise UsageError(f"weight: {text!r} is not N ({limits.WEIGHTS}) or a share P% (0..100)") from None
    if not limits.is_weight(weight):
        raise UsageError(f"weight: {weight} is out of range {limits.WEIGHTS}")
    return weight, None


def share_to_weight(pct: float, scale: int) -> int:
    """The weight that is pct percent of scale; at least 1 for any share above 0 (on a small
    scale, such as static weights of 1, rounding would otherwise turn a share into a drain)."""
    weight = min(WEIGHT_MAX, round(scale * pct / 100))
    return max(weight, 1) if pct > 0 else 0


def share_note(pct: float, weight: int, scale: int) -> str | None:
    """One line when the pinned weight is more than 5 points away from the share asked for
    (weights too small to express it, e.g. static weights of 1); None when it is close."""
    if not scale or abs(100 * weight / scale - pct) <= 5:
        return None
    return (
        f"note: {pct:g}% of the best backend's weight {scale} is {weight} ({100 * weight / scale:.3g}%): "
        f"the service's weights are too small to express it; give its backends larger weights (e.g. 100)"
    )


def _scale(edged, service: str) -> int:
    """The largest weight among the service's primaries now (10,000 under latency_inverse)."""
    for s in edged.status()["services"]:
        if s["name"] == service:
            return max((b["weight"] for b in s["backends"] if not b["standby"]), default=0)
    raise EdgeError(f"service: no service {service!r} runs here")


def cmd_weight(args) -> int:
    weight, pct = parse_weight(args.weight)
    if (args.weight is None) == (not args.clear):
        raise UsageError("weight: give either N, P% or --clear")
    with client(args) as edged:
        scale = None if args.clear else _scale(edged, args.service)
        if pct is not None:
            weight = share_to_weight(pct, scale)
            note = share_note(pct, weight, scale)
            if note:
                progress(args)(note)
        scope = _scope(edged.set_weight(args.service, args.backend, weight, local=args.local), args.local)
    name = f"{args.service}/{args.backend}"
    if args.clear:
        return emit(
            args,
            {"service": args.service, "backend": args.backend, "weight": None, "scale": scale},
            f"{name}: weight override cleared{scope}",
        )
    share = f" ({100 * weight / scale:.3g}% of the best backend's {scale})" if scale else ""
    return emit(
        args,
        {"service": args.service, "backend": args.backend, "weight": weight, "scale": scale},
        f"{name}: weight pinned at {weight}{share}{scope}",
    )


RELOAD_CHANGES = configdiff.LABELS + (("draining_backends", "backends draining"),)


def cmd_reload(args) -> int:
    from controlplane.config import load_config_text, read_config_text

    text = None
    if args.config:  # edged reads no file a client names: the text goes in the request
        text = read_config_text(args.config)
        load_config_text(text, args.config)  # refused here, naming the file, before edged sees it
    with client(args) as edged:
        summary = edged.reload(text)
    changes = [f"{label}: {'; '.join(summary[key])}" for key, label in RELOAD_CHANGES if summary.get(key)]
    return emit(args, summary, "reloaded: " + ("; ".join(changes) if changes else "no changes"))


def _fmt_event(event: dict) -> str:
    t = event.get("t") or 0.0
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
    return f"{stamp}  {event.get('kind', '?'):<9} {event.get('text', '')}"


def _follow(args, stream) -> int:
    """Prints the stream's events until --count, its end, or Ctrl-C (which cancels the call and
    lets the loop end by itself: a KeyboardInterrupt raised inside grpc's iterator could leave
    it holding a lock, and closing the channel would then wait for ever)."""
    interrupted = []

    def on_ctrl_c(signum, frame):
        interrupted.append(signum)
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C interrupts as usual
        stream.cancel()

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    seen = 0
    try:
        for event in stream:
            print(json.dumps(event, sort_keys=True) if args.json else _fmt_event(event), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                return 0
    except KeyboardInterrupt:  # a second Ctrl-C
        return 0
    finally:
        if signal.getsignal(signal.SIGINT) is on_ctrl_c:
            signal.signal(signal.SIGINT, previous)
        stream.close()
    if interrupted:
        return 0
    raise EdgeError("edged ended the event stream (it is stopping)")


def cmd_events(args) -> int:
    if args.count is not None and args.count < 1:
        raise UsageError(f"--count: {args.count} is not a positive number")
    with client(args) as edged:
        return _follow(args, edged.events(tuple(args.kind or ()), args.recent))
