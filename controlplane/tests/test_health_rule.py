"""maps.py's reading of a backend's health (the state `edgectl status` and edge_backend_up
show) against the data path's own rule: bpf/include/health.h compiled for this host, with
its two map lookups served from memory, and backend_usable() called through ctypes.

health.h is the rule; maps.py re-states it to explain it (rising, ejected, down). This test
keeps the two from drifting: for any backend, service and health record, maps says "up"
exactly when the data path would give the backend a new flow. Unprivileged; needs a C
compiler and the kernel's UAPI headers (linux/types.h).
"""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings, strategies as st

from controlplane import abi
from controlplane.maps import Maps
from controlplane.tests.memtables import Array, c_struct, compile_c

# health.h without the kernel: maps.h and stats.h are replaced by the two lookups and the
# counter health.h uses; everything else is health.h and abi.h as the data path builds them.
HARNESS = r"""
#define EDGE_MAPS_H
#define EDGE_STATS_H
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#include "abi.h"

static struct backend_health *the_health;
static struct backend_health *health_lookup(__u32 *id) { (void)id; return the_health; }
static struct backend_info *backend_lookup(__u32 *id) { (void)id; return 0; }
static struct { struct backend_health *(*lookup)(__u32 *); } edge_health = { health_lookup };
static struct { struct backend_info *(*lookup)(__u32 *); } edge_backends = { backend_lookup };
static void count_index(__u32 vid, __u32 index) { (void)vid; (void)index; }

#include "health.h"

int usable(const struct backend_info *be, const struct service_cfg *sc, struct backend_health *h, __u64 now)
{
	the_health = h;
	return backend_usable(be, sc, now);
}
"""

BackendInfo, ServiceCfg, BackendHealth = c_struct("backend_info"), c_struct("service_cfg"), c_struct("backend_health")


def health_lib(tmp_path_factory, source: str, fn: str) -> ctypes.CDLL:
    """source compiled; its function fn(backend_info *, service_cfg *, backend_health *, __u64 now)
    returns an int."""
    lib = compile_c(tmp_path_factory, source, fn)
    f = getattr(lib, fn)
    f.argtypes = [
        ctypes.POINTER(BackendInfo),
        ctypes.POINTER(ServiceCfg),
        ctypes.POINTER(BackendHealth),
        ctypes.c_uint64,
    ]
    f.restype = ctypes.c_int
    return lib


@pytest.fixture(scope="module")
def health_h(tmp_path_factory):
    return health_lib(tmp_path_factory, HARNESS, "usable")


NS = st.integers(0, 2**61)  # CLOCK_MONOTONIC ns: far from u64 wrap-around, as on any real node
SMALL_NS = st.integers(0, 10**10)


@settings(max_examples=400, deadline=None)
@given(
    be_flags=st.integers(0, 15),
    sc_flags=st.integers(0, 3),
    hb_timeout_ns=SMALL_NS,
    rise=st.integers(0, 4),
    now=NS,
    last_seen_back=st.none() | SMALL_NS,
    ejected_ahead=st.integers(-(10**10), 10**10),
    rise_count=st.integers(0, 5),
    probation=st.integers(0, 1),
)
def test_maps_says_up_exactly_when_the_data_path_would_use_the_backend(
    health_h, be_flags, sc_flags, hb_timeout_ns, rise, now, last_seen_back, ejected_ahead, rise_count, probation
):
    be = BackendInfo(flags=be_flags | abi.BE_F_VALID, health_id=0)
    sc = ServiceCfg(flags=sc_flags, hb_timeout_ns=hb_timeout_ns, rise=rise)
    h = BackendHealth(
        last_seen_ns=0 if last_seen_back is None else max(0, now - last_seen_back),
        ejected_until_ns=max(0, now + ejected_ahead),
        rise_count=rise_count,
        probation=probation,
    )
    maps = Maps(
        {abi.MAP_BACKENDS: Array(BackendInfo, 1), abi.MAP_HEALTH: Array(BackendHealth, 1)},
        maglev_fd=-1,
        maglev_m=13,
        max_services=1,
    )
    maps.t[abi.MAP_HEALTH].values[0] = h

    seen = maps._health(be, sc, now)

    assert seen["usable"] == bool(health_h.usable(be, sc, h, now)), seen
    assert seen["usable"] == (seen["state"] == "up")
