"""Faults of the node under edged: the data path cannot be compiled (kernel headers gone after
a kernel change), and the data path goes away under a running edged (its client-facing
interface deleted and made again; its bpffs unmounted).

        client ──veth── router (XDP, edged) ──veth── b0, b1, b2 (testbed HTTP backends)
"""

from __future__ import annotations

import subprocess
import time

from controlplane import edged as edged_module
from controlplane.testbed.daemon import EdgedProc

PORT = 8000


def doc(router, tmp_path, **node) -> dict:
    service = router.service("web", backends=[0, 1, 2])
    return router.config([service], node={"api_socket": str(tmp_path / "edged.sock"),
                                          "metrics_listen": "127.0.0.1:9470", **node})


def test_a_data_path_that_cannot_compile_is_one_line_and_a_distinct_exit(net, router, tmp_path):
    """Kernel headers missing (bcc's BCC_KERNEL_SOURCE pointed at nothing, as after a kernel
    update without its headers): edged says so in one line and exits with the status the unit
    tells systemd not to restart on; nothing is attached."""
    proc = EdgedProc.start(net.router, doc(router, tmp_path), router.iface, wait_deployed=False,
                           env={"BCC_KERNEL_SOURCE": str(tmp_path / "no-headers")})
    try:
        code = proc.proc.wait(timeout=120)
        proc._reader.join(10)
    finally:
        proc.stop()
    lines = proc.other_lines
    assert code == edged_module.EXIT_CANNOT_COMPILE == 3, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("edged: cannot compile the data path for kernel "), lines
    assert "kernel headers" in lines[0], lines
    assert router.pinned_ifaces() == []
    assert router.iface_state(router.iface).xdp_prog_id is None
