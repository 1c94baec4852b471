"""What `edgectl status` prints of adaptive probing: each backend's probe interval now, marked
relaxed while real traffic measures the backend (edged's view; '-' without it)."""

from __future__ import annotations

from controlplane import statusview
from controlplane.tests.snapshotstage import realistic_snapshot


def _row(out: str, backend: str) -> str:
    (line,) = [line for line in out.splitlines() if line.strip().startswith(backend + " ")]
    return line


def test_the_backend_table_shows_the_probe_interval_and_relaxed_probes(capsys):
    snap = {
        **realistic_snapshot(),
        "iface": "eth1",
        "instance": "eth1-4026531840",
        "return_ifaces": ["eth2"],
        "xdp": {"attached": True, "mode": "native", "prog_id": 42},
    }
    llama = snap["services"][0]["backends"]
    llama[0]["edged"].update(probe_relaxed=True, probe_interval_s=1.0)
    llama[1]["edged"].update(probe_relaxed=False, probe_interval_s=0.1)

    statusview.print_status(snap)
    out = capsys.readouterr().out

    header = [line for line in out.splitlines() if "probe every" in line]
    assert len(header) == 2, out  # one table per service
    assert "1s relaxed" in _row(out, "h100-a")
    assert "100ms" in _row(out, "h100-b") and "relaxed" not in _row(out, "h100-b")


def test_probe_every_without_edged_or_without_a_probe_is_a_dash():
    assert statusview.fmt_probe_every({}) == "-"  # read from the pinned maps: no edged view
    assert statusview.fmt_probe_every({"edged": {"probe_interval_s": None, "probe_relaxed": None}}) == "-"
    assert statusview.fmt_probe_every({"edged": {"probe_interval_s": 2.5, "probe_relaxed": True}}) == "2.5s relaxed"
    assert statusview.fmt_probe_every({"edged": {"probe_interval_s": 0.02, "probe_relaxed": False}}) == "20ms"


def test_each_service_shows_its_drop_reasons_and_the_node_those_before_a_service(capsys):
    snap = {
        **realistic_snapshot(),
        "iface": "eth1",
        "instance": "eth1-4026531840",
        "return_ifaces": ["eth2"],
        "xdp": {"attached": True, "mode": "native", "prog_id": 42},
    }
    snap["services"][0]["drops"]["untracked"] = 1500

    statusview.print_status(snap)
    lines = capsys.readouterr().out.splitlines()

    def under(service: str) -> str:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"service {service} "))
        return lines[at + 1].strip()

    assert under("llama-70b") == "drops: untracked 1.5k, no_backend 4"  # most first
    assert under("embed") == "drops: none"
    assert "  drops before a service was known: malformed 2, fragment 1" in lines


def test_the_conntrack_line_shows_half_open_entries_apart():
    from controlplane import statuspage

    line = statuspage.fmt_conntrack({"conntrack_entries": 30, "half_open_entries": 1024})
    assert line == "   conntrack entries: 30 (+ 1024 half-open)"
    assert statuspage.fmt_conntrack({"conntrack_entries": 30}) == "   conntrack entries: 30"
