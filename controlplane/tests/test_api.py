"""controlplane.api: every RPC through a real socket, status codes and socket permissions
(mutual TLS: test_api_tls.py; edgectl's API commands as a subprocess: test_api_edgectl.py).

The daemon is a stand-in (apistage.FakeDaemon) holding plain data; the server, client,
sockets and certificates are real. Servers run on an asyncio loop in a thread
(LoopThread) so the synchronous client can call them from the test. Traffic
stays on unix sockets in a fresh temporary directory and on 127.0.0.1.
"""

from __future__ import annotations

import copy
import grp
import json
import os
import pwd
import threading
import time
from pathlib import Path

import grpc
import pytest

from controlplane import abi
from controlplane.api import convert, edge_pb2, edge_pb2_grpc, server
from controlplane.config import Node
from controlplane.errors import ApiError, ConfigError, EdgeError, NotDeployed
from controlplane.tests.apistage import CALL_TIMEOUT_S, SNAP, FakeDaemon, edgectl, serving, wait_until

# ---------------------------------------------------------------- conversion


def test_status_dict_survives_the_message_unchanged():
    got = convert.status_from_proto(convert.status_to_proto(copy.deepcopy(SNAP)))
    assert got == SNAP
    assert list(got["verdicts"]) == list(abi.CNT_NAMES.values())  # a proto map has no order; ours is the ABI's
    assert list(got["drops"]) == list(abi.DROP_NAMES.values())


def test_a_status_message_built_in_one_call_is_the_one_filled_field_by_field():
    """convert.build (status at 10,000 backends) follows fill's rules: keys the proto does not
    name and None left out, an empty message set, maps and repeated fields as given."""
    snap = copy.deepcopy(SNAP)
    snap["not_a_field"] = {"x": 1}
    snap["xdp"] = {}  # a message with nothing set is still present
    snap["conntrack_entries"] = None
    backend = snap["services"][0]["backends"][0]
    backend["also_not_a_field"], backend["slots"] = [1, 2], None
    built = convert.build(edge_pb2.GetStatusResponse, snap)
    assert built == convert.fill(edge_pb2.GetStatusResponse(), snap)
    assert built.HasField("xdp") and not built.HasField("conntrack_entries")
    assert convert.to_dict(built)["services"][0]["backends"][0]["name"] == backend["name"]
    # status_to_proto builds a service at a time (one constructor call per service): the same message
    two = copy.deepcopy(snap)
    two["services"].append({**copy.deepcopy(two["services"][0]), "name": "other", "id": 7})
    assert convert.status_to_proto(two) == convert.fill(edge_pb2.GetStatusResponse(), two)
    assert convert.status_to_proto({**two, "services": []}) == convert.build(
        edge_pb2.GetStatusResponse, {**two, "services": []}
    )


def test_event_fields_keep_their_json_types():
    event = {
        "t": 1700000000.25,
        "kind": "weights",
        "text": "chat: weights b0 1->3",
        "service": "chat",
        "weights": {"b0": 3},
        "took_ms": 1.5,
        "adopted": True,
        "reason": "true",
    }
    assert convert.event_from_proto(convert.event_to_proto(event)) == event


