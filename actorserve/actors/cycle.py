"""One replica's batch cycle: take hand-offs, admit, plan under credits, step, settle.

:class:`BatchCycle` is plain synchronous code with no I/O and no event loop: one round
(:meth:`BatchCycle.run_once`, or :meth:`~BatchCycle.begin_round`, :meth:`~BatchCycle.step`
and :meth:`~BatchCycle.settle` for a driver that steps outside the lock) turns what was
handed over into one :class:`StepReport`. Two drivers run it for a
:class:`~actorserve.actors.batcher.ContinuousBatcher`:

- the step-loop thread (:class:`~actorserve.actors.steploop.StepLoop`, for models that
  step in a thread), which runs round after round and posts each report to the event loop;
- the batcher's own trio task (``step_in_thread = False``: microsecond steps), which runs
  a round whenever it is woken and handles the report itself.

What the event loop hands over (submissions, cancellation marks, reply credits,
acknowledged reports, ``stop``) goes through the methods of the first section, which
take :attr:`BatchCycle.cond`'s lock only briefly and never wait; the rest belongs to
whichever thread drives the cycle.

Flow control is one credit model: an item may have at most ``replies.capacity``
responses produced and not yet read (``produced - consumed``); past that it sits out
steps (``paused``) until its reader takes one, so handing out a report never finds a
full mailbox, however far the driver ran ahead of delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ..model import BatchModel, StepOutput
from .outputs import run_step
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .workitem import WorkItem

log = logging.getLogger(__name__)

#: Reports not yet handled by the event loop when a round may still plan a step: with 1
#: the step-loop thread computes step N+1 while the loop hands out step N, and never gets
#: more than two steps ahead of the readers.
MAX_AHEAD = 1


@attrs.define(eq=False, slots=True)
class StepReport:
    """One round of a :class:`BatchCycle`: what it admitted, stepped and let go. Items
    in ``left`` are out of the schedule: the cycle will not touch them (or their work)
    again. A plain record, made once per round and never copied."""

    #: the items stepped, in the order of ``outputs`` (empty: no step this round)
    batch: list[WorkItem]
    #: one output per item of ``batch``, or why the step failed (None: no step)
    outputs: list[StepOutput] | BaseException | None
    #: items that joined the batch this round
    admitted: list[WorkItem]
    #: every item that left the schedule this round (done, failed or dropped)
    left: list[WorkItem]
    #: cancelled items taken out of the schedule (a subset of ``left``)
    dropped: list[WorkItem]
    #: submissions taken so far, when nothing was scheduled after this round
    idle_after: int | None = None
    #: how long the step took (0: no step)
    step_ns: int = 0


class BatchCycle:
    """One replica's schedule and the round that steps it (see the module docstring).

    ``on_step(batch)`` is called before each step on the driver's thread; if it raises,
    that step fails. The caller of :meth:`begin_round` holds :attr:`cond`; every other
    driver method runs without it. ``on_wake`` (set by a driver that sleeps on the event
    loop, not on :attr:`cond`) is called after each hand-off, on the handing thread.
    """

    def __init__(
        self,
        model: BatchModel[Any, Any],
        *,
        max_batch_size: int,
        name: str,
        on_step: Callable[[list[WorkItem]], None] | None = None,
    ) -> None:
        self.model = model
        self.name = name
        self.on_step = on_step
        self.on_wake: Callable[[], None] | None = None
        self.cond = threading.Condition(threading.Lock())
        self.scheduler: Scheduler[WorkItem] = Scheduler(max_batch_size)  # the driver's
        self.taken = 0  # submissions taken by rounds (the driver's)
        # -- guarded by cond --
        self._submitted: deque[WorkItem] = deque()
        self._cancelled: list[WorkItem] = []
        self.stopping = False
        self._sleeping = False  # the driver's thread waits on cond
        self._posted = 0
        self._delivered = 0

    @property
    def max_batch_size(self) -> int:
        return self.scheduler.max_batch_size

    # -- hand-offs (any thread) ---------------------------------------------------------

    def _handed(self) -> None:
        """Under :attr:`cond`: something changed for the driver."""
        if self._sleeping:  # a notify costs about what the lock does, waiter or not
            self.cond.notify()
        if self.on_wake is not None:
            self.on_wake()

    def submit(self, items: list[WorkItem]) -> None:
        with self.cond:
            self._submitted.extend(items)
            self._handed()

    def cancel(self, item: WorkItem) -> None:
        """Take ``item`` out before the next step (it is reported in ``dropped``)."""
        with self.cond:
            self._cancelled.append(item)
            self._handed()

    def consumed(self, item: WorkItem, count: int = 1) -> None:
        """``item``'s reader took ``count`` responses: as many more may be produced.

        Called on the event loop for every response read, so it takes the lock only for
        an item that sits out steps. No wake-up is lost: this writes the count before it
        reads ``paused``, and :meth:`plan` marks ``paused`` before it reads the count
        again; under the GIL one of the two sees what the other wrote."""
        item.consumed += count  # written by the event loop only
        if item.paused:
            with self.cond:
                if item.paused:
                    item.paused = False
                    self._handed()

    def delivered(self) -> None:
        """A report was handled by the event loop."""
        with self.cond:
            self._delivered += 1
            if self._posted - self._delivered == MAX_AHEAD:
                self._handed()  # a round held back by MAX_AHEAD may plan again

    def stop(self) -> None:
        """The driver ends after the round it may be running (its report is still sent)."""
        with self.cond:
            self.stopping = True
            self._handed()

    # -- the round (the driver's thread) ------------------------------------------------

    def sleep(self) -> None:
        """Under :attr:`cond`: wait for the next hand-off (a driver with its own thread)."""
        self._sleeping = True
        try:
            self.cond.wait()
        finally:
            self._sleeping = False

    def begin_round(self) -> StepReport | None:
        """Under :attr:`cond`: take the hand-offs, admit, and plan the next step. The
        report to finish with :meth:`step` (when its batch is not empty) and
        :meth:`settle`; None when nothing changed and nothing can be stepped."""
        dropped = self.take()
        admitted = self.admit()
        batch = self.plan()
        if not (batch or admitted or dropped):
            return None
        self._posted += 1
        return StepReport(batch, None, admitted, list(dropped), dropped)

    def take(self) -> list[WorkItem]:
        """Under :attr:`cond`: queue the submissions; drop the cancelled items still
        scheduled (returned: the event loop tells the model and finishes them)."""
        scheduler = self.scheduler
        while self._submitted:
            item = self._submitted.popleft()
            scheduler.submit(item, item.exclusive_key, item.priority)
            self.taken += 1
        dropped: list[WorkItem] = []
        for item in self._cancelled:
            if item in scheduler:
                scheduler.finish(item)
                dropped.append(item)
        self._cancelled.clear()
        return dropped

    def admit(self) -> list[WorkItem]:
        """Waiting items join the batch while there is room (by priority, then first come,
        first served)."""
        return self.scheduler.admit()

    def plan(self) -> list[WorkItem]:
        """Under :attr:`cond`: the items to step now, each with a credit left; an item
        without one is ``paused`` until its reader takes a response. Nothing while the
        event loop is more than ``MAX_AHEAD`` reports behind."""
        if self._posted - self._delivered > MAX_AHEAD:
            return []
        batch = []
        for item in self.scheduler.plan():
            if item.produced - item.consumed >= item.replies.capacity:
                item.paused = True
                if item.produced - item.consumed >= item.replies.capacity:
                    continue  # the reader's next consumed() sees the mark and wakes us
                item.paused = False  # it took a response meanwhile (see consumed)
            batch.append(item)
        return batch

    def step(self, report: StepReport, on_call: Callable[[], None] | None = None) -> None:
        """Run the model's step for ``report.batch`` and record its outputs (or why it
        failed) and how long it took. ``on_call`` runs before each call of ``step``."""
        batch = report.batch
        started = time.perf_counter_ns()
        outputs: list[StepOutput] | BaseException
        try:
            if self.on_step is not None:
                self.on_step(batch)
        except Exception as exc:
            log.exception("%s: on_step raised", self.name)
            outputs = exc
        else:
            outputs = run_step(self.model, batch, self.name, on_call)
        report.outputs = outputs
        report.step_ns = time.perf_counter_ns() - started

    def settle(self, report: StepReport) -> None:
        """After the step: items done or failed leave the schedule (their slots are
        refilled by the next round); the rest used one credit per response."""
        scheduler, outputs, left = self.scheduler, report.outputs, report.left
        if isinstance(outputs, BaseException):
            for item in report.batch:
                scheduler.finish(item)
            left.extend(report.batch)
        elif outputs is not None:
            for item, out in zip(report.batch, outputs, strict=True):
                if out.done or out.error is not None:
                    scheduler.finish(item)
                    left.append(item)
                elif out.response is not None:
                    item.produced += 1
        if not len(scheduler):
            report.idle_after = self.taken

    def run_once(self) -> StepReport | None:
        """One whole round on this thread (None: nothing to report)."""
        with self.cond:
            report = None if self.stopping else self.begin_round()
        if report is None:
            return None
        if report.batch:
            self.step(report)
        self.settle(report)
        return report
