"""The plain-model runner: a :class:`Model`'s ``predict`` / ``predict_stream`` run in
the caller's own task.

Each replica runs at most ``max_pending`` requests at once (a request goes to the
least busy replica; past the bound, :class:`Overloaded`). A request of a stateful
sequence first waits for its turn from the sequence's :class:`SequenceActor` (so the
requests of one sequence run one after another), then runs here as well.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing, asynccontextmanager

import trio

from ..api import OneByOne, ResponseIterator, SequenceControl
from ..errors import ActorServeError, ModelFailed, Overloaded, SequenceNotFound
from ..model import Model, merge_responses
from ..settings import ModelSettings
from ..types import InferenceRequest, InferenceResponse
from .batcher import WorkItem
from .replies import new_item, stamp
from .sequence import Job
from .supervisor import Supervisor


async def _one(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


class PlainRunner:
    """Runs requests on the replicas of a plain model. Made by the :class:`ModelHost`
    once the replicas are loaded; the host counts requests in flight, this counts what
    each replica runs. Model exceptions become :class:`ModelFailed` (logged)."""

    def __init__(self, settings: ModelSettings, replicas: list[Model], supervisor: Supervisor) -> None:
        self.settings = settings
        self.replicas = replicas
        self.supervisor = supervisor
        #: requests running per replica (bounded by ``settings.max_pending``)
        self._load = [0] * len(replicas)
        #: replicas given new requests: the first ``active`` (the others are retiring)
        self.active = len(replicas)

    @property
    def running(self) -> int:
        """Requests running in the model now, over every replica."""
        return sum(self._load)

    def load_of(self, index: int) -> int:
        return self._load[index] if index < len(self._load) else 0

    def resize(self, active: int) -> None:
        """Give new requests to the first ``active`` replicas (``replicas`` holds them)."""
        self.active = active
        self._load.extend([0] * (len(self.replicas) - len(self._load)))

    def trim(self) -> int:
        """Forget retired replicas that run nothing any more (from the end); return how
        many replicas are left (the caller shortens ``replicas`` to that)."""
        while len(self._load) > self.active and self._load[-1] == 0:
            self._load.pop()
        return len(self._load)

    def _take_replica(self) -> int:
        index = min(range(self.active), key=self._load.__getitem__)
        if self._load[index] >= self.settings.max_pending:
            raise Overloaded(
                f"model {self.settings.name!r}: {self.settings.max_pending} requests already running (max_pending)",
                bound="max_pending",
            )
        self._load[index] += 1
        return index

    async def _call(self, response: Awaitable[InferenceResponse]) -> InferenceResponse:
        try:
            return await response
        except ActorServeError:
            raise
        except Exception as exc:
            raise ModelFailed.wrap(self.settings.name, exc) from None

    # -- the operations (the host has parsed the sequence controls; cancel is its own) --

    async def infer(self, request: InferenceRequest, control: SequenceControl) -> InferenceResponse:
        """One response for one request."""
        if control.stateful:
            async with aclosing(self._responses(request, control, unary=True)) as stream:
                responses = [r async for r in stream]
            return merge_responses(self.replicas[0], request, responses)
        index = self._take_replica()
        try:
            return stamp(await self._call(self.replicas[index].predict(request)), request.id)
        finally:
            self._load[index] -= 1

    @asynccontextmanager
    async def infer_stream(
        self, request: InferenceRequest, control: SequenceControl
    ) -> AsyncIterator[ResponseIterator]:
        """The responses of one request, produced in the caller's task as it reads."""
        async with aclosing(self._responses(request, control)) as stream:
            yield OneByOne(stream)

    @asynccontextmanager
    async def stream_input(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[ResponseIterator]:
        """A ``stream_input`` model's ``predict_stream`` over the whole request stream."""
        index = self._take_replica()
        try:
            model = self.replicas[index]
            async with aclosing(model.predict_stream(requests)) as out:  # type: ignore[type-var]
                yield OneByOne(out)
        finally:
            self._load[index] -= 1

    # -- one request --------------------------------------------------------------------

    async def _wait_turn(self, request: InferenceRequest, control: SequenceControl) -> WorkItem:
        """Queue ``request`` in its sequence and wait until the actor lets it run. The
        returned item is finished by the caller when the request is done."""
        item = new_item(request, self.settings.reply_buffer)
        job = Job(item, turn=trio.Event())
        actor = await self.supervisor.submit(job, control)
        item.sequence_id = actor.id
        assert job.turn is not None
        try:
            await job.turn.wait()
        except BaseException:
            item.cancel()
            raise
        if item.finished:  # the sequence ended while this request waited: say why
            raise item.error or SequenceNotFound(f"sequence {actor.id!r} ended")
        return item

    async def _responses(
        self, request: InferenceRequest, control: SequenceControl, *, unary: bool = False
    ) -> AsyncGenerator[InferenceResponse, None]:
        item = await self._wait_turn(request, control) if control.stateful else None
        sequence_id = item.sequence_id if item is not None else None
        try:
            index = self._take_replica()
        except BaseException:
            if item is not None:
                item.finish()
            raise
        model = self.replicas[index]
        try:
            if unary:
                yield stamp(await self._call(model.predict(request)), request.id, sequence_id)
                return
            async with aclosing(model.predict_stream(_one(request))) as responses:  # type: ignore[type-var]
                while True:
                    try:
                        response = await responses.__anext__()
                    except StopAsyncIteration:
                        break
                    except ActorServeError:
                        raise
                    except Exception as exc:
                        raise ModelFailed.wrap(self.settings.name, exc) from None
                    if item is not None and item.cancelled:
                        raise SequenceNotFound(f"sequence {sequence_id!r} was cancelled")
                    yield stamp(response, request.id, sequence_id)
        finally:
            self._load[index] -= 1
            if item is not None:
                item.finish()
