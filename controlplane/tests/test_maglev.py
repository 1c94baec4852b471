"""Unit tests for controlplane/maglev.py: determinism, exact quotas, draining, disruption, m checks.

Unprivileged and pure; a few seconds. Build timing is measured by tools/bench-maglev,
not asserted here.
"""

import hashlib
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from controlplane import maglev
from controlplane.maglev import build_table, is_prime

REPO = Path(__file__).resolve().parents[2]
BIG_M = 65537


def disruption_bound(share):
    """Most slots one removal or addition may move, given that backend's share of the table.

    Measured with 10..64 backends, weights 1..4, m=65537: mean 0.84%, p99 1.4% over 2000
    random removals; worst seen 2.1% below a 10% share and 5.2% at a 27% share. Hypothesis later
    found an addition moving 3.2% at a 7.7% share (11 backends, the example below): the floor
    is 2.5%, not 2%.
    """
    return 0.025 + 0.15 * share


names_st = st.lists(st.text(min_size=1, max_size=16), min_size=1, max_size=24, unique=True)
small_m_st = st.sampled_from([1009, 4099, 16411])  # 16411 is dealt in groups of 8 slots
few = settings(max_examples=25, deadline=None)


def draw_weights(draw, names, low=0, high=4):
    """Weights for names, with at least one positive."""
    weights = draw(st.lists(st.integers(low, high), min_size=len(names), max_size=len(names)))
    if not any(weights):
        weights[0] = 1
    return weights


def owner_by_slot(names, weights, m):
    """The table as backend names (None for -1), so tables of differently ordered inputs compare."""
    table = build_table(names, weights, m)
    return [names[i] if i >= 0 else None for i in table]


def expected_quotas(names, weights, m):
    """Largest remainder, written apart from maglev.py: floor(m*w/W), +1 by remainder, then name."""
    total = sum(weights)
    share = {n: Fraction(m * w, total) for n, w in zip(names, weights)}
    quota = {n: int(s) for n, s in share.items()}
    order = sorted(names, key=lambda n: (-(share[n] - quota[n]), n))
    for n in order[: m - sum(quota.values())]:
        quota[n] += 1
    return quota


def moved_fraction(before, after, among):
    """Share of the slots in `among` (a boolean mask) whose owner differs between two name tables."""
    before, after = np.array(before, dtype=object), np.array(after, dtype=object)
    return float(np.mean(before[among] != after[among]))


@st.composite
def fleet(draw, min_size=10, max_size=64):
    """10..64 address-like names with weights 1..4 (the range the disruption bound is stated for)."""
    n = draw(st.integers(min_size, max_size))
    hosts = draw(st.lists(st.integers(1, 2**24 - 2), min_size=n, max_size=n, unique=True))
    names = [f"10.{h >> 16}.{(h >> 8) & 255}.{h & 255}:8000" for h in hosts]
    return names, draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))


@few
@given(names=names_st, data=st.data(), m=small_m_st)
def test_same_inputs_give_the_same_table(names, data, m):
    weights = draw_weights(data.draw, names)
    first = build_table(names, weights, m)
    assert first.dtype == np.int32 and first.shape == (m,)
    assert np.array_equal(first, build_table(list(names), list(weights), m))


@few
@given(names=names_st, data=st.data(), m=small_m_st)
def test_input_order_does_not_change_which_name_owns_which_slot(names, data, m):
    weights = draw_weights(data.draw, names)
    order = data.draw(st.permutations(range(len(names))))
    shuffled_names = [names[i] for i in order]
    shuffled_weights = [weights[i] for i in order]
    assert owner_by_slot(names, weights, m) == owner_by_slot(shuffled_names, shuffled_weights, m)


@few
@given(names=names_st, data=st.data(), m=small_m_st)
def test_every_backend_owns_exactly_its_largest_remainder_quota(names, data, m):
    weights = draw_weights(data.draw, names, high=1000)
    table = build_table(names, weights, m)
    counts = np.bincount(table, minlength=len(names))
    assert (table >= 0).all()
    assert dict(zip(names, counts.tolist())) == expected_quotas(names, weights, m)


@settings(max_examples=10, deadline=None)
@given(fleet(max_size=300))
def test_shares_are_within_one_percent_of_weight_share_when_m_is_at_least_100_per_backend(backends_):
    names, weights = backends_
    # 65537 >= 100 * 300. Exact quotas put every backend within one slot of m*w/W;
    # with weights 1..4 that slot can be 4*300/65537 = 1.8% of the smallest share,
    # so check 1% where the share is >= 100 slots and one slot everywhere.
    counts = np.bincount(build_table(names, weights, BIG_M), minlength=len(names))
    total = sum(weights)
    for count, weight in zip(counts, weights):
        ideal = BIG_M * weight / total
        assert abs(count - ideal) < 1
        if ideal >= 100:
            assert abs(count / BIG_M - weight / total) <= 0.01 * weight / total


@few
@given(names=names_st, data=st.data(), m=small_m_st)
def test_weight_zero_backends_own_no_slot(names, data, m):
    weights = draw_weights(data.draw, names)
    # m >= 1009 and at most 24 weights of 0..4: every positive weight is worth >= 10 slots.
    assert set(build_table(names, weights, m).tolist()) == {i for i, w in enumerate(weights) if w > 0}


@pytest.mark.parametrize(
    "names, weights",
    [([], []), (["a"], [0]), (["a", "b", "c"], [0, 0, 0])],
    ids=["no backends", "one draining", "all draining"],
)
def test_no_positive_weight_gives_all_minus_one(names, weights):
    table = build_table(names, weights, 1009)
    assert table.dtype == np.int32 and table.shape == (1009,)
    assert (table == -1).all()


