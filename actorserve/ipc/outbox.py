"""The messages waiting for one connection's writer, and that writer's frame gathering."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

from .frames import encode_stream_outputs

#: scheduler rounds the writer waits, while more messages keep arriving, before it sends:
#: the tasks woken by one engine step each add their message within a round or two, so
#: a step's outputs leave as one frame. Never a wait on the clock. A message queued with
#: ``hurry`` (a new request, a stream's first response) skips them: under load a round
#: is every other runnable task's step, and that is time to first token.
GATHER_ROUNDS = 2


@attrs.define(eq=False)
class _Entries:
    """Streams' entries that will leave as one StreamOutputs message."""

    parts: list[bytes] = attrs.field(factory=list)
    size: int = 0


class Outbox:
    """Encoded messages in order, for the one writer task of a connection.

    Producers ``await put(message)``; it waits while ``max_messages`` or ``max_bytes`` are
    reached (backpressure: a slow socket makes the engine stop pulling streams).
    :meth:`put_urgent` is for the few control messages that must go out from a
    ``finally`` (a cancel, an ack); its callers bound them (at most one per call in
    flight). :meth:`put_entry` queues a stream's entry (:func:`~.frames.encode_stream_entry`):
    entries queued one after the other join one StreamOutputs message, so the outputs of
    every stream one engine step woke cross as one message. :meth:`take` gives the writer
    every message waiting, up to a frame's size.

    :meth:`close` fails every waiting and later :meth:`put` with the given error.
    """

    __slots__ = (
        "_bytes",
        "_error",
        "_hurry",
        "_items",
        "_max_bytes",
        "_max_messages",
        "_open",
        "_producers",
        "_writer",
    )

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self._items: deque[bytes | _Entries] = deque()
        #: the entries that a next entry joins while they are the last thing queued
        self._open: _Entries | None = None
        self._bytes = 0
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._producers = trio.lowlevel.ParkingLot()
        self._writer = trio.lowlevel.ParkingLot()
        self._error: Callable[[], BaseException] | None = None
        #: a message waiting wants to leave without the gather rounds
        self._hurry = False

    def __len__(self) -> int:
        return len(self._items)

    def _full(self) -> bool:
        return bool(self._items) and (
            len(self._items) >= self._max_messages or self._bytes >= self._max_bytes
        )

    async def put(self, message: bytes, *, hurry: bool = False) -> None:
        """Queue ``message``, waiting while the outbox is full; with ``hurry`` the writer
        sends it without waiting for more (a new call: its latency is the client's)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._error is None and self._full():
            await self._producers.park()
        self._append(message)
        if hurry:
            self._hurry = True
            # no yield: the writer, woken above, must not wait behind this task's next step
            return
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def put_entry(self, entry: bytes, max_message: int, *, hurry: bool = False) -> None:
        """Queue a stream's ``entry``, waiting only while the outbox is full: it joins the
        entries queued last unless something else was queued after them (order: a
        stream's Opened before its outputs, its End after) or they would pass
        ``max_message`` bytes. With ``hurry`` (a stream's first outputs) the writer
        sends what is waiting without its gather rounds."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._error is None and self._full():
            await self._producers.park()
        if self._error is not None:
            raise self._error()
        if hurry:
            self._hurry = True
        items, entries = self._items, self._open
        if (
            entries is None
            or not items
            or items[-1] is not entries
            or entries.size + len(entry) > max_message
        ):
            entries = self._open = _Entries()
            items.append(entries)
            if self._writer:
                self._writer.unpark()
        entries.parts.append(entry)
        entries.size += len(entry)
        self._bytes += len(entry)
        # No yield here (put's has one): the stream's task waits for its next batch at
        # once, and a yield per batch was one more task switch per stream per step.

    def put_urgent(self, message: bytes) -> None:
        """Queue ``message`` now, full or not (see the class docstring for who may)."""
        self._append(message)

    def _append(self, message: bytes) -> None:
        if self._error is not None:
            raise self._error()
        self._items.append(message)
        self._bytes += len(message)
        if self._writer:
            self._writer.unpark()

    async def take(self, max_bytes: int) -> list[bytes]:
        """Wait for a message, let the tasks already woken add theirs (up to
        :data:`GATHER_ROUNDS` scheduler rounds, none when one of them hurries), then
        return every message waiting whose total fits ``max_bytes`` (always at least
        one)."""
        while not self._items:
            await self._writer.park()
        seen = len(self._items)
        for _ in range(GATHER_ROUNDS):
            if self._hurry:
                break
            await trio.lowlevel.checkpoint()
            if len(self._items) == seen:
                break
            seen = len(self._items)
        self._hurry = False
        items = self._items
        taken: list[bytes] = []
        size = counted = 0
        while items and (not taken or size + _size(items[0]) <= max_bytes):
            item = items.popleft()
            if isinstance(item, bytes):
                taken.append(item)
                counted += len(item)
            else:
                taken.append(encode_stream_outputs(item.parts))
                counted += item.size
            size += len(taken[-1])
        self._bytes -= counted
        self._producers.unpark_all()
        return taken

    def close(self, error: Callable[[], BaseException]) -> None:
        """Refuse further messages with ``error()`` (a fresh exception each time) and
        wake every waiting producer so it raises it."""
        if self._error is None:
            self._error = error
        self._producers.unpark_all()


def _size(item: bytes | _Entries) -> int:
    """``item``'s size as a message (at most; an entries' header is under 9 bytes)."""
    return len(item) if isinstance(item, bytes) else item.size + 8
