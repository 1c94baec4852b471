"""The journal that makes maps.apply() a transaction: tables that note the old value
of every entry written or deleted, so a failed apply can put each back (newest first)
and leave the maps byte-identical. Knows no map layout: it copies keys and values as
the ctypes objects bcc hands out, whatever their type."""

from __future__ import annotations

from typing import Callable, Mapping

from controlplane.undo import Undo


class Journal(Undo):
    """tables: the given tables, recording into this journal; table: the one written last.
    after_undo: table name -> what to call after each of its entries is put back."""

    def __init__(self, tables: Mapping[str, object], after_undo: Mapping[str, Callable[[], None]] | None = None):
        super().__init__()
        self.table = "?"
        self.after_undo = dict(after_undo or {})
        self.tables = {name: Recorded(name, t, self) for name, t in tables.items()}


class Recorded:
    """A table whose writes leave their undo in a journal; reads go straight through."""

    def __init__(self, name: str, t, journal: Journal):
        self._name, self._t, self._j = name, t, journal

    def __getattr__(self, attr):
        return getattr(self._t, attr)

    def __getitem__(self, key):
        return self._t[key]

    def __len__(self):
        return len(self._t)

    def _remember(self, key) -> None:
        key = type(key).from_buffer_copy(key)
        after = self._j.after_undo.get(self._name, lambda: None)
        try:
            old = self._t[key]
        except KeyError:
            self._j.push(f"{self._name}: remove a new key", lambda: (self._discard(key), after()))
        else:
            self._j.push(f"{self._name}: restore", lambda: (self._t.__setitem__(key, old), after()))
        self._j.table = self._name

    def _discard(self, key) -> None:
        try:
            del self._t[key]
        except KeyError:
            pass

    def __setitem__(self, key, value) -> None:
        self._remember(key)
        self._t[key] = value

    def __delitem__(self, key) -> None:
        self._remember(key)
        del self._t[key]
