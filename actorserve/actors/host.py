"""ModelHost: one loaded model version, its replicas, batchers and sequences.

A :class:`BatchModel` gets ``workers`` replicas, each stepped by its own
:class:`ContinuousBatcher`; a sequence is pinned to one replica for its whole life and a
request without a sequence goes to the least-loaded replica. A plain :class:`Model` runs
in the caller's task (its sequences still run in order through a
:class:`SequenceActor`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import trio

from ..api import OneByOne, ResponseIterator
from ..errors import (
    ActorServeError,
    BadInput,
    ModelFailed,
    ModelNotReady,
    Overloaded,
    SequenceNotFound,
    ShuttingDown,
)
from ..model import BatchModel, Model, bool_parameter, merge_responses
from ..settings import ModelSettings, SettingsError
from ..types import InferenceRequest, InferenceResponse
from .batcher import ContinuousBatcher, WorkItem
from .mailbox import Mailbox
from .sequence import Job
from .supervisor import SequenceControl, Supervisor

log = logging.getLogger(__name__)


def resolve_implementation(settings: ModelSettings) -> type[Model]:
    """The model class named by ``implementation`` ("package.module.Class" or a class).

    A module beside the settings file is importable, as in MLServer."""
    impl = settings.implementation
    if isinstance(impl, type):
        cls = impl
    else:
        module_name, _, attr = str(impl).rpartition(".")
        if not module_name:
            raise SettingsError(f"model {settings.name!r}: implementation {impl!r} is not 'module.Class'")
        folder = str(settings.folder) if settings.folder else None
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            module = importlib.import_module(module_name)
            cls = getattr(module, attr)
        except (ImportError, AttributeError) as exc:
            raise SettingsError(f"model {settings.name!r}: cannot import {impl!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise SettingsError(f"model {settings.name!r}: {impl!r} is not an actorserve Model")
    return cls


def sequence_control(request: InferenceRequest) -> SequenceControl:
    """Read ``sequence_id/start/end/cancel`` from the request parameters (the transports
    put headers there). An id of 0 or "" means no sequence, as in Triton."""
    params = request.parameters
    if not params:
        return SequenceControl()
    raw_id = params.get("sequence_id")
    sequence_id: str | None
    if raw_id is None or raw_id == 0 or raw_id == "":
        sequence_id = None
    elif isinstance(raw_id, bool) or not isinstance(raw_id, (int, str)):
        raise BadInput(f"parameter 'sequence_id': expected an integer or a string, got {raw_id!r}")
    else:
        sequence_id = str(raw_id)
    return SequenceControl(
        id=sequence_id,
        start=bool_parameter(params.get("sequence_start", False), "sequence_start"),
        end=bool_parameter(params.get("sequence_end", False), "sequence_end"),
        cancel=bool_parameter(params.get("sequence_cancel", False), "sequence_cancel"),
    )


class _ItemStream:
    """Async iterator over a :class:`WorkItem`'s replies."""

    __slots__ = ("_item",)

    def __init__(self, item: WorkItem) -> None:
        self._item = item

    def __aiter__(self) -> _ItemStream:
        return self

    async def __anext__(self) -> InferenceResponse:
        return await self._item.next_reply()

    async def next_batch(self) -> list[InferenceResponse]:
        """The next response and every one already buffered behind it."""
        item = self._item
        batch = [await item.next_reply()]
        while len(item.replies):
            batch.append(await item.next_reply())
        return batch


async def _single(response: InferenceResponse) -> AsyncIterator[InferenceResponse]:
    yield response