@pytest.mark.parametrize(
    "error, code, details",
    [
        (
            ConfigError("services[0].port: 70000 is not a port"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "services[0].port: 70000 is not a port",
        ),
        (LookupError("unknown backend chat/x"), grpc.StatusCode.NOT_FOUND, "unknown backend chat/x"),
        (KeyError("unknown service 'x'"), grpc.StatusCode.NOT_FOUND, "unknown service 'x'"),
        (ValueError("weight 70000 out of range"), grpc.StatusCode.INVALID_ARGUMENT, "weight 70000 out of range"),
        (NotDeployed("nothing deployed on eth0"), grpc.StatusCode.FAILED_PRECONDITION, "nothing deployed on eth0"),
        (
            RuntimeError("boom\n  at line 2"),
            grpc.StatusCode.INTERNAL,
            "internal error in edged: RuntimeError: boom at line 2",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_errors_map_to_status_codes(error, code, details):
    assert server.status_of(error) == (code, details)


# ---------------------------------------------------------------- every RPC over a unix socket


def test_get_status_round_trip(edged):
    with edged.client() as c:
        snap = c.status()
        counted = c.status(count_conntrack=True)
    info = snap.pop("edged")
    assert snap == SNAP
    assert info["pid"] == os.getpid() and info["version"] and abs(info["t"] - time.time()) < 60
    assert counted["conntrack_entries"] == 12345
    assert counted["half_open_entries"] == 77 and snap["half_open_entries"] is None  # a table apart, when counted
    assert edged.daemon.calls == [("snapshot", False), ("snapshot", True)]


def test_drain_undrain_and_weight_reach_the_daemon(edged):
    with edged.client() as c:
        c.drain("chat", "b0")
        c.undrain("chat", "b0")
        c.set_weight("chat", "b1", 0)
        c.set_weight("chat", "b1", 65535)
        c.set_weight("chat", "b1", None)
    assert edged.daemon.calls == [
        ("drain", "chat", "b0"),
        ("undrain", "chat", "b0"),
        ("set_override", "chat", "b1", 0),
        ("set_override", "chat", "b1", 65535),
        ("set_override", "chat", "b1", None),
    ]


def test_drain_node_and_undrain_node_return_the_announcement(edged):
    with edged.client() as c:
        assert c.drain_node() == {"announced": [], "withdrawn": {"198.18.255.1": "node drained"}}
        assert c.drain_node(False) == {"announced": ["198.18.255.1"], "withdrawn": {}}
        edged.daemon.fail = EdgeError("node.bgp: not configured; drain-node withdraws the VIPs' BGP routes")
        with pytest.raises(ApiError) as e:
            c.drain_node()
    assert (e.value.code, str(e.value)) == (
        "FAILED_PRECONDITION",
        "node.bgp: not configured; drain-node withdraws the VIPs' BGP routes",
    )
    assert edged.daemon.calls == [("drain_node", True), ("drain_node", False), ("drain_node", True)]


def test_edgectl_drain_node_and_undrain_node(edged):
    sock = ("--socket", edged.path)
    outs = [edgectl("drain-node", *sock), edgectl("undrain-node", *sock)]
    assert [(o.returncode, o.stdout, o.stderr) for o in outs] == [
        (0, "198.18.255.1: withdrawn (node drained)\n", ""),
        (0, "198.18.255.1: announced\n", ""),
    ]


def test_reload_returns_what_changed(edged):
    with edged.client() as c:
        assert c.reload() == {
            "added_services": ["embed"],
            "removed_services": [],
            "updated_services": ["chat"],
            "added_backends": ["chat/b2"],
            "removed_backends": ["chat/b1"],
            "draining_backends": ["chat/b1"],
            "weights": [],
        }
        c.reload(config_text="version: 1\n")
    assert edged.daemon.calls == [("reload", None), ("reload", "version: 1\n")]


def _raw_reload(edged, **fields) -> tuple[str, str]:
    """Reload as any client may send it (older ones send config_path); (code, details)."""
    with grpc.insecure_channel(f"unix:{edged.path}") as channel:
        try:
            edge_pb2_grpc.EdgeStub(channel).Reload(edge_pb2.ReloadRequest(**fields), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as e:
            return e.code().name, e.details()
    return "OK", ""


def test_reload_never_takes_a_path_other_than_edgeds_own(edged):
    """A client naming another file (/etc/shadow, a FIFO, /dev/zero) is refused before edged
    touches it; naming edged's own file is the same as naming none (older clients do that)."""
    for path in ("/etc/shadow", "/dev/zero", "relative.yaml", "/etc/edge/../edge/edge.yaml"):
        code, details = _raw_reload(edged, config_path=path)
        assert (code, details) == (
            "INVALID_ARGUMENT",
            "config_path: edged reloads only the file it was "
            "started with (/etc/edge/edge.yaml); send the config's text instead",
        )
    assert edged.daemon.calls == []
    assert _raw_reload(edged, config_path="/etc/edge/edge.yaml") == ("OK", "")
    assert edged.daemon.calls == [("reload", None)]


def test_reload_text_is_capped_at_one_mib(edged):
    big = "#" * (1024 * 1024) + "\n"
    assert _raw_reload(edged, config_text=big) == (
        "INVALID_ARGUMENT",
        "config_text: 1048577 bytes, more than the 1048576 a config may have",
    )
    assert _raw_reload(edged, config_text="x" * (8 * 1024 * 1024))[0] == "RESOURCE_EXHAUSTED"
    assert edged.daemon.calls == []


@pytest.mark.parametrize(
    "call, code, message",
    [
        (lambda c: c.drain("chat", "nope"), "NOT_FOUND", "unknown backend chat/nope"),
        (lambda c: c.undrain("embed", "b0"), "NOT_FOUND", "unknown service 'embed'"),
        (lambda c: c.drain("", "b0"), "INVALID_ARGUMENT", "service: required"),
        (lambda c: c.set_weight("chat", "", 1), "INVALID_ARGUMENT", "backend: required"),
        (lambda c: c.set_weight("chat", "b0", 65536), "INVALID_ARGUMENT", "weight: 65536 is out of range 0..65535"),
        (lambda c: c.reload(config_text="port: 70000"), "INVALID_ARGUMENT", "services[0].port: 70000 is not a port"),
    ],
    ids=["unknown backend", "unknown service", "no service", "no backend", "weight too large", "invalid config"],
)
def test_refused_requests_have_their_status_code_and_one_line(edged, call, code, message):
    with edged.client() as c, pytest.raises(ApiError) as caught:
        call(c)
    assert (caught.value.code, str(caught.value)) == (code, message)


@pytest.mark.parametrize(
    "error, code",
    [
        (ConfigError("node.iface: not set"), "INVALID_ARGUMENT"),
        (KeyError("chat"), "NOT_FOUND"),
        (NotDeployed("nothing deployed on eth-test"), "FAILED_PRECONDITION"),
        (ZeroDivisionError("division by zero"), "INTERNAL"),
    ],
)
def test_daemon_errors_arrive_as_status_codes(edged, error, code):
    edged.daemon.fail = error
    with edged.client() as c, pytest.raises(ApiError) as caught:
        c.drain("chat", "b0")
    assert caught.value.code == code and "\n" not in str(caught.value)
    if code == "INTERNAL":  # and edged's own log hears of it
        assert str(caught.value) == "internal error in edged: ZeroDivisionError: division by zero"
        assert edged.lt.call(lambda: edged.daemon.events.recent[-1]["kind"]) == "error"


def test_watch_events_delivers_events_emitted_after_subscribing(edged):
    edged.emit("state", "before the call")
    stub = edge_pb2_grpc.EdgeStub(grpc.insecure_channel(f"unix:{edged.path}"))
    call = stub.WatchEvents(edge_pb2.WatchEventsRequest(kinds=["state", "weights"]), timeout=CALL_TIMEOUT_S)
    wait_until(edged.subscribers, what="the server to subscribe")
    edged.emit("state", "chat/b0: up -> down", service="chat", backend="b0", old="up", new="down")
    edged.emit("progress", "filtered out")
    edged.emit("weights", "chat: weights b0 1->3", service="chat", weights={"b0": 3, "b1": 1})
    got = [next(call), next(call)]
    call.cancel()
    assert [(e.kind, e.text, e.service, e.backend) for e in got] == [
        ("state", "chat/b0: up -> down", "chat", "b0"),
        ("weights", "chat: weights b0 1->3", "chat", ""),
    ]
    assert dict(got[0].fields) == {"old": '"up"', "new": '"down"'}
    assert json.loads(got[1].fields["weights"]) == {"b0": 3, "b1": 1}
    assert abs(got[0].time.ToNanoseconds() / 1e9 - time.time()) < 60
    wait_until(lambda: edged.subscribers() == 0, what="the server to unsubscribe a cancelled watch")


def test_client_events_replay_recent_then_follow(edged):
    edged.emit("deployed", "deployed on eth-test")
    watchdog = threading.Timer(10, lambda: edged.lt.call(edged.handle.servicer.end_watches))
    watchdog.start()
    try:
        with edged.client() as c:
            stream = c.events(recent=5)
            first = next(stream)
            wait_until(edged.subscribers, what="the server to subscribe")
            edged.emit("error", "chat: boom", service="chat")
            second = next(stream)
            stream.close()
    finally:
        watchdog.cancel()
    assert (first["kind"], first["text"]) == ("deployed", "deployed on eth-test")
    assert {k: second[k] for k in ("kind", "text", "service")} == {
        "kind": "error",
        "text": "chat: boom",
        "service": "chat",
    }


def test_stop_ends_event_streams_at_once(lt, sockdir):
    node = Node(api_socket=os.path.join(sockdir, "edged.sock"))
    with serving(lt, node) as served:
        with served.client() as c:
            stream = c.events()
            ended = []
            reader = threading.Thread(target=lambda: ended.append(list(stream)), daemon=True)
            reader.start()
            wait_until(served.subscribers, what="the server to subscribe")
            t0 = time.monotonic()
            lt.run(served.handle.stop(30))  # a stream left open would hold stop() for the whole grace
            reader.join(5)
            assert ended == [[]] and time.monotonic() - t0 < 5


def test_health_says_serving(edged):
    with edged.client() as c:
        assert c.health() == "SERVING"
        assert c.health(server.SERVICE_NAME) == "SERVING"


# ---------------------------------------------------------------- the unix socket


def _other_group() -> grp.struct_group:
    """A group to give the socket: one of ours, and not our primary one when we can."""
    if os.geteuid() == 0:
        return next(g for g in grp.getgrall() if g.gr_gid not in (0, 65534))
    gids = [g for g in os.getgroups() if g != os.getegid()] or [os.getegid()]
    return grp.getgrgid(gids[0])


def test_socket_is_0660_in_the_configured_group_and_removed_on_stop(lt, sockdir):
    group = _other_group()
    path = os.path.join(sockdir, "new", "dir", "edged.sock")  # the parent is made
    with serving(lt, Node(api_socket=path, api_group=group.gr_name)):
        st = os.stat(path)
        assert (oct(st.st_mode & 0o7777), st.st_gid) == (oct(0o660), group.gr_gid)
    assert not os.path.exists(path)


def test_stale_socket_is_replaced_and_a_live_one_is_not(lt, sockdir):
    import socket as sk

    path = os.path.join(sockdir, "edged.sock")
    stale = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    stale.bind(path)  # left behind by an edged that was killed: bound, no one listening
    stale.close()
    with serving(lt, Node(api_socket=path)) as first:
        with first.client() as c:
            assert c.health() == "SERVING"
        with pytest.raises(
            EdgeError, match=r"^node.api_socket: .*edged.sock is in use \(is another edged running\?\)$"
        ):
            lt.run(server.start(FakeDaemon(), Node(api_socket=path)))
        with first.client() as c:  # the first one still serves
            assert c.health() == "SERVING"


def test_socket_path_that_is_a_file_is_refused(lt, sockdir):
    path = os.path.join(sockdir, "edged.sock")
    Path(path).write_text("not a socket")
    with pytest.raises(EdgeError, match=r"^node.api_socket: .*edged.sock exists and is not a socket$"):
        lt.run(server.start(FakeDaemon(), Node(api_socket=path)))
    assert Path(path).read_text() == "not a socket"


def test_unknown_group_is_a_config_error(lt, sockdir):
    path = os.path.join(sockdir, "edged.sock")
    with pytest.raises(ConfigError, match=r"^node.api_group: no group 'no-such-group-x' on this host$"):
        lt.run(server.start(FakeDaemon(), Node(api_socket=path, api_group="no-such-group-x")))
    assert not os.path.exists(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another user needs root")
def test_users_outside_the_socket_group_are_refused(lt, sockdir):
    group = _other_group()
    nobody = pwd.getpwnam("nobody")
    assert group.gr_gid != nobody.pw_gid
    path = os.path.join(sockdir, "edged.sock")
    with serving(lt, Node(api_socket=path, api_group=group.gr_gid)) as served:
        as_nobody = dict(user=nobody.pw_uid, group=nobody.pw_gid, cwd="/")
        outsider = edgectl("drain", "chat", "b0", "--socket", path, extra_groups=[], **as_nobody)
        member = edgectl("drain", "chat", "b0", "--socket", path, extra_groups=[group.gr_gid], **as_nobody)
    assert outsider.returncode == 3  # the environment: not root, not in the group
    assert outsider.stderr == (
        f"edgectl: {path}: permission denied (edgectl must run as root or in group {group.gr_name})\n"
    )
    assert (member.returncode, member.stderr) == (0, "")
    assert served.daemon.calls == [("drain", "chat", "b0")]  # only the member's call arrived
