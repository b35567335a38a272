"""``ModelStreamInfer`` calls, as trio tasks: Triton's dialect and MLServer's.

A call is a small trio nursery: whatever reads requests and runs them (see the two
classes), and one writer. Every producer puts *batches* of messages into one bounded
outbox (``max_inflight`` batches): a request's task hands over every response its
engine stream already holds (:meth:`ResponseIterator.next_batch`) at once. The writer
takes every batch already waiting and writes them in one hop to asyncio and one HTTP/2
write (:meth:`Wire.send_many`), so a busy stream costs one hop per batch, not per
message; a lone message goes out at once, nothing waits to fill a batch.

Who owns what: the call's nursery owns every task; cancelling the call (the client went
away, a deadline, the end of the drain) cancels them all, and leaving an engine stream
cancels its request in the engine (dropped from its batch at the next step). When the
server starts draining, ``reading`` is cancelled: no new request is read, the ones in
flight finish, and the call ends UNAVAILABLE. A fatal error is queued behind the
responses before it, then the writer ends the call with that status.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Final

import trio
from grpclib.exceptions import GRPCError

from ...api import EngineAPI, RequestControl, ResponseIterator, control_of, with_control
from ...errors import ActorServeError, BadInput, ModelNotFound
from ...proto.inference import ModelInferResponse, ModelStreamInferResponse
from ...proto.upb import request_of, response_message, stream_raw_message, stream_response_message
from ...rawevents import RawEvent
from ...types import InferenceRequest, InferenceResponse
from ..errors import http_status
from ..exchange import Exchange, Recorder
from ..grpchost.bridge import to_aio
from ..grpchost.h2 import Wire
from ..grpchost.status import shutting_down, status_error
from .routing import with_routing_hint

#: The route of every request of a stream in the access log.
STREAM_ROUTE: Final = "/inference.GRPCInferenceService/ModelStreamInfer"

#: Most messages the writer takes for one write (a batch bigger than that goes whole).
WRITE_BATCH: Final = 64


class _Fatal:
    """Put in a stream's outbox: end the call with this status after what came before."""

    __slots__ = ("error",)

    def __init__(self, error: GRPCError) -> None:
        self.error = error


#: What producers put in the outbox.
Outbox = trio.MemorySendChannel[list[Any] | _Fatal]


async def _pump(
    responses: ResponseIterator,
    outbox: Outbox,
    wrap: Callable[[InferenceResponse], Any],
    recorder: Recorder | None = None,
    exchange: Exchange | None = None,
) -> None:
    """Hand every response of ``responses`` to the writer, a batch at a time (each
    batch recorded as sent, for the stream metrics). A front's engine client hands
    Triton's stream messages over raw (:mod:`actorserve.rawevents`): their data is
    already ``raw_output_contents``, so no response is built per event."""
    raw = wrap is stream_response_message  # Triton's stream messages can be written from raw events
    while True:
        batch: Sequence[RawEvent | InferenceResponse]
        try:
            if raw:
                batch = await responses.next_raw_batch()
                await outbox.send([_stream_message(item) for item in batch])
            else:
                batch = responses_only = await responses.next_batch()
                await outbox.send([wrap(response) for response in responses_only])
        except StopAsyncIteration:
            return
        if exchange is not None and recorder is not None:
            if exchange.first_at is None:
                first = batch[0]
                if isinstance(first, RawEvent):
                    exchange.answered(first.head.model_version, first.parameters.get("sequence_id"))
                else:
                    exchange.answered(first.model_version, first.parameters.get("sequence_id"))
            recorder.responses(exchange, len(batch))


def _stream_message(item: RawEvent | InferenceResponse) -> Any:
    return stream_raw_message(item) if isinstance(item, RawEvent) else stream_response_message(item)