async def _one(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


class ModelHost:
    """Serves one model version. Start :meth:`run` with ``nursery.start`` (it loads the
    model and returns when it is ready); stop it with :meth:`stop`."""

    def __init__(self, settings: ModelSettings, model_class: type[Model] | None = None) -> None:
        self.settings = settings
        self.model_class = model_class or resolve_implementation(settings)
        self.batched = issubclass(self.model_class, BatchModel)
        self.replicas: list[Model] = []
        self.batchers: list[ContinuousBatcher] = []
        self.supervisor: Supervisor | None = None
        self.state = "loading"
        self.inflight = 0
        self._plain_load = [0] * settings.workers
        self._scope = trio.CancelScope()
        self._drained = trio.Event()

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str:
        return self.settings.version

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def model(self) -> Model:
        """The first replica (for metadata)."""
        return self.replicas[0]

    def metadata(self) -> dict[str, Any]:
        return self.model.metadata()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    for i in range(self.settings.workers):
                        model = self.model_class(self.settings)
                        await model.load()
                        self.replicas.append(model)
                        if isinstance(model, BatchModel):
                            batcher = ContinuousBatcher(
                                model,
                                max_batch_size=model.max_batch_size,
                                max_batch_time=self.settings.max_batch_time,
                                max_pending=self.settings.max_pending,
                                name=f"{self.name}:{self.version} replica {i}",
                            )
                            await nursery.start(batcher.run)
                            self.batchers.append(batcher)
                    self.supervisor = Supervisor(
                        self.replicas[0],
                        self.settings.sequence,
                        self._pick_replica_for_sequence,
                        name=f"model {self.name!r} version {self.version!r}",
                    )
                    await nursery.start(self.supervisor.run)
                    self.state = "ready"
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self.state = "stopped"

    def stop(self) -> None:
        """End every sequence (reason ``shutdown``) and stop at once."""
        self.state = "stopped"
        if self.supervisor is not None:
            self.supervisor.end_all("shutdown")
        self._scope.cancel()

    async def drain(self, grace: float) -> None:
        """Refuse new requests and wait up to ``grace`` seconds for in-flight ones."""
        if self.state == "ready":
            self.state = "stopping"
        if self.inflight:
            with trio.move_on_after(grace):
                await self._drained.wait()

    # -- routing -----------------------------------------------------------------------

    def _pick_replica_for_sequence(self) -> ContinuousBatcher | None:
        if not self.batchers:
            return None
        return min(self.batchers, key=lambda b: b.load)

    def _enter(self) -> None:
        if self.state != "ready":
            if self.state == "loading":
                raise ModelNotReady(f"model {self.name!r} version {self.version!r} is still loading")
            raise ShuttingDown(f"model {self.name!r} version {self.version!r} is shutting down")
        self.inflight += 1

    def _leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0 and self.state != "ready":
            self._drained.set()

    def _new_item(self, request: InferenceRequest, sequence_id: str | None = None) -> WorkItem:
        return WorkItem(
            request,
            Mailbox(self.settings.reply_buffer, name=f"replies of {request.id or 'a request'}"),
            sequence_id,
        )

    async def _start_batched(self, request: InferenceRequest, control: SequenceControl) -> WorkItem:
        if control.stateful:
            assert self.supervisor is not None
            item = self._new_item(request)
            actor = await self.supervisor.submit(Job(item), control)
            item.sequence_id = actor.id
            return item
        model = self.replicas[0]
        assert isinstance(model, BatchModel)
        if model.requires_sequence:
            raise BadInput(f"model {self.name!r} is stateful: send a sequence_id (and sequence_start)")
        batcher = min(self.batchers, key=lambda b: b.load)
        item = self._new_item(request)
        item.work = batcher.model.begin(request, None)
        batcher.submit_nowait(item)
        return item

    def _cancelled_response(self, request: InferenceRequest, sequence_id: str) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=request.id,
            outputs=[],
            parameters={"sequence_id": sequence_id, "sequence_cancelled": True},
        )

    # -- the public operations ----------------------------------------------------------

    @asynccontextmanager
    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[ResponseIterator]:
        """Responses for one request, as they are produced. Leaving the block (or being
        cancelled) cancels the request; its sequence, if any, stays open."""
        self._enter()
        try:
            control = sequence_control(request)
            if control.cancel:
                assert self.supervisor is not None
                sequence_id = self.supervisor.cancel(control.id)
                yield OneByOne(_single(self._cancelled_response(request, sequence_id)))
            elif self.batched:
                item = await self._start_batched(request, control)
                try:
                    yield _ItemStream(item)
                finally:
                    item.cancel()
            else:
                async with aclosing(self._plain_stream(request, control)) as stream:
                    yield OneByOne(stream)
        finally:
            self._leave()

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """One response for one request (a stream's responses merged)."""
        if self.batched:
            async with self.infer_stream(request) as stream:
                responses = [r async for r in stream]
            model = self.replicas[0]
            assert isinstance(model, BatchModel)
            return model.merge(request, responses)
        self._enter()
        try:
            control = sequence_control(request)
            if control.cancel:
                assert self.supervisor is not None
                return self._cancelled_response(request, self.supervisor.cancel(control.id))
            if control.stateful:
                async with aclosing(self._plain_stream(request, control, unary=True)) as stream:
                    responses = [r async for r in stream]
                return merge_responses(self.replicas[0], request, responses)
            index = self._take_plain_replica()
            try:
                return self._stamp(await self._call(self.replicas[index].predict(request)), request)
            finally:
                self._plain_load[index] -= 1
        finally:
            self._leave()

    def _take_plain_replica(self) -> int:
        index = min(range(len(self._plain_load)), key=self._plain_load.__getitem__)
        if self._plain_load[index] >= self.settings.max_pending:
            raise Overloaded(
                f"model {self.name!r}: {self.settings.max_pending} requests already running (max_pending)"
            )
        self._plain_load[index] += 1
        return index

    async def _call(self, awaitable: Any) -> InferenceResponse:
        try:
            return await awaitable  # type: ignore[no-any-return]
        except ActorServeError:
            raise
        except Exception as exc:
            log.exception("model %r failed", self.name)
            raise ModelFailed(f"model {self.name!r} failed: {type(exc).__name__}: {exc}") from None

    def _stamp(self, response: InferenceResponse, request: InferenceRequest, sequence_id: str | None = None) -> InferenceResponse:
        if response.id is None:
            response.id = request.id
        if sequence_id is not None and "sequence_id" not in response.parameters:
            response.parameters["sequence_id"] = sequence_id
        return response

    async def _plain_stream(
        self, request: InferenceRequest, control: SequenceControl, *, unary: bool = False
    ) -> AsyncGenerator[InferenceResponse, None]:
        """A plain model's responses, run in this (the caller's) task."""
        item: WorkItem | None = None
        sequence_id: str | None = None
        if control.stateful:
            assert self.supervisor is not None
            item = self._new_item(request)
            job = Job(item, turn=trio.Event())
            actor = await self.supervisor.submit(job, control)
            sequence_id = item.sequence_id = actor.id
            assert job.turn is not None
            try:
                await job.turn.wait()
            except BaseException:
                item.cancel()
                raise
            if item.finished:  # the sequence ended while this request waited
                await item.next_reply()  # raises the reason
                raise SequenceNotFound(f"sequence {sequence_id!r} ended")
        index = self._take_plain_replica()
        model = self.replicas[index]
        try:
            if unary:
                yield self._stamp(await self._call(model.predict(request)), request, sequence_id)
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
                        log.exception("model %r failed", self.name)
                        raise ModelFailed(f"model {self.name!r} failed: {type(exc).__name__}: {exc}") from None
                    if item is not None and item.cancelled:
                        raise SequenceNotFound(f"sequence {sequence_id!r} was cancelled")
                    yield self._stamp(response, request, sequence_id)
        finally:
            self._plain_load[index] -= 1
            if item is not None:
                item.finish()

    @asynccontextmanager
    async def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[ResponseIterator]:
        """MLServer's streaming: a stream of requests in, one stream of responses out.

        A model with ``stream_input`` gets the whole request stream in one
        ``predict_stream`` call; otherwise each request is served in turn."""
        self._enter()
        try:
            if not self.batched and self.model_class.stream_input:
                index = self._take_plain_replica()
                try:
                    async with aclosing(self.replicas[index].predict_stream(requests)) as out:  # type: ignore[type-var]
                        yield OneByOne(out)
                finally:
                    self._plain_load[index] -= 1
            else:
                async with aclosing(self._each(requests)) as out:
                    yield OneByOne(out)
        finally:
            self._leave()

    async def _each(self, requests: AsyncIterator[InferenceRequest]) -> AsyncGenerator[InferenceResponse, None]:
        async for request in requests:
            async with self.infer_stream(request) as responses:
                async for response in responses:
                    yield response
