"""controlplane/siphash.py against the reference vectors of SipHash-2-4 (key 00..0f, message
00..(n-1)), and the heartbeat's MAC as bpf/include/siphash.h computes it: 16 bytes, two words."""

import pytest

from controlplane import abi
from controlplane.siphash import key_words, siphash24

KEY = bytes(range(16))
# vectors_sip64 of the reference implementation: output bytes, little endian, for n = 0, 15, 16
VECTORS = {0: "310e0edd47db6f72", 15: "e545be4961ca29a1", 16: "db9bc2577fcc2a3f", 63: "724506eb4c328a95"}


@pytest.mark.parametrize("n", sorted(VECTORS))
def test_reference_vectors(n):
    assert siphash24(KEY, bytes(range(n))).to_bytes(8, "little").hex() == VECTORS[n]


def test_key_words_are_the_little_endian_halves():
    assert key_words(KEY) == (0x0706050403020100, 0x0F0E0D0C0B0A0908)
    with pytest.raises(ValueError):
        key_words(b"short")


def test_a_heartbeat_carries_the_mac_of_its_first_16_bytes_under_its_backends_key():
    hb = abi.heartbeat(8000, 7, 0x5EED0001, 1_700_000_000)
    assert hb[16:] == siphash24(abi.hb_key(0x5EED0001), hb[: abi.HB_MAC_LEN]).to_bytes(8, "big")
    assert hb[16:] != abi.heartbeat(8000, 7, 0x5EED0002, 1_700_000_000)[16:]
    assert hb[16:] != abi.heartbeat(8000, 7, 0x5EED0001, 1_700_000_001)[16:]
