"""README.md and docs/: the README stays an operator's entry point (what it is, then the two
commands, then the way in), and every relative link in README.md, CHANGELOG.md and docs/*.md
reaches a file that exists, and a heading there when it names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\[(?:[^\[\]]|\[\])*\]\(([^)\s]+)\)")  # link text may hold "[]" (services[])


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # --help blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_reaches_a_file_and_heading(page):
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.is_file(), f"{page.name}: {target} names no file"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: {target} names no heading of {dest.name}"


def test_the_readme_opens_with_what_it_is_then_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    first_heading = next(i for i, line in enumerate(lines) if line.startswith("## "))
    assert lines[first_heading] == "## Try it (root, fresh Debian 12)"
    assert "XDP" in " ".join(lines[:first_heading])
    commands = [line.strip() for line in lines[first_heading : first_heading + 20] if line.startswith("    ")]
    assert commands == ["sudo tools/demo", "sudo tools/test"]


def test_the_readme_stays_short_and_links_every_docs_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300, "README.md is the way in; reference text belongs in docs/"
    for page in (REPO / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"
    assert "(CHANGELOG.md)" in text
