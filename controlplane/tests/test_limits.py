"""controlplane.limits: the weight and port ranges every entry point checks."""

import pytest

from controlplane import limits


@pytest.mark.parametrize(
    "value, ok",
    [
        (0, True),
        (1, True),
        (65535, True),
        (65536, False),
        (-1, False),
        (True, False),
        (1.0, False),
        ("1", False),
        (None, False),
    ],
)
def test_a_weight_is_an_int_from_0_to_65535(value, ok):
    assert limits.is_weight(value) is ok


@pytest.mark.parametrize(
    "value, zero, ok",
    [
        (1, False, True),
        (65535, False, True),
        (0, False, False),
        (0, True, True),
        (65536, True, False),
        (-1, True, False),
        (False, True, False),
        ("80", False, False),
    ],
)
def test_a_port_is_an_int_from_1_to_65535_or_0_where_a_free_one_is_asked_for(value, zero, ok):
    assert limits.is_port(value, zero=zero) is ok


def test_the_ranges_as_text_say_the_same():
    assert (limits.WEIGHTS, limits.PORTS) == ("0..65535", "1..65535")
