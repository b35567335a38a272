"""A front's end of the engine link: :class:`EngineClient`, the :class:`EngineAPI` over
one Unix socket connection to the engine process.

::

    async with open_engine_client("/run/actorserve/engine.sock") as engine:
        async with engine.infer_stream(request, model="streamer") as responses:
            async for response in responses: ...

Calls are multiplexed on the connection by id. One reader task routes each received
message to its call; one writer task sends every message waiting as one frame. A
stream's :meth:`~actorserve.api.ResponseIterator.next_batch` returns every response
received for it so far; consuming them gives the engine credit to send more, so a slow
reader holds at most a window of responses here and the rest waits in the engine.

Every unary method is one :meth:`EngineClient.call` of its record, inherited from
:class:`~.unary_methods.UnaryMethods`, which ``python -m actorserve.unarygen`` writes
from :class:`~actorserve.api.EngineAPI` (:mod:`actorserve.unary`). Only the answers of the table's ``remembered`` rows
(``model_info`` and ``metadata``, asked before every gRPC stream message, OpenAI
completion and REST ``text_input`` generate) are remembered, keyed by the record: the
engine pushes :class:`~actorserve.ipc.frames.ModelsChanged` on every load, unload,
default version or workers change, and the client forgets them all. Every other call is
one round trip. When the engine goes away (the connection closes or breaks) every open
call, and every later one, fails with :class:`~actorserve.errors.ShuttingDown`.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from ..api import EngineAPI, ResponseIterator, UnaryCall
from ..errors import Overloaded, ShuttingDown
from ..exceptiongroups import raise_single
from ..limits import CODE_IN_THREAD_ELEMENTS, PARSE_IN_THREAD_BYTES
from ..tracing import link_span
from ..types import InferenceRequest, InferenceResponse
from ..unary import UNARY_CALLS
from .call_ends import LinkStatistics, Outputs, RemoteResponses, _ClientCall
from .frames import (
    DEFAULT_LIMITS,
    Ack,
    Call,
    Cancel,
    Credit,
    End,
    Failed,
    FrameDecoder,
    Infer,
    LinkLimits,
    Message,
    ModelsChanged,
    Opened,
    OpenStream,
    OpenStreamIn,
    Reply,
    StreamInputEnd,
    StreamOutputs,
    StreamRequest,
    encode_message,
    frame_parts,
)
from .outbox import Outbox
from .unary_methods import UnaryMethods
from .unary_values import call_to_plain, result_codec
from .values import WireError, error_from_plain, raw_bytes, response_from_plain

#: bytes read from the engine's socket at a time
RECEIVE_BYTES = 256 * 1024
#: model_info / metadata answers a client remembers at most (then it starts afresh)
MAX_REMEMBERED = 4096

T = TypeVar("T")


class EngineClient(UnaryMethods):
    """The :class:`~actorserve.api.EngineAPI` of an engine in another process. Made by
    :func:`open_engine_client`, which owns the connection and the reader and writer.
    Its unary methods (``model_info``, ``unload``, ...) are :class:`UnaryMethods`',
    written from ``EngineAPI`` itself, each one :meth:`call`."""

    def __init__(self, stream: trio.abc.Stream, limits: LinkLimits = DEFAULT_LIMITS) -> None:
        self._stream = stream
        self._limits = limits
        self._max_message = limits.max_frame_bytes - 8
        self._outbox = Outbox(limits.outbox_messages, limits.outbox_bytes)
        self._calls: dict[int, _ClientCall] = {}
        self._ids = itertools.count(1)
        self._lost: str | None = None
        self._closed = trio.Event()
        self._frames_sent = self._messages_sent = self._frames_received = self._messages_received = 0
        #: answers of ``remembered`` calls (model_info, metadata) by (record type, its
        #: fields...), valid until ModelsChanged
        self._remembered: dict[tuple[Any, ...], Any] = {}
        self._models_generation = 0

    # -- the connection ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The connection is gone; every call fails with :class:`ShuttingDown`."""
        return self._lost is not None

    async def wait_closed(self) -> None:
        """Return once the connection is gone (the engine exited, or the client closed)."""
        await self._closed.wait()

    def link_statistics(self) -> LinkStatistics:
        return LinkStatistics(
            self._frames_sent,
            self._messages_sent,
            self._frames_received,
            self._messages_received,
            len(self._calls),
        )

    def _error(self) -> ShuttingDown:
        return ShuttingDown(f"the engine is not reachable: {self._lost}")

    def _check_open(self) -> None:
        if self._lost is not None:
            raise self._error()

    def _lose(self, reason: str) -> None:
        """Fail every open and later call (idempotent; the first reason stays)."""
        if self._lost is None:
            self._lost = reason
            self._outbox.close(self._error)
            for call in self._calls.values():
                call.arrived.unpark_all()
                call.credit_lot.unpark_all()
            self._closed.set()

    async def _read(self) -> None:
        decoder = FrameDecoder(self._limits.max_frame_bytes)
        try:
            while True:
                data = await self._stream.receive_some(RECEIVE_BYTES)
                if not data:
                    self._lose("the engine closed the connection")
                    return
                decoder.feed(data)
                while (messages := decoder.next_frame()) is not None:
                    self._frames_received += 1
                    self._messages_received += len(messages)
                    for message in messages:
                        self._deliver(message)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lose(f"the connection broke ({exc})")
        except WireError as exc:
            self._lose(f"the engine sent a malformed frame ({exc})")

    def _deliver(self, message: Message) -> None:
        if isinstance(message, StreamOutputs):
            calls = self._calls
            for call_id, events in message.entries:
                stream = calls.get(call_id)
                if stream is not None:  # else a call we left: its outputs crossed our cancel
                    stream.inbox.append(Outputs(events))
                    stream.arrived.unpark_all()
            return
        if isinstance(message, ModelsChanged):
            self._remembered.clear()
            self._models_generation += 1
            return
        call = self._calls.get(message.id)
        if call is None:
            return  # a call we left: the engine's message crossed our cancel
        if isinstance(message, Credit):
            call.credit += message.count
            call.credit_lot.unpark_all()
            return
        if not isinstance(message, (Reply, Opened, End, Failed)):
            raise WireError(f"an engine may not send {type(message).__name__}")
        if isinstance(message, (Reply, End, Failed)):
            call.finished = True
        call.inbox.append(message)
        call.arrived.unpark_all()

    async def _write(self) -> None:
        try:
            while True:
                messages = await self._outbox.take(self._max_message)
                for part in frame_parts(messages):
                    await self._stream.send_all(part)
                self._frames_sent += 1
                self._messages_sent += len(messages)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lose(f"the connection broke ({exc})")

    # -- calls ------------------------------------------------------------------------------

    def _open(self) -> _ClientCall:
        self._check_open()
        if len(self._calls) >= self._limits.max_calls:
            raise Overloaded(f"{self._limits.max_calls} calls already open to the engine")
        call = _ClientCall(next(self._ids))
        self._calls[call.id] = call
        return call

    def _leave(self, call: _ClientCall) -> None:
        """Forget ``call``; if the engine still runs it, tell it to stop."""
        del self._calls[call.id]
        if not call.finished and self._lost is None:
            self._outbox.put_urgent(encode_message(Cancel(call.id)))

    async def _send(self, message: Message) -> None:
        """Queue ``message``; :class:`BadInput` if it cannot be encoded (the caller's
        request: a tensor that does not fit its shape, a value msgpack cannot hold). It
        hurries (:meth:`Outbox.put`): a request's wait for the writer's gather rounds
        is the client's latency, and under load a round is every runnable task's step.
        A request of ``CODE_IN_THREAD_ELEMENTS`` BYTES elements or more is encoded in a
        worker thread (numbers are one copy each, on the loop): the loop answers everyone
        else meanwhile."""
        self._check_open()
        request = getattr(message, "request", None)
        if not isinstance(request, InferenceRequest) or _bytes_elements(request) < CODE_IN_THREAD_ELEMENTS:
            await self._outbox.put(encode_message(message, self._max_message), hurry=True)
            return
        # handed over in a box the thread empties: an idle worker thread keeps its last
        # job (and so the request's tensors) until its next
        box, limit = [message], self._max_message
        del message, request
        encoded = await trio.to_thread.run_sync(lambda: encode_message(box.pop(), limit))
        await self._outbox.put(encoded, hurry=True)

    def _consumed(self, call: _ClientCall, count: int) -> None:
        call.unacked += count
        if call.unacked >= max(1, self._limits.window // 2) and not call.finished and self._lost is None:
            self._outbox.put_urgent(encode_message(Ack(call.id, call.unacked)))
            call.unacked = 0

    async def call(self, request: UnaryCall[T]) -> T:
        """Run a unary method given as its record (:mod:`actorserve.unary`): one round
        trip, or the remembered answer of a ``remembered`` row (see the module)."""
        row = UNARY_CALLS[type(request)]
        if not row.remembered:
            result: T = await self._round_trip(request)
            return result
        key = (row.record, *(getattr(request, field.name) for field in attrs.fields(row.record)))
        if key in self._remembered:
            remembered: T = self._remembered[key]
            return remembered
        # Remembered unless the models changed meanwhile: a push may overtake the reply
        # it makes stale.
        generation = self._models_generation
        result = await self._round_trip(request)
        if generation == self._models_generation:
            if len(self._remembered) >= MAX_REMEMBERED:
                self._remembered.clear()
            self._remembered[key] = result
        return result

    async def _round_trip(self, request: UnaryCall[Any]) -> Any:
        method, args = call_to_plain(request)
        call = self._open()
        try:
            await self._send(Call(call.id, method, args))
            reply = await call.next_message(self)
        finally:
            self._leave(call)
        if isinstance(reply, Failed):
            raise error_from_plain(reply.kind, reply.message)
        if not isinstance(reply, Reply):
            raise WireError(f"{method}: expected a reply, got {type(reply).__name__}")
        _, from_plain = result_codec(type(request))
        return from_plain(reply.value)

    # -- the EngineAPI's other methods (the unary ones are UnaryMethods') -------------------

    async def infer(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> InferenceResponse:
        control = request.control
        link = None if control is None or control.trace is None else link_span(request, control.trace)
        call, ok = self._open(), False
        try:
            await self._send(Infer(call.id, request, model, version))
            del request  # sent: its tensors are freed while the answer comes (if the caller let go)
            reply = await call.next_message(self)
            ok = isinstance(reply, Reply)
        finally:
            self._leave(call)
            if link is not None:
                link.end(ok)
        if isinstance(reply, Failed):
            raise error_from_plain(reply.kind, reply.message)
        if not isinstance(reply, Reply):
            raise WireError(f"infer: expected a reply, got {type(reply).__name__}")
        if raw_bytes(reply.value) < PARSE_IN_THREAD_BYTES:
            return response_from_plain(reply.value)
        return await trio.to_thread.run_sync(response_from_plain, reply.value)  # off the loop

    @asynccontextmanager
    async def infer_stream(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> AsyncIterator[ResponseIterator]:
        """The responses of one request. Errors at the start (no such model, a bad
        sequence) are raised here, later ones by the iterator, as in process. Leaving the
        block cancels the request in the engine."""
        control = request.control
        link = None if control is None or control.trace is None else link_span(request, control.trace)
        call, ok = self._open(), False
        try:
            await self._send(OpenStream(call.id, request, model, version, self._limits.window))
            await self._opened(call)
            yield RemoteResponses(self, call)
            ok = True
        finally:
            self._leave(call)
            if link is not None:
                link.end(ok)

    @asynccontextmanager
    async def stream(
        self, requests: AsyncIterator[InferenceRequest], *, model: str, version: str | None = None
    ) -> AsyncIterator[ResponseIterator]:
        """MLServer's ``predict_stream``: a task of this block sends ``requests`` as the
        engine asks for them; an error reading them ends the responses with it."""
        call = self._open()
        try:
            async with trio.open_nursery() as nursery:
                await self._send(OpenStreamIn(call.id, model, version, self._limits.window))
                call.credit = max(1, self._limits.window)
                responses = RemoteResponses(self, call)
                nursery.start_soon(self._feed, call, requests, responses)
                try:
                    await self._opened(call)
                    yield responses
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise_single(group)
        finally:
            self._leave(call)

    async def _opened(self, call: _ClientCall) -> None:
        first = await call.next_message(self)
        if isinstance(first, Failed):
            raise error_from_plain(first.kind, first.message)
        if not isinstance(first, Opened):
            raise WireError(f"a stream must open first, got {type(first).__name__}")

    async def _feed(
        self, call: _ClientCall, requests: AsyncIterator[InferenceRequest], responses: RemoteResponses
    ) -> None:
        try:
            async for request in requests:
                while call.credit <= 0 and not call.finished:
                    self._check_open()
                    await call.credit_lot.park()
                if call.finished:
                    return  # the engine ended the stream; it takes no more requests
                call.credit -= 1
                await self._send(StreamRequest(call.id, request))
            await self._send(StreamInputEnd(call.id))
        except ShuttingDown:
            return  # the responses report the lost engine
        except Exception as exc:  # as in process: the error ends the responses
            responses._fail_with(exc)
            call.arrived.unpark_all()


@asynccontextmanager
async def open_engine_client(
    path: str, *, limits: LinkLimits = DEFAULT_LIMITS
) -> AsyncIterator[EngineClient]:
    """Connect to the engine process's socket at ``path`` and yield its client. Leaving
    the block closes the connection (the engine cancels whatever is still open).
    ``OSError`` if nothing listens there."""
    stream = await trio.open_unix_socket(path)
    try:
        async with stream, trio.open_nursery() as nursery:
            client = EngineClient(stream, limits)
            nursery.start_soon(client._read)
            nursery.start_soon(client._write)
            try:
                yield client
            finally:
                client._lose("the client was closed")
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise_single(group)


if TYPE_CHECKING:  # the client implements the boundary the transports use
    _: type[EngineAPI] = EngineClient


def _bytes_elements(request: InferenceRequest) -> int:
    return sum(t.size for t in request.inputs if t.datatype == "BYTES")
