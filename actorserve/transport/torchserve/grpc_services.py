"""TorchServe's gRPC services, registered raw on our grpclib server beside Triton's:
``org.pytorch.serve.grpc.inference.InferenceAPIsService`` (Ping, Predictions,
StreamPredictions, StreamPredictions2) and ``...management.ManagementAPIsService``.

Handlers run on grpclib's asyncio loop and reach the engine in one trio task per call
(:func:`~actorserve.transport.grpc.bridge.to_trio`), like the Triton service. Unary
``Predictions`` answers the handler's first response, as TorchServe does. Errors are
TorchServe's: its HTTP code mapped to a gRPC status (``GRPCUtils``), the message as the
details; on StreamPredictions2 an error is a response whose ``status`` is a
``google.rpc.Status`` (with an ``ErrorInfo``), and the stream stays open (a request with
neither a sequence id nor a start is refused so).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ...api import EngineAPI
from ...proto.torchserve.google.protobuf import Any as PbAny
from ...proto.torchserve.google.protobuf import Empty
from ...proto.torchserve.google.rpc import ErrorInfo
from ...proto.torchserve.google.rpc import Status as RpcStatus
from ...proto.torchserve.org.pytorch.serve.grpc import management as pm
from ...proto.torchserve.org.pytorch.serve.grpc.inference import (
    PredictionResponse,
    PredictionsRequest,
    TorchServeHealthResponse,
)
from ...settings import Settings
from ...torchserve import envelope
from ..grpc.bridge import to_aio, to_trio
from ..grpc.h2 import Wire
from .errors import TsError, TsRefusal, answer_error, ts_error
from .management_ops import Management, Reply
from .predictions import Call, Predictor, first_answers

INFERENCE: Final = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/"
MANAGEMENT: Final = "/org.pytorch.serve.grpc.management.ManagementAPIsService/"

#: requests of one StreamPredictions2 call running at once before it stops reading
STREAM2_INFLIGHT: Final = 16

#: TorchServe's GRPCUtils.getGRPCStatusCode
_CODES: Final = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    409: Status.ABORTED,
    413: Status.RESOURCE_EXHAUSTED,
    429: Status.RESOURCE_EXHAUSTED,
    416: Status.OUT_OF_RANGE,
    499: Status.CANCELLED,
    501: Status.UNIMPLEMENTED,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}

#: the Java package of TorchServe's exceptions that are not in ``org.pytorch.serve.http``
_PACKAGES: Final = {
    "ModelNotFoundException": "org.pytorch.serve.archive.model",
    "ModelVersionNotFoundException": "org.pytorch.serve.archive.model",
}

Track = Callable[
    [Callable[[Stream[Any, Any]], Awaitable[None]]], Callable[[Stream[Any, Any]], Awaitable[None]]
]


def grpc_code(http: int) -> Status:
    if http in _CODES:
        return _CODES[http]
    return Status.OK if 200 <= http < 300 else Status.INTERNAL


def grpc_error(error: TsError) -> GRPCError:
    return GRPCError(grpc_code(error.code), error.message)


def rpc_status(error: TsError) -> RpcStatus:
    """An in-band StreamPredictions2 error; its ``ErrorInfo`` reason is the exception's
    Java name as TorchServe gives it (a reason with a dot in it is given whole)."""
    reason = error.type or "InternalServerException"
    if "." not in reason:
        reason = f"{_PACKAGES.get(reason, 'org.pytorch.serve.http')}.{reason}"
    detail = PbAny.pack(ErrorInfo(reason=reason))
    return RpcStatus(code=grpc_code(error.code).value, message=error.message, details=[detail])


def handler_status(error: TsError) -> RpcStatus:
    """A handler's failed answer in band: TorchServe's worker reports every one as
    ``InternalServerException`` (``GRPCJob.sendError``), whatever the handler raised."""
    return rpc_status(TsError(error.code, "InternalServerException", error.message))


class _Turn:
    """One request's place among its sequence's answers on a StreamPredictions2 call:
    :meth:`wait` until the request before it (same sequence id) has sent its first
    answer; :meth:`done` once this one has (or never will). No id: no order to keep."""

    def __init__(self, first_sent: dict[str, trio.Event], sequence_id: str) -> None:
        self._table, self._id = first_sent, sequence_id
        self._before = first_sent.get(sequence_id) if sequence_id else None
        self._mine = trio.Event()
        if sequence_id:
            first_sent[sequence_id] = self._mine

    async def wait(self) -> None:
        if self._before is not None:
            await self._before.wait()
            self._before = None

    def done(self) -> None:
        self._mine.set()
        if self._table.get(self._id) is self._mine:
            del self._table[self._id]


def _call(message: PredictionsRequest, headers: Mapping[str, str]) -> Call:
    if not message.model_name:
        raise _bad_request("Parameter model_name is required.")
    inputs = {key: (bytes(value), "") for key, value in message.input.items()}
    return Call(message.model_name, message.model_version or None, inputs, headers)


def _bad_request(message: str) -> TsRefusal:
    """A request TorchServe's gRPC frontend refuses before any model sees it: INTERNAL,
    with ``BadRequestException.()`` as the reason of an in-band status (as it says)."""
    return TsRefusal(TsError(500, "BadRequestException.()", message))


class Served:
    """Handlers as grpclib serves them (an object with ``__mapping__``)."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers

    def __mapping__(self) -> dict[str, Handler]:
        return self.handlers


