"""The responses of a stream that its own task produces: a bounded buffer between that
task (the producer, e.g. a plain model's ``predict_stream`` run by
:class:`~actorserve.actors.plain.PlainRunner`) and the one reader that takes them.

The reader takes every response waiting in one :meth:`Pumped.next_batch`, so a model
that makes several responses between two waits has them written in one chunk (one SSE
write, one engine-link entry) instead of one each. The producer waits while
``window`` responses are untaken (backpressure: a slow client stops the model) and
hands the reader its turn when its batch is old enough (:meth:`Pumped.turn`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar, Final

import trio

from ..api import ResponseIterator
from ..types import InferenceResponse

#: seconds a response may wait in the buffer while its producer keeps making more
#: without waiting (a model computing inline): past it the producer lets the reader
#: write what is there. 64 responses of a cheap model take about this long, so they
#: leave in one chunk; a model that waits between responses has each read as it comes.
GATHER: Final = 0.0005

#: what one scheduler round may spend in the steps of every inline producer together:
#: with more than two streams producing in the process, each one's gather is this shared
#: out among them (never under :data:`GATHER_MIN`). 16 streams each holding the loop for
#: a whole GATHER made a round 8 ms long, and a new stream needs five rounds to its first
#: token (the link's read, the call, the producer, the reader, the writer).
ROUND: Final = 0.001

#: the shortest gather: below it the per-batch work (a wake-up, an entry, a write) costs
#: more than the responses it carries
GATHER_MIN: Final = 0.0001

#: scheduler rounds the producer yields after the stream's first response is taken, before
#: it goes on: the path that writes that response may take several (a gRPC stream's
#: writer task, its hop to grpclib's asyncio loop, that loop's flush), and a model
#: computing inline would otherwise hold it back for a whole :data:`GATHER`. Once per
#: stream; a paced model waits anyway.
FIRST_ROUNDS: Final = 4


class Pumped(ResponseIterator):
    """A :class:`~actorserve.api.ResponseIterator` fed by a producer task: responses
    in order, then the end (:meth:`close`) or the producer's error (:meth:`fail`),
    raised after the responses before it."""

    #: streams whose producer runs in this process (counted by their runner: see
    #: :meth:`producing`); what :data:`ROUND` is shared out among
    active: ClassVar[int] = 0

    @staticmethod
    @contextmanager
    def producing() -> Iterator[None]:
        """Count one stream's producer while the block runs."""
        Pumped.active += 1
        try:
            yield
        finally:
            Pumped.active -= 1

    __slots__ = ("_buffer", "_ended", "_error", "_first", "_oldest", "_reader", "_room", "_window", "_woken")

    def __init__(self, window: int) -> None:
        self._buffer: deque[InferenceResponse] = deque()
        self._window = max(1, window)
        self._ended = False
        self._error: BaseException | None = None
        self._reader = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        #: trio.current_time() when the oldest untaken response was put
        self._oldest = 0.0
        self._first = True  # the first response is never held (time to first token)
        self._woken = False  # the reader was woken to take what is buffered

    # -- the producer's end -----------------------------------------------------------

    def put(self, response: InferenceResponse, now: float) -> None:
        """Buffer ``response`` (made at ``now``) and wake the reader; never waits (the
        producer calls :meth:`turn` after each put)."""
        if not self._buffer:
            self._oldest = now
            if self._reader:
                self._reader.unpark()
                self._woken = True
        self._buffer.append(response)

    def due(self, now: float) -> bool:
        """Whether the producer should give the reader its turn now, rather than go on
        to its next step: the stream's first response is there, the buffer is full, or
        its oldest response waited :data:`GATHER` (the producer made responses without
        waiting for that long; less with more than two streams producing: :data:`ROUND`). Otherwise the reader, woken by :meth:`put`, runs when the
        producer next waits (its next step, usually): no scheduler round is added to a
        step that waits anyway. A step computed inline (no wait) therefore holds the
        response before it back until it ends, as it holds everything else on the event
        loop."""
        if self._first or len(self._buffer) >= self._window:
            return True
        active = Pumped.active
        gather = GATHER if active <= 2 else max(GATHER_MIN, min(GATHER, ROUND / active))
        return now - self._oldest >= gather

    async def turn(self) -> None:
        """Let the reader take what is buffered if it is waiting for it (else one
        scheduler round), then wait while the buffer is full. After the first response
        :data:`FIRST_ROUNDS` more: whatever the reader woke to send it (a writer task, a
        hop to another loop) runs before a model computing inline takes the loop for its
        next :data:`GATHER`."""
        first, self._first = self._first, False
        if self._woken:
            self._woken = False
            await self._room.park()  # the reader's take wakes this: it goes first
        else:
            await trio.lowlevel.checkpoint()
        if first:
            for _ in range(FIRST_ROUNDS):
                await trio.lowlevel.checkpoint()
        while len(self._buffer) >= self._window:
            await self._room.park()

    def close(self) -> None:
        """No more responses: the reader gets the end after those buffered."""
        self._ended = True
        self._reader.unpark_all()

    def fail(self, error: BaseException) -> None:
        """End with ``error``, raised to the reader after the responses buffered."""
        if not self._ended:
            self._error = error
        self.close()

    # -- the reader's end -------------------------------------------------------------

    def __aiter__(self) -> Pumped:
        return self

    async def __anext__(self) -> InferenceResponse:
        await self._wait()
        response = self._buffer.popleft()
        self._woken = False
        if self._room:
            self._room.unpark_all()
        return response

    async def next_batch(self) -> list[InferenceResponse]:
        """Every response waiting (at least one, waiting for it); the producer's error
        after the responses before it, then :class:`StopAsyncIteration`."""
        await self._wait()
        batch = list(self._buffer)
        self._buffer.clear()
        self._woken = False
        if self._room:
            self._room.unpark_all()
        return batch

    async def _wait(self) -> None:
        while not self._buffer:
            if self._ended:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            await self._reader.park()
