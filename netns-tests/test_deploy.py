"""edgectl deploy / undeploy / status on the router namespace: what they leave on the node.

        client ──veth── router ──veth── b0
                   rt-c (XDP)  ├──veth── b1      deploy: XDP on rt-c, tc clsact ingress filter
                               └──veth── b2      "edge_return" (prio 0xED) on rt-b0..2, pins
                                                 under <pin_dir>/v<ABI>/rt-c-<netns inode>/

A failed deploy leaves the node exactly as it was: every interface's XDP program, clsact and
ingress filters, net.ipv4.ip_forward, and the pins of this namespace are compared before and
after (node_state). Errors are one line on stderr, `edgectl: ...`, with exit 1.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from controlplane import abi
from controlplane.lab.foreign import foreign_xdp
from controlplane.lab.router import TcFilter, ip_forward_off, node_state
from controlplane.lab.traffic import close_all, open_connections

PORT = 8000  # conftest.BACKEND_PORT, also the VIP port
TC_PRIO = 0xED
RETURN_FILTER = TcFilter("bpf", TC_PRIO, abi.PROG_RETURN)


def assert_one_line_error(done, *fragments: str) -> str:
    """edgectl failed with exit 1 and exactly one stderr line `edgectl: ...` holding every fragment."""
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (1, 1), done.stderr
    assert lines[0].startswith("edgectl: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert done.stdout == ""
    return lines[0]


def test_deploy_on_a_missing_interface_fails_in_one_line_and_changes_nothing(net, router):
    before = node_state(router)

    done = router.deploy([router.service("web")], iface="nosuch0", check=False)

    assert_one_line_error(done, "nosuch0")
    assert node_state(router) == before
    assert before["pins"] == [] and all(s.xdp_prog_id is None for s in before["ifaces"].values())


def test_invalid_config_is_refused_naming_the_field_and_changes_nothing(net, router):
    service = router.service("web")
    service["backends"][0]["port"] = 70000
    before = node_state(router)

    done = router.deploy([service], check=False)

    assert_one_line_error(done, "services[0].backends[0].port", "70000")
    assert node_state(router) == before


def test_backend_without_a_route_is_refused_naming_it_and_changes_nothing(net, router):
    """198.19.99.2 is in the test range but on no link of the router, which has no default route.

    ip_forward is 0 first, so a deploy that got as far as enabling it would show.
    """
    service = router.service("web")
    service["backends"][2]["address"] = "198.19.99.2"
    with ip_forward_off(router):
        before = node_state(router)

        done = router.deploy([service], check=False)

        assert_one_line_error(done, "198.19.99.2", "services[0].backends[2]")
        assert node_state(router) == before


def test_a_deploy_failing_at_its_last_step_rolls_everything_back(net, router):
    """lo has no native XDP, so deploy fails when it attaches XDP, its last step: after it has
    pinned the maps, put clsact and the return filter on rt-b0..2 and turned ip_forward on
    (0 before). All of that is undone, and the error names the interface."""
    with ip_forward_off(router):
        before = node_state(router)

        done = router.deploy([router.service("web")], iface="lo", check=False)

        assert_one_line_error(done, "attach XDP", "lo")
        assert node_state(router) == before
        assert not router.pin_path_of("lo").exists()


def test_deploy_refuses_to_replace_a_foreign_xdp_program(net, router):
    with foreign_xdp(router, router.iface) as prog_id:
        before = node_state(router)

        done = router.deploy([router.service("web")], check=False)

        assert_one_line_error(done, router.iface, "foreign", str(prog_id))
        assert node_state(router) == before
        assert before["ifaces"][router.iface].xdp_prog_id == prog_id


def test_a_foreign_xdp_program_on_a_backend_side_leaves_its_replies_to_tc(net, router):
    """node.reply_xdp auto: the other interfaces get the fast path, that one keeps its program
    and tc alone (said in one line); on: the deploy fails and leaves the node as it was."""
    ifname = net.backend_iface(1)
    with foreign_xdp(router, ifname) as prog_id:
        before = node_state(router)
        done = router.deploy([router.service("web")], node={"reply_xdp": "on"}, check=False)
        assert_one_line_error(done, "reply_xdp", ifname, "foreign")
        assert node_state(router) == before

        router.deploy([router.service("web")])
        (snap,) = router.status_all()
        assert snap["reply_xdp_ifaces"] == [net.backend_iface(0), net.backend_iface(2)]
        assert router.iface_state(ifname).xdp_prog_id == prog_id
        router.undeploy()
        assert router.iface_state(ifname).xdp_prog_id == prog_id


def test_undeploy_removes_exactly_what_deploy_added(net, router):
    """XDP, return filters, the clsact qdiscs deploy created (not the one on rt-b1, there before),
    the pins; and ip_forward goes back to 0. `status` without --iface shows the one deployment
    while it is there. A second undeploy says there is nothing and exits 0."""
    with net.router.iproute() as ipr:
        ipr.tc("add", "clsact", ipr.link_lookup(ifname=net.backend_iface(1))[0])
    with ip_forward_off(router):
        before = node_state(router)
        assert before["ifaces"][net.backend_iface(1)].clsact

        router.deploy([router.service("web")])

        deployed = node_state(router)
        (snap,) = router.status_all()
        assert (snap["iface"], snap["xdp"]["attached"], snap["xdp"]["mode"]) == (router.iface, True, "native")
        assert snap["pin_path"] == str(router.pin_path) and deployed["pins"] == [router.iface]
        assert deployed["ifaces"][router.iface].xdp_prog_id == snap["xdp"]["prog_id"]
        assert sorted(snap["return_ifaces"]) == [net.backend_iface(i) for i in range(3)]
        assert snap["reply_xdp_ifaces"] == [net.backend_iface(i) for i in range(3)]
        for i in range(3):
            state = deployed["ifaces"][net.backend_iface(i)]
            assert (state.clsact, state.ingress_filters) == (True, (RETURN_FILTER,))
            assert state.xdp_prog_id is not None  # edge_reply, the fast path of replies
        assert deployed["ip_forward"] == "1"

        done = router.undeploy()
        assert done.stdout.strip() == f"undeployed from {router.iface}"
        assert node_state(router) == before
        assert not router.pin_path.exists()

        again = router.undeploy()
        assert (again.returncode, again.stdout.strip()) == (0, f"nothing deployed on {router.iface}")
        assert router.status_all() == []
        assert router.edgectl("status").stdout.strip() == "nothing deployed in this network namespace"


def test_redeploy_updates_in_place_keeping_xdp_and_connections(net, router):
    """A second deploy with changed weights and an added UDP service replaces the maps' contents
    in place: XDP stays attached (the program may be replaced atomically), one return filter per
    backend interface, same instance and pins, and 30 keep-alive connections answered by their
    backend without a single failure while the redeploy runs (requests loop on them throughout)."""
    router.deploy([router.service("web")])
    first = router.status()
    conns = open_connections(net.client, net.vip, PORT, 30)
    owners = [conn.request().backend for conn in conns]
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def keep_asking() -> None:
        deadline = time.monotonic() + 60.0
        for _ in range(100_000):
            if stop.is_set() or time.monotonic() > deadline:
                return
            for k, conn in enumerate(conns):
                try:
                    got = conn.request().backend
                except OSError as e:
                    failures.append(f"connection {k}: {e!r}")
                    return
                if got != owners[k]:
                    failures.append(f"connection {k}: {owners[k]} -> {got}")
                answered[0] += 1

    asker = threading.Thread(target=keep_asking, name="keep-asking")
    try:
        asker.start()
        done = router.deploy([router.service("web", weights=[1, 2, 1]), router.service("dns", protocol="udp")])
    finally:
        stop.set()
        asker.join(timeout=10.0)
        close_all(conns)

    assert not asker.is_alive()
    assert failures == []
    assert answered[0] >= 300  # ten rounds at least ran while the redeploy did
    assert done.stdout.startswith(f"updated on {router.iface}")
    second = router.status()
    assert second["xdp"]["attached"] and second["xdp"]["mode"] == first["xdp"]["mode"] == "native"
    assert (second["instance"], second["pin_path"]) == (first["instance"], first["pin_path"])
    assert [s["name"] for s in second["services"]] == ["web", "dns"]
    assert [b["weight"] for b in second["services"][0]["backends"]] == [1, 2, 1]
    for i in range(3):
        assert router.iface_state(net.backend_iface(i)).ingress_filters == (RETURN_FILTER,)


def _foreign_pin_dir(owner: int, mode: int) -> str:
    """A directory on the host's bpffs as another user could make it (bpffs is often 1777)."""
    path = f"/sys/fs/bpf/edgetest-{os.urandom(4).hex()}"
    os.mkdir(path)
    os.chown(path, owner, -1)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize(
    "owner, mode, says",
    [
        (65534, 0o755, "is owned by uid 65534"),
        (0, 0o777, "is writable by others (mode 0777)"),
        (0, 0o775, "is writable by its group (mode 0775)"),
    ],
    ids=["another user's", "world-writable", "group-writable"],
)
def test_deploy_refuses_a_pin_directory_it_does_not_own(net, router, owner, mode, says):
    """Maps pinned where another user can write could be swapped under the router: refused
    in one line naming the directory, and nothing is attached or pinned."""
    pin_dir = _foreign_pin_dir(owner, mode)
    done = None
    try:
        before = node_state(router)
        done = router.deploy([router.service("web")], node={"pin_dir": pin_dir}, check=False)
        assert_one_line_error(done, f"node.pin_dir: {pin_dir} {says}")
        assert node_state(router) == before
        assert os.listdir(pin_dir) == []
    finally:
        if done is not None and done.returncode == 0:  # the old code deployed there: undeploy, then remove what is left
            router.edgectl("-q", "undeploy", "--iface", router.iface, "--pin-dir", pin_dir)
        shutil.rmtree(pin_dir)


@pytest.mark.parametrize("reply_xdp", ["auto", "off"])
def test_deploy_on_a_backend_facing_interface_says_what_it_is_and_changes_nothing(net, router, reply_xdp):
    """It advised "remove it first" before: removing edge_reply there breaks the running router.
    With reply_xdp off no XDP program sits there (only edge_return on tc): before, deploy took the
    link over as a second router's client side."""
    router.deploy([router.service("web")], node={"reply_xdp": reply_xdp})
    try:
        before = node_state(router)
        ifname = net.backend_iface(0)

        done = router.deploy([router.service("web")], iface=ifname, check=False)

        if done.returncode == 0:  # the old code deployed a second router there: undo that first
            router.edgectl("-q", "undeploy", "--iface", ifname)
        line = assert_one_line_error(done, ifname, "backend-facing interface", "client-facing")
        assert "remove it" not in line
        assert node_state(router) == before
    finally:
        router.undeploy()
