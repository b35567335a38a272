"""The continuous batcher: one task per model replica that steps all admitted work
together.

Each iteration: drop work whose caller went away, admit waiting work up to
``max_batch_size`` (when the batch was empty, wait for the first item and then up to
``max_batch_time`` for more), run :meth:`BatchModel.step` for the batch in a worker
thread (one step at a time per replica), and deliver each output to that
item's reply mailbox with ``send_nowait``. An item whose reply mailbox is full sits out
steps until its reader catches up, so a slow reader never stalls the batch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import attrs
import outcome
import trio

from ..errors import ModelFailed, Overloaded, ShuttingDown
from ..model import BatchModel, StepOutput
from ..types import InferenceRequest, InferenceResponse
from .mailbox import Mailbox
from .scheduler import Scheduler

log = logging.getLogger(__name__)



@attrs.define(eq=False, slots=True)
class WorkItem:
    """One request's journey through a batcher.

    Created by whoever accepts the request; ``replies`` is read by the caller only.
    The batcher owns ``work`` while the item is scheduled and closes ``replies`` when
    the item leaves (after the last response or an error); ``done`` is set then.
    """

    request: InferenceRequest
    replies: Mailbox[InferenceResponse]
    sequence_id: str | None = None
    work: Any = None
    batcher: ContinuousBatcher | None = None
    cancelled: bool = False
    paused: bool = False
    finished: bool = False
    error: BaseException | None = None
    undelivered: int = 0  # an output of the last step not yet in ``replies``
    done: trio.Event = attrs.field(factory=trio.Event)

    def cancel(self, error: BaseException | None = None) -> None:
        """Leave the batch at the next step: the caller went away or, with ``error``,
        the request was stopped (its reader gets the error after buffered outputs)."""
        if self.finished or self.cancelled:
            return
        self.cancelled = True
        if error is not None:
            self.error = error
        if self.batcher is not None:
            self.batcher.wake()
        else:
            self.finish()

    def fail(self, error: BaseException) -> None:
        """Finish with ``error``: the reader gets it after the outputs already buffered."""
        if not self.finished:
            self.error = error
            self.finish()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.replies.close()
            self.done.set()

    async def next_reply(self) -> InferenceResponse:
        """The next response for the caller; raises the item's error, or
        :class:`StopAsyncIteration` at the end."""
        try:
            reply = await self.replies.receive()
        except trio.EndOfChannel:
            if self.error is not None:
                raise self.error from None
            raise StopAsyncIteration from None
        if self.paused and self.batcher is not None:
            self.paused = False
            self.batcher.wake()
        return reply


@attrs.define(eq=False, slots=True)
class _Step:
    """A step running in a worker thread; ``finish`` is called on the trio thread."""

    result: outcome.Outcome[list[StepOutput]] | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    def finish(self, result: outcome.Outcome[list[StepOutput]]) -> None:
        self.result = result
        self.done.set()


@attrs.frozen
class BatcherStatistics:
    waiting: int
    running: int
    steps: int
    items_stepped: int


class ContinuousBatcher:
    """Steps one :class:`BatchModel` replica. Start :meth:`run` with ``nursery.start``;
    submit with :meth:`submit_nowait` (raises :class:`Overloaded` when ``max_pending``
    items already wait). Cancelling :meth:`run` waits for a running step to finish, then
    fails every item it still holds with :class:`ShuttingDown`."""

    def __init__(
        self,
        model: BatchModel[Any, Any],
        *,
        max_batch_size: int,
        max_batch_time: float = 0.0,
        max_pending: int = 1024,
        name: str = "batcher",
        on_step: Callable[[list[WorkItem]], None] | None = None,
    ) -> None:
        self.model = model
        self.name = name
        self.max_batch_time = max_batch_time
        self.max_pending = max_pending
        self._scheduler: Scheduler[WorkItem] = Scheduler(max_batch_size)
        self._wakeup = trio.Event()
        self._closed = False
        self._on_step = on_step
        self.steps = 0
        self.items_stepped = 0

    # -- submitting side --------------------------------------------------------------

    @property
    def load(self) -> int:
        """Items waiting or running: the measure for least-loaded routing."""
        return len(self._scheduler)

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(
            self._scheduler.waiting, self._scheduler.running, self.steps, self.items_stepped
        )

    def submit_nowait(self, item: WorkItem) -> None:
        if self._closed:
            raise ShuttingDown(f"{self.name} is shutting down")
        if self._scheduler.waiting >= self.max_pending:
            raise Overloaded(f"{self.name}: {self.max_pending} requests already wait for a batch slot")
        item.batcher = self
        self._scheduler.submit(item, item.sequence_id)
        self.wake()

    def wake(self) -> None:
        self._wakeup.set()

    async def _wait_for_wakeup(self) -> None:
        await self._wakeup.wait()
        self._wakeup = trio.Event()

    # -- the loop -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await self._loop()
        finally:
            self._closed = True
            self._fail_all(ShuttingDown(f"{self.name} stopped"))

    async def _loop(self) -> None:
        scheduler = self._scheduler
        idle = True
        # Outputs of the last step, handed out while the next step computes.
        pending: tuple[list[WorkItem], list[StepOutput] | BaseException] | None = None
        while True:
            self._refill()
            if pending is None and idle and self.max_batch_time > 0 and 0 < scheduler.running < scheduler.max_batch_size:
                await self._gather(self.max_batch_time)
            batch = [item for item in scheduler.plan() if not self._sits_out(item)]
            if not batch:
                if pending is not None:
                    self._deliver(*pending)
                    pending = None
                    continue
                idle = scheduler.running == 0
                # Nothing to step: wait for a submit, a cancel or a reader catching up.
                if not self._wakeup.is_set():
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            idle = False
            if self._on_step is not None:
                self._on_step(batch)
            step = self._start_step(batch)
            if pending is not None:
                self._deliver(*pending)  # the readers run while this step computes
                pending = None
            outputs = await self._step_result(batch, step)
            self._settle(batch, outputs)
            pending = (batch, outputs)

    async def _gather(self, max_time: float) -> None:
        """Wait up to ``max_time`` for the batch to fill up (only after being idle)."""
        scheduler = self._scheduler
        deadline = trio.current_time() + max_time
        with trio.move_on_at(deadline):
            while scheduler.running < scheduler.max_batch_size:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                self._refill()
        self._wakeup = trio.Event()

    def _refill(self) -> None:
        """Drop cancelled items, then admit; repeat while admitted items were cancelled."""
        self._sweep_cancelled()
        while any(item.cancelled for item in self._scheduler.admit()):
            self._sweep_cancelled()

    def _sits_out(self, item: WorkItem) -> bool:
        if len(item.replies) + item.undelivered >= item.replies.capacity:
            item.paused = True
            return True
        return False

    def _sweep_cancelled(self) -> None:
        """Take cancelled items out (admitted or waiting) and tell the model."""
        for item in [i for i in self._scheduler.plan() if i.cancelled]:
            self._drop(item)

    def _drop(self, item: WorkItem) -> None:
        self._scheduler.finish(item)
        if item.work is not None:
            try:
                self.model.on_request_cancelled(item.work)
            except Exception:
                log.exception("%s: on_request_cancelled raised", self.name)
        item.finish()

    def _start_step(self, batch: list[WorkItem]) -> _Step:
        """Start the model's step for ``batch`` now, without yielding to other tasks.

        Why not ``trio.to_thread.run_sync(..., limiter=CapacityLimiter(1))``: acquiring
        the limiter is a checkpoint *before* the thread starts, so the readers woken by
        the previous step all ran first and the next step started late (the engine
        benchmark measured 0.72-0.79x the plain loop at 64 streams that way). One step at
        a time per replica holds by construction: only this task starts steps, and it
        waits for each (:meth:`_step_result`) before starting the next.
        """
        step = _Step()
        works = [item.work for item in batch]
        if not self.model.step_in_thread:
            step.result = outcome.capture(self.model.step, works)
            step.done.set()
            return step
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[list[StepOutput]]) -> None:
            token.run_sync_soon(step.finish, result)

        trio.lowlevel.start_thread_soon(functools.partial(self.model.step, works), deliver)
        return step

    async def _step_result(self, batch: list[WorkItem], step: _Step) -> list[StepOutput] | BaseException:
        """Wait for a started step. A running step is never abandoned: cancellation
        waits for it (it holds the work objects), then takes effect."""
        with trio.CancelScope(shield=True):
            await step.done.wait()
        await trio.lowlevel.checkpoint_if_cancelled()
        assert step.result is not None
        try:
            outputs = step.result.unwrap()
        except Exception as exc:
            log.exception("%s: step of %d items failed", self.name, len(batch))
            return exc
        self.steps += 1
        self.items_stepped += len(batch)
        if not isinstance(outputs, list) or len(outputs) != len(batch):
            count = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
            error = ModelFailed(f"{self.model.name}: step returned {count} outputs for {len(batch)} items")
            log.error("%s", error)
            return error
        return outputs

    def _settle(self, batch: list[WorkItem], outputs: list[StepOutput] | BaseException) -> None:
        """Right after a step: items that are done or failed leave the schedule (their
        slots are refilled by the next step), the rest hold one undelivered output."""
        scheduler = self._scheduler
        if isinstance(outputs, BaseException):
            for item in batch:
                scheduler.finish(item)
            return
        for item, out in zip(batch, outputs, strict=True):
            if out.done or out.error is not None:
                scheduler.finish(item)
            elif out.response is not None:
                item.undelivered = 1

    def _deliver(self, batch: list[WorkItem], outputs: list[StepOutput] | BaseException) -> None:
        """Hand a settled step's outputs to the readers. May run while the next step
        computes: it touches only reply mailboxes and responses, never work objects, and
        leaves cancelled items that are still scheduled to the next sweep."""
        if isinstance(outputs, BaseException):
            failure = outputs if isinstance(outputs, ModelFailed) else ModelFailed(
                f"model {self.model.name!r} failed: {type(outputs).__name__}: {outputs}"
            )
            for item in batch:
                item.fail(failure)
            return
        for item, out in zip(batch, outputs, strict=True):
            item.undelivered = 0
            final = out.done or out.error is not None
            if item.cancelled:
                if final:
                    item.finish()
                continue
            if out.error is not None:
                item.fail(out.error)
                continue
            if out.response is not None:
                response = out.response
                if item.sequence_id is not None and "sequence_id" not in response.parameters:
                    response.parameters["sequence_id"] = item.sequence_id
                if response.id is None:
                    response.id = item.request.id
                try:
                    item.replies.send_nowait(response)
                except trio.ClosedResourceError:
                    item.cancelled = True  # the sweep drops it before the next step
                    if final:
                        item.finish()
                    continue
            if final:
                item.finish()

    def _fail_all(self, error: Exception) -> None:
        scheduler = self._scheduler
        items = scheduler.plan()
        for item in items:
            scheduler.finish(item)
            item.fail(error)
        while scheduler.waiting:
            admitted = scheduler.admit() or []
            for item in admitted:
                scheduler.finish(item)
                item.fail(error)
            if not admitted:
                break
