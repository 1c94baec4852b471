"""interrupts.uninterrupted: a Ctrl-C inside the block arrives after it, so the change and its
undo step made inside are never split by a KeyboardInterrupt."""

from __future__ import annotations

import signal

import pytest

from controlplane.interrupts import uninterrupted


def test_a_ctrl_c_inside_arrives_after_the_block():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with uninterrupted():
            signal.raise_signal(signal.SIGINT)
            done.append("change")
            done.append("its undo")
    assert done == ["change", "its undo"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_nothing_happens():
    with uninterrupted():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
