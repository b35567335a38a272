"""The continuous batcher: one per model replica, stepping all admitted work together.

Each step: drop work whose caller went away, admit waiting work up to ``max_batch_size``
(after idling, wait up to ``max_batch_time`` for more), run :meth:`BatchModel.step`, and
``send_nowait`` each output to its item's reply mailbox. An item whose mailbox is full sits
out steps until its reader catches up, so a slow reader never stalls the batch.

Two drivers, chosen by :attr:`BatchModel.step_in_thread`:

- True (real models): a :class:`~actorserve.actors.steploop.StepLoop` worker thread per
  replica owns the batch and runs step after step; the event loop gets one report per
  step and hands the outputs out (see that module for the hand-off);
- False (microsecond steps): the batcher's trio task steps inline, as below.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ModelFailed, Overloaded, ShuttingDown
from ..model import BatchModel, StepOutput
from .counters import BatcherStatistics, StepCounters
from .outputs import run_step
from .scheduler import Scheduler
from .steploop import ReplicaHung, StepLoop, StepReport
from .workitem import WorkItem

log = logging.getLogger(__name__)
__all__ = ["BatcherStatistics", "ContinuousBatcher", "WorkItem"]


class ContinuousBatcher:
    """Steps one :class:`BatchModel` replica. Start :meth:`run` with ``nursery.start``;
    submit with :meth:`submit_nowait` (raises :class:`Overloaded` when ``max_pending``
    items already wait). Cancelling :meth:`run` waits for a running step to finish, then
    fails every item it still holds with :class:`ShuttingDown`.

    ``on_step(batch)`` is called before each step: on the worker thread when the model
    steps in a thread, else on the trio thread. ``model.on_request_cancelled`` is always
    called on the trio thread, once per cancelled item, after the item left the batch.
    """

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
        self._scheduler: Scheduler[WorkItem] = Scheduler(max_batch_size)  # inline only
        self._wakeup = trio.Event()
        self._closed = False
        self._on_step = on_step
        self.counters = StepCounters()
        # With a step loop, the trio side mirrors the thread's schedule from its reports.
        self._threaded = model.step_in_thread
        self._loop: StepLoop | None = None
        self._held: set[WorkItem] = set()
        self._running = 0
        self._handed = 0  # submissions given to the thread
        self._thread_idle = True  # the thread reported an empty schedule since then
        self._gathering: list[WorkItem] | None = None
        self._gather_deadline = 0.0
        self._thread_exited = trio.Event()
        self._thread_error: BaseException | None = None
        self.hung = False  # a step ran past step_timeout: the thread was abandoned

    # -- submitting side --------------------------------------------------------------

    @property
    def load(self) -> int:
        """Items waiting or running: the measure for least-loaded routing."""
        return len(self._held) if self._threaded else len(self._scheduler)

    def statistics(self) -> BatcherStatistics:
        if self._threaded:
            waiting, running = len(self._held) - self._running, self._running
        else:
            waiting, running = self._scheduler.waiting, self._scheduler.running
        return BatcherStatistics(waiting, running, self.counters.steps, self.counters.items_stepped)

    def submit_nowait(self, item: WorkItem) -> None:
        if self._closed:
            raise ShuttingDown(f"{self.name} is shutting down")
        if self._threaded and self._loop is None:
            raise ShuttingDown(f"{self.name} is not running")
        waiting = len(self._held) - self._running if self._threaded else self._scheduler.waiting
        if waiting >= self.max_pending:
            raise Overloaded(
                f"{self.name}: {self.max_pending} requests already wait for a batch slot", bound="max_pending"
            )
        item.batcher = self
        item.submitted_at = trio.current_time()
        if self._threaded:
            self._held.add(item)
            self._hand(item)
            return
        self._scheduler.submit(item, item.exclusive_key)
        self.wake()

    def wake(self) -> None:
        """Make the loop look at its schedule again."""
        if self._loop is not None:
            self._loop.kick()
        else:
            self._wakeup.set()

    def _cancelled(self, item: WorkItem) -> None:
        """``item.cancel()`` was called: it leaves the batch at the next step."""
        if not self._threaded:
            self.wake()
        elif self._gathering is not None and item in self._gathering:
            self._gathering.remove(item)
            self._release(item)
            self._tell_cancelled(item)
            item.finish()
        elif self._loop is not None and item in self._held:
            self._loop.cancel(item)

    def _read(self, item: WorkItem, count: int = 1) -> None:
        """``item``'s reader took ``count`` responses."""
        if self._threaded:
            if self._loop is not None and not item.finished:
                self._loop.consumed(item, count)
        elif item.paused:
            item.paused = False
            self.wake()

    # -- the step loop (model steps in a worker thread) --------------------------------

    def _hand(self, item: WorkItem) -> None:
        """Give a new item to the thread, or hold it back while gathering a batch."""
        assert self._loop is not None
        if self._gathering is None and self._thread_idle and self.max_batch_time > 0:
            self._gathering = []
            self._gather_deadline = trio.current_time() + self.max_batch_time
            self._wakeup.set()
        if self._gathering is not None:
            self._gathering.append(item)
            if len(self._gathering) >= self._scheduler.max_batch_size:
                self._flush_gathering()
            return
        self._thread_idle = False
        self._handed += 1
        self._loop.submit([item])

    def _flush_gathering(self) -> None:
        if self._gathering is not None and self._loop is not None:
            items, self._gathering = self._gathering, None
            if items:
                self._thread_idle = False
                self._handed += len(items)
                self._loop.submit(items)
            self._wakeup.set()

    async def _run_threaded(self, task_status: trio.TaskStatus[None]) -> None:
        loop = StepLoop(
            self.model,
            max_batch_size=self._scheduler.max_batch_size,
            report=self._on_report,
            exited=self._on_thread_exit,
            name=self.name,
            on_step=self._on_step,
            step_timeout=self.model.step_timeout,
        )
        self._loop = loop
        loop.start()
        try:
            task_status.started()
            # This task only times max_batch_time (trio's clock); the thread does the rest.
            while not self._thread_exited.is_set():
                gathering = self._gathering
                if gathering is None:
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                with trio.move_on_at(self._gather_deadline):
                    while self._gathering is gathering and not self._thread_exited.is_set():
                        await self._wakeup.wait()
                        self._wakeup = trio.Event()
                if self._gathering is gathering:
                    self._flush_gathering()
        finally:
            self._closed = True
            loop.stop()
            with trio.CancelScope(shield=True):
                await self._thread_exited.wait()  # after the running step's report
            loop.join()
            self._loop = None
            held, self._held, self._gathering = self._held, set(), None
            self._running = 0
            hung = self._thread_error if isinstance(self._thread_error, ReplicaHung) else None
            self.hung, error = hung is not None, hung or ShuttingDown(f"{self.name} stopped")
            for item in held:
                item.fail(error)
        if self._thread_error is not None:
            raise self._thread_error

    def _on_thread_exit(self, error: BaseException | None) -> None:
        self._thread_error = error
        self._thread_exited.set()
        self._wakeup.set()

    def _on_report(self, report: StepReport) -> None:
        """One round of the thread (trio thread, via ``run_sync_soon``): mirror the
        schedule, hand the outputs out, finish what was dropped."""
        assert self._loop is not None
        self._loop.delivered()
        for item in report.admitted:
            item.admitted = True
            self._running += 1
        self.counters.admitted(report.admitted)
        for item in report.left:
            self._release(item)
        if report.outputs is not None:
            if not isinstance(report.outputs, BaseException):
                self.counters.stepped(len(report.batch), report.step_ns)
            self._deliver(report.batch, report.outputs)
        for item in report.dropped:
            self._tell_cancelled(item)
            item.finish()
        if report.idle_after is not None and report.idle_after == self._handed:
            self._thread_idle = True

    def _release(self, item: WorkItem) -> None:
        if item in self._held:
            self._held.remove(item)
            if item.admitted:
                self._running -= 1

    def _tell_cancelled(self, item: WorkItem) -> None:
        if item.work is not None:
            try:
                self.model.on_request_cancelled(item.work)
            except Exception:
                log.exception("%s: on_request_cancelled raised", self.name)

    # -- the inline loop (model steps on the trio thread) -------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._threaded:
            await self._run_threaded(task_status)
            return
        task_status.started()
        try:
            await self._loop_inline()
        finally:
            self._closed = True
            self._fail_all(ShuttingDown(f"{self.name} stopped"))

    async def _loop_inline(self) -> None:
        scheduler = self._scheduler
        idle = True
        # Outputs of the last step, handed out after the next step ran (its plan saw
        # them as undelivered, see _sits_out).
        pending: tuple[list[WorkItem], list[StepOutput] | BaseException] | None = None
        while True:
            self._refill()
            if (
                pending is None
                and idle
                and self.max_batch_time > 0
                and 0 < scheduler.running < scheduler.max_batch_size
            ):
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
            outputs = self._step_inline(batch)
            if pending is not None:
                self._deliver(*pending)
                pending = None
            await trio.lowlevel.checkpoint()  # the readers run between steps
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
        while True:
            admitted = self._scheduler.admit()
            self.counters.admitted(admitted)
            if not any(item.cancelled for item in admitted):
                return
            self._sweep_cancelled()

    def _sits_out(self, item: WorkItem) -> bool:
        if len(item.replies) + item.undelivered >= item.replies.capacity:
            item.paused = True
            return True
        return False

    def _sweep_cancelled(self) -> None:
        """Take cancelled items out (admitted or waiting) and tell the model."""
        for item in [i for i in self._scheduler.plan() if i.cancelled]:
            self._scheduler.finish(item)
            self._tell_cancelled(item)
            item.finish()

    def _step_inline(self, batch: list[WorkItem]) -> list[StepOutput] | BaseException:
        """Run the model's step for ``batch`` now, on this thread (microsecond steps)."""
        started = time.perf_counter_ns()
        outputs = run_step(self.model, batch, self.name)
        took = time.perf_counter_ns() - started
        if not isinstance(outputs, BaseException):
            self.counters.stepped(len(batch), took)
        timeout = self.model.step_timeout
        if timeout and took > timeout * 1e9:  # on the event loop: nothing could preempt it
            log.warning(
                "%s: a step ran %.1f s on the event loop, past its step_timeout of %g s (an inline "
                "step cannot be preempted: set step_in_thread for long steps)",
                self.name,
                took / 1e9,
                timeout,
            )
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
            failure = (
                outputs
                if isinstance(outputs, ModelFailed)
                else ModelFailed(f"model {self.model.name!r} failed: {type(outputs).__name__}: {outputs}")
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
                try:  # the reader's ItemResponses stamps the ids (actors/replies.py)
                    item.replies.send_nowait(out.response)
                except trio.ClosedResourceError:
                    item.cancel()  # it leaves the batch before the next step
                    if final:
                        item.finish()
                    continue
            item.delivered(streamed=out.response is not None and not final, end_sequence=out.end_sequence)
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
