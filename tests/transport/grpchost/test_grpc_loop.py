"""grpclib's loop (:mod:`actorserve.transport.grpchost.loop`): the asyncio callbacks
ready at the start of a step run in that one trio step, in order; what they queue runs
in the next step, so trio is never starved; timers and trio tasks started from asyncio
behave as on trio-asyncio's own loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
import trio_asyncio

from actorserve.transport.grpchost.bridge import to_aio, to_trio
from actorserve.transport.grpchost.loop import MIN_TIMERS_TO_REBUILD, BatchingLoop, run_callbacks_in_batches


class LoopSteps(trio.abc.Instrument):
    """Counts the steps of trio-asyncio's main-loop task (one per trio round it runs in)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("._main_loop"):
            self.steps += 1


@asynccontextmanager
async def batching_loop() -> AsyncIterator[Any]:
    async with trio_asyncio.open_loop() as loop:
        run_callbacks_in_batches(loop)
        assert isinstance(loop, BatchingLoop)
        await trio.testing.wait_all_tasks_blocked()  # the main loop now steps as a BatchingLoop
        yield loop


async def test_callbacks_queued_together_run_in_order_in_one_trio_step() -> None:
    ran: list[int] = []
    steps = LoopSteps()
    async with batching_loop() as loop:
        trio.lowlevel.add_instrument(steps)
        try:
            for i in range(20):
                loop.call_soon(ran.append, i)
            await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(steps)
    assert ran == list(range(20))
    assert steps.steps <= 2  # trio-asyncio's own loop takes a step (a trio round) per callback: 20


async def test_what_a_batch_queues_runs_after_it_in_the_next_step() -> None:
    ran: list[str] = []
    async with batching_loop() as loop:

        def first() -> None:
            ran.append("first")
            loop.call_soon(ran.append, "queued by first")

        loop.call_soon(first)
        loop.call_soon(ran.append, "second")
        await trio.testing.wait_all_tasks_blocked()
    assert ran == ["first", "second", "queued by first"]


async def test_a_callback_that_always_reschedules_itself_does_not_starve_trio() -> None:
    spins = 0
    done = trio.Event()
    async with batching_loop() as loop:

        def spin() -> None:
            nonlocal spins
            spins += 1
            if spins < 10_000:
                loop.call_soon(spin)
            else:
                done.set()

        loop.call_soon(spin)
        for _ in range(5):  # each checkpoint returns while the callback keeps rescheduling
            await trio.lowlevel.checkpoint()
        assert spins < 100
        with trio.fail_after(10):
            await done.wait()


async def test_timers_fire_at_their_time_among_callbacks(autojump_clock: trio.testing.MockClock) -> None:
    ran: list[tuple[str, float]] = []
    async with batching_loop() as loop:
        start = trio.current_time()
        loop.call_later(5, lambda: ran.append(("late", trio.current_time() - start)))
        loop.call_later(1, lambda: ran.append(("early", trio.current_time() - start)))
        cancelled = loop.call_later(2, lambda: ran.append(("cancelled", 0.0)))
        loop.call_soon(lambda: ran.append(("soon", trio.current_time() - start)))
        cancelled.cancel()
        await trio.sleep(10)
    assert ran == [("soon", 0.0), ("early", 1.0), ("late", 5.0)]


async def test_cancelled_timers_leave_the_heap(autojump_clock: trio.testing.MockClock) -> None:
    fired: list[float] = []
    async with batching_loop() as loop:
        start = trio.current_time()
        kept = loop.call_later(600, lambda: fired.append(trio.current_time() - start))
        for _ in range(10):  # ten waves of a deadline per call, each cancelled when its call ends
            timers = [loop.call_later(300, fired.append, -1.0) for _ in range(10 * MIN_TIMERS_TO_REBUILD)]
            await trio.testing.wait_all_tasks_blocked()
            for timer in timers:
                timer.cancel()
        loop.call_soon(lambda: None)  # a step after the last cancellations
        await trio.testing.wait_all_tasks_blocked()
        assert len(loop._timers) <= 10 * MIN_TIMERS_TO_REBUILD + 1  # trio-asyncio's kept all 10,001
        await trio.sleep(1000)
        assert loop._timers == []
    assert not kept.cancelled()
    assert fired == [600.0]


async def test_trio_tasks_started_from_asyncio_return_their_results() -> None:
    async def double(x: int) -> int:
        await trio.lowlevel.checkpoint()
        return 2 * x

    async def many() -> list[int]:
        return list(await asyncio.gather(*(to_trio(double, i) for i in range(10))))

    async with batching_loop():
        assert await to_aio(many) == [2 * i for i in range(10)]


@pytest.mark.parametrize("started", [False, True], ids=["before-it-starts", "while-it-runs"])
async def test_cancelling_the_asyncio_side_cancels_the_trio_task(started: bool) -> None:
    outcome: list[str] = []

    async def trio_side(running: asyncio.Event) -> None:
        running.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            outcome.append("cancelled")
            raise

    async def asyncio_side(cancel: Callable[[asyncio.Task[Any], asyncio.Event], Any]) -> None:
        running = asyncio.Event()
        task = asyncio.ensure_future(to_trio(trio_side, running))
        await cancel(task, running)
        with pytest.raises(asyncio.CancelledError):
            await task

    async def at_once(task: asyncio.Task[Any], running: asyncio.Event) -> None:
        task.cancel()  # in the same batch that queued the trio task

    async def once_running(task: asyncio.Task[Any], running: asyncio.Event) -> None:
        await running.wait()
        task.cancel()

    async with batching_loop():
        with trio.fail_after(10):
            await to_aio(asyncio_side, once_running if started else at_once)
    assert outcome == (["cancelled"] if started else [])