async def _recorded(
    engine_call: Any,
    recorder: Recorder | None,
    exchange: Exchange,
    outbox: Outbox,
    wrap: Callable[[InferenceResponse], Any],
) -> None:
    """Pump ``engine_call``'s responses, recording the request (``exchange``) if there
    is a ``recorder``; errors propagate."""
    outcome: int | None = None
    if recorder is not None:
        recorder.open(exchange)
    try:
        async with engine_call as responses:
            await _pump(responses, outbox, wrap, recorder, exchange)
        outcome = 200
    except Exception as exc:
        exchange.not_found = isinstance(exc, ModelNotFound)
        outcome = http_status(exc)
        raise
    finally:
        if recorder is not None:
            exchange.status = "OK" if outcome == 200 else "CANCELLED" if outcome is None else "ERROR"
            recorder.finish(exchange, outcome)


#: the span of one request of a ModelStreamInfer call (tracing on), a child of the call's
STREAM_REQUEST_SPAN: Final = "ModelStreamInfer request"


def _stream_exchange(request: InferenceRequest, sequence_id: str | None = None) -> Exchange:
    exchange = Exchange("grpc", "POST", STREAM_ROUTE)
    exchange.bytes = None
    exchange.model_request(request.model_name or "", request.model_version)
    exchange.sequence_id = sequence_id
    return exchange


class StreamCall:
    """One ``ModelStreamInfer`` call: :meth:`run` it on the trio side; it raises the
    call's final status as :class:`GRPCError` (or returns: OK)."""

    def __init__(
        self,
        engine: EngineAPI,
        wire: Wire,
        *,
        max_inflight: int,
        draining: trio.Event,
        recorder: Recorder | None = None,
    ) -> None:
        self.engine = engine
        self.recorder = recorder
        self.wire = wire
        self.max_inflight = max_inflight
        self._draining = draining
        #: subclasses read requests inside it
        self.reading = trio.CancelScope()
        #: the first message, when the handler read it before the call began (its
        #: request stream had ended: nothing to wait for); None once taken, or if not
        self.prefetched: Any = None
        self._cut_short = False
        self._fatal: GRPCError | None = None

    async def run(self) -> None:
        outbox, to_write = trio.open_memory_channel[list[Any] | _Fatal](self.max_inflight)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, to_write, nursery.cancel_scope)
            async with outbox, trio.open_nursery() as feeding:
                feeding.start_soon(self._stop_reading_on_drain)
                await self.feed(outbox)
                feeding.cancel_scope.cancel()
        if self._fatal is not None:
            raise self._fatal
        if self._cut_short:
            raise shutting_down()

    async def _stop_reading_on_drain(self) -> None:
        await self._draining.wait()
        self._cut_short = True
        self.reading.cancel()

    async def feed(self, outbox: Outbox) -> None:
        raise NotImplementedError

    async def recv(self) -> Any:
        """The client's next message, or None once it half-closed."""
        if self.prefetched is not None:
            message, self.prefetched = self.prefetched, None
            await trio.lowlevel.checkpoint()
            return message
        return await to_aio(self.wire.recv)

    async def _write(
        self, to_write: trio.MemoryReceiveChannel[list[Any] | _Fatal], call_scope: trio.CancelScope
    ) -> None:
        async with to_write:
            while True:
                try:
                    item = await to_write.receive()
                except trio.EndOfChannel:
                    return
                messages: list[Any] = []
                fatal: _Fatal | None = None
                while True:  # everything already waiting, never waiting for more
                    if isinstance(item, _Fatal):
                        fatal = item
                        break
                    messages.extend(item)
                    if len(messages) >= WRITE_BATCH:
                        break
                    try:
                        item = to_write.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if messages:
                    await to_aio(self.wire.send_many, messages)
                if fatal is not None:
                    self._fatal = fatal.error
                    call_scope.cancel()
                    return


