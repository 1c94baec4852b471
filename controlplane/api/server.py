"""edged's side of the API: an asyncio gRPC server that turns edge.v1 calls into
calls on the daemon and the daemon's errors into status codes. It decides nothing.

It listens on the unix socket node.api_socket (mode 0660, group node.api_group),
and on node.api_listen (TCP) only with mutual TLS (node.api_tls). grpc.health.v1
says SERVING from start() until stop(). In edged, on its asyncio loop:

    handle = await server.start(daemon, cfg.node)
    ...
    await handle.stop(grace_s=1.0)

daemon is an Edged (below): the part of edged.Daemon the API calls, and all of it.
"""

from __future__ import annotations

import asyncio
import grp
import inspect
import logging
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from controlplane import __version__, gcpause, limits, statuspage
from controlplane.api import convert, edge_pb2, edge_pb2_grpc
from controlplane.config import MAX_CONFIG_BYTES
from controlplane.errors import ConfigError, EdgeError

if TYPE_CHECKING:  # a type only: the API server runs without loading edged's daemon
    from controlplane.edged.events import Events

SERVICE_NAME = "edge.v1.Edge"  # the name grpc.health.v1 reports it under
SOCKET_MODE = 0o660
WATCH_QUEUE = 1024  # events a slow watcher may fall behind by before it loses some

