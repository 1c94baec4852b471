"""maps/sizing.py: what a node section pins, pure. The kernel's side of the same figures is
netns-tests/test_map_sizing.py."""

from __future__ import annotations

from dataclasses import replace

from controlplane import abi
from controlplane.config import Node
from controlplane.maps import sizing


def test_every_pinned_map_has_a_shape():
    assert set(sizing.SHAPES) == set(abi.MAP_NAMES)


def test_the_largest_node_section_is_gibibytes_and_maglev_dominates_it():
    largest = Node(maglev_m=1000003, max_services=256, max_backends=65536, ct_size=16777216)
    sizes = sizing.node_bytes(largest, cpus=2)
    assert next(iter(sizes)) == abi.MAP_MAGLEV  # largest first
    slots = 256 * 2 * 1000003
    assert slots * 4 <= sizes[abi.MAP_MAGLEV] <= slots * 4 + 2 * 4096  # 4 bytes a slot (two a value)
    assert sum(sizes.values()) > 3 << 30  # 3.6 GiB (5.5 GiB at 8 bytes a Maglev slot)


def test_per_cpu_maps_grow_with_the_cpus():
    node = Node()
    one, many = sizing.node_bytes(node, cpus=1), sizing.node_bytes(node, cpus=64)
    assert many[abi.MAP_WIRE] > 32 * one[abi.MAP_WIRE] / 2
    assert many[abi.MAP_CT] == one[abi.MAP_CT] + 0  # one LRU list for all CPUs


def test_misfit_names_the_keys_to_lower_and_says_nothing_when_it_fits():
    node = Node()
    need = sum(sizing.node_bytes(node, cpus=2).values())
    assert sizing.misfit(node, need, cpus=2) is None
    assert sizing.misfit(node, None, cpus=2) is None
    line = sizing.misfit(replace(node, ct_size=16777216), need, cpus=2)
    assert line.startswith("node: the maps would pin ") and "node.ct_size" in line and "\n" not in line


def test_conntrack_bytes_per_entry_ipv4_unchanged_and_ipv6():
    # IPv4's entry is what it was before IPv6 (its key stays 16 bytes); IPv6's key holds two addresses
    assert sizing.ct_entry_bytes(abi.MAP_CT) == 104
    assert sizing.ct_entry_bytes(abi.MAP_CT6) == 128
