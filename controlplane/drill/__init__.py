"""Failover drills: silence one backend of a service inside a namespace testbed and measure, from
real packets, how fast the data path moves new flows off it, what was lost and what came late.
`edgectl drill failover --help`, or failover(cfg, Plan(...)) from Python (root).

plan (what to do, checked against the config), frames (scapy), capture (AF_PACKET, a child
process), analysis (pure), run (the testbed and the traffic), report (table, JSON, plot).
"""

from controlplane.drill.analysis import LATE_MARGIN_MS, Flow, HealthSeen, analyse, down_windows
from controlplane.drill.frames import build_frames, csum_replace16
from controlplane.drill.plan import (
    DEFAULT_DURATION_S,
    DEFAULT_RATE,
    FIRST_SPORT,
    MAX_FLOWS,
    MAX_RATE,
    MODES,
    DrillError,
    Plan,
    check_plan,
    pick_service,
    testbed_document,
    testbed_topo,
)
from controlplane.drill.report import T0_LABELS, build_report, format_table, require_matplotlib, write_json, write_plot
from controlplane.drill.run import failover

__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_RATE",
    "FIRST_SPORT",
    "LATE_MARGIN_MS",
    "MAX_FLOWS",
    "MAX_RATE",
    "MODES",
    "T0_LABELS",
    "DrillError",
    "Flow",
    "HealthSeen",
    "Plan",
    "analyse",
    "build_frames",
    "build_report",
    "check_plan",
    "csum_replace16",
    "down_windows",
    "failover",
    "format_table",
    "pick_service",
    "require_matplotlib",
    "testbed_document",
    "testbed_topo",
    "write_json",
    "write_plot",
]
