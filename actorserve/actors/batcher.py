"""The continuous batcher: one per model replica, stepping all admitted work together.

The batch itself is a :class:`~actorserve.actors.cycle.BatchCycle`: each round drops work
whose caller went away, admits waiting work up to ``max_batch_size``, leaves out items
whose reader is ``reply_buffer`` responses behind (they sit out steps until it catches
up, so a slow reader never stalls the batch), runs :meth:`BatchModel.step` and reports.
The batcher is the event loop's side of it: it hands submissions, cancellations and
reply credits over, holds new work back for up to ``max_batch_time`` after an idle
spell (with 0, until its task runs again: work that arrives in the same tick of the
event loop starts in the same step), and ``send_nowait`` s each report's outputs to
their items' reply mailboxes.

Who runs the rounds is chosen by :attr:`BatchModel.step_in_thread`:

- True (real models): a :class:`~actorserve.actors.steploop.StepLoop` worker thread per
  replica runs round after round and posts each report to the event loop;
- False (microsecond steps): the batcher's trio task runs a round whenever it is woken.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ModelFailed, Overloaded, ShuttingDown
from ..model import BatchModel, StepOutput
from .counters import BatcherStatistics, StepCounters
from .cycle import BatchCycle, StepReport
from .steploop import Doorbell, ReplicaHung, StepLoop
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
        self._cycle = BatchCycle(model, max_batch_size=max_batch_size, name=name, on_step=on_step)
        self._wakeup = trio.Event()
        self._closed = False
        self.counters = StepCounters()
        # The trio side mirrors the cycle's schedule from its reports.
        self._loop: StepLoop | None = None  # the worker thread, while it runs
        self._doorbell: Doorbell | None = None  # what this task waits on, while it runs
        self._held: set[WorkItem] = set()
        self._running = 0
        self._handed = 0  # submissions given to the cycle
        self._cycle_idle = True  # a report said the schedule was empty since then
        self._gathering: list[WorkItem] | None = None
        self._gather_deadline = 0.0
        self._thread_exited = trio.Event()
        self._thread_error: BaseException | None = None
        self._pending: StepReport | None = None  # stepped inline, outputs not handed out
        self.hung = False  # a step ran past step_timeout: the thread was abandoned

    # -- submitting side --------------------------------------------------------------

    @property
    def load(self) -> int:
        """Items waiting or running: the measure for least-loaded routing."""
        return len(self._held)

    def statistics(self) -> BatcherStatistics:
        waiting = len(self._held) - self._running
        return BatcherStatistics(waiting, self._running, self.counters.steps, self.counters.items_stepped)

    def submit_nowait(self, item: WorkItem) -> None:
        if self._closed:
            raise ShuttingDown(f"{self.name} is shutting down")
        if len(self._held) - self._running >= self.max_pending:
            raise Overloaded(
                f"{self.name}: {self.max_pending} requests already wait for a batch slot", bound="max_pending"
            )
        item.batcher = self
        item.submitted_at = trio.current_time()
        self._held.add(item)
        self._hand(item)

    def _cancelled(self, item: WorkItem) -> None:
        """``item.cancel()`` was called: it leaves the batch at the next step."""
        if self._gathering is not None and item in self._gathering:
            self._gathering.remove(item)
            self._release(item)
            self._tell_cancelled(item)
            item.finish()
        elif item in self._held:
            self._cycle.cancel(item)

    def _read(self, item: WorkItem, count: int = 1) -> None:
        """``item``'s reader took ``count`` responses: as many more may be produced."""
        if not item.finished:
            self._cycle.consumed(item, count)

    def _hand(self, item: WorkItem) -> None:
        """Give a new item to the cycle, or hold it back while gathering a batch: after
        an idle spell, for ``max_batch_time``, or with 0 until the batcher's task runs
        again, after the tasks already runnable (what arrives together steps together:
        the step-loop thread, woken by the first item, would otherwise start a step for
        it alone as soon as it gets the GIL, and the rest would finish a step later)."""
        if self._gathering is None and self._cycle_idle:
            self._gathering = []
            self._gather_deadline = trio.current_time() + self.max_batch_time
            self._wake()
        if self._gathering is not None:
            self._gathering.append(item)
            if len(self._gathering) >= self._cycle.max_batch_size:
                self._flush_gathering()
            return
        self._cycle_idle = False
        self._handed += 1
        self._cycle.submit([item])

    def _flush_gathering(self) -> None:
        if self._gathering is not None:
            items, self._gathering = self._gathering, None
            if items:
                self._cycle_idle = False
                self._handed += len(items)
                self._cycle.submit(items)
            self._wake()

    def _wake(self) -> None:
        if self._doorbell is not None:
            self._doorbell.ring()
        else:
            self._wakeup.set()  # the event of the current sleep: _wait replaces it

    async def _wait(self) -> None:
        """Sleep until woken; hand a gathered batch over once its time is up."""
        gathering = self._gathering
        if gathering is None:
            if not self._wakeup.is_set():  # woken already: no checkpoint (inline rounds are hot)
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            return
        with trio.move_on_at(self._gather_deadline):
            await self._wakeup.wait()
        self._wakeup = trio.Event()
        if self._gathering is gathering and trio.current_time() >= self._gather_deadline:
            self._flush_gathering()

    # -- the event loop's side of a round ---------------------------------------------

    def _on_report(self, report: StepReport) -> None:
        """One round of the step loop, on the batcher's trio task (the step loop's
        :class:`~actorserve.actors.steploop.Doorbell` woke it, or it ran the round inline)."""
        self._account(report)
        if report.outputs is not None:
            self._deliver(report.batch, report.outputs)

    def _account(self, report: StepReport) -> None:
        """Mirror the schedule from ``report``, count its step, finish what was dropped."""
        self._cycle.delivered()
        for item in report.admitted:
            item.admitted = True
            self._running += 1
            if item.trace is not None:
                item.trace.admitted(self.counters)
        self.counters.admitted(report.admitted)
        for item in report.left:
            self._release(item)
        if report.outputs is not None and not isinstance(report.outputs, BaseException):
            self.counters.stepped(len(report.batch), report.step_ns)
        for item in report.dropped:
            self._tell_cancelled(item)
            item.finish()
        if report.idle_after is not None and report.idle_after == self._handed:
            self._cycle_idle = True

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

    # -- the drivers ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            if self.model.step_in_thread:
                await self._run_thread(task_status)
            else:
                task_status.started()
                await self._run_inline()
        finally:
            self._closed = True
            self._deliver_pending()  # handed out before the items it holds fail
            held, self._held, self._gathering = self._held, set(), None
            self._running = 0
            hung = self._thread_error if isinstance(self._thread_error, ReplicaHung) else None
            self.hung, error = hung is not None, hung or ShuttingDown(f"{self.name} stopped")
            for item in held:
                item.fail(error)
        if self._thread_error is not None:
            raise self._thread_error

    async def _run_thread(self, task_status: trio.TaskStatus[None]) -> None:
        """The step-loop thread runs the rounds; this task answers its doorbell (each
        round's report, then its exit), times ``max_batch_time`` (trio's clock), and
        at the end waits for the thread to end after the running step's report."""
        doorbell = Doorbell()
        loop = StepLoop(
            self._cycle,
            doorbell,
            report=self._on_report,
            exited=self._on_thread_exit,
            step_timeout=self.model.step_timeout,
        )
        self._loop, self._doorbell = loop, doorbell
        loop.start()
        try:
            task_status.started()
            while not self._thread_exited.is_set():
                await self._answer(doorbell)
        finally:
            self._closed = True
            loop.stop()
            with trio.CancelScope(shield=True):
                while not self._thread_exited.is_set():  # after the running step's report
                    await self._answer(doorbell)
            loop.join()
            self._loop = self._doorbell = None
            doorbell.close()

    async def _answer(self, doorbell: Doorbell) -> None:
        """Wait for the doorbell (while gathering, no later than the deadline), run the
        calls posted, and hand a gathered batch over once its time is up."""
        gathering = self._gathering
        with trio.move_on_at(self._gather_deadline if gathering is not None else math.inf):
            await doorbell.wait()
        for call, argument in doorbell.take():
            call(argument)
        if (
            gathering is not None
            and self._gathering is gathering
            and trio.current_time() >= self._gather_deadline
        ):
            self._flush_gathering()

    def _on_thread_exit(self, error: BaseException | None) -> None:
        """The thread's last post (run by :meth:`_answer`)."""
        self._thread_error = error
        self._thread_exited.set()

    async def _run_inline(self) -> None:
        """Rounds on this task, woken by every hand-off. A step's outputs are handed out
        after the next step ran (its plan counted them as produced, so slow readers still
        sit out): the readers then run while the next step is computed, as with the thread."""
        cycle = self._cycle
        cycle.on_wake = self._wake
        timeout = self.model.step_timeout
        while True:
            report = cycle.run_once()
            if report is None:
                if self._pending is not None:
                    self._deliver_pending()
                    continue
                # Nothing to step: wait for a submit, a cancel or a reader catching up.
                await self._wait()
                continue
            self._account(report)
            self._deliver_pending()
            if report.outputs is None:
                continue
            if timeout and report.step_ns > timeout * 1e9:  # on the event loop: nothing could preempt it
                log.warning(
                    "%s: a step ran %.1f s on the event loop, past its step_timeout of %g s (an inline "
                    "step cannot be preempted: set step_in_thread for long steps)",
                    self.name,
                    report.step_ns / 1e9,
                    timeout,
                )
            self._pending = report
            await trio.lowlevel.checkpoint()  # the readers run between steps

    def _deliver_pending(self) -> None:
        report, self._pending = self._pending, None
        if report is not None and report.outputs is not None:
            self._deliver(report.batch, report.outputs)

    def _deliver(self, batch: list[WorkItem], outputs: list[StepOutput] | BaseException) -> None:
        """Hand a settled step's outputs to the readers. May run while the next step
        computes: it touches only reply mailboxes and responses, never work objects, and
        leaves cancelled items that are still scheduled to the next round."""
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
