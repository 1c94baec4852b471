"""controlplane/openfix.py: a fix moves only by what two censuses in a row agree on."""

from controlplane.openfix import Reconciler


def test_a_leak_seen_twice_becomes_the_fix_by_the_smaller_residual():
    rec = Reconciler()
    assert rec.step({1: (10, 0)}, {1: 7}) == {}  # residual 3, once
    assert rec.step({1: (11, 0)}, {1: 9}) == {1: 2}  # residual 2: min(3, 2)
    assert rec.step({1: (11, 2)}, {1: 9}) == {}  # held: residual 0


def test_residuals_of_opposite_signs_or_one_census_move_nothing():
    rec = Reconciler()
    assert rec.step({1: (5, 0), 2: (4, 0)}, {1: 4, 2: 5}) == {}
    assert rec.step({1: (5, 0), 2: (4, 0)}, {1: 6, 2: 3}) == {}  # 1: +1 then -1; 2: -1 then +1
    assert rec.pending == {1: -1, 2: 1}


def test_a_count_below_conntrack_gets_a_negative_fix_and_absent_backends_have_none_open():
    rec = Reconciler()
    rec.step({1: (-1, 0), 3: (2, 0)}, {1: 0})
    assert rec.step({1: (-1, 0), 3: (2, 0)}, {1: 0}) == {1: -1, 3: 2}
