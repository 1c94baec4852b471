"""The ejection cap of passive detection (health.h, try_eject) at any service size up to 1,024
backends: bpf/include/health.h compiled for this host, its two map lookups served from arrays,
try_eject called through ctypes. Up to 64 backends every one is counted; above, an even sample of
64 estimates the ejected share, which must keep the cap: nothing is ejected past it, and below
it a backend is. Unprivileged; needs a C compiler and the kernel's UAPI headers.
"""

from __future__ import annotations

import ctypes

import pytest

from controlplane import abi
from controlplane.tests.memtables import c_struct, compile_c

NOW = 10**12
N_MAX = abi.MAX_PER_SERVICE

HARNESS = r"""
#define EDGE_MAPS_H
#define EDGE_STATS_H
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#include "abi.h"

static struct backend_info the_backends[EDGE_MAX_PER_SERVICE];
static struct backend_health the_health[EDGE_MAX_PER_SERVICE + 1];
static struct backend_health *health_lookup(__u32 *id) { return *id <= EDGE_MAX_PER_SERVICE ? &the_health[*id] : 0; }
static struct backend_info *backend_lookup(__u32 *id) { return *id < EDGE_MAX_PER_SERVICE ? &the_backends[*id] : 0; }
static struct { struct backend_health *(*lookup)(__u32 *); } edge_health = { health_lookup };
static struct { struct backend_info *(*lookup)(__u32 *); } edge_backends = { backend_lookup };
static void count_index(__u32 vid, __u32 index) { (void)vid; (void)index; }

#include "health.h"

/* n backends (ids 0..n-1, health ids alike), those with ejected[i] ejected until after now;
 * returns what try_eject does to one more backend (health id EDGE_MAX_PER_SERVICE). */
int eject_one(__u32 n, const unsigned char *ejected, __u32 pct, __u64 now)
{
	static struct service_cfg sc;
	__u32 i;

	sc.n_backends = n;
	sc.max_ejected_pct = pct;
	sc.ejection_ns = 1000;
	for (i = 0; i < n; i++) {
		sc.backends[i] = i;
		the_backends[i].health_id = i;
		the_health[i].ejected_until_ns = ejected[i] ? now + 1 : 0;
	}
	the_health[EDGE_MAX_PER_SERVICE] = (struct backend_health){0};
	return try_eject(0, &sc, &the_health[EDGE_MAX_PER_SERVICE], now);
}
"""

ServiceCfg = c_struct("service_cfg")


@pytest.fixture(scope="module")
def eject_one(tmp_path_factory):
    lib = compile_c(tmp_path_factory, HARNESS, "eject")
    lib.eject_one.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64]
    lib.eject_one.restype = ctypes.c_int

    def call(n: int, ejected: set[int], pct: int) -> bool:
        flags = bytes(1 if i in ejected else 0 for i in range(n))
        return bool(lib.eject_one(n, flags, pct, NOW))

    return call


@pytest.mark.parametrize("n", [1, 10, 64])
def test_up_to_64_backends_every_ejection_is_counted(eject_one, n):
    for k in range(n):
        allowed = (k + 1) * 100 <= 50 * n
        assert eject_one(n, set(range(k)), 50) == allowed, (n, k)


@pytest.mark.parametrize("n", [65, 100, 1000, N_MAX])
@pytest.mark.parametrize("spread", ["every-other", "first", "last", "middle"])
def test_a_large_service_past_its_cap_ejects_no_more(eject_one, n, spread):
    """The sample sees every ceil(n / 64)-th backend, so a block of ejected backends is known to
    within a step at each of its two ends: 2/64 (3.1%) of n at most. Past the cap by that much,
    nothing more is ejected, however the ejected backends lie in the list."""
    over = -(-n * 53 // 100) + 2 * -(-n // 64)  # 50% + 3% + two steps
    ejected = {
        "every-other": set(range(0, n, 2)) | set(range(1, 2 * (over - n // 2) + 1, 2)),
        "first": set(range(over)),
        "last": set(range(n - over, n)),
        "middle": set(range((n - over) // 2, (n - over) // 2 + over)),
    }[spread]
    assert len(ejected) >= over
    assert not eject_one(n, ejected, 50)


@pytest.mark.parametrize("n", [65, 100, 1000, N_MAX])
def test_a_large_service_with_few_ejected_ejects_one_more(eject_one, n):
    assert eject_one(n, set(), 50)
    assert eject_one(n, set(range(0, n, 10)), 50)  # about a tenth
    assert not eject_one(n, set(range(n)), 50)  # all
