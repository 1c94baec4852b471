"""Heartbeat tokens of discovered backends: HMAC-SHA256(service secret, "ADDR:PORT"), first 64 bits.

The router and the agent beside a backend (edge-heartbeat --token-secret-file)
compute the same token from the same secret file and the backend's endpoint,
so no token has to be handed out per backend. Pure; reads only the secret file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from ipaddress import IPv4Address

from controlplane.errors import ConfigError

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096


def derive_token(secret: bytes, address: IPv4Address | str, port: int) -> int:
    """The 64-bit token of endpoint address:port; never 0 (the config rejects token 0)."""
    digest = hmac.new(secret, f"{IPv4Address(str(address))}:{int(port)}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") or 1


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
