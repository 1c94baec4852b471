"""A compile error in bpf/ is reported with its real file and line (the loader's #line
markers), not a line of the amalgamated unit bcc compiles. Needs root and bcc (bcc compiles)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from controlplane import loader
from controlplane.errors import CompileError


def test_a_deliberate_error_in_a_header_names_that_header_and_line(tmp_path: Path) -> None:
    bpf = tmp_path / "bpf"
    shutil.copytree(loader.BPF_DIR, bpf)
    header = bpf / "include" / "select.h"
    lines = header.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("#define EDGE_TO_NEXT_STAGE"))
    lines.insert(at + 1, "int edge_broken = no_such_symbol;\n")  # now line at + 2
    header.write_text("".join(lines))
    with pytest.raises(CompileError) as failed:
        loader.compile_datapath(tmp_path / "pins", loader.Params(), text=loader.source_text(bpf))
    message = str(failed.value)
    assert f"bpf/include/select.h:{at + 2}:" in message, message
    assert "no_such_symbol" in message, message
