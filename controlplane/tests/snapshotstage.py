"""A realistic edged snapshot (what Daemon.snapshot() hands the metrics exporter and status):
two services, backends in every health state, traffic counters (realistic_snapshot); for
test_metrics.py and test_statusview.py.
"""

from __future__ import annotations

from controlplane import abi


def _probe(config_weight: int, **fields) -> dict:
    """One backend's edge_be_probe entry as maps.read_probe() gives it."""
    out = {
        "updated_ns": 5_000_000_000,
        "config_weight": config_weight,
        "rtt_p50_us": 0,
        "rtt_p99_us": 0,
        "rtt_smoothed_us": 0,
        "waiting": None,
        "running": None,
        "kv_permille": None,
        "probes_ok": 0,
        "probes_failed": 0,
        "flags": 0,
        "override_weight": 0,
        "state": "",
        "reason": "",
    }
    out.update(fields)
    return out


def _health(usable: bool, state: str, heartbeat_age_s: float | None, heartbeat: bool = True) -> dict:
    return {
        "state": state,
        "usable": usable,
        "heartbeat": heartbeat,
        "heartbeat_age_s": heartbeat_age_s,
        "rise_count": 3 if usable else 0,
        "heartbeat_seq": 1234,
        "passive": False,
        "ejected_for_s": 0.0,
        "ejections": 0,
        "syn_outstanding": 0,
    }


def _traffic(packets: int, bytes_: int, new_flows: int, return_packets: int, failovers: int) -> dict:
    return {
        "packets": packets,
        "bytes": bytes_,
        "new_flows": new_flows,
        "return_packets": return_packets,
        "failovers": failovers,
    }


def _edged(**fields) -> dict:
    out = {
        "rtt_p50_s": None,
        "rtt_p99_s": None,
        "rtt_smoothed_s": None,
        "waiting": None,
        "running": None,
        "kv_usage": None,
        "hung": None,
        "weight": None,
        "config_weight": None,
        "state": "",
        "probes_ok": 0,
        "probes_failed": 0,
    }
    out.update(fields)
    return out


def _counts(verdicts: dict | None = None, drops: dict | None = None) -> dict:
    """A slot of edge_svc_counts as the snapshot shows it: every name, zero unless given."""
    return {
        "verdicts": {n: (verdicts or {}).get(n, 0) for n in abi.CNT_NAMES.values()},
        "drops": {n: (drops or {}).get(n, 0) for n in abi.DROP_NAMES.values()},
    }


def with_node_counts(snap: dict) -> dict:
    """snap with the node's verdicts and drops: its services' and no_service's, summed."""
    slots = [snap["no_service"], *snap["services"]]
    for kind in ("verdicts", "drops"):
        snap[kind] = {n: sum(c[kind][n] for c in slots) for n in slots[0][kind]}
    return snap


def realistic_snapshot() -> dict:
    """One node: llama-70b on two H100 boxes and a standby (heartbeats, probes
    and load signals), and an embedding service with static weights and no
    health checks. h100-b's heartbeats stopped and its metrics endpoint never
    answered, so its load signals are unknown."""
    llama = [
        {
            "id": 0,
            "name": "h100-a",
            "address": "198.18.1.2",
            "port": 8000,
            "weight": 700,
            "standby": False,
            "state": "up",
            "health": _health(True, "up", 0.0042),
            "slots": 45875,
            "probe": _probe(
                1,
                rtt_p50_us=850,
                rtt_p99_us=2100,
                rtt_smoothed_us=900,
                waiting=3,
                running=12,
                kv_permille=625,
                probes_ok=1500,
                probes_failed=2,
                state="up",
            ),
            **_traffic(120_000, 96_000_000, 800, 110_000, 0),
            "edged": _edged(
                rtt_p50_s=0.00085,
                rtt_p99_s=0.0021,
                rtt_smoothed_s=0.0009,
                waiting=3.0,
                running=12.0,
                kv_usage=0.625,
                hung=False,
                weight=700,
                config_weight=1,
                state="up",
                probes_ok=1500,
                probes_failed=2,
                probe_relaxed=True,
                probe_interval_s=1.0,
            ),
        },
        {
            "id": 1,
            "name": "h100-b",
            "address": "198.18.2.2",
            "port": 8000,
            "weight": 300,
            "standby": False,
            "state": "down",
            "health": _health(False, "down", None),
            "slots": 19662,
            "probe": _probe(1, probes_ok=40, probes_failed=310, state="down", reason="3 probes failed"),
            **_traffic(50_000, 41_000_000, 350, 47_000, 0),
            "edged": _edged(
                config_weight=1,
                weight=300,
                state="down",
                probes_ok=40,
                probes_failed=310,
                probe_relaxed=False,
                probe_interval_s=0.1,
            ),
        },
        {
            "id": 2,
            "name": "h100-spare",
            "address": "198.18.3.2",
            "port": 8000,
            "weight": 1,
            "standby": True,
            "state": "up",
            "health": _health(True, "up", 0.0971),
            "slots": 0,
            "probe": _probe(1, state="up"),
            **_traffic(900, 700_000, 12, 850, 12),
            "edged": _edged(config_weight=1, weight=1, state="up", hung=True, waiting=0.0, running=4.0),
        },
    ]
    embed = [
        {
            "id": 3,
            "name": "l4-0",
            "address": "198.18.4.2",
            "port": 9000,
            "weight": 2,
            "standby": False,
            "state": "up",
            "health": _health(True, "up", None, heartbeat=False),
            "slots": 1009,
            "probe": _probe(2),
            **_traffic(3_000, 2_500_000, 40, 2_900, 0),
        },
    ]
    return with_node_counts(
        {
            "node": {
                "maglev_m": 65537,
                "max_services": 16,
                "max_backends": 1024,
                "ct_size": 262144,
                "ingress_ifindex": 4,
                "xdp_flags": 2,
                "ip_forward_was": 0,
                "return_ifindex": [5, 6],
                "return_clsact_added": [True, True],
            },
            "services": [
                {
                    "name": "llama-70b",
                    "id": 0,
                    "vip": "198.18.0.10",
                    "port": 8000,
                    "protocol": "tcp",
                    "table": 1,
                    "existing_flows": "reselect",
                    **_traffic(170_900, 137_700_000, 1162, 157_850, 12),
                    **_counts(
                        verdicts={
                            "redirect": 170_900,
                            "drop": 4,
                            "return_nat": 157_850,
                            "return_redirect": 157_800,
                            "stateless": 30,
                            "return_stateless": 25,
                            "icmp_to_backend": 3,
                            "icmp_return": 1,
                        },
                        drops={"no_backend": 4},
                    ),
                    "backends": llama,
                },
                {
                    "name": "embed",
                    "id": 1,
                    "vip": "198.18.0.11",
                    "port": 9000,
                    "protocol": "tcp",
                    "table": 0,
                    "existing_flows": "keep",
                    **_traffic(3_000, 2_500_000, 40, 2_900, 0),
                    **_counts(verdicts={"redirect": 3_000, "return_nat": 2_900, "return_redirect": 2_900}),
                    "backends": embed,
                },
            ],
            "no_service": _counts(
                verdicts={"pass": 90, "drop": 3, "heartbeat": 52_000, "icmp_echo": 2},
                drops={"malformed": 2, "fragment": 1},
            ),
            "conntrack_entries": None,
            "half_open_entries": None,
        }
    )
