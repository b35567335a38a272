"""The engine process's end of the engine link: serves front connections on a Unix socket.

Per front connection: one reader task dispatches messages, one task per open call runs
it against the engine, and one writer task sends every message waiting as one frame
(so the outputs of one engine step for that front leave together). Everything is
bounded: the connection's :class:`~actorserve.ipc.outbox.Outbox` blocks the call tasks
when the socket is slow, and a stream's task stops pulling the engine once ``window``
responses are unacknowledged, so the engine's own backpressure takes over (the batch
item sits out steps). A front that disconnects cancels all its calls: their requests
leave the batch at the next step; their sequences stay open.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import attrs
import trio

from ..api import EngineAPI, ResponseIterator
from ..engine.catalog import Watchers
from ..errors import ActorServeError, BadInput, ModelFailed
from ..types import InferenceRequest, InferenceResponse
from .call_ends import RequestFeed
from .deltas import DeltaEncoder
from .frames import (
    DEFAULT_LIMITS,
    Ack,
    Call,
    Cancel,
    Credit,
    End,
    Failed,
    FrameDecoder,
    FrameTooLarge,
    Infer,
    LinkLimits,
    Message,
    ModelsChanged,
    Opened,
    OpenStream,
    OpenStreamIn,
    Reply,
    StreamInputEnd,
    StreamRequest,
    encode_message,
    encode_stream_entry,
    frame_parts,
)
from .outbox import Outbox
from .unary_values import call_from_plain, result_codec
from .values import WireError, error_to_plain, response_to_plain

log = logging.getLogger(__name__)

#: bytes read from a front's socket at a time
RECEIVE_BYTES = 256 * 1024


async def open_unix_listener(path: str | os.PathLike[str], *, backlog: int = 128) -> trio.SocketListener:
    """A listener bound to a new Unix stream socket at ``path`` (which must not exist)."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        await sock.bind(os.fspath(path))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_fronts(
    engine: EngineAPI,
    listener: trio.SocketListener,
    *,
    limits: LinkLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept front connections on ``listener`` and serve each until it closes; runs
    until cancelled (then every connection and its calls are cancelled). Takes
    ownership of ``listener`` and closes it. A broken connection is logged and closed;
    it never ends this service."""
    async with listener, trio.open_nursery() as nursery:
        task_status.started()
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
                log.warning("accepting a front connection failed: %s", exc)
                await trio.sleep(0.1)
                continue
            nursery.start_soon(_serve_connection, engine, stream, limits)


async def _serve_connection(engine: EngineAPI, stream: trio.abc.Stream, limits: LinkLimits) -> None:
    async with stream:
        connection = FrontConnection(engine, stream, limits)
        watchers = getattr(engine, "watchers", None)  # an in-process Engine pushes model changes
        watch = (
            watchers.watching(connection.models_changed) if isinstance(watchers, Watchers) else nullcontext()
        )
        try:
            with watch:
                await connection.run()
        except Exception as exc:  # one front's trouble never stops the engine
            log.warning("front connection closed: %s", _single(exc), exc_info=not _expected(exc))


def _expected(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_expected(e) for e in exc.exceptions)
    return isinstance(exc, (WireError, trio.BrokenResourceError, trio.ClosedResourceError, OSError))


@attrs.define(eq=False)
class _OpenCall:
    """An open call's handles; touched by the reader and the call's own task only."""

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: responses the engine may still send before an Ack (streams)
    credit: int = 0
    credit_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    #: the stream-in call's request feed (the reader sends, the engine takes)
    feed: trio.MemorySendChannel[InferenceRequest] | None = None


class FrontConnection:
    """One front's connection: owns its calls, outbox and the tasks serving them."""

    def __init__(self, engine: EngineAPI, stream: trio.abc.Stream, limits: LinkLimits) -> None:
        self._engine = engine
        self._stream = stream
        self._limits = limits
        self._max_message = limits.max_frame_bytes - 8
        self._outbox = Outbox(limits.outbox_messages, limits.outbox_bytes)
        self._calls: dict[int, _OpenCall] = {}
        self._push_queued = False  # a ModelsChanged waits in the outbox

    async def run(self) -> None:
        """Serve until the front closes the connection (or breaks it)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write)
            await self._read(nursery)
            nursery.cancel_scope.cancel()  # the front left: cancel its calls

    async def _read(self, calls: trio.Nursery) -> None:
        decoder = FrameDecoder(self._limits.max_frame_bytes)
        while True:
            data = await self._stream.receive_some(RECEIVE_BYTES)
            if not data:
                return
            decoder.feed(data)
            while (messages := decoder.next_frame()) is not None:
                for message in messages:
                    self._dispatch(message, calls)

    async def _write(self) -> None:
        while True:
            messages = await self._outbox.take(self._max_message)
            self._push_queued = False  # a later change needs a push of its own
            for part in frame_parts(messages):
                await self._stream.send_all(part)

    def models_changed(self) -> None:
        """Tell the front its remembered model_info / metadata answers are stale (one push
        waiting at a time, however many changes)."""
        if not self._push_queued:
            self._push_queued = True
            self._outbox.put_urgent(self._encode(ModelsChanged(0)))

    # -- dispatch (in the reader; never waits) ----------------------------------------------

    def _dispatch(self, message: Message, calls: trio.Nursery) -> None:
        if isinstance(message, (Call, Infer, OpenStream, OpenStreamIn)):
            if message.id in self._calls:
                raise WireError(f"call id {message.id} is already open")
            if len(self._calls) >= self._limits.max_calls:
                raise WireError(f"more than {self._limits.max_calls} calls open on one connection")
            call = self._calls[message.id] = _OpenCall()
            requests = None
            if isinstance(message, OpenStreamIn):  # its requests may be in this very frame
                call.credit = max(1, message.window)
                call.feed, requests = trio.open_memory_channel[InferenceRequest](call.credit)
            calls.start_soon(self._run_call, message, call, requests)
            return
        open_call = self._calls.get(message.id)
        if open_call is None:
            return  # the call ended already; the front's message crossed our reply
        self._control(message, open_call)

    def _control(self, message: Message, call: _OpenCall) -> None:
        if isinstance(message, Cancel):
            call.scope.cancel()
        elif isinstance(message, Ack):
            call.credit += message.count
            call.credit_lot.unpark_all()
        elif isinstance(message, StreamRequest):
            if call.feed is None:
                raise WireError(f"call {message.id} takes no requests")
            try:
                call.feed.send_nowait(message.request)
            except trio.WouldBlock:
                raise WireError(f"call {message.id}: a request beyond the granted credit") from None
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the engine stopped reading this stream's requests
        elif isinstance(message, StreamInputEnd):
            if call.feed is not None:
                call.feed.close()
        else:
            raise WireError(f"a front may not send {type(message).__name__}")

    # -- calls (one task each) --------------------------------------------------------------

    async def _run_call(
        self,
        message: Call | Infer | OpenStream | OpenStreamIn,
        call: _OpenCall,
        requests: trio.MemoryReceiveChannel[InferenceRequest] | None,
    ) -> None:
        try:
            with call.scope:
                try:
                    if isinstance(message, Call):
                        value = await self._unary(message.method, message.args)
                        reply = self._encode(Reply(message.id, value))
                    elif isinstance(message, Infer):
                        response = await self._engine.infer(
                            message.request, model=message.model, version=message.version
                        )
                        reply = self._encode_output(lambda: Reply(message.id, response_to_plain(response)))
                    elif isinstance(message, OpenStream):
                        call.credit = max(1, message.window)
                        stream = self._engine.infer_stream(
                            message.request, model=message.model, version=message.version
                        )
                        async with stream as responses:
                            await self._outbox.put(self._encode(Opened(message.id)))
                            await self._pump(message.id, call, responses)
                        reply = self._encode(End(message.id))
                    else:
                        assert call.feed is not None and requests is not None
                        reply = await self._stream_in(message, call, call.feed, requests)
                except Exception as exc:
                    reply = self._failure(message.id, exc)
                # a unary answer is the caller's whole latency; a stream's End follows
                # its last outputs and may join what else leaves this round
                await self._outbox.put(reply, hurry=not isinstance(message, (OpenStream, OpenStreamIn)))
        finally:
            self._calls.pop(message.id, None)

    async def _unary(self, method: str, args: Mapping[str, Any]) -> Any:
        """Run one unary call by the table (:mod:`actorserve.unary`); its answer plain."""
        request = call_from_plain(method, args)
        to_plain, _ = result_codec(type(request))
        return to_plain(await self._engine.call(request))

    async def _pump(self, call_id: int, call: _OpenCall, responses: ResponseIterator) -> None:
        """Send a stream's responses while the front has credit left: every batch the
        engine has waiting becomes one entry (its deltas, :mod:`.deltas`), joined with the
        other streams' entries of the same wake-up into one message."""
        deltas = DeltaEncoder()
        limit = self._max_message - 8  # a StreamOutputs header is under 8 bytes
        first = True  # the first outputs hurry: time to first token
        while True:
            while call.credit <= 0:
                await call.credit_lot.park()
            try:
                batch = await responses.next_batch()
            except StopAsyncIteration:
                return
            call.credit -= len(batch)
            entries, failure = self._encode_entries(call_id, deltas, batch, limit)
            for entry in entries:
                await self._outbox.put_entry(entry, limit, hurry=first)
            first = False
            if failure is not None:
                raise failure

    def _encode_entries(
        self, call_id: int, deltas: DeltaEncoder, batch: list[InferenceResponse], limit: int
    ) -> tuple[list[bytes], ModelFailed | None]:
        """``batch`` as one entry, or one per response if together they are too large;
        with the error of the first response that cannot cross (the model's failure: it
        fails this call only), the responses before it still go."""
        events: list[Any] = []
        failure: ModelFailed | None = None
        for response in batch:
            try:
                events.append(deltas.event(response))
            except BadInput as exc:
                failure = _cannot_send(exc)
                break
        if not events:
            return [], failure
        try:
            return [encode_stream_entry(call_id, events, limit)], failure
        except FrameTooLarge:
            pass
        entries = []
        for event in events:
            try:
                entries.append(encode_stream_entry(call_id, [event], limit))
            except BadInput as exc:
                return entries, _cannot_send(exc)
        return entries, failure

    def _encode_output(self, message: Callable[[], Message]) -> bytes:
        """A message carrying a model's output; one that cannot cross (a tensor whose
        data does not fit its shape, a value msgpack cannot hold, too large) is the
        model's failure, not the client's."""
        try:
            return self._encode(message())
        except BadInput as exc:
            raise _cannot_send(exc) from None

    async def _stream_in(
        self,
        message: OpenStreamIn,
        call: _OpenCall,
        feed: trio.MemorySendChannel[InferenceRequest],
        requests: trio.MemoryReceiveChannel[InferenceRequest],
    ) -> bytes:
        """Serve ``engine.stream`` with the requests the front sends as credit allows
        (it starts with ``window``: the feed's size); the same window bounds the
        responses the engine sends ahead of the front's acks."""
        async with feed, requests:
            source = RequestFeed(requests, functools.partial(self._grant, message.id))
            async with self._engine.stream(source, model=message.model, version=message.version) as responses:
                await self._outbox.put(self._encode(Opened(message.id)))
                await self._pump(message.id, call, responses)
        return self._encode(End(message.id))

    async def _grant(self, call_id: int) -> None:
        await self._outbox.put(self._encode(Credit(call_id, 1)))

    def _encode(self, message: Message) -> bytes:
        return encode_message(message, self._max_message)

    def _failure(self, call_id: int, error: Exception) -> bytes:
        error = _single(error)
        if not isinstance(error, ActorServeError):
            log.error("engine call %d failed", call_id, exc_info=error)
        kind, text = error_to_plain(error)
        return encode_message(Failed(call_id, kind, text))


def _cannot_send(error: BadInput) -> ModelFailed:
    return ModelFailed(f"the engine cannot send the model's output: {error.message}")


def _single(error: Exception) -> Exception:
    """The one error inside (possibly nested) single-error groups, else ``error``."""
    while isinstance(error, ExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
