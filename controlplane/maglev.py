"""Maglev lookup tables: which backend owns each of the m slots of one VIP.

Owns build_table() (names and weights -> numpy array of m backend positions) and
is_prime(). Pure: numpy, hashlib and the standard library only, so it imports on a
laptop without bcc or pyroute2. It does not know map layouts; maps.py writes the array.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from typing import Sequence

import numpy as np

# How a table is dealt.
#
# Slots are handed out in G groups, G prime: group g holds slots g, g+G, g+2G, ...
# (m // G of them; the first m % G groups one more). Each backend walks the groups
# in its own order, group(j) = (offset + j*skip) % G, offset and skip taken from a
# BLAKE2b digest of its name, and makes step j at time j / quota, so all backends
# reach their quota at about the same time. A group goes to the backend that reaches
# it first (equal times: the smaller name), and a backend stops taking slots when it
# holds exactly its quota. Without the quota cut-off this is weighted rendezvous
# hashing, where removing a backend moves nothing else; the cut-off is where the
# small disruption comes from. (Classic Maglev instead counts turns, so one removal
# shifts every later turn of every backend.)
#
# Vectorised in phases: in each, every backend still short of its quota makes its
# next ~_PHASE_STEP * quota * G / m steps at once, np.minimum.at keeps the earliest
# claim on each group, and each backend keeps the prefix of its wins that fits its
# quota. When few groups are left, each free group is offered to the backend that
# would reach it first (its step number is (g - offset) * skip^-1 mod G), backends
# accept offers in that order up to their quota, and that repeats until the table is
# full. Groups cut the work about GROUP_SLOTS-fold; the price is disruption: on average
# 0.34% of survivor slots move per removal with single-slot groups, 0.84% with 8.

GROUP_SLOTS = 8  # slots per group when m is large enough; see _group_count()
MIN_GROUPS = 1024  # with fewer groups than this, each slot is its own group
MAX_M = 2**31 - 1  # slot numbers and positions must fit int32 (and the BPF u32 key)

_HASH_PERSON = b"edge-maglev-v1"  # changing it re-deals every table
_PHASE_STEP = 1.5  # time per phase; at time t about exp(-t) of the groups are still free
_MAX_TIME = 15.0  # after this, whatever is free is left to the offer rounds
_TAIL_PAIRS = 2  # offer rounds start once free groups * hungry backends <= _TAIL_PAIRS * G
_TAIL_CHUNK = 1 << 18  # (group, backend) keys held in memory at once during offer rounds
_NO_CLAIM = np.iinfo(np.int64).max


def is_prime(n: int) -> bool:
    """Exact for n < 3.1e23 (Miller-Rabin, first 12 prime bases); far above any table size."""
    n = operator.index(n)
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def build_table(names: Sequence[str], weights: Sequence[int], m: int) -> np.ndarray:
    """Return an int32 array of m entries: the position in names of the backend owning each slot.

    names: unique backend names; only the name -> weight mapping matters, not the order.
    weights: non-negative integers; weight 0 (draining) owns no slot. If no weight is
        positive, every entry is -1.
    m: table size: a prime, at most 2**31 - 1, larger than the number of positive weights.

    Each backend gets exactly its largest-remainder share of m (ties: smaller name
    first), so it may own 0 slots if its weight is tiny next to the others. The result
    is the same on every machine and Python version.

    Disruption (m=65537, 10..64 backends, weights 1..4): removing one backend moves
    0.84% of the survivors' slots on average, p99 1.4% (2000 random removals). It grows
    with the removed backend's share of the table: at most 2.1% seen below a 10% share,
    5.2% at a 27% share. Adding one moves about as much between the backends already
    there (mean 0.81%, at most 3.8%). tests/test_maglev.py asserts both stay under
    2% + 0.15 * (share of the backend removed or added).
    """
    m = _check_m(m)
    weights = [operator.index(w) for w in weights]
    if len(names) != len(weights):
        raise ValueError(f"maglev: {len(names)} names but {len(weights)} weights")
    if len(set(names)) != len(names):
        raise ValueError("maglev: backend names must be unique")
    if any(w < 0 for w in weights):
        raise ValueError(f"maglev: weights must be >= 0, got {min(weights)}")
    by_name = sorted((name, pos) for pos, name in enumerate(names) if weights[pos] > 0)
    if len(by_name) >= m:
        raise ValueError(f"maglev: m={m} must be larger than the {len(by_name)} backends with weight>0")
    table = np.full(m, -1, np.int32)
    if not by_name:
        return table
    quota = _quotas([weights[pos] for _, pos in by_name], m)
    owners = [(name, pos, q) for (name, pos), q in zip(by_name, quota) if q > 0]
    if len(owners) == 1:
        table[:] = owners[0][1]
        return table
    fill = _Fill(m, _group_count(m))
    _deal(fill, [name for name, _, _ in owners], np.array([q for _, _, q in owners], np.int64))
    return fill.table(np.array([pos for _, pos, _ in owners], np.int32), out=table)


def _check_m(m: int) -> int:
    m = operator.index(m)
    if not is_prime(m):
        raise ValueError(f"maglev: m={m} is not prime")
    if m > MAX_M:
        raise ValueError(f"maglev: m={m} is above {MAX_M}")
    return m


def _quotas(weights: list[int], m: int) -> list[int]:
    """Largest-remainder shares of m; weights are in name order, so ties go to the smaller name."""
    total = sum(weights)
    quota = [m * w // total for w in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: -(m * weights[i] % total))
    for i in by_remainder[: m - sum(quota)]:
        quota[i] += 1
    return quota


@functools.lru_cache(maxsize=64)
def _group_count(m: int) -> int:
    """G: the largest prime <= m / GROUP_SLOTS, or m itself for small tables."""
    g = m // GROUP_SLOTS
    if g < MIN_GROUPS:
        return m
    while not is_prime(g):
        g -= 1
    return g


@functools.lru_cache(maxsize=4096)
def _walk(name: str, groups: int) -> tuple[int, int, int, int]:
    """(offset, skip, skip^-1, -offset*skip^-1) mod groups, from the name's BLAKE2b digest."""
    digest = hashlib.blake2b(name.encode(), digest_size=16, person=_HASH_PERSON).digest()
    offset = int.from_bytes(digest[:8], "little") % groups
    skip = int.from_bytes(digest[8:], "little") % (groups - 1) + 1
    inverse = pow(skip, -1, groups)
    return offset, skip, inverse, -offset * inverse % groups