class TorchServeGrpc:
    """Both services' handlers; ``track`` wraps a handler that works (the gRPC server's
    call counting and drain)."""

    def __init__(self, engine: EngineAPI, settings: Settings, track: Track) -> None:
        self.engine = engine
        self.settings = settings
        self.predictor = Predictor(engine)
        self.management = Management(engine)
        self._track = track

    def __mapping__(self) -> dict[str, Handler]:
        unary, server_stream = Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM
        handlers = {
            INFERENCE + "Ping": Handler(self._ping, unary, Empty, TorchServeHealthResponse),
            INFERENCE + "Predictions": Handler(
                self._track(self._predictions), unary, PredictionsRequest, PredictionResponse
            ),
            INFERENCE + "StreamPredictions": Handler(
                self._track(self._stream_predictions), server_stream, PredictionsRequest, PredictionResponse
            ),
            INFERENCE + "StreamPredictions2": Handler(
                self._track(self._stream_predictions2),
                Cardinality.STREAM_STREAM,
                PredictionsRequest,
                PredictionResponse,
            ),
        }
        operations: list[tuple[str, Any, Callable[[Any], Awaitable[Reply]]]] = [
            ("DescribeModel", pm.DescribeModelRequest, self._describe),
            ("ListModels", pm.ListModelsRequest, self._list),
            ("RegisterModel", pm.RegisterModelRequest, self._register),
            ("ScaleWorker", pm.ScaleWorkerRequest, self._scale),
            ("SetDefault", pm.SetDefaultRequest, self._set_default),
            ("UnregisterModel", pm.UnregisterModelRequest, self._unregister),
        ]
        for name, request_type, operation in operations:
            handler = self._track(self._management_call(request_type, operation))
            handlers[MANAGEMENT + name] = Handler(handler, unary, request_type, pm.ManagementResponse)
        return handlers

    def only(self, service: str) -> Served:
        """One of the two services alone (``"inference"`` or ``"management"``), for a
        port of its own: the other's methods are UNIMPLEMENTED there."""
        prefix = {"inference": INFERENCE, "management": MANAGEMENT}[service]
        return Served({path: h for path, h in self.__mapping__().items() if path.startswith(prefix)})

    def _wire(self, stream: Stream[Any, Any], recv_type: Any) -> Wire:
        return Wire(
            stream, recv_type, max_bytes=self.settings.max_body_bytes, min_bytes=self.settings.gzip_min_bytes
        )

    async def _request(self, stream: Stream[Any, Any], recv_type: Any) -> tuple[Wire, Any]:
        wire = self._wire(stream, recv_type)
        message = await wire.recv_one()
        return wire, message

    # -- inference ------------------------------------------------------------------------

    async def _ping(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, Empty)
        healthy = await to_trio(self.engine.ready)
        health = json.dumps({"status": "Healthy" if healthy else "Unhealthy"}, indent=2)
        await wire.send(TorchServeHealthResponse(health=health))

    async def _predictions(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, PredictionsRequest)
        await to_trio(self._predict_unary, wire, message)

    async def _predict_unary(self, wire: Wire, message: PredictionsRequest) -> None:
        """Answered with the handler's first response, as TorchServe's ``GRPCJob``
        completes a unary call on it: a handler that sends intermediate responses is
        answered with the first of them, and the rest of the request is cancelled
        (TorchServe lets its handler run on and drops them)."""
        try:
            async with self.predictor.stream(_call(message, {})) as (responses, _):
                answers = await first_answers(responses)
        except Exception as exc:
            raise grpc_error(ts_error(exc)) from None
        if not answers:
            raise grpc_error(TsError(503, "InternalServerException", "the model gave no answer"))
        if not envelope.ok_status(answers[0].status):
            raise grpc_error(answer_error(answers[0]))
        await to_aio(wire.send, PredictionResponse(prediction=answers[0].body))

    async def _stream_predictions(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, PredictionsRequest)
        await to_trio(self._predict_stream, wire, message)

    async def _predict_stream(self, wire: Wire, message: PredictionsRequest) -> None:
        try:
            async with self.predictor.stream(_call(message, {})) as (responses, _):
                while answers := await first_answers(responses):
                    replies: list[PredictionResponse] = []
                    for answer in answers:
                        if not envelope.ok_status(answer.status):
                            if replies:
                                await to_aio(wire.send_many, replies)
                            raise grpc_error(answer_error(answer))
                        replies.append(PredictionResponse(prediction=answer.body))
                    await to_aio(wire.send_many, replies)
        except GRPCError:
            raise
        except Exception as exc:
            raise grpc_error(ts_error(exc)) from None

    async def _stream_predictions2(self, stream: Stream[Any, Any]) -> None:
        wire = self._wire(stream, PredictionsRequest)
        await to_trio(self._bidi, wire)

    async def _bidi(self, wire: Wire) -> None:
        """Read requests in order; each runs in a task of its own once the engine took
        the one before (so a sequence's requests keep their order); one writer. A
        request's first answer waits for the first answer of the request of its sequence
        before it: answers that arrive together (one engine frame) keep the order."""
        send, receive = trio.open_memory_channel[list[PredictionResponse]](STREAM2_INFLIGHT)
        slots = trio.Semaphore(STREAM2_INFLIGHT)
        first_sent: dict[str, trio.Event] = {}  # sequence id -> its latest request's first answer
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, wire, receive)
            async with send:
                while (message := await to_aio(wire.recv)) is not None:
                    await slots.acquire()
                    turn = _Turn(first_sent, message.sequence_id or "")
                    await nursery.start(self._one_of_bidi, message, send.clone(), slots, turn)

    async def _write(self, wire: Wire, receive: trio.MemoryReceiveChannel[list[PredictionResponse]]) -> None:
        async with receive:
            async for batch in receive:
                while True:  # everything already waiting goes in one write
                    try:
                        batch = batch + receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await to_aio(wire.send_many, batch)

    async def _one_of_bidi(
        self,
        message: PredictionsRequest,
        out: trio.MemorySendChannel[list[PredictionResponse]],
        slots: trio.Semaphore,
        turn: _Turn,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        names = self.predictor.names
        sequence_id = message.sequence_id or ""
        headers: dict[str, str] = {}
        for key in (names.sequence_start, names.sequence_end):
            flag = message.input.get(key)
            if flag is not None and bytes(flag).decode("utf-8", "replace").strip().lower() == "true":
                headers[key] = "true"
        if sequence_id:
            headers[names.sequence_id] = sequence_id
        started = False
        try:
            async with out:
                try:
                    if not sequence_id and names.sequence_start not in headers:
                        # only a start may leave the id to the server (ts-seq-<uuid>)
                        raise _bad_request("Parameter sequenceId is required.")
                    async with self.predictor.stream(_call(message, headers)) as (responses, made_id):
                        task_status.started()
                        started = True
                        sequence_id = made_id or sequence_id
                        while answers := await first_answers(responses):
                            batch = []
                            for answer in answers:
                                reply = PredictionResponse(prediction=answer.body, sequence_id=sequence_id)
                                if not envelope.ok_status(answer.status):
                                    reply = PredictionResponse(
                                        sequence_id=sequence_id, status=handler_status(answer_error(answer))
                                    )
                                batch.append(reply)
                            await turn.wait()
                            await out.send(batch)
                            turn.done()
                except Exception as exc:
                    status = rpc_status(ts_error(exc))
                    await turn.wait()
                    await out.send([PredictionResponse(sequence_id=sequence_id, status=status)])
        finally:
            turn.done()
            slots.release()
            if not started:  # an error before the engine took it: read the next one
                task_status.started()

    # -- management -----------------------------------------------------------------------

    def _management_call(
        self, request_type: Any, operation: Callable[[Any], Awaitable[Reply]]
    ) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
        async def handler(stream: Stream[Any, Any]) -> None:
            wire, message = await self._request(stream, request_type)
            reply = await to_trio(self._manage, operation, message)
            await wire.send(pm.ManagementResponse(msg=reply.msg()))

        return handler

    async def _manage(self, operation: Callable[[Any], Awaitable[Reply]], message: Any) -> Reply:
        try:
            reply = await operation(message)
        except Exception as exc:
            raise grpc_error(ts_error(exc)) from None
        if reply.code >= 400:
            raise GRPCError(grpc_code(reply.code), str(reply.value.get("message", reply.value)))
        return reply

    async def _describe(self, m: pm.DescribeModelRequest) -> Reply:
        return await self.management.describe(m.model_name, m.model_version or None)

    async def _list(self, m: pm.ListModelsRequest) -> Reply:
        return await self.management.list_models(m.limit or None, m.next_page_token or None)

    async def _register(self, m: pm.RegisterModelRequest) -> Reply:
        options = {"url": m.url, "model_name": m.model_name, "handler": m.handler}
        for key, value in (
            ("batch_size", m.batch_size),
            ("max_batch_delay", m.max_batch_delay),
            ("initial_workers", m.initial_workers),
        ):
            if value:
                options[key] = str(value)
        return await self.management.register(options)

    async def _scale(self, m: pm.ScaleWorkerRequest) -> Reply:
        options = {k: str(v) for k, v in (("min_worker", m.min_worker), ("max_worker", m.max_worker)) if v}
        return await self.management.scale(m.model_name, m.model_version or None, options)

    async def _set_default(self, m: pm.SetDefaultRequest) -> Reply:
        return await self.management.set_default(m.model_name, m.model_version)

    async def _unregister(self, m: pm.UnregisterModelRequest) -> Reply:
        return await self.management.unregister(m.model_name, m.model_version or None)
