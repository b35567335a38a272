"""``inference.GRPCInferenceService``: the grpclib handlers, typed against
:class:`~actorserve.api.EngineAPI` only.

Handlers run on grpclib's asyncio loop; each reaches the engine through one
:func:`~actorserve.transport.grpchost.bridge.to_trio` hop (the engine's state lives on the trio side). A unary call is
one trio task: a client that cancels (or whose deadline passes) cancels the asyncio
handler, which cancels the trio task, which leaves the engine's request. ModelStreamInfer
is a :mod:`.streams` call. Call counting and draining are the gRPC host's
(:mod:`actorserve.transport.grpchost`).

Errors: domain errors map to a gRPC status through :mod:`actorserve.transport.errors`;
anything else is a bug, logged with its traceback and sent as INTERNAL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

from grpclib.const import Cardinality, Handler
from grpclib.server import Stream

from ...api import EngineAPI, ModelState, TensorMetadata, with_control
from ...errors import ModelNotFound
from ...proto.inference import (
    ModelConfigRequest,
    ModelConfigResponse,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelMetadataResponseTensorMetadata,
    ModelReadyRequest,
    ModelReadyResponse,
    ModelStatisticsRequest,
    ModelStatisticsResponse,
    ModelStreamInferResponse,
    RepositoryIndexRequest,
    RepositoryIndexResponse,
    RepositoryIndexResponseModelIndex,
    RepositoryModelLoadRequest,
    RepositoryModelLoadResponse,
    RepositoryModelUnloadRequest,
    RepositoryModelUnloadResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from ...proto.upb import InferRequestDecoder, request_of, response_message
from ...replica import replica_id
from ...settings import Settings, SettingsError
from ...version import __version__
from ..exchange import Exchange
from ..grpchost.bridge import to_trio
from ..grpchost.door import Calls
from ..grpchost.h2 import Wire
from ..grpchost.interceptor import call_exchange
from ..grpchost.status import log, status_error
from ..grpchost.unary import lean
from ..triton import EXTENSIONS, UNLOAD_DEPENDENTS_NOTE, config_json, load_config, statistics_json
from .routing import SequenceWire, echo_sequence, parameter_sequence_id, with_routing_hint
from .streams import MLServerStream, StreamCall, TritonStream
from .triton_pb import config_to_pb, repository_parameters, statistics_to_pb

SERVICE: Final = "/inference.GRPCInferenceService/"

#: The RPCs of this service that manage models (the auth seam: with
#: ``actorserve.v1.Management``, see .management_service, these need a management token).
MANAGEMENT_METHODS: Final = ("RepositoryModelLoad", "RepositoryModelUnload")

#: Metadata header with which a Triton client asks for a gRPC status instead of an
#: in-band ``error_message`` on ModelStreamInfer.
TRITON_GRPC_ERROR: Final = "triton_grpc_error"

T = TypeVar("T")

_Method = Callable[[Stream[Any, Any]], Awaitable[None]]


async def _mapping_errors(afn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await afn(*args)`` with a domain error turned into its :class:`GRPCError`."""
    try:
        return await afn(*args)
    except Exception as exc:
        raise status_error(exc) from None