class TritonStream(StreamCall):
    """Triton's flavour: requests run concurrently, each answered by its own
    ``ModelStreamInferResponse`` messages; a request's error is in-band
    (``error_message``) and the stream goes on, unless the client sent
    ``triton_grpc_error: true`` (``status_errors``), which turns the first error into
    the call's status.

    Requests of one sequence (same ``sequence_id``) on this stream run one after the
    other in arrival order; ``sequence_cancel`` jumps the queue. Requests for a model
    with ``stream_input`` all go, in order, into one ``engine.stream`` call per model
    version, whose input ends when the client half-closes. At most ``max_inflight``
    requests run; past that the reader stops reading (backpressure to the client).
    """

    def __init__(
        self,
        engine: EngineAPI,
        wire: Wire,
        *,
        max_inflight: int,
        draining: trio.Event,
        status_errors: bool,
        recorder: Recorder | None = None,
    ) -> None:
        super().__init__(engine, wire, max_inflight=max_inflight, draining=draining, recorder=recorder)
        self.status_errors = status_errors
        self.slots = trio.Semaphore(max_inflight)
        #: sequence id -> set when the last request of that sequence read so far is done.
        self._sequence_tail: dict[str, trio.Event] = {}
        self._sessions: dict[tuple[str, str], _InputSession] = {}

    async def feed(self, outbox: Outbox) -> None:
        async with trio.open_nursery() as requests:
            with self.reading:
                await self._read(requests, outbox)
            for session in self._sessions.values():
                session.inbox.close()  # no more requests: end those models' input

    async def _read(self, requests: trio.Nursery, outbox: Outbox) -> None:
        while True:
            await self.slots.acquire()
            try:
                message = await self.recv()
            except BaseException:
                self.slots.release()
                raise
            if message is None:
                self.slots.release()
                return
            try:
                request = request_of(message)
                session = await self._session_for(request, requests, outbox)
                # the controls order a sequence's requests here (a stream-in session's
                # requests go to their model as they come)
                control = control_of(with_control(request)) if session is None else None
            except Exception as exc:
                self.slots.release()
                await self._fail(outbox, message, exc)
                continue
            if session is not None:
                self.slots.release()  # the session's own inbox bounds it
                session.last = message
                try:
                    await session.inbox.send(request)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._fail(
                        outbox, message, BadInput(f"the request stream of model {session.key[0]!r} has ended")
                    )
                continue
            assert control is not None
            wait_for, done = self._sequence_turn(control)
            requests.start_soon(
                self._serve, message, request, outbox.clone(), control.sequence_id, wait_for, done
            )

    def _sequence_turn(self, control: RequestControl) -> tuple[trio.Event | None, trio.Event | None]:
        """(what to wait for, what to set when done) to keep a sequence in order."""
        if control.sequence_id is None or control.cancel:
            return None, None
        done = trio.Event()
        previous = self._sequence_tail.get(control.sequence_id)
        self._sequence_tail[control.sequence_id] = done
        return previous, done

    async def _serve(
        self,
        message: Any,
        request: InferenceRequest,
        outbox: Outbox,
        sequence_id: str | None,
        wait_for: trio.Event | None,
        done: trio.Event | None,
    ) -> None:
        try:
            async with outbox:
                if wait_for is not None:
                    await wait_for.wait()
                try:
                    await self._one(request, outbox, sequence_id)
                except Exception as exc:
                    await self._fail(outbox, message, exc)
        finally:
            self.slots.release()
            if done is not None:
                done.set()
                if sequence_id is not None and self._sequence_tail.get(sequence_id) is done:
                    del self._sequence_tail[sequence_id]

    async def _one(self, request: InferenceRequest, outbox: Outbox, sequence_id: str | None) -> None:
        exchange = _stream_exchange(request, sequence_id)
        if self.recorder is not None:
            self.recorder.traced_part(exchange, STREAM_REQUEST_SPAN)
        await _recorded(
            self.engine.infer_stream(request), self.recorder, exchange, outbox, stream_response_message
        )

    async def _session_for(
        self, request: InferenceRequest, requests: trio.Nursery, outbox: Outbox
    ) -> _InputSession | None:
        """The stream-in session for the request's model, started on first use, or None
        if the model serves each request on its own."""
        try:
            info = await self.engine.model_info(request.model_name or "", request.model_version)
        except ActorServeError:
            return None  # engine.infer_stream reports it
        if info.batched or not info.stream_input:
            return None
        key = (info.name, info.version)
        session = self._sessions.get(key)
        if session is None:
            session = _InputSession(key, self.max_inflight)
            self._sessions[key] = session
            requests.start_soon(self._run_session, session, outbox.clone())
        return session

    async def _run_session(self, session: _InputSession, outbox: Outbox) -> None:
        try:
            async with outbox, session.requests:
                name, version = session.key
                try:
                    async with self.engine.stream(session.requests, model=name, version=version) as responses:
                        await _pump(responses, outbox, stream_response_message)
                except Exception as exc:
                    await self._fail(outbox, session.last, exc)
        finally:
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]

    async def _fail(self, outbox: Outbox, message: Any, exc: BaseException) -> None:
        error = with_routing_hint(status_error(exc), exc, getattr(self.wire, "sequence_id", None), message)
        if self.status_errors:
            await outbox.send(_Fatal(error))
            return
        reply = ModelStreamInferResponse(
            error_message=error.message or "",
            infer_response=ModelInferResponse(
                model_name=message.model_name if message is not None else "",
                model_version=message.model_version if message is not None else "",
                id=message.id if message is not None else "",
            ),
        )
        await outbox.send([reply])


