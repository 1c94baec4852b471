"""The ctypes types of every pinned map's key and value, read from the C itself: the structs
of bpf/include/abi.h and the BPF_TABLE_PINNED lines of bpf/include/maps.h, so no layout is
written twice (the types are the ones bcc generates from the same headers; a test compares
them field by field, another the sizes with abi.h's _Static_asserts). What opens a pinned map
without bcc (controlplane/bpfmap.py) takes its types from here. Pure text work and ctypes."""

from __future__ import annotations

import ast
import ctypes as ct
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from controlplane.bpfsource import BPF_DIR

SCALARS = {
    "__u8": ct.c_ubyte,
    "__u16": ct.c_ushort,
    "__u32": ct.c_uint,
    "__u64": ct.c_ulonglong,
    "__s64": ct.c_longlong,
    "__be16": ct.c_ushort,
    "__be32": ct.c_uint,
    "__be64": ct.c_ulonglong,
    "char": ct.c_char,
}
_STRUCT = re.compile(r"^struct (\w+) \{(.*?)^\};", re.M | re.S)
_FIELD = re.compile(r"^\s*(struct\s+\w+|\w+)\s+(\w+)(?:\[(\w+)\])?;", re.M)
_TABLE = re.compile(r'BPF_TABLE_PINNED\(\s*"(\w+)",\s*([^,]+?),\s*([^,]+?),\s*(\w+),\s*([^,]+?),', re.S)
_DEFINE = re.compile(r"#define\s+(EDGE_\w+)\s+(0x[0-9a-fA-F]+|\d+)\b")


@dataclass(frozen=True)
class Layout:
    """One pinned map: its kind as maps.h names it (hash, array, lru_hash, percpu_array, prog),
    its key and value types (the value of one CPU for a per-CPU map), and its size expression."""

    kind: str
    key: type
    value: type
    size: str

    @property
    def array(self) -> bool:
        return "array" in self.kind or self.kind == "prog"

    @property
    def percpu(self) -> bool:
        return self.kind.startswith("percpu")


def _include(name: str, include: Path | None) -> str:
    return ((include or BPF_DIR / "include") / name).read_text()


@functools.lru_cache(maxsize=None)
def defines(include: Path | None = None) -> dict[str, int]:
    """abi.h's integer #defines (EDGE_*)."""
    return {n: int(v, 0) for n, v in _DEFINE.findall(_include("abi.h", include))}


@functools.lru_cache(maxsize=None)
def structs(include: Path | None = None) -> dict[str, type]:
    """Every struct of abi.h as a ctypes Structure (natural alignment, as the C compiler lays
    it out); a struct used as a field must be declared before it, as C requires."""
    consts = defines(include)
    out: dict[str, type] = {}
    for name, body in _STRUCT.findall(_include("abi.h", include)):
        fields = []
        for ctype, fname, dim in _FIELD.findall(re.sub(r"/\*.*?\*/", "", body, flags=re.S)):
            t = out[ctype.split()[1]] if ctype.startswith("struct") else SCALARS[ctype]
            if dim:
                t = t * (consts[dim] if dim in consts else int(dim))
            fields.append((fname, t))
        out[name] = type(name, (ct.Structure,), {"_fields_": fields})
    return out


def _ctype(decl: str, found: dict[str, type]) -> type:
    decl = decl.strip()
    return found[decl.split()[1]] if decl.startswith("struct ") else SCALARS[decl]


@functools.lru_cache(maxsize=None)
def layouts(include: Path | None = None) -> dict[str, Layout]:
    """Map name -> its Layout, for every BPF_TABLE_PINNED of maps.h."""
    found = structs(include)
    return {
        name: Layout(kind, _ctype(key, found), _ctype(value, found), " ".join(size.split()))
        for kind, key, value, name, size in _TABLE.findall(_include("maps.h", include))
    }


def entries(layout: Layout, sizes: dict[str, int], include: Path | None = None) -> int:
    """max_entries of a map from its size expression (EDGE_* names and numbers joined by + and *,
    in parentheses or not); sizes: the loader's -D sizes (EDGE_MAGLEV_M, ...)."""
    known = {**defines(include), **sizes}
    return _value(ast.parse(layout.size, mode="eval").body, known, layout.size)


def _value(node: ast.AST, known: dict[str, int], text: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _value(node.left, known, text), _value(node.right, known, text)
        return left + right if isinstance(node.op, ast.Add) else left * right
    raise ValueError(f"maps.h: a map size this reader cannot work out: {text}")
