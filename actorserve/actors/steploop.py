"""The step loop: one replica's worker thread, running its :class:`BatchCycle` round
after round.

For a :class:`~actorserve.model.BatchModel` whose ``step`` runs in a thread, the
:class:`~actorserve.actors.batcher.ContinuousBatcher` starts one :class:`StepLoop`. The
thread owns the batch composition while it runs and steps back to back while work is
admitted, without waiting for the event loop between steps. What crosses between the two
threads:

- event loop -> thread: the cycle's hand-offs (:mod:`actorserve.actors.cycle`: a lock, a
  bounded deque and a condition; none of them waits for more than the lock);
- thread -> event loop: one :class:`~actorserve.actors.cycle.StepReport` per round through
  ``TrioToken.run_sync_soon``: one wake-up of the loop per step, not per stream. A round
  plans a step only while at most ``MAX_AHEAD`` reports wait for the loop, so a stalled
  loop cannot make outputs pile up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import trio

from ..errors import ModelFailed
from .cycle import BatchCycle, StepReport

log = logging.getLogger(__name__)

#: the watchdog looks at a running step this many times per ``step_timeout`` (at most
#: once every WATCH_MAX_INTERVAL seconds, so a long deadline is still seen promptly)
WATCH_PER_TIMEOUT = 4
WATCH_MAX_INTERVAL = 1.0


class ReplicaHung(ModelFailed):
    """A step ran past the model's ``step_timeout``: the step loop gave up on its thread
    (it cannot be killed; it is abandoned, and what it returns later is dropped). The
    batcher fails its items with this error and raises it, so the host replaces the
    replica."""


class StepLoop:
    """The worker thread that drives a :class:`BatchCycle` for the event loop.

    Create it on the trio thread, :meth:`start` it, and :meth:`stop` it; the thread
    calls ``report`` (via ``run_sync_soon``) once per round and ``exited(error)`` last
    (``error`` is None unless the loop itself broke).

    With ``step_timeout`` (seconds), a watchdog thread looks at the running step; past
    the deadline it declares the loop hung: ``exited(ReplicaHung(...))`` is called at
    once, and the stepping thread, whenever its step returns, reports nothing more and
    ends (:meth:`join` does not wait for it).
    """

    def __init__(
        self,
        cycle: BatchCycle,
        *,
        report: Callable[[StepReport], None],
        exited: Callable[[BaseException | None], None],
        step_timeout: float | None = None,
    ) -> None:
        self.cycle = cycle
        self.name = cycle.name
        self.step_timeout = step_timeout
        self._report = report
        self._exited = exited
        self._token = trio.lowlevel.current_trio_token()
        # -- guarded by cycle.cond --
        self._step_started: float | None = None  # time.monotonic() of the running call
        self.hung = False
        # --
        self._thread = threading.Thread(target=self._main, name=f"step loop: {self.name}", daemon=True)
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

    def stop(self) -> None:
        """The thread ends after the step it may be running (its report is still sent)."""
        self.cycle.stop()

    # -- the thread -----------------------------------------------------------------------

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            self._serve()
        except BaseException as exc:  # a bug or KeyboardInterrupt: the batcher re-raises it
            error = exc
        finally:
            with self.cycle.cond:
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
            with self.cycle.cond:
                started = self._step_started
                if started is None or time.monotonic() - started <= timeout:
                    continue
                self.hung = True
                self.cycle.stopping = True
            error = ReplicaHung(
                f"model {self.cycle.model.name!r}: a step ran past its step_timeout of {timeout:g} s; "
                "the replica was declared hung and is being replaced"
            )
            log.warning("%s: %s (its thread is abandoned)", self.name, error)
            try:
                self._token.run_sync_soon(self._exited, error)
            except trio.RunFinishedError:
                pass
            return

    def _call_started(self) -> None:
        with self.cycle.cond:
            self._step_started = time.monotonic()

    def _serve(self) -> None:
        cycle = self.cycle
        on_call = self._call_started if self.step_timeout else None
        while True:
            with cycle.cond:
                while True:
                    if cycle.stopping:
                        return  # the batcher fails what is still scheduled
                    report = cycle.begin_round()
                    if report is not None:
                        break
                    cycle.sleep()
            if report.batch:
                cycle.step(report, on_call)
                with cycle.cond:
                    self._step_started = None
                    if self.hung:  # too late: the items were failed, the replica replaced
                        log.warning(
                            "%s: the abandoned step returned after %.1f s; its outputs are dropped",
                            self.name,
                            report.step_ns / 1e9,
                        )
                        return
            cycle.settle(report)
            try:
                self._token.run_sync_soon(self._report, report)
            except trio.RunFinishedError:
                return
