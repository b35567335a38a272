"""grpclib's loop: trio-asyncio's, run the way asyncio runs its own, every callback that
is ready at the start of a step in that one step.

trio-asyncio (0.16) takes its asyncio callbacks from a trio memory channel one at a
time, each behind a ``move_on_after`` and a ``receive`` that yields to trio's scheduler:
every asyncio callback (a task step, a future's wake-up, a coalesced write) cost a whole
trio scheduling round (a cancel scope, a reschedule, an ``epoll_wait``), about six per
unary gRPC call, and a trio task started from asyncio (:func:`.bridge.to_trio`) one more
while the loop waited for it to start. Measured with ``perf stat`` on a front under 16
concurrent ``ModelInfer`` calls: 6.5 ``epoll_wait`` per call; and since each call's
trio side ran in a round of its own, the front sent the engine one link frame per call.

:func:`run_callbacks_in_batches` makes the loop take the first callback as before (it
waits for it, or for the next timer, with trio's checkpoint) and then run, without
yielding, every callback that was already queued behind it, as asyncio's ``_run_once``
runs the ready queue: those queued by the batch run in the next step, so one callback
that keeps scheduling callbacks cannot starve trio. A trio task a callback starts
(``trio_as_aio``) is started in the batch without waiting for it to run: it runs in
trio's next round, with every other task the batch started; its handle still resolves
its future, and a cancelled one still cancels it (trio-asyncio's ``AsyncHandle``).
Cancelled timers leave the timer heap as asyncio's own loop drops them (trio-asyncio
kept each until it was due).

This reaches into trio-asyncio's private loop (its queue, timers, nursery and handles),
as :mod:`.h2` reaches into grpclib's; tested in ``tests/transport/grpchost/test_loop.py``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from typing import Any, Final

import trio
from sniffio import thread_local as sniffio_library
from trio_asyncio import TrioEventLoop
from trio_asyncio._handles import AsyncHandle

#: timers in the heap before it is ever rebuilt without its cancelled ones (asyncio's)
MIN_TIMERS_TO_REBUILD: Final = 100


class BatchingLoop(TrioEventLoop):  # type: ignore[misc]  # trio-asyncio has no type hints
    """A :class:`trio_asyncio.TrioEventLoop` whose main loop runs each step's ready
    callbacks in one trio step (see the module docstring). Made by
    :func:`run_callbacks_in_batches`."""

    # trio-asyncio's and asyncio's own state, as this class uses it
    _timers: list[Any]  # the heap of asyncio.TimerHandle
    _timer_cancelled_count: int

    async def _main_loop_one(self, no_wait: bool = False) -> None:
        if no_wait:  # the drain at close: trio-asyncio's own, one callback at a time
            await super()._main_loop_one(no_wait=True)
            return
        timers = self._drop_cancelled_timers()
        next_timer = timers[0]._when if timers else math.inf
        if next_timer <= self.time():
            due = heapq.heappop(timers)
            due._scheduled = False
            self._run(due)  # a due timer first, as trio-asyncio does
            return
        obj: Any = None
        # At the timer's time, not after a timeout computed from a second reading of
        # the clock: that could be negative by then, which trio refuses (ValueError),
        # and the error ended this loop, silently, with every call waiting on it.
        with trio.move_on_at(next_timer):
            obj = await self._q_recv.receive()
        if obj is None:
            return  # a timer is due: the next step takes it
        queued = self._q_recv.statistics().current_buffer_used
        self._take(obj)
        for _ in range(queued):
            self._take(self._q_recv.receive_nowait())

    def _take(self, obj: Any) -> None:
        """One object from the queue: a timer to wait for, a trio task to start, or a
        callback to run."""
        if isinstance(obj, asyncio.TimerHandle):
            timer: Any = obj
            if not timer._cancelled:
                heapq.heappush(self._timers, timer)
                timer._scheduled = True  # so that cancelling it counts it (asyncio's flag)
        elif isinstance(obj, AsyncHandle):
            # trio-asyncio then waits for the task to start (a trio round per task)
            obj._context.run(self._nursery.start_soon, obj._run, name=obj._callback)
        else:
            self._run(obj)

    def _timer_handle_cancelled(self, handle: Any) -> None:
        # asyncio's TimerHandle.cancel calls this for a timer in the heap
        self._timer_cancelled_count += 1

    def _drop_cancelled_timers(self) -> list[Any]:
        """The timer heap without cancelled timers at its head, rebuilt without any once
        most of it is cancelled, as asyncio's ``_run_once`` keeps its own.

        trio-asyncio keeps a cancelled timer until it is due: grpclib's deadline timer
        (one per call with a ``grpc-timeout``) and the idle timer of :mod:`.deadlines`
        (set whenever a connection's last stream ends, cancelled by the next call), so
        the heap grew by a call's worth per call for as long as the timeout, each
        keeping its call's context."""
        timers = self._timers
        if len(timers) > MIN_TIMERS_TO_REBUILD and self._timer_cancelled_count * 2 > len(timers):
            kept = []
            for timer in timers:
                if timer._cancelled:
                    timer._scheduled = False
                else:
                    kept.append(timer)
            heapq.heapify(kept)
            timers[:] = kept
            self._timer_cancelled_count = 0
        while timers and timers[0]._cancelled:
            heapq.heappop(timers)._scheduled = False
            # (a timer trio-asyncio's own loop pushed before the swap was never counted)
            self._timer_cancelled_count = max(0, self._timer_cancelled_count - 1)
        return timers

    @staticmethod
    def _run(handle: Any) -> None:
        if handle._cancelled:
            return
        previous, sniffio_library.name = sniffio_library.name, "asyncio"
        try:
            handle._run()
        finally:
            sniffio_library.name = previous


def run_callbacks_in_batches(loop: TrioEventLoop) -> None:
    """Make ``loop`` (just opened by ``trio_asyncio.open_loop``, which builds a plain
    :class:`~trio_asyncio.TrioEventLoop` itself) a :class:`BatchingLoop`: from its next
    step on, it runs its ready callbacks in batches."""
    loop.__class__ = BatchingLoop


__all__ = ["MIN_TIMERS_TO_REBUILD", "BatchingLoop", "run_callbacks_in_batches"]