class _InputSession:
    """The requests of one stream that go to one stream-in model version."""

    __slots__ = ("inbox", "key", "last", "requests")

    def __init__(self, key: tuple[str, str], size: int) -> None:
        self.key = key
        self.inbox, self.requests = trio.open_memory_channel[InferenceRequest](size)
        self.last: Any = None


class MLServerStream(StreamCall):
    """MLServer's flavour: the whole request stream goes to one ``engine.stream`` call
    for the model named by the first request; responses are bare
    ``ModelInferResponse`` messages; an error ends the call with its status."""

    async def feed(self, outbox: Outbox) -> None:
        inbox, requests = trio.open_memory_channel[InferenceRequest](self.max_inflight)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, inbox, outbox.clone(), nursery.cancel_scope)
            async with requests:
                try:
                    first = await requests.receive()
                except trio.EndOfChannel:
                    return
                try:
                    async with aclosing(_prepend(first, requests)) as stream_in:
                        engine_call = self.engine.stream(
                            stream_in, model=first.model_name or "", version=first.model_version
                        )  # the whole call is one request to the model
                        exchange = _stream_exchange(first)
                        await _recorded(engine_call, self.recorder, exchange, outbox, response_message)
                except Exception as exc:
                    await outbox.send(_Fatal(status_error(exc)))
                    nursery.cancel_scope.cancel()

    async def _read(
        self, inbox: trio.MemorySendChannel[InferenceRequest], outbox: Outbox, call_scope: trio.CancelScope
    ) -> None:
        async with inbox, outbox:
            with self.reading:
                while True:
                    message = await self.recv()
                    if message is None:
                        return
                    try:
                        request = request_of(message)
                    except Exception as exc:
                        await outbox.send(_Fatal(status_error(exc)))
                        call_scope.cancel()
                        return
                    try:
                        await inbox.send(request)
                    except trio.BrokenResourceError:
                        return  # the model stopped reading its input


async def _prepend(
    first: InferenceRequest, rest: AsyncIterator[InferenceRequest]
) -> AsyncGenerator[InferenceRequest, None]:
    yield first
    async for request in rest:
        yield request


__all__ = ["WRITE_BATCH", "MLServerStream", "StreamCall", "TritonStream"]
