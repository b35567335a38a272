"""The step loop: one replica's worker thread, stepping its batch back to back.

For a :class:`~actorserve.model.BatchModel` whose ``step`` runs in a thread, the
:class:`~actorserve.actors.batcher.ContinuousBatcher` starts one :class:`StepLoop`. The
thread owns the batch composition (a :class:`~actorserve.actors.scheduler.Scheduler`)
and runs step after step while work is admitted, without waiting for the event loop
between steps. What crosses between the two threads:

- event loop -> thread, through :class:`StepLoop`'s methods (a lock, a bounded deque and
  a condition; none of them waits for more than the lock): submissions (at most
  ``max_pending`` wait, the batcher checks), cancellation marks, reply credits (a reader
  took a response), acknowledgements of delivered reports, and ``stop``;
- thread -> event loop: one :class:`StepReport` per step (or per change while no step
  runs) through ``TrioToken.run_sync_soon``: one wake-up of the loop per step, not per
  stream. The thread starts a step only while at most ``MAX_AHEAD`` reports wait for the
  loop, so a stalled loop cannot make outputs pile up.

Flow control is by credit: an item may have at most ``replies.capacity`` responses
produced and not yet read (``produced - consumed``); past that it sits out steps
(``paused``) until its reader takes one, so ``send_nowait`` on the trio side never finds a
full mailbox.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import ModelFailed
from ..model import BatchModel, StepOutput
from .outputs import run_step
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .workitem import WorkItem

log = logging.getLogger(__name__)

#: Reports not yet handled by the event loop when the thread may still start a step:
#: with 1 the thread computes step N+1 while the loop hands out step N, and never gets
#: more than two steps ahead of the readers.
MAX_AHEAD = 1

#: the watchdog looks at a running step this many times per ``step_timeout`` (at most
#: once every WATCH_MAX_INTERVAL seconds, so a long deadline is still seen promptly)
WATCH_PER_TIMEOUT = 4
WATCH_MAX_INTERVAL = 1.0


class ReplicaHung(ModelFailed):
    """A step ran past the model's ``step_timeout``: the step loop gave up on its thread
    (it cannot be killed; it is abandoned, and what it returns later is dropped). The
    batcher fails its items with this error and raises it, so the host replaces the
    replica."""


@attrs.define(eq=False, slots=True)
class StepReport:
    """What the thread tells the event loop after a step, or after a change of the
    schedule while no step runs. Items in ``left`` are out of the schedule: the thread
    will not touch them (or their work) again."""

    batch: list[WorkItem]
    #: one output per item of ``batch``, or why the step failed (None: no step)
    outputs: list[StepOutput] | BaseException | None
    admitted: list[WorkItem]
    #: every item that left the schedule this round (done, failed or dropped)
    left: list[WorkItem]
    #: cancelled items taken out of the schedule (a subset of ``left``)
    dropped: list[WorkItem]
    #: submissions taken so far, when nothing was scheduled after this round
    idle_after: int | None
    #: how long the step took (0: no step)
    step_ns: int = 0


class StepLoop:
    """The hand-off between a batcher (event loop) and its worker thread.

    Create it on the trio thread, :meth:`start` it, and :meth:`stop` it; the thread
    calls ``report`` (via ``run_sync_soon``) once per round and ``exited(error)`` last
    (``error`` is None unless the loop itself broke). Every method but the thread's own
    is called on the trio thread and takes the lock only briefly.

    With ``step_timeout`` (seconds), a watchdog thread looks at the running step; past
    the deadline it declares the loop hung: ``exited(ReplicaHung(...))`` is called at
    once, and the stepping thread, whenever its step returns, reports nothing more and
    ends (:meth:`join` does not wait for it).
    """

    def __init__(
        self,
        model: BatchModel[Any, Any],
        *,
        max_batch_size: int,
        report: Callable[[StepReport], None],
        exited: Callable[[BaseException | None], None],
        name: str,
        on_step: Callable[[list[WorkItem]], None] | None = None,
        step_timeout: float | None = None,
    ) -> None:
        self.model = model
        self.name = name
        self.step_timeout = step_timeout
        self._report = report
        self._exited = exited
        self._on_step = on_step
        self._token = trio.lowlevel.current_trio_token()
        self._scheduler: Scheduler[WorkItem] = Scheduler(max_batch_size)  # thread-owned
        self._cond = threading.Condition(threading.Lock())
        # -- guarded by _cond --
        self._submitted: deque[WorkItem] = deque()
        self._cancelled: list[WorkItem] = []
        self._stopping = False
        self._posted = 0
        self._delivered = 0
        self._step_started: float | None = None  # time.monotonic() of the running call
        self.hung = False
        # --
        self._taken = 0  # thread-owned
        self._thread = threading.Thread(target=self._main, name=f"step loop: {name}", daemon=True)
        self._watchdog: threading.Thread | None = None
        self._watch_stop = threading.Event()

    # -- event-loop side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if self.step_timeout:
            self._watchdog = threading.Thread(
                target=self._watch, name=f"step watchdog: {self.name}", daemon=True
            )
            self._watchdog.start()

    def join(self) -> None:
        """Called after ``exited``: the thread is returning (unless it hung: then it is
        left to finish its step on its own), so this does not block."""
        self._watch_stop.set()
        if self._watchdog is not None:
            self._watchdog.join()
        if not self.hung:
            self._thread.join()

    def submit(self, items: list[WorkItem]) -> None:
        with self._cond:
            self._submitted.extend(items)
            self._cond.notify()

    def cancel(self, item: WorkItem) -> None:
        """Take ``item`` out before the next step (it is reported in ``dropped``)."""
        with self._cond:
            self._cancelled.append(item)
            self._cond.notify()

    def consumed(self, item: WorkItem, count: int = 1) -> None:
        """``item``'s reader took ``count`` responses: as many more may be produced."""
        with self._cond:
            item.consumed += count
            if item.paused:
                item.paused = False
                self._cond.notify()

    def delivered(self) -> None:
        """A report was handled by the event loop."""
        with self._cond:
            self._delivered += 1
            self._cond.notify()

    def kick(self) -> None:
        """Make the thread look at its schedule again."""
        with self._cond:
            self._cond.notify()

    def stop(self) -> None:
        """The thread ends after the step it may be running (its report is still sent)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    # -- the thread -----------------------------------------------------------------------

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            self._serve()
        except BaseException as exc:  # a bug or KeyboardInterrupt: the batcher re-raises it
            error = exc
        finally:
            with self._cond:
                hung = self.hung  # then the watchdog said the last word
            if not hung:
                try:
                    self._token.run_sync_soon(self._exited, error)
                except trio.RunFinishedError:
                    pass

    def _watch(self) -> None:
        """The watchdog thread: declare the loop hung once a call of ``step`` has run
        past ``step_timeout`` (real time: a thread's step does not run on trio's clock)."""
        timeout = self.step_timeout
        assert timeout
        interval = min(timeout / WATCH_PER_TIMEOUT, WATCH_MAX_INTERVAL)
        while not self._watch_stop.wait(interval):
            with self._cond:
                started = self._step_started
                if started is None or time.monotonic() - started <= timeout:
                    continue
                self.hung = True
                self._stopping = True
            error = ReplicaHung(
                f"model {self.model.name!r}: a step ran past its step_timeout of {timeout:g} s; "
                "the replica was declared hung and is being replaced"
            )
            log.warning("%s: %s (its thread is abandoned)", self.name, error)
            try:
                self._token.run_sync_soon(self._exited, error)
            except trio.RunFinishedError:
                pass
            return

    def _call_started(self) -> None:
        with self._cond:
            self._step_started = time.monotonic()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return  # the batcher fails what is still scheduled
                    admitted, left, dropped, batch = self._next_round()
                    if batch or admitted or dropped:
                        break
                    self._cond.wait()
                self._posted += 1
            outputs: list[StepOutput] | BaseException | None = None
            step_ns = 0
            if batch:
                started = time.perf_counter_ns()
                outputs = self._step(batch)
                step_ns = time.perf_counter_ns() - started
                with self._cond:
                    self._step_started = None
                    if self.hung:  # too late: the items were failed, the replica replaced
                        log.warning(
                            "%s: the abandoned step returned after %.1f s; its outputs are dropped",
                            self.name,
                            step_ns / 1e9,
                        )
                        return
                left.extend(self._settle(batch, outputs))
            idle_after = self._taken if not len(self._scheduler) else None
            report = StepReport(batch or [], outputs, admitted, left, dropped, idle_after, step_ns)
            try:
                self._token.run_sync_soon(self._report, report)
            except trio.RunFinishedError:
                return

    def _next_round(
        self,
    ) -> tuple[list[WorkItem], list[WorkItem], list[WorkItem], list[WorkItem] | None]:
        """Under the lock: take submissions and cancellations, admit, and plan the next
        step (None: nothing to step now, or the event loop is too far behind)."""
        scheduler = self._scheduler
        while self._submitted:
            item = self._submitted.popleft()
            scheduler.submit(item, item.exclusive_key)
            self._taken += 1
        dropped: list[WorkItem] = []
        for item in self._cancelled:
            if item in scheduler:
                scheduler.finish(item)
                dropped.append(item)
        self._cancelled.clear()
        admitted = scheduler.admit()
        if self._posted - self._delivered > MAX_AHEAD:
            return admitted, list(dropped), dropped, None
        batch = []
        for item in scheduler.plan():
            if item.produced - item.consumed >= item.replies.capacity:
                item.paused = True  # sits out until its reader takes a response
            else:
                batch.append(item)
        return admitted, list(dropped), dropped, batch or None

    def _step(self, batch: list[WorkItem]) -> list[StepOutput] | BaseException:
        if self._on_step is not None:
            try:
                self._on_step(batch)
            except Exception as exc:
                log.exception("%s: on_step raised", self.name)
                return exc
        return run_step(self.model, batch, self.name, self._call_started if self.step_timeout else None)

    def _settle(self, batch: list[WorkItem], outputs: list[StepOutput] | BaseException) -> list[WorkItem]:
        """Items that are done or failed leave the schedule (their slots are refilled by
        the next round); the rest used one credit per response. Returns the leavers."""
        scheduler = self._scheduler
        if isinstance(outputs, BaseException):
            for item in batch:
                scheduler.finish(item)
            return list(batch)
        left = []
        for item, out in zip(batch, outputs, strict=True):
            if out.done or out.error is not None:
                scheduler.finish(item)
                left.append(item)
            elif out.response is not None:
                item.produced += 1
        return left
