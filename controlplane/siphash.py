"""SipHash-2-4 (Aumasson and Bernstein), the MAC of a heartbeat: what bpf/include/siphash.h
computes in the data path, for the senders (abi.heartbeat) and the tests. Pure; no I/O.
"""

from __future__ import annotations

MASK = 0xFFFFFFFFFFFFFFFF
KEY_BYTES = 16


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _rounds(v: list[int], n: int) -> None:
    v0, v1, v2, v3 = v
    for _ in range(n):
        v0 = (v0 + v1) & MASK
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & MASK
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & MASK
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & MASK
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    v[:] = [v0, v1, v2, v3]


def key_words(key: bytes) -> tuple[int, int]:
    """(k0, k1) of a 16-byte key: its bytes 0-7 and 8-15 as little-endian words (abi.h, hb_target.key)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a SipHash key has {KEY_BYTES} bytes, not {len(key)}")
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")


def siphash24(key: bytes, message: bytes) -> int:
    """SipHash-2-4 of message under the 16-byte key, as a 64-bit integer."""
    k0, k1 = key_words(key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    tail = len(message) % 8
    blocks = [int.from_bytes(message[i : i + 8], "little") for i in range(0, len(message) - tail, 8)]
    blocks.append(((len(message) & 0xFF) << 56) | int.from_bytes(message[len(message) - tail :], "little"))
    for m in blocks:
        v[3] ^= m
        _rounds(v, 2)
        v[0] ^= m
    v[2] ^= 0xFF
    _rounds(v, 4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]