def test_draining_a_backend_is_the_same_as_removing_it():
    names = [f"10.0.0.{i}:8000" for i in range(12)]
    weights = [1, 2, 3, 4] * 3
    drained = owner_by_slot(names, weights[:5] + [0] + weights[6:], BIG_M)
    removed = owner_by_slot(names[:5] + names[6:], weights[:5] + weights[6:], BIG_M)
    assert drained == removed


@settings(max_examples=20, deadline=None)
@given(fleet(), st.data())
def test_removing_one_backend_moves_few_survivor_slots(backends_, data):
    names, weights = backends_
    gone = data.draw(st.integers(0, len(names) - 1))
    before = owner_by_slot(names, weights, BIG_M)
    after = owner_by_slot(names[:gone] + names[gone + 1 :], weights[:gone] + weights[gone + 1 :], BIG_M)
    survivors = np.array(before, dtype=object) != names[gone]
    assert names[gone] not in after
    assert moved_fraction(before, after, survivors) <= disruption_bound(1 - survivors.mean())


@settings(max_examples=20, deadline=None)
@given(fleet(max_size=63), st.integers(1, 4))
@example(  # moved 3.2% at a 7.7% share: what set the bound's floor
    (
        ["10.0.0.1:8000", "10.0.0.5:8000", "10.0.0.6:8000", "10.0.0.7:8000", "10.0.11.50:8000"]
        + ["10.145.192.1:8000", "10.0.0.4:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.5.58.7:8000"],
        [1, 1, 1, 1, 1, 2, 2, 1, 1, 1],
    ),
    1,
)
def test_adding_one_backend_moves_few_slots_between_existing_backends(backends_, weight):
    names, weights = backends_
    new = "10.255.255.255:8000"  # fleet() never makes this name
    before = owner_by_slot(names, weights, BIG_M)
    after = owner_by_slot(names + [new], weights + [weight], BIG_M)
    before, after = np.array(before, dtype=object), np.array(after, dtype=object)
    to_new = after == new
    assert to_new.sum() == expected_quotas(names + [new], weights + [weight], BIG_M)[new]
    assert np.mean((before != after) & ~to_new) <= disruption_bound(to_new.mean())


@pytest.mark.parametrize("m", [0, 1, 4, 1000, 65535, 65536, -7])
def test_non_prime_m_raises_value_error_naming_m(m):
    with pytest.raises(ValueError, match=f"m={m}"):
        build_table(["a"], [1], m)


def test_m_must_exceed_the_number_of_positive_weights():
    with pytest.raises(ValueError, match="m=3"):
        build_table(["a", "b", "c", "d"], [1, 1, 1, 0], 3)
    assert (build_table(["a", "b", "c"], [1, 1, 0], 3) >= 0).all()


@pytest.mark.parametrize(
    "names, weights",
    [(["a", "a"], [1, 1]), (["a", "b"], [1, -1]), (["a", "b"], [1])],
    ids=["duplicate name", "negative weight", "length mismatch"],
)
def test_bad_backend_lists_raise_value_error(names, weights):
    with pytest.raises(ValueError):
        build_table(names, weights, 1009)


def test_is_prime_matches_trial_division_below_5000():
    def trial(n):
        return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))

    assert [n for n in range(-3, 5000) if is_prime(n)] == [n for n in range(-3, 5000) if trial(n)]


@pytest.mark.parametrize(
    "n, prime",
    [(65537, True), (2**31 - 1, True), (2**61 - 1, True), (561, False), (3215031751, False), (2**32 + 1, False)],
    ids=["65537", "2^31-1", "2^61-1", "Carmichael 561", "strong pseudoprime to 2,3,5,7", "Fermat F5"],
)
def test_is_prime_on_large_and_tricky_numbers(n, prime):
    assert is_prime(n) is prime


GOLDEN_NAMES = [f"10.0.0.{i}:8000" for i in range(1, 21)]
GOLDEN_WEIGHTS = [i % 4 + 1 for i in range(1, 21)]
GOLDEN_SHA256 = "4fe9c29433b56096e36e37b2cc3647efc7e7d8c2b465da14df275cb5c4833041"


def test_table_for_a_fixed_input_never_changes():
    """Every daemon, old or new, must deal the same table; a change here re-deals every VIP."""
    table = build_table(GOLDEN_NAMES, GOLDEN_WEIGHTS, BIG_M)
    assert hashlib.sha256(table.astype("<i4").tobytes()).hexdigest() == GOLDEN_SHA256


def test_table_does_not_depend_on_python_hash_seed():
    code = (
        "import hashlib, sys; from controlplane.maglev import build_table as b; "
        f"t = b({GOLDEN_NAMES!r}, {GOLDEN_WEIGHTS!r}, {BIG_M}); "
        "print(hashlib.sha256(t.astype('<i4').tobytes()).hexdigest())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == GOLDEN_SHA256


def test_offer_rounds_in_small_chunks_deal_the_same_table(monkeypatch):
    """The chunked path (for very many backends) must agree with the all-in-memory one."""
    names = [f"10.0.{i // 256}.{i % 256}:8000" for i in range(300)]
    weights = [i % 4 + 1 for i in range(300)]
    whole = build_table(names, weights, BIG_M)
    monkeypatch.setattr(maglev, "_TAIL_CHUNK", 64)
    assert np.array_equal(build_table(names, weights, BIG_M), whole)
