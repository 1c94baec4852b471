"""tools/bench-datapath's report: the environment it ran in and the tables it prints from its
results (a dict, also what --json writes). Standard library only; it measures nothing.
"""

from __future__ import annotations

import platform
from pathlib import Path

TARGETS6_KEYS = ("established6", "new_flow6", "reply6_xdp", "reply6")  # the IPv6 summary line, against (e6) ...


def environment(cpu: int) -> dict:
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    models = [
        line.split(":", 1)[1].strip()
        for line in (read("/proc/cpuinfo") or "").splitlines()
        if line.startswith("model name")
    ]
    return {
        "kernel": platform.release(),
        "cpu_model": models[0] if models else None,
        "cpu": cpu,
        "bpf_jit_enable": read("/proc/sys/net/core/bpf_jit_enable"),
        "bpf_stats_enabled": read("/proc/sys/kernel/bpf_stats_enabled"),
    }


def print_table(out: dict) -> None:
    env, params = out["env"], out["params"]
    jit = {"0": "off", "1": "on", "2": "on (debug)"}.get(env["bpf_jit_enable"], env["bpf_jit_enable"])
    print(
        f"bench-datapath: XDP ingress, XDP and tc replies through BPF_PROG_TEST_RUN; kernel {env['kernel']}, "
        f"{env['cpu_model'] or 'unknown CPU'}, CPU {env['cpu']}, JIT {jit}"
    )
    if env["bpf_stats_enabled"] not in (None, "0"):
        print("  warning: kernel.bpf_stats_enabled=1 adds two clock reads to every run")
    print(
        f"  {params['frame_len']}-byte TCP frames, {params['rounds']} rounds x {params['repeat']:,} "
        f"repetitions per case ({params['repeat_new']:,} for (b), (f)), median of the rounds;"
    )
    print("  a ratio is the median of the rounds' ratios (case and floor of one round, seconds apart)")
    for ct_type, run in out["ct_types"].items():
        print_variant(ct_type, params, run)
    print("  ns/pkt = raw - wrapper: the kernel's mean per repetition minus that of a program that")
    print("  only restores the same headers (for (b), (f) also the same per-repetition 5-tuple change).")
    print()
    print(
        "  summary    "
        + "".join(
            f" {name:>11} {floor:>6}  ratio"
            for name, floor in (("established", "(e)"), ("new flow", "(f)"), ("reply XDP", "(j)"), ("reply tc", "(h)"))
        )
    )
    for ct_type, run in out["ct_types"].items():
        c, r = run["results"]["cases"], run["results"]["ratios"]
        for family, keys in (("", ("established", "new_flow", "reply_xdp", "reply")), (" v6", TARGETS6_KEYS)):
            if keys[0] not in r:
                continue
            print(
                f"  {ct_type + family:<11}"
                + "".join(
                    f" {c[key]['ns_per_packet']:>11.1f} {c[r[key]['floor']]['ns_per_packet']:>6.1f} {r[key]['value']:>5.2f}x"
                    for key in keys
                )
            )


def print_variant(ct_type: str, params: dict, run: dict) -> None:
    res, checks, measured = run["results"], run["checks"], run["measured"]
    print()
    full = measured["conntrack_full_in_round"]
    ct = f"conntrack {ct_type} ({run['ct_flags']}), {params['ct_size']:,} entries"
    if "half_open_size" in params:  # new flows' SYNs go into the half-open table: that is what fills
        ct += f", half-open {params['half_open_size']:,}"
    ct += f", full from round {full} on: inserts then evict" if full else ", never full"
    print(f"  Maglev M={params['maglev_m']}, {params['backends']} backends, health {params['health']}, {ct}")
    rows = [("case", "ns/pkt", "raw", "wrapper", "raw min..max")]
    for key in (
        "established",
        "new_flow",
        "failover",
        "pass",
        "reference",
        "floor",
        "floor_new",
        "new_flow_room",
        "reply_xdp",
        "reply_xdp_floor",
        "reply",
        "reply_floor",
        "hb_mac",
        "established6",
        "new_flow6",
        "floor6",
        "floor6_new",
        "reply6_xdp",
        "reply6_xdp_floor",
        "reply6",
        "reply6_floor",
    ):
        if key not in res["cases"]:
            continue
        r = res["cases"][key]
        rows.append(
            (
                r["label"],
                f"{r['ns_per_packet']:.1f}",
                f"{r['raw_ns_per_packet']:.1f}",
                f"{r['wrapper_ns_per_packet']:.1f}",
                f"{min(r['samples_raw_ns'])}..{max(r['samples_raw_ns'])}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + row[0].ljust(widths[0]) + "".join(f"  {c:>{w}}" for c, w in zip(row[1:], widths[1:])))
    for key, name in (
        ("established", "(a)/(e) established"),
        ("new_flow", "(b)/(f) new flow"),
        ("reply_xdp", "(i)/(j) reply, XDP"),
        ("reply", "(g)/(h) reply, tc"),
        ("established6", "(a6)/(e6) IPv6 est."),
        ("new_flow6", "(b6)/(f6) IPv6 new"),
        ("reply6_xdp", "(i6)/(j6) IPv6 XDP"),
        ("reply6", "(g6)/(h6) IPv6 tc"),
    ):
        if key not in res["ratios"]:
            continue
        r = res["ratios"][key]
        ref = f"   ({r['to_reference']}x the reference (d))" if r["to_reference"] is not None else ""
        spread = (
            f"   rounds {min(r['rounds']):.2f}..{max(r['rounds']):.2f}, of medians {r['of_medians']:.2f}x"
            if r.get("rounds")
            else ""
        )
        print(
            f"  {name:<20} {r['value']:7.2f}x   target <= {r['target_max']}x   "
            f"{'met' if r['met'] else 'NOT met'}{spread}{ref}"
        )
    if "failover" in res["cases"]:
        k, b = res["cases"]["failover"]["ns_per_packet"], res["cases"]["new_flow"]["ns_per_packet"]
        print(f"  (l)/(b) failover       {k / b if b > 0 else float('inf'):7.2f}x   (information: {checks['dead']})")
    print(
        f"  checked: (a) NATed to {checks['established_backend']} with the fib's MACs, TTL and checksums "
        f"right, no new conntrack entry;"
    )
    print(
        f"  (b) {measured['new_flows']:,} new flows, one per repetition ({measured['a_repins']} re-pins "
        f"of (a) after eviction); (c) passed unchanged;"
    )
    print("  (i), (g) reverse NATed to the VIP, sent to the client with the fib's MACs, TTL and checksums right")
    if "established_backend6" in checks:
        print(
            f"  (a6) NATed to {checks['established_backend6']}, (b6) to a backend, (i6), (g6) to the client from the "
            "VIP, with the fib's MACs, hop limit and TCP checksums right"
        )
