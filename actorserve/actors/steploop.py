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
  a :class:`Doorbell` the batcher's trio task waits on: one wake-up of the loop per step,
  not per stream. A round plans a step only while at most ``MAX_AHEAD`` reports wait for
  the loop, so a stalled loop cannot make outputs pile up.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ModelFailed
from .cycle import BatchCycle, StepReport

log = logging.getLogger(__name__)

#: the watchdog looks at a running step this many times per ``step_timeout`` (at most
#: once every WATCH_MAX_INTERVAL seconds, so a long deadline is still seen promptly)
WATCH_PER_TIMEOUT = 4
WATCH_MAX_INTERVAL = 1.0


#: a call for the event loop: (callback, its one argument)
Call = tuple[Callable[[Any], None], Any]


class Doorbell:
    """Calls from the step loop's threads for the batcher's trio task: a deque of calls
    and a file descriptor the task waits on (:meth:`wait`), rung after each :meth:`post`.

    Not ``TrioToken.run_sync_soon``: trio wakes its loop with a write to an AF_UNIX
    socket, which Linux treats as a synchronous wake-up (the writer is expected to sleep
    next) and so tends to run the woken event loop on the writer's CPU, where the
    stepping thread, about to start the next step, then waits for the loop's hand-out of
    the last one. An eventfd write is an ordinary wake-up. Measured in one process,
    alternating the two round by round on 2 shared cores: engine / plain loop 0.887 vs
    0.858 at 64 streams, 0.720 vs 0.667 at 1 (medians of 12). On a busy box the writer
    still often waits for a CPU after the write (it is the loop's hand-out that needs
    one). Where there is no eventfd (not Linux), a socket pair does the same job.

    :meth:`post` and :meth:`ring` may be called from any thread, until :meth:`close`;
    :meth:`wait` and :meth:`take` by one trio task."""

    def __init__(self) -> None:
        self._calls: deque[Call] = deque()
        self._pair: tuple[socket.socket, socket.socket] | None = None
        if hasattr(os, "eventfd"):
            self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            self._pair = socket.socketpair()
            for end in self._pair:
                end.setblocking(False)
            self._fd = self._pair[0].fileno()

    def post(self, call: Callable[[Any], None], argument: Any) -> None:
        self._calls.append((call, argument))
        self.ring()

    def ring(self) -> None:
        """Wake the waiting task (with nothing to take, it wakes and waits again)."""
        try:
            if self._pair is None:
                os.eventfd_write(self._fd, 1)
            else:  # pragma: no cover - not Linux
                self._pair[1].send(b"\0")
        except BlockingIOError:  # pragma: no cover - full: it is rung already
            pass

    async def wait(self) -> None:
        await trio.lowlevel.wait_readable(self._fd)

    def take(self) -> list[Call]:
        """The calls posted so far, oldest first (a ring after this wakes :meth:`wait`)."""
        try:
            if self._pair is None:
                os.eventfd_read(self._fd)
            else:  # pragma: no cover - not Linux
                self._pair[0].recv(4096)
        except BlockingIOError:
            pass
        calls = []
        while self._calls:
            calls.append(self._calls.popleft())
        return calls

    def close(self) -> None:
        """After every thread that posts has ended (or, hung, will post nothing more)."""
        if self._pair is not None:  # pragma: no cover - not Linux
            for end in self._pair:
                end.close()
        else:
            os.close(self._fd)


class ReplicaHung(ModelFailed):
    """A step ran past the model's ``step_timeout``: the step loop gave up on its thread
    (it cannot be killed; it is abandoned, and what it returns later is dropped). The
    batcher fails its items with this error and raises it, so the host replaces the
    replica."""


class StepLoop:
    """The worker thread that drives a :class:`BatchCycle` for the event loop.

    Create it with the ``doorbell`` its batcher's task answers, :meth:`start` it, and
    :meth:`stop` it; the thread posts ``report`` once per round and ``exited(error)``
    last (``error`` is None unless the loop itself broke).

    With ``step_timeout`` (seconds), a watchdog thread looks at the running step; past
    the deadline it declares the loop hung: ``exited(ReplicaHung(...))`` is called at
    once, and the stepping thread, whenever its step returns, reports nothing more and
    ends (:meth:`join` does not wait for it).
    """

    def __init__(
        self,
        cycle: BatchCycle,
        doorbell: Doorbell,
        *,
        report: Callable[[StepReport], None],
        exited: Callable[[BaseException | None], None],
        step_timeout: float | None = None,
    ) -> None:
        self.cycle = cycle
        self.name = cycle.name
        self.step_timeout = step_timeout
        self.doorbell = doorbell
        self._report = report
        self._exited = exited
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
                self.doorbell.post(self._exited, error)

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
            self.doorbell.post(self._exited, error)
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
            self.doorbell.post(self._report, report)
