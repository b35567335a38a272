"""``grpc.health.v1.Health``: Check and Watch, as the gRPC health checking protocol
(grpc/grpc ``doc/health-checking.md``) describes them.

The ``service`` a probe names is one of:

- ``""`` (the server), or the name of a gRPC service the port serves (Envoy's and
  Kubernetes' probes may name one): SERVING while the engine is ready (every model
  loaded, nothing draining, as ``ServerReady`` / ``GET /v2/health/ready``), else
  NOT_SERVING;
- a model's name: SERVING while its default version is ready, NOT_SERVING while it is
  loaded but not ready (loading, unloading) or the server drains.

Anything else is unknown: Check fails with NOT_FOUND (the protocol's answer), Watch
sends SERVICE_UNKNOWN and keeps watching (the model may be loaded later).

Watch sends the status at once, then each change: a trio task polls the engine every
:data:`WATCH_INTERVAL` seconds (the engine link has no change notification a door can
use) and at once when the drain starts; the client's cancel (or the server's close)
ends it. At most :data:`MAX_WATCHES` Watch calls run per process (RESOURCE_EXHAUSTED
past that).
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import trio
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.server import Stream

from ...api import EngineAPI
from ...errors import ModelNotFound
from ...settings import Settings
from ..grpchost.bridge import to_trio
from ..grpchost.door import Calls
from ..grpchost.h2 import Wire
from ..grpchost.status import status_error
from .reflection import SERVED_SERVICES

SERVICE: Final = "/grpc.health.v1.Health/"
#: seconds between two looks at the engine of one Watch call
WATCH_INTERVAL: Final = 1.0
#: Watch calls running at once in one process
MAX_WATCHES: Final = 256

#: a ServingStatus value (protobuf's stubs type it apart from int)
Serving: TypeAlias = "HealthCheckResponse.ServingStatus.ValueType"

SERVING: Final = HealthCheckResponse.SERVING
NOT_SERVING: Final = HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: Final = HealthCheckResponse.SERVICE_UNKNOWN


class HealthService:
    """The handlers of ``grpc.health.v1.Health`` (open: no token; not counted by the
    drain, so a probe is answered NOT_SERVING while the server drains, not refused)."""

    def __init__(self, engine: EngineAPI, settings: Settings, calls: Calls) -> None:
        self.engine = engine
        self.settings = settings
        self.calls = calls
        #: Watch calls running (asyncio side)
        self.watching = 0

    def __mapping__(self) -> dict[str, Handler]:
        return {
            SERVICE + "Check": Handler(
                self._check, Cardinality.UNARY_UNARY, HealthCheckRequest, HealthCheckResponse
            ),
            SERVICE + "Watch": Handler(
                self._watch, Cardinality.UNARY_STREAM, HealthCheckRequest, HealthCheckResponse
            ),
        }

    def _wire(self, stream: Stream[Any, Any]) -> Wire:
        return Wire(
            stream,
            HealthCheckRequest,
            max_bytes=self.settings.max_body_bytes,
            min_bytes=self.settings.gzip_min_bytes,
        )

    async def _check(self, stream: Stream[Any, Any]) -> None:
        wire = self._wire(stream)
        message = await wire.recv_one()
        status = await to_trio(self._status, message.service)
        if status == SERVICE_UNKNOWN:
            raise GRPCError(Status.NOT_FOUND, unknown_service(message.service))
        await wire.send(HealthCheckResponse(status=status))

    async def _watch(self, stream: Stream[Any, Any]) -> None:
        wire = self._wire(stream)
        message = await wire.recv_one()
        if self.watching >= MAX_WATCHES:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, f"{MAX_WATCHES} health Watch calls are running")
        self.watching += 1
        try:
            last: Serving | None = None
            while True:  # until the client cancels or the server closes the call
                last = await to_trio(self._next_status, message.service, last)
                await wire.send(HealthCheckResponse(status=last))
        finally:
            self.watching -= 1

    def _draining(self) -> bool:
        return self.calls.draining or self.calls.drain_started.is_set()

    async def _status(self, service: str) -> Serving:
        """The status of ``service`` now (trio side)."""
        try:
            if not service or service in SERVED_SERVICES:
                ready = await self.engine.ready()
            else:
                ready = (await self.engine.model_info(service)).ready
        except ModelNotFound:
            return SERVICE_UNKNOWN
        except Exception as exc:
            raise status_error(exc) from None
        return SERVING if ready and not self._draining() else NOT_SERVING

    async def _next_status(self, service: str, last: Serving | None) -> Serving:
        """The status of ``service`` once it differs from ``last`` (trio side): looked
        at every :data:`WATCH_INTERVAL` seconds and when the drain starts."""
        while True:  # ends with a change, or is cancelled with its call
            status = await self._status(service)
            if status != last:
                return status
            draining = self.calls.drain_started
            if not draining.is_set():
                with trio.move_on_after(WATCH_INTERVAL):
                    await draining.wait()
            elif status == NOT_SERVING:
                await trio.sleep_forever()  # draining: NOT_SERVING for good, nothing left to see
            else:
                await trio.sleep(WATCH_INTERVAL)  # an unknown model may still be loaded


def unknown_service(service: str) -> str:
    """Check's NOT_FOUND message."""
    return (
        f"unknown service {service[:200]!r}: name '' (the server), a gRPC service this port "
        "serves, or a loaded model"
    )


__all__ = ["MAX_WATCHES", "SERVICE", "WATCH_INTERVAL", "HealthService", "unknown_service"]
