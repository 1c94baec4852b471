"""edged watches its BGP speaker, with real BIRD in namespaces (lab/ecmp.py's fleet: an
upstream bird with ECMP, one edge router running edged and its bird):

- bird killed: edged notices (a bgp-speaker event), starts bird again and announces the VIP
  again; the upstream routes it to the router again. Before, edged never noticed: no event,
  status "announced" while the upstream had withdrawn the node.
- /run full while bird.conf is written (a small tmpfs, filled, mounted by the test over the
  directory of node.bgp.config_file): the change fails with ENOSPC; edged withdraws every VIP
  without the file (birdc disable) and its announcer goes on: once there is room again, an
  undrain announces the VIP again. Before, the announcer's task ended with the VIP announced.
"""

from __future__ import annotations

import os
import signal
import subprocess

from controlplane.lab.daemon import EdgedProc
from controlplane.lab.ecmp import Fleet
from controlplane.lab.fleet import FleetTopo


def test_a_killed_bird_is_restarted_and_announces_again():
    with Fleet.start(FleetTopo(routers=1, backends=1)) as fleet:
        edged = fleet.edgeds[0]
        (pid,) = fleet.speaker_pids(0)  # the bird this test's edged started
        mark = len(edged.events)
        os.kill(pid, signal.SIGKILL)
        died = edged.wait_for(lambda e: e["kind"] == "bgp-speaker" and not e["ok"], 20.0, "bird's death", after=mark)
        assert f"bird (pid {pid}) exited with status -9" in died["text"], died["text"]
        back = edged.wait_for(
            lambda e: e["kind"] == "bgp-speaker" and e["ok"] and "restarted" in e["text"],
            20.0,
            "bird restarted",
            after=mark,
        )
        assert back["pid"] != pid
        edged.wait_for(lambda e: e["kind"] == "bgp" and "announced" in e["text"], 20.0, "announced again", after=mark)
        fleet.net.wait_next_hops({0}, 30.0)
        with fleet.client(0) as c:
            assert c.status()["bgp"]["announced"] == [str(fleet.net.vip)]


def _fill(directory: str) -> None:
    """Writes a file in directory until its file system is full (a 16 KiB tmpfs: a few writes)."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(64):
            try:
                os.write(fd, b"\0" * 4096)
            except OSError:
                return
    finally:
        os.close(fd)
    raise AssertionError(f"{directory} did not fill up")


def test_a_full_run_dir_withdraws_safely_and_the_announcer_lives_on():
    with Fleet.start(FleetTopo(routers=1, backends=1)) as fleet:
        net = fleet.net
        doc = fleet.config(0)
        conf_dir = os.path.join(os.path.dirname(doc["node"]["bgp"]["config_file"]), "conf")
        os.mkdir(conf_dir)
        doc["node"]["bgp"]["config_file"] = os.path.join(conf_dir, "bird.conf")
        fleet.edgeds[0].stop()
        edged = fleet.edgeds[0] = EdgedProc.start(net.router(0), doc, net.router_iface(0))
        edged.wait_for(lambda e: e["kind"] == "bgp" and "announced" in e["text"], 60.0, "announced")
        net.wait_next_hops({0}, 30.0)
        mounted = False
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=0755", "tmpfs", conf_dir], check=True)
            mounted = True
            _fill(conf_dir)
            mark = len(edged.events)
            fleet.edgectl(0, "drain-node")  # the change that rewrites bird.conf; it fails: ENOSPC
            failed = edged.wait_for(
                lambda e: e["kind"] == "bgp-speaker" and not e["ok"], 20.0, "the speaker failure", after=mark
            )
            assert "No space left on device" in failed["error"], failed["text"]
            net.wait_next_hops(set(), 20.0)  # withdrawn without the file
            with fleet.client(0) as c:
                assert c.status()["bgp"]["announced"] == []
        finally:
            if mounted:
                subprocess.run(["umount", conf_dir], check=True)
        mark = len(edged.events)
        out = fleet.edgectl(0, "undrain-node")
        assert out.returncode == 0, out.stderr
        edged.wait_for(lambda e: e["kind"] == "bgp-speaker" and e["ok"], 20.0, "the speaker works again", after=mark)
        net.wait_next_hops({0}, 30.0)
        assert edged.proc.poll() is None
