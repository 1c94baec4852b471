"""edge/edged.service: systemd-analyze verify accepts it, and it agrees with config.py's defaults.

verify fails a unit whose ExecStart binary is missing, and /usr/local/bin/edged
exists only on an installed node; so the unit is verified as a copy in a tmp dir
with ExecStart pointing at an executable that exists, everything else unchanged.
verify exits 0 on unknown keys and bad values too, so any output is a failure.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from controlplane.config import Bgp, Node

UNIT = Path(__file__).resolve().parents[2] / "edge" / "edged.service"
EDGED = "/usr/local/bin/edged"
EDGECTL = "/usr/local/bin/edgectl"
CAPABILITIES = {"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN", "CAP_NET_BIND_SERVICE"}


def directives(text: str) -> dict[str, list[str]]:
    """'Key' -> its values in order, over all sections; comments and blank lines skipped."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


UNIT_KEYS = directives(UNIT.read_text())


def one(key: str) -> str:
    values = UNIT_KEYS.get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    stand_in = shutil.which("true")
    assert stand_in and one("ExecStart").startswith(EDGED + " ")
    text = UNIT.read_text()
    copy = tmp_path / UNIT.name  # verify takes the unit's name from the file's
    text = text.replace(f"ExecStart={EDGED} ", f"ExecStart={stand_in} ", 1)
    copy.write_text(text.replace(f"ExecReload={EDGECTL} ", f"ExecReload={stand_in} ", 1))
    out = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr


def test_edged_is_a_notify_service_with_a_watchdog_and_a_reload_that_waits_for_the_answer():
    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("WatchdogSec").endswith("s") and int(one("WatchdogSec")[:-1]) >= 5
    assert one("ExecStart") == f"{EDGED} --config /etc/edge/edge.yaml"
    # edgectl waits for edged's answer: a rejected config fails `systemctl reload`
    assert one("ExecReload") == f"{EDGECTL} -q reload"
    assert one("Restart") == "on-failure"
    assert one("KillMode") == "mixed"


def test_capabilities_are_exactly_the_routers():
    assert set(one("CapabilityBoundingSet").split()) == CAPABILITIES
    assert set(one("AmbientCapabilities").split()) == CAPABILITIES
    assert one("LimitMEMLOCK") == "infinity"


def test_sandbox_leaves_the_paths_edged_writes_writable():
    writable = [PurePosixPath(p) for p in one("ReadWritePaths").split()]
    runtime = PurePosixPath("/run") / one("RuntimeDirectory")
    node = Node()
    assert one("ProtectSystem") == "strict"
    assert PurePosixPath(node.api_socket).parent == runtime, "node.api_socket must be in RuntimeDirectory"
    assert runtime in writable
    assert any(PurePosixPath(node.pin_dir).is_relative_to(p) for p in writable), "node.pin_dir must be writable"
    bgp = Bgp(local_as=65001, peers=())
    for path in (bgp.config_file, bgp.control_socket):  # written by edged and its bird
        assert PurePosixPath(path).parent == runtime, f"node.bgp default {path} must be in RuntimeDirectory"


def test_settings_that_would_break_bcc_or_deploy_stay_off():
    # /lib/modules hidden (kernel headers), /proc/sys read-only (ip_forward), no W+X for LLVM's JIT.
    for key in ("ProtectKernelModules", "ProtectKernelTunables", "MemoryDenyWriteExecute", "ProcSubset"):
        assert key not in UNIT_KEYS, key


def test_memory_is_capped():
    """A leak in edged (or a runaway compile) ends in a restart, not in the node's OOM killer
    choosing among the inference stack. Maps edged creates count too (kernel 5.11+ charges BPF
    memory to the creator's cgroup): conntrack at the default ct_size is tens of MB."""
    value = one("MemoryMax")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)
    assert 512 << 20 <= size <= 4 << 30, value


def test_restarts_end_and_a_data_path_that_cannot_compile_or_a_bad_config_is_not_restarted():
    from controlplane.edged.cli import EXIT_CANNOT_COMPILE, EXIT_CONFIG

    assert one("RestartPreventExitStatus").split() == [str(EXIT_CANNOT_COMPILE), str(EXIT_CONFIG)]
    interval = one("StartLimitIntervalSec")
    assert interval not in ("0", "infinity") and int(interval.rstrip("s")) > 0  # 0 would retry for ever
    assert 1 <= int(one("StartLimitBurst")) <= 20


def test_the_run_dir_and_its_marks_outlive_a_stop():
    """/run/edge holds the drain-node and undeploy marks beside the locks: a stop (or restart)
    must not delete them, or a drained node announces again after `systemctl restart edged`.
    A reboot clears /run, as it clears the pins in bpffs."""
    assert one("RuntimeDirectory") == "edge"
    assert one("RuntimeDirectoryPreserve") == "yes"


def test_descriptors_are_limited_explicitly():
    """edged opens a socket per probe, per metrics and API connection, and fds per map; the
    unit says how many it may hold instead of inheriting 1,024 (the metrics endpoint caps its
    own connections well below it)."""
    from controlplane.edged import metricsserver

    limit = int(one("LimitNOFILE"))
    assert limit >= 8 * metricsserver.MAX_CONNECTIONS and limit >= 4096