class _Fill:
    """Which backend owns which slots of each group while a table is being dealt."""

    def __init__(self, m: int, groups: int):
        self.m, self.groups = m, groups
        self.rows, extra = divmod(m, groups)  # a group has `rows` slots, the first `extra` one more
        self.size = np.full(groups, self.rows, np.int64)
        self.size[:extra] += 1
        self.free = self.size.copy()  # free slots per group; they are always its last rows
        self.owner = np.full(groups, -1, np.int64)  # backend of groups taken whole
        self.splits: list[tuple[np.ndarray, ...]] = []  # (group, first row, rows, backend)

    def take(self, group: np.ndarray, backend: np.ndarray, count: np.ndarray) -> None:
        """Give count[k] of the free slots of group[k] to backend[k]."""
        whole = count == self.size[group]
        if whole.all():
            self.owner[group] = backend
        else:
            self.owner[group[whole]] = backend[whole]
            part = ~whole
            g = group[part]
            self.splits.append((g, self.size[g] - self.free[g], count[part], backend[part]))
        self.free[group] -= count

    def table(self, positions: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Write positions[backend] for every slot into out; slot s is row s // G of group s % G."""
        full_rows = self.rows * self.groups
        out[:full_rows].reshape(self.rows, self.groups)[:] = positions[self.owner]
        out[full_rows:] = positions[self.owner[: self.m - full_rows]]
        if self.splits:
            group, first, count, backend = (np.concatenate(c) for c in zip(*self.splits))
            row = np.repeat(first - (np.cumsum(count) - count), count) + np.arange(count.sum())
            out[np.repeat(group, count) + self.groups * row] = positions[np.repeat(backend, count)]
        return out


def _claim_prefix(free: np.ndarray, who: np.ndarray, room: np.ndarray) -> tuple[np.ndarray, ...]:
    """Claims sorted by backend, then priority: each backend takes free slots until its room is used.

    Returns (accepted mask, slots taken per accepted claim, slots taken per backend).
    """
    before = np.cumsum(free) - free
    per_backend = np.bincount(who, weights=free, minlength=len(room)).astype(np.int64)
    start = np.cumsum(per_backend) - per_backend
    left = room[who] - (before - start[who])
    ok = left > 0
    return ok, np.minimum(free[ok], left[ok]), np.minimum(per_backend, room)


def _deal(fill: _Fill, names: list[str], quota: np.ndarray) -> None:
    """Give backend i (names sorted) exactly quota[i] slots of fill."""
    groups, n = fill.groups, len(names)
    walk = np.array([_walk(name, groups) for name in names], np.int64)
    offset, skip, inverse, inv_offset = walk.T
    # claim key = step * scale + backend: earlier time first, then the smaller name.
    # scale ~ 2**bits / quota, sized so that step < 2 * groups cannot overflow int64.
    bits = 62 - (2 * groups).bit_length() - n.bit_length()
    scale = np.maximum((1 << bits) // quota, 1) * n
    room = quota.copy()
    step = np.zeros(n, np.int64)  # next step of each backend's walk
    rate = quota * (groups / fill.m)  # groups walked per unit of time
    best = np.full(groups, _NO_CLAIM, np.int64)
    hungry = np.arange(n)
    free_groups, now = groups, 0.0
    while free_groups * len(hungry) > _TAIL_PAIRS * groups and now < _MAX_TIME:
        now += _PHASE_STEP
        start = step[hungry]
        stop = np.ceil(now * rate[hungry]).astype(np.int64)
        stop = np.minimum(np.maximum(stop, start + 1), groups)  # at least one step: progress
        steps = stop - start
        first = np.cumsum(steps) - steps
        total = int(steps.sum())
        if total == 0:
            break
        shift = start - first  # step = shift[b] + index in this phase's flat pair list
        sk = skip[hungry]
        first_group = (offset[hungry] + shift * sk) % groups
        group = (np.repeat(first_group, steps) + np.arange(total) * np.repeat(sk, steps)) % groups
        pair = np.flatnonzero(fill.free[group])
        group = group[pair]
        who = np.repeat(np.arange(len(hungry)), steps)[pair]
        key = (pair + shift[who]) * scale[hungry][who] + hungry[who]
        np.minimum.at(best, group, key)
        won = np.flatnonzero(best[group] == key)
        best[group] = _NO_CLAIM
        group, who = group[won], who[won]
        ok, count, used = _claim_prefix(fill.free[group], who, room[hungry])
        fill.take(group[ok], hungry[who[ok]], count)
        room[hungry] -= used
        step[hungry] = stop
        free_groups = int(np.count_nonzero(fill.free))
        hungry = np.flatnonzero(room)
    _offer_rounds(fill, room, step, scale, inverse, inv_offset)


def _offer_rounds(
    fill: _Fill, room: np.ndarray, step: np.ndarray, scale: np.ndarray, inverse: np.ndarray, inv_offset: np.ndarray
) -> None:
    """Settle the last free groups: each goes to the hungry backend whose walk reaches it first."""
    free = np.flatnonzero(fill.free)
    if len(free) == 0:
        return
    groups = fill.groups
    hungry = np.flatnonzero(room)
    room = room[hungry]
    scale_h = scale[hungry]

    def keys(rows, cols):
        b = hungry[cols]
        j = (free[rows, None] * inverse[b] + inv_offset[b]) % groups  # rank in b's walk
        j += groups * (j < step[b])  # already walked past: reached on the next lap
        return j * scale_h[cols] + b

    rows = np.arange(len(free))
    cached = keys(rows, np.arange(len(hungry))) if len(free) * len(hungry) <= _TAIL_CHUNK else None
    while len(rows):
        if cached is not None:
            k = cached[rows]
            col = k.argmin(axis=1)
            key = k[np.arange(len(rows)), col]
        else:  # too many backends to hold every (group, backend) key at once
            live = np.flatnonzero(room)
            col = np.empty(len(rows), np.int64)
            key = np.empty(len(rows), np.int64)
            chunk = max(1, _TAIL_CHUNK // len(live))
            for lo in range(0, len(rows), chunk):
                k = keys(rows[lo : lo + chunk], live)
                c = k.argmin(axis=1)
                key[lo : lo + chunk] = k[np.arange(len(c)), c]
                col[lo : lo + chunk] = live[c]
        order = np.argsort(col * (2 * groups) + key // scale_h[col])
        col, offer = col[order], rows[order]
        ok, count, used = _claim_prefix(fill.free[free[offer]], col, room)
        fill.take(free[offer[ok]], hungry[col[ok]], count)
        room = room - used
        rows = rows[fill.free[free[rows]] > 0]
        if cached is not None:
            cached[:, room == 0] = _NO_CLAIM
