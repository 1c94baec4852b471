"""edgectl's side of the API: a small synchronous client of edge.v1.Edge.

It talks to edged over its unix socket, or over TCP with mutual TLS (client
certificate, key and the CA that signed edged's certificate). Every failure
is an EdgeError with one line: NotRunning when nothing answers at the socket,
ApiError (with the gRPC code) when edged refused the request.

    with Client(socket_path="/run/edge/edged.sock") as edged:
        edged.drain("chat", "h100-a")
"""

from __future__ import annotations

import grp
import os
import socket
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane import statuspage
from controlplane.api import convert, edge_pb2, edge_pb2_grpc
from controlplane.errors import ApiDenied, ApiError, EdgeError, NotRunning

TIMEOUT_S = 10.0
RELOAD_TIMEOUT_S = 60.0  # a reload may redeploy services


@dataclass(frozen=True)
class Tls:
    """Files of a TCP client: its certificate and key, and the CA that signed edged's."""

    cert: str
    key: str
    ca: str


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise EdgeError(f"cannot read the {what} {path}: {e.strerror or e}") from e


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Client:
    """One channel to one edged. socket_path, or api (HOST:PORT) with tls."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        api: str | None = None,
        tls: Tls | None = None,
        timeout_s: float = TIMEOUT_S,
    ):
        self.socket_path = None if api else socket_path
        self.timeout_s = timeout_s
        if api:
            if tls is None:
                raise EdgeError(
                    f"{api}: TCP needs a client certificate, its key and the CA (edged serves TCP with mutual TLS only)"
                )
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca, "CA certificate"),
                private_key=_read(tls.key, "client key"),
                certificate_chain=_read(tls.cert, "client certificate"),
            )
            self.target = api
            self.channel = grpc.secure_channel(api, creds)
        else:
            if not socket_path:
                raise EdgeError("no API socket given")
            self.target = socket_path
            self.channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stub = edge_pb2_grpc.EdgeStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ errors

    def _unreachable(self, details: str) -> ApiError:
        """Why the socket did not answer, in the operator's words."""
        path = self.socket_path
        if path is None:
            return NotRunning(f"cannot reach edged at {self.target}: {details}")
        if "No such file or directory" in details:  # none when grpc tried, even if edged bound it since
            return NotRunning(f"edged is not running (no API socket at {path})")
        try:
            os.stat(path)
        except PermissionError:
            return ApiDenied(f"{path}: permission denied (a directory above the socket is closed to this user)")
        except OSError:
            return NotRunning(f"edged is not running (no API socket at {path})")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return NotRunning(f"edged is not running (nothing listens on the API socket {path})")
        except PermissionError:
            try:
                group = grp.getgrgid(os.stat(path).st_gid).gr_name
            except (KeyError, OSError):
                group = "its group"
            return ApiDenied(f"{path}: permission denied (edgectl must run as root or in group {group})")
        except OSError as e:
            return ApiError(f"cannot reach edged at {path}: {e.strerror or e}", "UNAVAILABLE")
        finally:
            probe.close()
        return ApiError(f"edged at {path} is unavailable: {details}", "UNAVAILABLE")

    def _error(self, e: grpc.RpcError, method: str) -> ApiError:
        code = e.code()
        details = _one_line(e.details() or code.name.lower())
        if code == grpc.StatusCode.UNAVAILABLE:
            return self._unreachable(details)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ApiError(f"edged at {self.target} did not answer {method} in time", code.name)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return ApiError(f"edged at {self.target} does not serve {method} (an older edged?)", code.name)
        return ApiError(details, code.name)

    def _call(self, method: str, request, timeout_s: float | None = None):
        try:
            return getattr(self.stub, method)(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as e:
            raise self._error(e, method) from None

    # ------------------------------------------------------------ calls

    def status(self, count_conntrack: bool = False, view: statuspage.View | None = None) -> dict:
        """edged's snapshot, in the shape of `edgectl status --json` (one instance); view: the
        summaries or a page of backends, as edged applies it (statuspage.apply)."""
        request = edge_pb2.GetStatusRequest(count_conntrack=count_conntrack)
        if view is not None:
            request.view.CopyFrom(convert.view_to_proto(view))
        msg = self._call("GetStatus", request)
        return convert.status_from_proto(msg)

    # In a fleet these act on every node unless local; each returns the scope edged applied
    # it with: "fleet" or "node" (an edged from before fleet-wide actions answers "node").

    def drain(self, service: str, backend: str, local: bool = False) -> str:
        msg = self._call("Drain", edge_pb2.DrainRequest(service=service, backend=backend, local=local))
        return msg.scope or "node"

    def undrain(self, service: str, backend: str, local: bool = False) -> str:
        msg = self._call("Undrain", edge_pb2.UndrainRequest(service=service, backend=backend, local=local))
        return msg.scope or "node"

    def set_weight(self, service: str, backend: str, weight: int | None, local: bool = False) -> str:
        """Pins backend's weight; None clears the override."""
        msg = self._call(
            "SetWeight", edge_pb2.SetWeightRequest(service=service, backend=backend, weight=weight, local=local)
        )
        return msg.scope or "node"

    def reload(self, config_text: str | None = None) -> dict:
        """Applies config_text, or else edged's own config file read again. What changed:
        added_services, removed_services, ... (lists of names)."""
        msg = self._call(
            "Reload", edge_pb2.ReloadRequest(config_text=config_text), max(self.timeout_s, RELOAD_TIMEOUT_S)
        )
        return convert.to_dict(msg)

    def drain_node(self, drained: bool = True) -> dict:
        """Withdraws (or with drained=False announces again) every VIP over BGP:
        {announced: [vip], withdrawn: {vip: why}}."""
        method = "DrainNode" if drained else "UndrainNode"
        request = edge_pb2.DrainNodeRequest() if drained else edge_pb2.UndrainNodeRequest()
        return convert.to_dict(self._call(method, request))

    def events(self, kinds: tuple[str, ...] = (), recent: int = 0) -> "EventStream":
        """edged's events from now on (after up to `recent` earlier ones), until edged
        ends the stream or it is cancelled."""
        call = self.stub.WatchEvents(edge_pb2.WatchEventsRequest(kinds=list(kinds), recent=recent))
        return EventStream(self, call)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: SERVING, NOT_SERVING, ..."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise self._error(e, "Check") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class EventStream:
    """An iterator of edged's events (dicts). cancel() ends it: the iteration stops
    quietly. cancel() may be called from another thread or from a signal handler,
    which is how a watch should end on Ctrl-C: a KeyboardInterrupt raised at an
    arbitrary point inside grpc's iterator can interrupt it while it holds its
    locks (grpc/grpc#19464 recommends cancelling the call from a handler)."""

    def __init__(self, client: Client, call):
        self._client = client
        self._call = call

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> dict:
        try:
            msg = next(self._call)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise self._client._error(e, "WatchEvents") from None
        return convert.event_from_proto(msg)

    def cancel(self) -> None:
        self._call.cancel()

    close = cancel
