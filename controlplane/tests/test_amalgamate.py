"""loader.source_text(): the one compilation unit bcc gets, our headers pasted in. Every line
must be traceable to its real file and line through the #line markers, so that compiler errors
name bpf/include/select.h:42 and not a line of a 3,000-line blob. No root, no bcc."""

from __future__ import annotations

import re
from pathlib import Path

from controlplane import loader

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r'^#line (\d+) "([^"]+)"$')
ALREADY = re.compile(r"^/\* (\S+) already included \*/$")


def origins(text: str) -> list[tuple[str, int, str]]:
    """(file, line, text) of every line of text that is not a #line marker, as a compiler sees it."""
    out, where, no = [], None, 0
    for line in text.splitlines():
        marker = LINE.match(line)
        if marker:
            no, where = int(marker.group(1)), marker.group(2)
            continue
        assert where is not None, f"a line before the first #line marker: {line!r}"
        out.append((where, no, line))
        no += 1
    return out


def test_every_line_of_the_unit_is_the_line_its_marker_names():
    seen_files = set()
    for name, no, line in origins(loader.source_text()):
        real = (REPO / name).read_text().splitlines()[no - 1]
        seen_files.add(name)
        if ALREADY.match(line):
            assert re.match(r'^#include\s+"', real), f"{name}:{no}: {real!r} replaced by {line!r}"
            continue
        assert line == real, f"{name}:{no}: the unit says {line!r}, the file {real!r}"
    headers = {f"bpf/include/{p.name}" for p in (REPO / "bpf" / "include").glob("*.h")}
    assert {"bpf/edge_xdp.c", "bpf/edge_tc.c"} | headers <= seen_files


def test_names_are_relative_to_the_repository_and_each_header_is_pasted_once():
    text = loader.source_text()
    names = [m.group(2) for m in map(LINE.match, text.splitlines()) if m]
    assert all(not n.startswith("/") for n in names)
    starts = [line for line in text.splitlines() if line == '#line 1 "bpf/include/select.h"']
    assert len(starts) == 1
    assert not re.search(r'^#include\s+"', text, re.M)  # only system headers stay includes


def test_a_file_without_final_newline_still_ends_its_line(tmp_path: Path):
    bpf = tmp_path / "bpf"
    (bpf / "include").mkdir(parents=True)
    (bpf / "include" / "a.h").write_text("int a;")  # no newline at the end
    (bpf / "main.c").write_text('#include "include/a.h"\nint b;\n')
    text = loader._amalgamate(bpf / "main.c", set(), bpf)
    assert text.splitlines() == [
        '#line 1 "bpf/main.c"',
        '#line 1 "bpf/include/a.h"',
        "int a;",
        '#line 2 "bpf/main.c"',
        "int b;",
    ]
