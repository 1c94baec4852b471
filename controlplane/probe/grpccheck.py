"""The prober's gRPC check kind: grpc.health.v1 Check over one channel per target (grpc's
own client; imported only where a service probes with grpc). The other kinds, and the _Check
schedule it shares, are in probe.checks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Optional

from controlplane import config
from controlplane.probe.checks import Host, _Check, _monotonic_ns

if TYPE_CHECKING:
    from controlplane.probe.engine import _Backend


class _GrpcCheck(_Check):
    """grpc.health.v1.Health/Check over one channel per target; ok iff SERVING."""

    def __init__(self, prober: Host, backend: "_Backend", probe: config.Probe):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.grpc, self.health_pb2 = grpc, health_pb2
        target = backend.target
        self.channel = grpc.aio.insecure_channel(
            f"{target.address}:{target.port}",
            options=[
                # Retry a dead backend's connection at about the probe rate, not after minutes.
                ("grpc.initial_reconnect_backoff_ms", probe.interval_ms),
                ("grpc.min_reconnect_backoff_ms", probe.interval_ms),
                ("grpc.max_reconnect_backoff_ms", max(probe.interval_ms, 1000)),
            ],
        )
        self.check = health_pb2_grpc.HealthStub(self.channel).Check
        self.request = health_pb2.HealthCheckRequest(service=probe.grpc_service)
        self.task: Optional[asyncio.Task] = None
        super().__init__(prober, backend, probe.interval_ms, probe.timeout_ms)

    def begin(self) -> None:
        self.task = self.prober.spawn(self._call(self.round))

    async def _call(self, round_: int) -> None:
        t0 = _monotonic_ns()
        try:
            reply = await self.check(self.request, timeout=self.timeout_ns / 1e9)
        except self.grpc.aio.AioRpcError as e:
            if self.busy and round_ == self.round:
                self.fail(self._word(e))
            return
        except Exception as e:  # grpc's own errors outside AioRpcError: a failed probe
            if self.busy and round_ == self.round:
                self.fail(f"grpc {type(e).__name__}")
            return
        rtt_ns = _monotonic_ns() - t0
        if not (self.busy and round_ == self.round):
            return
        serving = self.health_pb2.HealthCheckResponse.SERVING
        if reply.status == serving:
            self.finish(rtt_ns)
        else:
            self.fail(self.health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def _word(self, e) -> str:
        code = e.code()
        if code == self.grpc.StatusCode.DEADLINE_EXCEEDED:
            return "timeout"
        if code == self.grpc.StatusCode.UNAVAILABLE:
            return "refused" if "refused" in (e.details() or "").lower() else "unavailable"
        return f"grpc {code.name}"

    def abort(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        await self.channel.close()
