"""The batched runner: a :class:`BatchModel`'s requests as :class:`WorkItem` s stepped
by its replicas' :class:`ContinuousBatcher` s.

A request without a sequence is begun here and goes to the least loaded replica; a
request of a sequence goes to its :class:`SequenceActor`, which begins it with the
sequence's state and submits it to the replica the sequence is pinned to. Either way
the caller reads the item's replies through :class:`ItemResponses`, and leaving
cancels the item: it leaves the batch at the next step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..api import RequestControl, ResponseIterator
from ..errors import BadInput, ModelNotReady
from ..model import BatchModel
from ..settings import ModelSettings
from ..types import InferenceRequest, InferenceResponse
from .batcher import ContinuousBatcher, WorkItem
from .inflight import Inflight
from .replies import new_item, stamp
from .sequence import Job
from .supervisor import Supervisor


def least_loaded(batchers: list[ContinuousBatcher]) -> ContinuousBatcher:
    """The replica with the fewest items waiting or running; :class:`ModelNotReady`
    when there is none (the only one hung and its replacement is loading)."""
    if not batchers:
        raise ModelNotReady(
            "no replica of the model is running (a hung one is being replaced); retry shortly"
        )
    return min(batchers, key=lambda b: b.load)


class ItemResponses(ResponseIterator):
    """The responses of one :class:`WorkItem` (a :class:`ResponseIterator`), each
    stamped with the request's id and sequence id."""

    __slots__ = ("_item",)

    def __init__(self, item: WorkItem) -> None:
        self._item = item

    @property
    def sequence_id(self) -> str | None:
        return self._item.sequence_id

    @property
    def model_sequence_id(self) -> str | None:
        return self._item.model_sequence_id

    def __aiter__(self) -> ItemResponses:
        return self

    async def __anext__(self) -> InferenceResponse:
        item = self._item
        return stamp(await item.next_reply(), item.request.id, item.sequence_id, item.model_sequence_id)

    async def next_batch(self) -> list[InferenceResponse]:
        """The next response and every one already buffered behind it (not those that
        arrive while they are taken: a batch is bounded by the reply buffer)."""
        item = self._item
        request_id, sequence_id, model_id = item.request.id, item.sequence_id, item.model_sequence_id
        batch = [await item.next_reply(), *item.take_waiting()]
        return [stamp(response, request_id, sequence_id, model_id) for response in batch]


class BatchedRunner:
    """Runs requests on the batchers of a :class:`BatchModel`'s replicas. Made by the
    :class:`ModelHost` once they run; the host counts the callers in flight.

    A caller that leaves before its item finished leaves it to be dropped at the next
    step; until then the item counts in ``leftovers`` (watched by a task in ``nursery``,
    the host's), so "nothing in flight" also means "nothing left in a batch".
    """

    def __init__(
        self,
        settings: ModelSettings,
        model: BatchModel[Any, Any],
        batchers: list[ContinuousBatcher],
        supervisor: Supervisor,
        nursery: trio.Nursery,
        leftovers: Inflight,
    ) -> None:
        self.settings = settings
        self.model = model
        self.batchers = batchers
        self.supervisor = supervisor
        self._nursery = nursery
        self._leftovers = leftovers
        self.closed = False

    async def _start(self, request: InferenceRequest, control: RequestControl) -> WorkItem:
        """Submit ``request``: to its sequence's actor, or begun and straight to the least
        loaded batcher. Raises what ``begin``, the supervisor or the batcher raise."""
        if control.stateful:
            item = new_item(request, self.settings.reply_buffer)
            actor = await self.supervisor.submit(Job(item), control)
            item.sequence_id, item.model_sequence_id = actor.id, actor.model_id
            return item
        if self.model.requires_sequence:
            raise BadInput(
                f"model {self.settings.name!r} is stateful: send a sequence_id (and sequence_start)"
            )
        batcher = least_loaded(self.batchers)
        item = new_item(request, self.settings.reply_buffer)
        await batcher.model.prepare(request, None)
        item.work = batcher.model.begin(request, None)
        batcher.submit_nowait(item)
        return item

    @asynccontextmanager
    async def infer_stream(
        self, request: InferenceRequest, control: RequestControl
    ) -> AsyncIterator[ResponseIterator]:
        """The responses of one request as the steps produce them."""
        item = await self._start(request, control)
        try:
            yield ItemResponses(item)
        finally:
            item.cancel()
            if not item.finished:
                self._watch_leftover(item)

    async def infer(self, request: InferenceRequest, control: RequestControl) -> InferenceResponse:
        """One response: the item's responses merged by the model (stamped too: a
        request that streamed nothing still tells its caller the sequence's id, which
        the server may have made)."""
        async with self.infer_stream(request, control) as stream:
            responses = [r async for r in stream]
        assert isinstance(stream, ItemResponses)
        merged = self.model.merge(request, responses)
        return stamp(merged, request.id, stream.sequence_id, stream.model_sequence_id)

    def _watch_leftover(self, item: WorkItem) -> None:
        if self.closed:  # the batchers are gone: they failed every item they held
            return
        self._leftovers.enter()
        self._nursery.start_soon(self._leftover, item)

    async def _leftover(self, item: WorkItem) -> None:
        try:
            await item.done.wait()
        finally:
            self._leftovers.leave()