class InferenceService:
    """The grpclib handlers of ``GRPCInferenceService``, registered raw (not through
    betterproto2's generated base, whose bidi method is half-duplex), on the gRPC host
    (``calls``: the token check, records, call counting and drain are the host's).
    ``SettingsError`` for a bad ``grpc_stream_*`` setting."""

    def __init__(self, engine: EngineAPI, settings: Settings, calls: Calls) -> None:
        if settings.grpc_stream_dialect not in ("triton", "mlserver"):
            raise SettingsError(
                f"grpc_stream_dialect must be 'triton' or 'mlserver', got {settings.grpc_stream_dialect!r}"
            )
        if settings.grpc_stream_max_inflight < 1:
            raise SettingsError("grpc_stream_max_inflight must be >= 1")
        self.engine = engine
        self.settings = settings
        #: the gRPC host: call counting, drain, records
        self.calls = calls
        self.recorder = calls.recorder

    def __mapping__(self) -> dict[str, Handler]:
        unary = Cardinality.UNARY_UNARY
        stream_reply = (
            ModelInferResponse
            if self.settings.grpc_stream_dialect == "mlserver"
            else ModelStreamInferResponse
        )
        methods: list[tuple[str, _Method, Cardinality, Any, Any, bool]] = [
            ("ServerLive", self._server_live, unary, ServerLiveRequest, ServerLiveResponse, False),
            ("ServerReady", self._server_ready, unary, ServerReadyRequest, ServerReadyResponse, False),
            ("ModelReady", self._model_ready, unary, ModelReadyRequest, ModelReadyResponse, False),
            (
                "ServerMetadata",
                self._server_metadata,
                unary,
                ServerMetadataRequest,
                ServerMetadataResponse,
                False,
            ),
            (
                "ModelMetadata",
                self._model_metadata,
                unary,
                ModelMetadataRequest,
                ModelMetadataResponse,
                False,
            ),
            ("ModelConfig", self._model_config, unary, ModelConfigRequest, ModelConfigResponse, False),
            (
                "ModelStatistics",
                self._model_statistics,
                unary,
                ModelStatisticsRequest,
                ModelStatisticsResponse,
                False,
            ),
            ("ModelInfer", self._model_infer, unary, ModelInferRequest, ModelInferResponse, True),
            (
                "ModelStreamInfer",
                self._model_stream_infer,
                Cardinality.STREAM_STREAM,
                ModelInferRequest,
                stream_reply,
                True,
            ),
            (
                "RepositoryIndex",
                self._repository_index,
                unary,
                RepositoryIndexRequest,
                RepositoryIndexResponse,
                False,
            ),
            (
                "RepositoryModelLoad",
                self._repository_model_load,
                unary,
                RepositoryModelLoadRequest,
                RepositoryModelLoadResponse,
                True,
            ),
            (
                "RepositoryModelUnload",
                self._repository_model_unload,
                unary,
                RepositoryModelUnloadRequest,
                RepositoryModelUnloadResponse,
                True,
            ),
        ]
        # the unary methods read and write through Wire only: the host's lean path serves them
        return {
            SERVICE + name: Handler(
                self.calls.tracked(_lean(func, cardinality)) if work else _lean(func, cardinality),
                cardinality,
                request,
                reply,
            )
            for name, func, cardinality, request, reply, work in methods
        }

    def tracked(self, func: _Method) -> _Method:
        """``func`` counted and drained by the host (for .management_service's handlers too)."""
        return self.calls.tracked(func)

    def _wire(self, stream: Stream[Any, Any], recv_type: Any) -> Wire:
        kind = (
            SequenceWire if recv_type is InferRequestDecoder else Wire
        )  # the routing key checked (.routing)
        return kind(
            stream, recv_type, max_bytes=self.settings.max_body_bytes, min_bytes=self.settings.gzip_min_bytes
        )

    async def _request(self, stream: Stream[Any, Any], recv_type: Any) -> tuple[Wire, Any]:
        wire = self._wire(stream, recv_type)
        message = await wire.recv_one()
        exchange = call_exchange()
        if exchange is not None:  # for the access line
            exchange.model = getattr(message, "name", None) or getattr(message, "model_name", None) or None
            exchange.version = (
                getattr(message, "version", None) or getattr(message, "model_version", None) or None
            )
        return wire, message

    async def _engine(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await afn(*args)`` on the trio side, errors mapped to a status."""
        return await to_trio(_mapping_errors, afn, *args)

    # -- health and metadata --------------------------------------------------------------

    async def _server_live(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, ServerLiveRequest)
        await wire.send(ServerLiveResponse(live=True))

    async def _server_ready(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, ServerReadyRequest)
        ready = await self._engine(self.engine.ready)
        await wire.send(ServerReadyResponse(ready=ready and not self.calls.draining))

    async def _model_ready(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelReadyRequest)
        ready = await self._engine(_model_is_ready, self.engine, message.name, message.version or None)
        await wire.send(ModelReadyResponse(ready=ready and not self.calls.draining))

    async def _server_metadata(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, ServerMetadataRequest)
        await wire.send(
            ServerMetadataResponse(name="actorserve", version=__version__, extensions=list(EXTENSIONS))
        )

    async def _model_metadata(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelMetadataRequest)
        meta = await self._engine(self.engine.metadata, message.name, message.version or None)
        await wire.send(
            ModelMetadataResponse(
                name=meta.name,
                versions=list(meta.versions),
                platform=meta.platform,
                inputs=_tensor_metadata(meta.inputs),
                outputs=_tensor_metadata(meta.outputs),
            )
        )

    async def _model_config(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelConfigRequest)
        version = message.version or None
        description = await self._engine(self.engine.describe, message.name, version)
        metadata = await self._engine(self.engine.metadata, message.name, version)
        await wire.send(ModelConfigResponse(config=config_to_pb(config_json(description, metadata))))

    async def _model_statistics(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelStatisticsRequest)
        stats = await self._engine(self.engine.inference_statistics, message.name, message.version or None)
        await wire.send(statistics_to_pb(statistics_json(stats)))

    async def _repository_index(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, RepositoryIndexRequest)
        models = [
            RepositoryIndexResponseModelIndex(
                name=entry.name, version=entry.version, state=entry.state.value, reason=entry.reason
            )
            for entry in await self._engine(self.engine.repository_index)
            if not message.ready or entry.state is ModelState.READY
        ]
        await wire.send(RepositoryIndexResponse(models=models))

    # -- inference and management -------------------------------------------------------

    async def _model_infer(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, InferRequestDecoder)
        exchange = call_exchange()
        if exchange is not None:
            exchange.model_request(message.model_name, message.model_version or None)
            self.recorder.open(exchange)
        reply = await to_trio(self._infer, message, exchange, getattr(wire, "sequence_id", None))
        echo_sequence(stream, parameter_sequence_id(reply.parameters))
        await wire.send(reply)

    async def _infer(self, message: Any, exchange: Exchange | None, metadata_id: str | None) -> Any:
        try:
            response = await self.engine.infer(with_control(request_of(message)))
            if exchange is not None:
                exchange.answered(response.model_version, response.parameters.get("sequence_id"))
            return response_message(response)
        except Exception as exc:
            if exchange is not None and isinstance(exc, ModelNotFound):
                exchange.not_found = True
            raise with_routing_hint(status_error(exc), exc, metadata_id, message) from None

    async def _repository_model_load(self, stream: Stream[Any, Any]) -> None:
        # As over REST: every version the repository has of the model, with Triton's
        # ``config`` parameter (a JSON string) as a model-settings override.
        wire, message = await self._request(stream, RepositoryModelLoadRequest)
        await self._engine(self._load, message.model_name, repository_parameters(message.parameters))
        await wire.send(RepositoryModelLoadResponse())

    async def _load(self, name: str, parameters: dict[str, Any]) -> None:
        await self.engine.load_from_repository(name, load_config(parameters))

    async def _repository_model_unload(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, RepositoryModelUnloadRequest)
        if repository_parameters(message.parameters).get("unload_dependents"):
            log.info("unload %s: %s", message.model_name, UNLOAD_DEPENDENTS_NOTE)
        await self._engine(self._unload, message.model_name)
        await wire.send(RepositoryModelUnloadResponse())

    async def _unload(self, name: str) -> None:
        await self.engine.unload(name, grace=self.settings.grace_period)

    async def _model_stream_infer(self, stream: Stream[Any, Any]) -> None:
        wire = self._wire(stream, InferRequestDecoder)
        if isinstance(wire, SequenceWire):
            echo_sequence(stream, wire.sequence_id)
            wire.name_first_start = replica_id(self.settings.replica_id)
        max_inflight, draining = self.settings.grpc_stream_max_inflight, self.calls.drain_started
        call: StreamCall
        if self.settings.grpc_stream_dialect == "mlserver":
            call = MLServerStream(
                self.engine, wire, max_inflight=max_inflight, draining=draining, recorder=self.recorder
            )
        else:
            metadata: Mapping[str, Any] = stream.metadata or {}
            status_errors = str(metadata.get(TRITON_GRPC_ERROR, "")).strip().lower() in ("true", "1")
            call = TritonStream(
                self.engine,
                wire,
                max_inflight=max_inflight,
                draining=draining,
                status_errors=status_errors,
                recorder=self.recorder,
            )
        if wire.request_ended():
            # the whole request stream is here (a client that sent its request and
            # half-closed): its first message is read on this side, so the call's
            # first read costs no hop back from trio (time to first token)
            call.prefetched = await wire.recv()
        await to_trio(call.run)


def _lean(func: _Method, cardinality: Cardinality) -> _Method:
    return lean(func) if cardinality is Cardinality.UNARY_UNARY else func


def _tensor_metadata(specs: tuple[TensorMetadata, ...]) -> list[Any]:
    return [
        ModelMetadataResponseTensorMetadata(name=s.name, datatype=s.datatype, shape=list(s.shape))
        for s in specs
    ]


__all__ = ["MANAGEMENT_METHODS", "SERVICE", "TRITON_GRPC_ERROR", "InferenceService"]


async def _model_is_ready(engine: EngineAPI, name: str, version: str | None) -> bool:
    """Triton's ``ModelReady``: ``false``, not an error, for a model that is not loaded
    (unloaded or never known), as ``InferenceServer::ModelIsReady`` answers."""
    try:
        return (await engine.model_info(name, version)).ready
    except ModelNotFound:
        return False
