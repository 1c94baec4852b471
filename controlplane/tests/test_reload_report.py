"""What a reload says it changed (edged's summary, controlplane/configdiff.py): nothing for an
unchanged config, weight changes listed, a VIP move named; run on the real Daemon over the
in-memory maps of test_edged_loop."""

from __future__ import annotations

import asyncio
import copy

import yaml

from controlplane import configdiff
from controlplane.config import parse_config
from controlplane.tests.edgedstage import config, daemon, doc, edged


def reloaded(new_doc: dict, monkeypatch) -> dict:
    monkeypatch.setattr(
        edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )

    async def go():
        d = daemon(config(("b0", "b1")))
        return await d.reload(yaml.safe_dump(new_doc))

    return asyncio.run(go())


def test_an_unchanged_config_reloads_with_no_changes(monkeypatch):
    summary = reloaded(doc(("b0", "b1")), monkeypatch)
    assert not any(summary.values()), summary  # said "services updated: web" before


def test_weight_changes_are_listed(monkeypatch):
    new = doc(("b0", "b1"))
    new["services"][0]["backends"][1]["weight"] = 300
    summary = reloaded(new, monkeypatch)
    assert summary["weights"] == ["web/b1 100 -> 300"]
    assert summary["updated_services"] == [] and summary["added_backends"] == []


def test_a_moved_vip_and_a_new_backend_are_named(monkeypatch):
    new = doc(("b0", "b1", "b2"))
    new["services"][0]["vip"] = "198.18.0.11"
    summary = reloaded(new, monkeypatch)
    assert summary["updated_services"] == ["web: vip 198.18.0.10:8000/tcp -> 198.18.0.11:8000/tcp"]
    assert summary["added_backends"] == ["web/b2"]


def test_the_diff_of_a_config_against_itself_is_empty_and_describes_each_change():
    old = config(("b0", "b1"))
    assert not configdiff.changed(configdiff.diff(configdiff.shape_of_config(old), configdiff.shape_of_config(old)))
    d = copy.deepcopy(doc(("b0", "b2")))
    d["services"][0]["backends"][0]["weight"] = 5
    got = configdiff.diff(configdiff.shape_of_config(old), configdiff.shape_of_config(parse_config(d)))
    assert configdiff.describe(got) == [
        "backends added: web/b2",
        "backends removed: web/b1",
        "weights: web/b0 100 -> 5",
    ]


def test_an_operator_drain_and_pin_outlive_a_reload_under_the_static_policy(monkeypatch):
    """A reload wrote the configured weights and edged, believing its pushed weights were still
    in the table, never pushed the drain again: the drained backend got new flows."""
    monkeypatch.setattr(
        edged.deploy, "backend_routes", lambda cfg: {b.address: 1 for s in cfg.services for b in s.backends}
    )

    async def go():
        d = daemon(config(("b0", "b1", "b2"), policy="static"))
        d.operations.drain("web", "b1")
        d.operations.set_override("web", "b2", 7)
        assert d.state.maps.weights("web") == {"b0": 100, "b1": 0, "b2": 7}
        new = doc(("b0", "b1", "b2"), policy="static")
        new["services"][0]["backends"][0]["weight"] = 300
        seen = []
        for _ in range(2):  # a change, then the same file again; no step of the loop in between
            await d.reload(yaml.safe_dump(new))
            seen.append(d.state.maps.weights("web"))
        return seen

    assert asyncio.run(go()) == [{"b0": 300, "b1": 0, "b2": 7}] * 2
