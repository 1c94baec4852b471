"""The value ranges several entry points check, each written once: a backend's weight and a
TCP/UDP port. The config, edgectl, the gRPC API, edged's operations, fleet marks, the weight
policy, DNS discovery, the prober, the heartbeat agent and the lab all ask here; each caller
words the error for its own interface (a ConfigError naming the key, edgectl's one line, ...).
Pure: imports nothing but typing."""

from typing import TypeGuard

WEIGHT_MAX = 65535  # a backend's weight: 0 (no new flows) .. this, in the config, the API and marks
PORT_MAX = 65535

WEIGHTS = f"0..{WEIGHT_MAX}"  # for messages and help texts
PORTS = f"1..{PORT_MAX}"


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_weight(value: object) -> bool:
    """An int (not a bool) in 0..WEIGHT_MAX."""
    return _int(value) and 0 <= value <= WEIGHT_MAX


def is_port(value: object, zero: bool = False) -> bool:
    """An int (not a bool) in 1..PORT_MAX; with zero, 0 too (a listener's "any free port")."""
    return _int(value) and (0 if zero else 1) <= value <= PORT_MAX
