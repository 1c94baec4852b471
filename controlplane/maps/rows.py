"""Array maps read whole at once for a walk (status's snapshot): Rows has the reading face of a
table (Key, Leaf, sLeaf, item get, getvalue, lookup_into, len) over values read in batches
(bpfmap.Map.rows, BPF_MAP_LOOKUP_BATCH), so the walk's helpers read them as they read a map.
At 10,000 backends a walk made about nine lookups a backend, each a system call with its
Python around it, holding edged's interpreter (tools/bench-probe --scale). Part of the maps
package."""

from __future__ import annotations

import ctypes

from controlplane.errors import MapError


class Rows:
    """Every value of array table t as it was when read."""

    def __init__(self, t) -> None:
        self.name = getattr(t, "name", "?")
        self.Key, self.Leaf = t.Key, t.Leaf
        if hasattr(t, "sLeaf"):
            self.sLeaf = t.sLeaf
        self.max_entries = len(t)
        # an array of a simple type (edge_inflight's s64) gives Python ints: handed out as Leaf, as a lookup does
        self._simple = issubclass(t.Leaf, ctypes._SimpleCData)
        read = getattr(t, "rows", None)
        # tables without batched reads (the tests' in-memory ones): a value at a time
        self._rows = read() if read is not None else [t.getvalue(t.Key(i)) for i in range(self.max_entries)]

    def __len__(self) -> int:
        return self.max_entries

    def __getitem__(self, key):
        i = key if isinstance(key, int) else key.value
        if not 0 <= i < self.max_entries:
            raise MapError(f"{self.name}: lookup {i}: Array index out of range", map=self.name)
        value = self._rows[i]
        return self.Leaf(value) if self._simple and not isinstance(value, self.Leaf) else value

    getvalue = __getitem__

    def lookup_into(self, key, address: int) -> None:
        ctypes.memmove(address, ctypes.addressof(self[key]), ctypes.sizeof(self.Leaf))
