"""The generated parts of docs/: the config reference (from config.py's schema), the metrics
list (from edged/metricspecs.py's METRICS) and every command's --help (from the argparse
definitions). Each docs page holds its part between BEGIN/END GENERATED markers;
`python -m controlplane.refdoc --write` rewrites them (without --write it says which differ), and
controlplane/tests/test_refdoc.py fails when a page and the code disagree. Pure text work."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import sys
import typing
from contextlib import contextmanager
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Callable, Iterator

DOCS = Path(__file__).resolve().parent.parent / "docs"
HELP_COLUMNS = 100  # argparse wraps --help to the terminal; the docs get this width
# --help shows defaults read from these at parser build time; the docs show the built-in ones.
HELP_ENV = ("EDGE_API_SOCKET", "EDGE_PIN_DIR", "EDGE_CONFIG")


# ---- configuration.md: every key of config.py, section by section ----


def section_class(hint: Any) -> type | None:
    """The dataclass a field's type holds: Heartbeat for Optional[Heartbeat] or tuple[Backend, ...]."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        found = section_class(arg)
        if found is not None:
            return found
    return None


def _show_default(f: dataclasses.Field) -> str:
    """A key's default as the reference shows it."""
    if f.metadata.get("required"):
        return "required"
    value = f.default
    if value is None:
        return "absent"
    if dataclasses.is_dataclass(value):
        return "defaults"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == ():
        return "`[]`"
    if isinstance(value, (int, str, IPv4Address)):
        return f"`{value}`"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _config_sections(cls: type, path: str) -> Iterator[tuple[str, type]]:
    """(path, dataclass) of cls and every section below it, depth first in declaration order."""
    yield path, cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = section_class(hints[f.name])
        if section is None:
            continue
        is_list = typing.get_origin(hints[f.name]) is tuple
        where = f"{path}.{f.name}" if path else f.name
        yield from _config_sections(section, f"{where}[]" if is_list else where)


def _section_link(path: str) -> str:
    """A link to the section's heading (GitHub's anchors: lower case, punctuation dropped)."""
    return f"[`{path}`](#{re.sub(r'[^a-z0-9_-]', '', path.lower())})"


def _config_table(cls: type, path: str) -> list[str]:
    title = f"`{path}`" if path else "top level"
    lines = [f"### {title}", "", _cell(cls.__doc__ or ""), "", "| key | default | meaning |", "|---|---|---|"]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meaning = _cell(f.metadata["help"])
        if section_class(hints[f.name]) is not None:
            where = f"{path}.{f.name}" if path else f.name
            where += "[]" if typing.get_origin(hints[f.name]) is tuple else ""
            meaning += f" (see {_section_link(where)})"
        lines.append(f"| `{f.name}` | {_show_default(f)} | {meaning} |")
    return lines + [""]


def config_reference() -> str:
    from controlplane.config import Config

    lines: list[str] = []
    for path, cls in _config_sections(Config, ""):
        lines += _config_table(cls, path)
    return "\n".join(lines).rstrip("\n") + "\n"


# ---- metrics.md: every family edged exports ----


def metrics_reference() -> str:
    from controlplane import abi
    from controlplane.edged.metricspecs import METRICS

    lines = ["| metric | kind | labels | meaning |", "|---|---|---|---|"]
    for spec in METRICS:
        labels = ", ".join(spec.labels) or "-"
        lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {_cell(spec.doc)} |")
    lines += [
        "",
        "Values of `reason` (`edge_drops_total`): " + ", ".join(f"`{n}`" for n in abi.DROP_NAMES.values()) + ".",
        "",
        "Values of `verdict` (`edge_verdicts_total`): " + ", ".join(f"`{n}`" for n in abi.CNT_NAMES.values()) + ".",
    ]
    return "\n".join(lines) + "\n"


# ---- cli.md: every command's --help ----


@contextmanager
def _help_environment() -> Iterator[None]:
    """A fixed terminal width and no EDGE_* overrides while parsers are built and formatted."""
    saved = {name: os.environ.get(name) for name in ("COLUMNS", *HELP_ENV)}
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    for name in HELP_ENV:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """parser and every subcommand's parser below it, in the order --help lists them."""
    yield parser
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _subparsers(sub)


def _parsers() -> list[Callable[[], argparse.ArgumentParser]]:
    from controlplane import cli
    from controlplane.edged import cli as edged_cli

    agent_options = importlib.import_module("controlplane.agent.options")  # the package's options() hides it
    return [cli.build_parser, edged_cli.parser, agent_options.parser]


def cli_reference() -> str:
    lines: list[str] = []
    with _help_environment():
        for build in _parsers():
            for parser in _subparsers(build()):
                lines += [f"### `{parser.prog}`", "", "```", parser.format_help().rstrip(), "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# ---- the pages ----

PARTS = {  # name in the markers: (page under docs/, generator)
    "config": ("configuration.md", config_reference),
    "metrics": ("metrics.md", metrics_reference),
    "cli": ("cli.md", cli_reference),
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN GENERATED: {name} [^\n]*-->\n)(.*?)(<!-- END GENERATED: {name} -->)", re.S)


def render(name: str, page: str) -> str:
    """page with its generated part `name` made again; ValueError when it has no markers."""
    pattern = _block(name)
    if not pattern.search(page):
        raise ValueError(f"no BEGIN/END GENERATED: {name} markers")
    text = PARTS[name][1]()
    return pattern.sub(lambda m: m.group(1) + "\n" + text + "\n" + m.group(3), page, count=1)


def stale(docs: Path = DOCS) -> list[str]:
    """The pages whose generated part differs from what the code gives."""
    out = []
    for name, (page, _) in PARTS.items():
        path = docs / page
        if render(name, path.read_text()) != path.read_text():
            out.append(str(path.relative_to(docs.parent)))
    return out


def write(docs: Path = DOCS) -> list[str]:
    """Rewrites the generated parts; returns the pages that changed."""
    changed = stale(docs)
    for name, (page, _) in PARTS.items():
        path = docs / page
        path.write_text(render(name, path.read_text()))
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controlplane.refdoc", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the generated parts of docs/")
    args = p.parse_args(argv)
    if args.write:
        for page in write():
            print(f"refdoc: rewrote {page}")
        return 0
    pages = stale()
    for page in pages:
        print(f"refdoc: {page} differs from the code; run python -m controlplane.refdoc --write", file=sys.stderr)
    return 1 if pages else 0


if __name__ == "__main__":
    sys.exit(main())
