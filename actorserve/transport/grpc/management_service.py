"""``actorserve.v1.Management``: the management API beyond the OIP over gRPC (describe a
model, set its workers, set its default version), typed against
:class:`~actorserve.api.EngineAPI` only. The REST routes of
:mod:`actorserve.transport.rest.management_routes` mean the same.

:meth:`ManagementService.__mapping__` holds every management RPC, and only them; the
token check wraps every handler of the server by service and method name
(:func:`actorserve.transport.grpchost.interceptor.guarded`). The OIP's own repository RPCs (RepositoryModelLoad / Unload)
live in ``GRPCInferenceService``; ``service.MANAGEMENT_METHODS`` names them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import attrs
from grpclib.const import Cardinality, Handler
from grpclib.server import Stream

from ...api import EngineAPI, ModelDescription
from ...errors import BadInput
from ...proto.actorserve.v1 import (
    DescribeModelRequest,
    ReplicaDescription,
    SequenceLimits,
    SetDefaultVersionRequest,
    SetWorkersRequest,
)
from ...proto.actorserve.v1 import ModelDescription as ModelDescriptionPb
from ..grpchost.h2 import Wire

SERVICE: Final = "/actorserve.v1.Management/"

Method = Callable[[Stream[Any, Any]], Awaitable[None]]


class Calls(Protocol):
    """What the handlers borrow from the inference service: reading the request and
    calling the engine on the trio side with errors mapped to a status."""

    async def _request(self, stream: Stream[Any, Any], recv_type: Any) -> tuple[Wire, Any]: ...

    async def _engine(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any: ...

    def tracked(self, func: Method) -> Method: ...


def description_to_pb(d: ModelDescription) -> ModelDescriptionPb:
    scalars = attrs.asdict(d, recurse=False)
    for key in (
        "replicas",
        "versions",
        "idle_timeout_ms",
        "max_duration_ms",
        "max_queue",
        "max_sequences",
        "evict_idle",
        "platform",
        "requires_sequence",
        "loaded_at_startup",
    ):
        scalars.pop(key)
    return ModelDescriptionPb(
        **scalars,
        versions=list(d.versions),
        sequence=SequenceLimits(
            idle_timeout_ms=d.idle_timeout_ms,
            max_duration_ms=d.max_duration_ms,
            max_queue=d.max_queue,
            max_sequences=d.max_sequences,
            evict_idle=d.evict_idle,
        ),
        replicas=[ReplicaDescription(**attrs.asdict(r)) for r in d.replicas],
    )


class ManagementService:
    """The grpclib handlers of ``actorserve.v1.Management``."""

    def __init__(self, engine: EngineAPI, calls: Calls) -> None:
        self.engine = engine
        self.calls = calls

    def __mapping__(self) -> dict[str, Handler]:
        unary = Cardinality.UNARY_UNARY
        methods: list[tuple[str, Method, Any]] = [
            ("DescribeModel", self._describe, DescribeModelRequest),
            ("SetWorkers", self._set_workers, SetWorkersRequest),
            ("SetDefaultVersion", self._set_default_version, SetDefaultVersionRequest),
        ]
        handlers = {}
        for name, func, request in methods:
            handlers[SERVICE + name] = Handler(self.calls.tracked(func), unary, request, ModelDescriptionPb)
        return handlers

    async def _reply(self, wire: Wire, name: str, version: str | None) -> None:
        description = await self.calls._engine(self.engine.describe, name, version)
        await wire.send(description_to_pb(description))

    async def _describe(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self.calls._request(stream, DescribeModelRequest)
        await self._reply(wire, message.name, message.version or None)

    async def _set_workers(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self.calls._request(stream, SetWorkersRequest)
        await self.calls._engine(self._scale, message)
        await self._reply(wire, message.name, message.version or None)

    async def _scale(self, message: SetWorkersRequest) -> None:
        if message.workers < 1:
            raise BadInput(f"workers must be >= 1, got {message.workers}")
        if message.grace_seconds is not None and message.grace_seconds < 0:
            raise BadInput(f"grace_seconds must be >= 0, got {message.grace_seconds}")
        await self.engine.set_workers(
            message.name, message.workers, message.version or None, grace=message.grace_seconds
        )

    async def _set_default_version(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self.calls._request(stream, SetDefaultVersionRequest)
        await self.calls._engine(self.engine.set_default_version, message.name, message.version)
        await self._reply(wire, message.name, None)
