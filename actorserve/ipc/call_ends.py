"""The ends of one call on the engine link: on the client side, what the reader received
for it and the :class:`~actorserve.api.ResponseIterator` of a remote stream (see
:mod:`.client`); on the engine side, the request feed of a stream-in call (see
:mod:`.engine_side`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import attrs
import trio

from ..api import ResponseIterator
from ..rawevents import RawEvent
from ..types import InferenceRequest, InferenceResponse
from .deltas import DeltaDecoder
from .frames import End, Failed, Message
from .values import Plain, WireError, error_from_plain

T = TypeVar("T")


class Link(Protocol):
    """What a call needs of its client (:class:`~actorserve.ipc.client.EngineClient`)."""

    def _check_open(self) -> None: ...

    def _consumed(self, call: _ClientCall, count: int) -> None: ...


@attrs.frozen(slots=True)
class LinkStatistics:
    """Counters of one client connection (frames and messages each way)."""

    frames_sent: int
    messages_sent: int
    frames_received: int
    messages_received: int
    open_calls: int


@attrs.frozen(slots=True)
class Outputs:
    """A stream's part of a :class:`~.frames.StreamOutputs` message: its responses as
    events of :mod:`.deltas`, decoded by the stream's reader."""

    events: list[Plain]


@attrs.define(eq=False)
class _ClientCall:
    """An open call: what the reader received for it, for the caller's task to take."""

    id: int
    inbox: deque[Message | Outputs] = attrs.field(factory=deque)
    arrived: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    #: End, Failed or Reply received: the engine forgot the call
    finished: bool = False
    #: responses consumed and not yet acknowledged to the engine
    unacked: int = 0
    #: stream-in: requests the engine can take now
    credit: int = 0
    credit_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    async def next_message(self, client: Link) -> Message | Outputs:
        while not self.inbox:
            client._check_open()
            await self.arrived.park()
        return self.inbox.popleft()


class RemoteResponses(ResponseIterator):
    """The :class:`~actorserve.api.ResponseIterator` of a remote stream."""

    __slots__ = ("_buffer", "_call", "_client", "_deltas", "_done", "_local_error")

    def __init__(self, client: Link, call: _ClientCall) -> None:
        self._client = client
        self._call = call
        self._deltas = DeltaDecoder()
        self._buffer: deque[InferenceResponse] = deque()
        self._done = False
        self._local_error: Exception | None = None

    def _fail_with(self, error: Exception) -> None:
        self._local_error = error

    def __aiter__(self) -> RemoteResponses:
        return self

    async def __anext__(self) -> InferenceResponse:
        if not self._buffer:
            self._buffer.extend(await self.next_batch())
        return self._buffer.popleft()

    async def next_batch(self) -> list[InferenceResponse]:
        """Every response received and not yet taken (at least one, waiting for it);
        :class:`StopAsyncIteration` at the end, the stream's error after its responses."""
        if self._buffer:
            buffered = list(self._buffer)
            self._buffer.clear()
            return buffered
        return await self._next(self._deltas.responses)

    async def next_raw_batch(self) -> list[RawEvent | InferenceResponse]:
        """:meth:`next_batch` with the responses whose outputs are numbers or one string
        left raw (:mod:`actorserve.rawevents`): for a transport that writes the raw
        data itself, with no response built per event."""
        if self._buffer:
            buffered: list[RawEvent | InferenceResponse] = list(self._buffer)
            self._buffer.clear()
            return buffered
        return await self._next(self._deltas.raw_events)

    async def _next(self, decode: Callable[[list[Plain]], list[T]]) -> list[T]:
        call = self._call
        if self._done:
            raise StopAsyncIteration
        while not call.inbox:
            if self._local_error is not None:
                self._done = True
                raise self._local_error
            self._client._check_open()
            await call.arrived.park()
        batch: list[T] = []
        while call.inbox and isinstance(head := call.inbox[0], Outputs):
            call.inbox.popleft()
            try:
                batch.extend(decode(head.events))
            except WireError:
                self._done = True  # what follows cannot be decoded either
                raise
        if batch:
            self._client._consumed(call, len(batch))
            return batch
        last = call.inbox.popleft()
        self._done = True
        if isinstance(last, Failed):
            raise error_from_plain(last.kind, last.message)
        if isinstance(last, End):
            raise StopAsyncIteration
        raise WireError(f"unexpected {type(last).__name__} in a stream")


class RequestFeed:
    """The engine side of a stream-in call: the async iterator ``engine.stream`` consumes,
    requests from the front; each one taken grants the front credit for another."""

    __slots__ = ("_grant", "_requests")

    def __init__(
        self, requests: trio.MemoryReceiveChannel[InferenceRequest], grant: Callable[[], Awaitable[None]]
    ) -> None:
        self._requests = requests
        self._grant = grant

    def __aiter__(self) -> RequestFeed:
        return self

    async def __anext__(self) -> InferenceRequest:
        try:
            request = await self._requests.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        await self._grant()
        return request