log = logging.getLogger("edged.api")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def status_of(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and one-line details a failed call answers with."""
    if isinstance(e, ConfigError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(e)
    if isinstance(e, LookupError):  # unknown service or backend
        # KeyError's str() is the repr of its key; its argument reads better.
        text = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], str) else str(e)
        return grpc.StatusCode.NOT_FOUND, _one_line(text)
    if isinstance(e, ValueError):  # a value the daemon rejects, e.g. a weight out of range
        return grpc.StatusCode.INVALID_ARGUMENT, _one_line(e)
    if isinstance(e, EdgeError):
        return grpc.StatusCode.FAILED_PRECONDITION, str(e)
    return grpc.StatusCode.INTERNAL, _one_line(f"internal error in edged: {type(e).__name__}: {e}")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _to_proto(box: list[dict], edged: dict) -> Any:
    """GetStatus's message of the snapshot in box (taken out of it)."""
    return convert.status_to_proto(box.pop(), edged)


def _required(value: str, name: str) -> str:
    if not value:
        raise ConfigError(f"{name}: required")
    return value


class Edged(Protocol):
    """What the API calls on edged (edged.Daemon); a test may serve any object that has it."""

    events: Events  # subscribe/unsubscribe/recent for WatchEvents, emit for internal errors
    config_path: Optional[str]  # the file edged was started with: the only one a reload reads
    not_serving: str  # why the data path is not whole, '' while it is

    def snapshot(
        self, count_conntrack: bool = False, view: Optional[statuspage.View] = None
    ) -> Awaitable[dict] | dict: ...

    def operate(
        self, kind: str, service: str, backend: str, weight: Optional[int] = None, local: bool = False
    ) -> Awaitable[str]: ...

    def reload(self, text: Optional[str] = None) -> Awaitable[dict]: ...

    def drain_node(self, drained: bool = True) -> Awaitable[dict]: ...


class EdgeServicer(edge_pb2_grpc.EdgeServicer):
    """edge.v1.Edge on top of a daemon."""

    def __init__(self, daemon: Edged):
        self.daemon = daemon
        self._watchers: set[asyncio.Queue] = set()

    async def _answer(self, context: grpc.aio.ServicerContext, method: str, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await work()
        except Exception as e:  # every failure becomes a status code; none escapes as a bare UNKNOWN
            code, details = status_of(e)
            if code == grpc.StatusCode.INTERNAL:
                log.error("%s: %s", method, details, exc_info=True)
                self.daemon.events.emit("error", f"api: {method}: {details}", method=method)
        await context.abort(code, details)

    async def GetStatus(self, request, context):
        async def work():
            view = convert.view_from_proto(request.view) if request.HasField("view") else None
            if view is not None:
                view.check()  # a bad view is refused before the walk
            # the collector off while the call's objects live (a million at 10,000 backends): freed by
            # their reference counts when it ends, never walked or promoted by a collection (gcpause)
            with gcpause.paused():
                # a page or the summaries (view): megabytes at 10,000 backends stay in edged
                snap = await _maybe_await(self.daemon.snapshot(count_conntrack=request.count_conntrack, view=view))
                edged = {
                    "version": __version__,
                    "pid": os.getpid(),
                    "t": time.time(),
                    "not_serving": self.daemon.not_serving,
                }
                # off the loop: the snapshot is this call's own, and converting thousands of backends
                # takes a second and more at 5,000 (the loop serves other calls and probes meanwhile);
                # handed over in a box that the conversion empties, so that it is freed when the
                # conversion returns (the executor's work item may hold its arguments a little longer)
                box = [snap]
                del snap
                return await asyncio.to_thread(_to_proto, box, edged)

        return await self._answer(context, "GetStatus", work)

    async def _operate(self, kind: str, request, weight: int | None = None) -> str:
        return await _maybe_await(
            self.daemon.operate(
                kind,
                _required(request.service, "service"),
                _required(request.backend, "backend"),
                weight=weight,
                local=request.local,
            )
        )

    async def Drain(self, request, context):
        async def work():
            return edge_pb2.DrainResponse(scope=await self._operate("drain", request))

        return await self._answer(context, "Drain", work)

    async def Undrain(self, request, context):
        async def work():
            return edge_pb2.UndrainResponse(scope=await self._operate("undrain", request))

        return await self._answer(context, "Undrain", work)

    async def SetWeight(self, request, context):
        async def work():
            weight = request.weight if request.HasField("weight") else None
            if weight is not None and not limits.is_weight(weight):
                raise ConfigError(f"weight: {weight} is out of range {limits.WEIGHTS}")
            return edge_pb2.SetWeightResponse(scope=await self._operate("weight", request, weight))

        return await self._answer(context, "SetWeight", work)

    async def Reload(self, request, context):
        async def work():
            if request.HasField("config_text"):
                size = len(request.config_text.encode("utf-8"))
                if size > MAX_CONFIG_BYTES:
                    raise ConfigError(f"config_text: {size} bytes, more than the {MAX_CONFIG_BYTES} a config may have")
                summary = await self.daemon.reload(request.config_text)
            else:
                # Older clients name a file; edged reads no file a client names but its own.
                own = self.daemon.config_path
                if request.HasField("config_path") and request.config_path != own:
                    raise ConfigError(
                        f"config_path: edged reloads only the file it was started with "
                        f"({own or 'none'}); send the config's text instead"
                    )
                summary = await self.daemon.reload()
            return convert.fill(edge_pb2.ReloadResponse(), summary or {})

        return await self._answer(context, "Reload", work)

    async def DrainNode(self, request, context):
        async def work():
            return convert.fill(edge_pb2.AnnouncementResponse(), await self.daemon.drain_node(True))

        return await self._answer(context, "DrainNode", work)

    async def UndrainNode(self, request, context):
        async def work():
            return convert.fill(edge_pb2.AnnouncementResponse(), await self.daemon.drain_node(False))

        return await self._answer(context, "UndrainNode", work)

    async def WatchEvents(self, request, context):
        kinds = set(request.kinds)
        events = self.daemon.events
        q = events.subscribe(WATCH_QUEUE)
        # No await between subscribe() and copying recent: every event is in exactly one.
        replay = list(events.recent)[-request.recent :] if request.recent else []
        self._watchers.add(q)
        try:
            for event in replay:
                if not kinds or event.get("kind") in kinds:
                    yield convert.event_to_proto(event)
            while True:
                event = await q.get()
                if event is None:  # the server is stopping: end the stream cleanly
                    return
                if not kinds or event.get("kind") in kinds:
                    yield convert.event_to_proto(event)
        finally:
            self._watchers.discard(q)
            events.unsubscribe(q)

    def end_watches(self) -> None:
        """Ends every WatchEvents stream (they would otherwise hold stop() for its grace)."""
        for q in list(self._watchers):
            if q.full():
                q.get_nowait()  # a watcher this far behind loses one more event
            q.put_nowait(None)


# ---------------------------------------------------------------- listening


def _gid(group: int | str | None) -> int | None:
    if group is None or isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"node.api_group: no group {group!r} on this host") from None


def _clear_stale_socket(path: str) -> None:
    """Removes a socket file no one listens on; refuses to take over a live one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise EdgeError(f"node.api_socket: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    except OSError as e:
        raise EdgeError(f"node.api_socket: {path}: {e.strerror or e}") from e
    finally:
        probe.close()
    raise EdgeError(f"node.api_socket: {path} is in use (is another edged running?)")


def _listen_unix(server: grpc.aio.Server, path: str, gid: int | None) -> os.stat_result:
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    except OSError as e:
        raise EdgeError(f"node.api_socket: cannot create {os.path.dirname(path)}: {e.strerror or e}") from e
    _clear_stale_socket(path)
    # grpc binds here with the process umask; a tight one keeps the socket closed
    # to everyone until chown and chmod below (the umask is back a moment later).
    old = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix:{path}")
    except RuntimeError as e:
        raise EdgeError(f"node.api_socket: cannot listen on {path}: {_one_line(e)}") from e
    finally:
        os.umask(old)
    try:
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, SOCKET_MODE)
    except OSError as e:
        os.unlink(path)
        raise EdgeError(f"node.api_socket: {path}: cannot set group and mode: {e.strerror or e}") from e
    return os.lstat(path)


def _read_pem(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"node.api_tls.{key}: cannot read {path}: {e.strerror or e}") from e


def _listen_tcp(server: grpc.aio.Server, listen: str, tls: Any) -> int:
    if tls is None:
        raise ConfigError("node.api_listen: TCP is served only with mutual TLS; set node.api_tls")
    creds = grpc.ssl_server_credentials(
        [(_read_pem(tls.key, "key"), _read_pem(tls.cert, "cert"))],
        root_certificates=_read_pem(tls.client_ca, "client_ca"),
        require_client_auth=True,
    )
    try:
        port = server.add_secure_port(listen, creds)
    except RuntimeError as e:
        raise EdgeError(f"node.api_listen: cannot listen on {listen}: {_one_line(e)}") from e
    if not port:
        raise EdgeError(f"node.api_listen: cannot listen on {listen}")
    return port


@dataclass
class ApiServer:
    """A running API server; stop() ends it and removes its socket file."""

    server: grpc.aio.Server
    servicer: EdgeServicer
    health: health_aio.HealthServicer
    socket_path: str | None = None
    tcp_port: int | None = None  # the bound port (useful when node.api_listen asks for port 0)
    _socket_id: tuple[int, int] | None = field(default=None, repr=False)

    async def set_serving(self, serving: bool) -> None:
        """grpc.health.v1: SERVING, or NOT_SERVING while edged's data path is not whole."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Says NOT_SERVING, ends event streams, lets calls finish for grace_s, closes."""
        await self.health.enter_graceful_shutdown()
        self.servicer.end_watches()
        await self.server.stop(grace_s)
        if self.socket_path and self._socket_id:
            try:
                st = os.lstat(self.socket_path)
                if (st.st_dev, st.st_ino) == self._socket_id:  # still ours, not a successor's
                    os.unlink(self.socket_path)
            except FileNotFoundError:
                pass


async def start(daemon: Edged, node: Any, *, unix: bool = True) -> ApiServer:
    """Serves edge.v1.Edge and grpc.health.v1 for daemon, as node (config.Node) says.

    unix: listen on node.api_socket (tests may serve TCP alone). Raises EdgeError
    (ConfigError for bad settings) with nothing left listening.
    """
    # SO_REUSEPORT (grpc's default) would let a second edged share the TCP port silently.
    # The largest request is a Reload with a config's text (at most MAX_CONFIG_BYTES).
    server = grpc.aio.server(
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_CONFIG_BYTES + 64 * 1024)]
    )
    servicer = EdgeServicer(daemon)
    edge_pb2_grpc.add_EdgeServicer_to_server(servicer, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    handle = ApiServer(server, servicer, health)
    try:
        listen = getattr(node, "api_listen", None)
        if listen:
            handle.tcp_port = _listen_tcp(server, listen, getattr(node, "api_tls", None))
        if unix:
            path = node.api_socket
            st = _listen_unix(server, path, _gid(getattr(node, "api_group", None)))
            handle.socket_path, handle._socket_id = path, (st.st_dev, st.st_ino)
        await server.start()
    except BaseException:
        await server.stop(None)
        if handle.socket_path:
            try:
                os.unlink(handle.socket_path)
            except FileNotFoundError:
                pass
        raise
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return handle
