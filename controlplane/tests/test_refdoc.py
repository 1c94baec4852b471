"""docs/'s reference parts against the code: the config reference against config.py's schema,
the metrics list against what edged's exporter really serves, every --help against the argparse
definitions (controlplane/refdoc.py makes them; `python -m controlplane.refdoc --write`)."""

from __future__ import annotations

import dataclasses
import re
import typing
import urllib.request
from pathlib import Path

import pytest

from controlplane import refdoc
from controlplane.config import Config
from controlplane.edged import metrics, metricsserver
from controlplane.tests.snapshotstage import realistic_snapshot

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", sorted(refdoc.PARTS))
def test_the_generated_part_of_each_page_is_what_the_code_gives(name):
    page, _ = refdoc.PARTS[name]
    text = (DOCS / page).read_text()
    assert refdoc.render(name, text) == text, f"docs/{page} is stale: run python -m controlplane.refdoc --write"


def declared_keys(cls: type = Config, prefix: str = "") -> set[str]:
    """Every key path config.py declares (dataclasses.fields from Config down), e.g. services[].health.probe.kind."""
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        hint = hints[f.name]
        inner = [a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)]
        if inner:
            is_list = typing.get_origin(hint) is tuple
            keys |= declared_keys(inner[0], f"{prefix}{f.name}[]." if is_list else f"{prefix}{f.name}.")
    return keys


class Source:
    """A data path's snapshot as maps.snapshot() gives it: two services, every health state."""

    def snapshot(self) -> dict:
        return realistic_snapshot()


def _documented_keys() -> set[str]:
    """Every key path the configuration reference has a row for, e.g. services[].health.probe.kind."""
    keys, prefix = set(), None  # prefix: None before the first section heading
    for line in (DOCS / "configuration.md").read_text().splitlines():
        heading = re.fullmatch(r"### (?:`([^`]+)`|top level)", line)
        if heading:
            prefix = f"{heading.group(1)}." if heading.group(1) else ""
            continue
        row = re.match(r"\| `([a-z_0-9]+)` \|", line)
        if row and prefix is not None:
            keys.add(prefix + row.group(1))
    return keys


def test_the_configuration_reference_has_every_key_of_the_schema_and_no_other():
    assert _documented_keys() == declared_keys()


def test_the_metrics_page_lists_exactly_what_the_exporter_serves():
    collector = metrics.EdgeCollector(Source(), iface="eth1", serving=lambda: True)
    server = metricsserver.start_http("127.0.0.1:0", metrics.make_registry(collector, process=False))
    try:
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        server.close()
    served = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE edge_")}
    page = (DOCS / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(edge_[a-z_]+)` \|", page, re.M))
    assert served == documented
    assert len(served) >= 36


def test_render_replaces_only_between_the_markers_and_refuses_a_page_without_them():
    page = "before\n<!-- BEGIN GENERATED: metrics (x) -->\nSTALE-TEXT\n<!-- END GENERATED: metrics -->\nafter\n"
    out = refdoc.render("metrics", page)
    assert out.startswith("before\n<!-- BEGIN GENERATED: metrics (x) -->\n\n| metric |")
    assert out.endswith("\n<!-- END GENERATED: metrics -->\nafter\n") and "STALE-TEXT" not in out
    with pytest.raises(ValueError, match="no BEGIN/END GENERATED: metrics markers"):
        refdoc.render("metrics", "nothing here\n")


def test_the_cli_reference_does_not_depend_on_the_terminal_or_the_environment(monkeypatch):
    plain = refdoc.cli_reference()
    monkeypatch.setenv("COLUMNS", "41")
    monkeypatch.setenv("EDGE_API_SOCKET", "/elsewhere/edged.sock")
    assert refdoc.cli_reference() == plain
    assert "/elsewhere" not in plain and "### `edgectl drill failover`" in plain
