"""A request in flight through a :class:`~actorserve.actors.batcher.ContinuousBatcher`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from ..tracing import ItemTrace
from ..types import InferenceRequest, InferenceResponse
from .mailbox import Mailbox


class ItemOwner(Protocol):
    """What an item tells the batcher that holds it (the
    :class:`~actorserve.actors.batcher.ContinuousBatcher`)."""

    def _cancelled(self, item: WorkItem) -> None: ...

    def _read(self, item: WorkItem, count: int = 1) -> None: ...


@attrs.define(eq=False, slots=True)
class WorkItem:
    """One request's journey through a batcher.

    Created by whoever accepts the request; ``replies`` is read by the caller only.
    The batcher owns ``work`` while the item is scheduled and closes ``replies`` when
    the item leaves (after the last response or an error); ``done`` is set then.
    """

    request: InferenceRequest
    replies: Mailbox[InferenceResponse]
    #: its sequence's id as its client named it (what its answers say)
    sequence_id: str | None = None
    #: the id the model knows that sequence by (differs when bound to a token)
    model_sequence_id: str | None = None
    work: Any = None
    batcher: ItemOwner | None = None
    cancelled: bool = False
    paused: bool = False
    finished: bool = False
    error: BaseException | None = None
    # Reply credits: responses made by the batch cycle / taken by the reader (the cycle
    # pauses the item while ``produced - consumed`` reaches the mailbox's capacity).
    produced: int = 0
    consumed: int = 0
    admitted: bool = False  # the event loop learnt that the item is in the batch
    submitted_at: float = 0.0  # trio.current_time() at submit (for queue statistics)
    done: trio.Event = attrs.field(factory=trio.Event)
    #: set by the batcher when a step's output says the sequence ends after this item
    ends_sequence: bool = False
    #: when set (sequence overlap), also set once the item has streamed a response
    progressed: trio.Event | None = None
    #: called once when the item finishes (its sequence actor's bookkeeping)
    on_finish: Callable[[], None] | None = None
    #: the request's queue and batch spans, when it is traced (:func:`actorserve.tracing.item_trace`)
    trace: ItemTrace | None = None

    def delivered(self, *, streamed: bool, end_sequence: bool) -> None:
        """A step's output was handed to the reader: ``streamed`` a response and the item
        goes on (its sequence's next request may join, with overlap); ``end_sequence``:
        the model ends the sequence once this item is done."""
        if end_sequence:
            self.ends_sequence = True
        if streamed and self.progressed is not None:
            self.progressed.set()

    @property
    def priority(self) -> int | None:
        """Triton's ``priority`` of the request (1 highest; None or 0: the default)."""
        control = self.request.control
        return None if control is None else control.priority

    @property
    def exclusive_key(self) -> str | None:
        """What the scheduler keeps from running together with this item: its sequence,
        unless the sequence lets requests overlap (its actor then orders them)."""
        if self.progressed is not None:
            return None
        # the model's id: two owners' sequences of one name are two sequences
        return self.sequence_id if self.model_sequence_id is None else self.model_sequence_id

    def cancel(self, error: BaseException | None = None) -> None:
        """Leave the batch at the next step: the caller went away or, with ``error``,
        the request was stopped (its reader gets the error after buffered outputs)."""
        if self.finished or self.cancelled:
            return
        self.cancelled = True
        if error is not None:
            self.error = error
        if self.batcher is not None:
            self.batcher._cancelled(self)
        else:
            self.finish()

    def fail(self, error: BaseException) -> None:
        """Finish with ``error``: the reader gets it after the outputs already buffered.
        An item stopped with a reason (:meth:`cancel` with an error) keeps that reason:
        it says why (``sequence 's' expired``) better than what came after."""
        if not self.finished:
            if self.error is None or not self.cancelled:
                self.error = error
            self.finish()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.replies.close()
            self.done.set()
            if self.trace is not None:
                # delivered: what the reader took and what still waits for it
                self.trace.finished(self.submitted_at, self.consumed + len(self.replies), self.error)
            if self.progressed is not None:
                self.progressed.set()
            if self.on_finish is not None:
                on_finish, self.on_finish = self.on_finish, None
                on_finish()

    def take_waiting(self) -> list[InferenceResponse]:
        """Every reply already buffered (maybe none), without waiting or yielding; the
        batcher is credited once for all of them. Errors and the end are left for
        :meth:`next_reply` to raise."""
        replies: list[InferenceResponse] = []
        while len(self.replies):
            replies.append(self.replies.receive_nowait())
        if replies and self.batcher is not None:
            self.batcher._read(self, len(replies))
        return replies

    async def next_reply(self) -> InferenceResponse:
        """The next response for the caller; raises the item's error, or
        :class:`StopAsyncIteration` at the end."""
        try:
            reply = await self.replies.receive()
        except trio.EndOfChannel:
            if self.error is not None:
                raise self.error from None
            raise StopAsyncIteration from None
        if self.batcher is not None:
            self.batcher._read(self)
        return reply
