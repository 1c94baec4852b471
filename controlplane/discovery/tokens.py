"""Heartbeat keys of discovered backends, derived from the service secret and the backend's
identity in the control plane, its endpoint: the first 128 bits of
HMAC-SHA256(secret, "edge heartbeat key v2 ADDR:PORT") ("[ADDR]:PORT" for an IPv6 endpoint).

The router derives every backend's key from the secret; each agent gets only its own key
(`edgectl heartbeat-key` prints it for --token-file), so no agent can compute another backend's
key (HMAC-SHA256 without the secret). The key is the SipHash-2-4 key of the backend's
heartbeat MACs (abi.heartbeat), never sent on the wire. Pure; reads only the secret file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from ipaddress import AddressValueError, IPv4Address, IPv6Address, ip_address
from typing import TYPE_CHECKING

from controlplane.errors import ConfigError

if TYPE_CHECKING:
    from controlplane.config import Config

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096


KEY_LABEL = b"edge heartbeat key v2 "


def derive_token(secret: bytes, address: IPv4Address | IPv6Address | str, port: int) -> int:
    """The 128-bit heartbeat key (as the config's `token`) of endpoint address:port; never 0 (the
    config rejects token 0)."""
    a = ip_address(str(address))
    identity = (f"{a}:{int(port)}" if a.version == 4 else f"[{a}]:{int(port)}").encode()
    digest = hmac.new(secret, KEY_LABEL + identity, hashlib.sha256).digest()
    return int.from_bytes(digest[:16], "big") or 1


def read_secret(path: str, where: str) -> bytes:
    """The secret in the file at path (surrounding whitespace stripped); where names the config
    field. Only a regular file of at most MAX_SECRET_BYTES is read: it is opened without
    blocking (a FIFO or device never blocks the caller) and refused unless it is one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{where}: {path} is not a regular file")
        if st.st_size > MAX_SECRET_BYTES:
            raise ConfigError(f"{where}: {path} is larger than {MAX_SECRET_BYTES} bytes")
        secret = os.read(fd, MAX_SECRET_BYTES + 1).strip()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path}: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"{where}: {path} holds {len(secret)} bytes; a secret needs at least {MIN_SECRET_BYTES}")
    if len(secret) > MAX_SECRET_BYTES:
        raise ConfigError(f"{where}: {path} is larger than {MAX_SECRET_BYTES} bytes")
    return secret


def heartbeat_key(cfg: "Config", service: str, endpoint: str) -> int:
    """The key (as a token) of backend endpoint "ADDR:PORT" of the named service in cfg: its
    configured token, else the one derived from the service's discovery.token_secret_file.
    ConfigError naming the argument when there is none."""
    try:
        s = next(s for s in cfg.services if s.name == service)
    except StopIteration:
        raise ConfigError(f"--service: no service {service!r} in the config") from None
    addr, _, port = endpoint.rpartition(":")
    try:
        address, number = ip_address(addr.removeprefix("[").removesuffix("]")), int(port)
    except (AddressValueError, ValueError):
        raise ConfigError(f"--backend: {endpoint!r} is not ADDR:PORT") from None
    for b in s.backends:
        if b.address == address and b.port == number and b.token is not None:
            return b.token
    path = s.discovery.token_secret_file if s.discovery else None
    if path is None:
        raise ConfigError(
            f"--backend: {endpoint} has no token in service {service!r} and the service has "
            f"no discovery.token_secret_file to derive one from"
        )
    return derive_token(read_secret(path, f"services[{service}].discovery.token_secret_file"), address, number)
