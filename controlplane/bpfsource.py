"""The C the data path is compiled from: bpf/'s programs as the one compilation unit bcc
gets, our headers pasted in with #line markers; and where bpf/ is (a checkout's top level, or
the package data of an installed wheel). Pure text work, no bcc (loader.py compiles)."""

from __future__ import annotations

import re
from pathlib import Path

SOURCES = ("edge_xdp.c", "edge_tc.c", "edge_reply.c")


def _bpf_dir(package: Path) -> Path:
    """Where bpf/ is: package data of an installed wheel (controlplane/bpf/, setup.py puts it
    there), else the checkout's top-level bpf/ beside the package (a checkout, an editable install)."""
    shipped = package / "bpf"
    return shipped if (shipped / SOURCES[0]).is_file() else package.parent / "bpf"


BPF_DIR = _bpf_dir(Path(__file__).resolve().parent)
_INCLUDE = re.compile(r'^#include\s+"([^"]+)"\s*$', re.M)


def _amalgamate(path: Path, seen: set[Path], top: Path = BPF_DIR) -> str:
    """path with our own headers pasted in (bcc rewrites map helpers, map.lookup(), only in
    its main file); their include guards stay in force. #line markers name every line's
    real file (relative to top's parent: bpf/include/select.h) and line, so compiler errors
    point there; a header pasted once already becomes a comment on the same line."""
    name = path.resolve().relative_to(top.resolve().parent)
    out = [f'#line 1 "{name}"\n']
    for no, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        match = _INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        inc = (path.parent / match.group(1)).resolve()
        if inc in seen:
            out.append(f"/* {match.group(1)} already included */\n")
            continue
        seen.add(inc)
        out.append(_amalgamate(inc, seen, top))
        out.append(f'#line {no + 1} "{name}"\n')
    text = "".join(out)
    return text if text.endswith("\n") else text + "\n"


def source_text(bpf_dir: Path = BPF_DIR) -> str:
    """The one compilation unit bcc gets: SOURCES of bpf_dir, headers pasted in."""
    seen: set[Path] = set()
    return "".join(_amalgamate(bpf_dir / name, seen, bpf_dir) for name in SOURCES)
