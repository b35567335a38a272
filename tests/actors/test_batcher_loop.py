"""The batcher's step loop: a worker thread that steps a threaded model back to back.

These tests drive a :class:`ContinuousBatcher` directly with a model that steps in a
thread. Most run on the real clock (the thread's steps take real time) and bound every
wait with ``fail_after``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import pytest
import trio
import trio.testing
from support.models import Count, ThreadedRecordingModel, recording_settings, request

import actorserve
from actorserve import ModelFailed, SequenceNotFound, ShuttingDown, StepOutput
from actorserve.actors import cycle
from actorserve.actors.batcher import BatcherStatistics, ContinuousBatcher, WorkItem
from actorserve.actors.mailbox import Mailbox
from actorserve.actors.steploop import Doorbell

TIMEOUT = 10


class LoopModel(ThreadedRecordingModel):
    """Records steps (from the worker thread) like RecordingModel, plus: each step takes
    ``step_time`` seconds; with ``gate`` cleared, a step waits for it; ``entered`` is set
    when a step starts; ``short`` drops the last output (a broken model)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_time = 0.0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.short = False
        self.step_threads: set[int] = set()
        self.cancel_threads: set[int] = set()

    def step(self, batch: list[Count]) -> list[StepOutput]:
        self.step_threads.add(threading.get_ident())
        self.entered.set()
        self.gate.wait(TIMEOUT)
        if self.step_time:
            time.sleep(self.step_time)
        outputs = super().step(batch)
        return outputs[:-1] if self.short else outputs

    def on_request_cancelled(self, work: Count) -> None:
        self.cancel_threads.add(threading.get_ident())
        super().on_request_cancelled(work)


@asynccontextmanager
async def running(
    limit: float | None = TIMEOUT, **settings: Any
) -> AsyncIterator[tuple[ContinuousBatcher, LoopModel]]:
    """A batcher for a LoopModel. Pass ``limit=None`` under MockClock's autojump: the
    clock jumps while the worker thread steps, which trio cannot see."""
    model = LoopModel(recording_settings(implementation=LoopModel, **settings))
    batcher = ContinuousBatcher(
        model,
        max_batch_size=model.max_batch_size,
        max_batch_time=model.settings.max_batch_time,
        max_pending=model.settings.max_pending,
        name="test replica",
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        with trio.fail_after(limit) if limit is not None else nullcontext():
            yield batcher, model
        nursery.cancel_scope.cancel()


def submit(
    batcher: ContinuousBatcher, rid: str, n_tokens: int, *, buffer: int = 64, **parameters: Any
) -> WorkItem:
    item = WorkItem(request(rid, n_tokens, **parameters), Mailbox(buffer, name=rid))
    item.work = batcher.model.begin(item.request, None)
    batcher.submit_nowait(item)
    return item


def hog_the_event_loop(seconds: float) -> None:
    """Keep the trio thread from running anything: no report is delivered meanwhile."""
    time.sleep(seconds)


async def read_all(item: WorkItem) -> list[int]:
    got = []
    while True:
        try:
            reply = await item.next_reply()
        except StopAsyncIteration:
            return got
        got.append(int(reply.outputs[0].data[0]))


async def test_thread_steps_while_the_event_loop_is_blocked_up_to_the_bound() -> None:
    async with running(max_batch_size=4) as (batcher, model):
        model.step_time = 0.0005
        item = submit(batcher, "long", 10_000)
        await item.next_reply()
        delivered = batcher.counters.steps
        hog_the_event_loop(0.3)
        stepped = len(model.steps)
        # Without a round trip through the loop the thread went on stepping, but at most
        # MAX_AHEAD + 1 steps past what the loop had taken: outputs cannot pile up.
        assert stepped == delivered + cycle.MAX_AHEAD + 1
        item.cancel()
        await item.done.wait()
    assert len(model.step_threads) == 1  # one long-lived worker thread


async def test_one_wakeup_of_the_event_loop_per_step_whatever_the_batch_size() -> None:
    async with running(max_batch_size=16, max_batch_time=5.0) as (batcher, model):
        assert batcher._loop is not None
        calls: list[Callable[..., object]] = []
        doorbell = batcher._loop.doorbell
        post = doorbell.post

        def counting_post(fn: Callable[[Any], None], argument: Any) -> None:
            calls.append(fn)
            post(fn, argument)

        doorbell.post = counting_post  # type: ignore[method-assign, assignment]
        # The thread is idle, so the batch gathers until it is full: one hand-off of 16.
        items = [submit(batcher, f"s{i}", 10) for i in range(16)]
        results: dict[str, list[int]] = {}
        async with trio.open_nursery() as nursery:
            for item in items:

                async def reader(item: WorkItem = item) -> None:
                    results[str(item.request.id)] = await read_all(item)

                nursery.start_soon(reader)
        assert results == {f"s{i}": list(range(10)) for i in range(16)}
        assert [len(step) for step in model.steps] == [16] * 10
        assert len(calls) == 10  # 160 outputs, 10 steps, 10 wake-ups
        assert batcher.statistics() == BatcherStatistics(0, 0, 10, 160)


async def test_cancelled_item_leaves_within_one_step_and_the_loop_is_told() -> None:
    async with running(max_batch_size=4) as (batcher, model):
        model.step_time = 0.001
        other = submit(batcher, "other", 10_000)
        quitter = submit(batcher, "quitter", 10_000)
        await quitter.next_reply()
        await quitter.next_reply()
        at_cancel = len(model.steps)
        quitter.cancel()
        await quitter.done.wait()
        # The step planned before the cancel may hold it; the one after may not.
        assert all("quitter" not in step for step in model.steps[at_cancel + 1 :])
        assert model.cancelled == ["quitter"]
        assert model.cancel_threads == {threading.get_ident()}  # on the trio thread
        assert batcher.load == 1 and batcher.statistics().running == 1
        before = len(model.steps)
        await other.next_reply()
        while len(model.steps) < before + 3:  # the other stream goes on
            await other.next_reply()
        other.cancel()
        await other.done.wait()
        assert batcher.load == 0


async def test_slow_reader_sits_out_exactly_when_its_buffer_is_full() -> None:
    async with running(max_batch_size=4) as (batcher, model):
        slow = submit(batcher, "slow", 20, buffer=2)
        fast = submit(batcher, "fast", 30)
        assert await read_all(fast) == list(range(30))
        assert sum("slow" in s for s in model.steps) == 2  # filled its buffer, then sat out
        assert slow.paused
        assert await read_all(slow) == list(range(20))
        assert not slow.paused


async def test_shutdown_waits_for_the_running_step_then_fails_held_items() -> None:
    model = LoopModel(recording_settings(implementation=LoopModel, max_batch_size=1))
    batcher = ContinuousBatcher(model, max_batch_size=1, name="test replica")
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def run_batcher(*, task_status: trio.TaskStatus[None]) -> None:
                with scope:
                    await batcher.run(task_status=task_status)

            await nursery.start(run_batcher)
            assert batcher._loop is not None
            thread = batcher._loop._thread
            model.gate.clear()
            running_item = submit(batcher, "running", 5)
            waiting_item = submit(batcher, "waiting", 5)
            await trio.to_thread.run_sync(model.entered.wait)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not running_item.finished  # the step still runs: run() waits for it
            with pytest.raises(ShuttingDown):
                submit(batcher, "late", 1)
            model.gate.set()
        assert not thread.is_alive()
        assert model.steps == [["running"]]
        # The running step's output is delivered, then both held items fail.
        assert int((await running_item.next_reply()).outputs[0].data[0]) == 0
        for item in (running_item, waiting_item):
            with pytest.raises(ShuttingDown, match="stopped"):
                await item.next_reply()
        assert batcher.load == 0


async def test_a_failing_step_fails_its_items_and_the_replica_keeps_serving() -> None:
    async with running(max_batch_size=4) as (batcher, model):
        bad = submit(batcher, "bad", 3, fail_on=True)
        with pytest.raises(ModelFailed, match="step exploded"):
            await read_all(bad)
        assert await read_all(submit(batcher, "good", 3)) == [0, 1, 2]
        model.short = True
        with pytest.raises(ModelFailed, match="returned 0 outputs for 1 items"):
            await read_all(submit(batcher, "short", 3))
        model.short = False
        assert await read_all(submit(batcher, "after", 2)) == [0, 1]
        assert batcher.load == 0


async def test_max_batch_time_gathers_after_idle(autojump_clock: trio.testing.MockClock) -> None:
    async with running(None, max_batch_size=4, max_batch_time=0.005) as (batcher, model):
        first = submit(batcher, "a", 1)
        await trio.sleep(0.002)
        others = [submit(batcher, "b", 1), submit(batcher, "c", 1)]
        for item in [first, *others]:
            assert await read_all(item) == [0]
        assert model.steps == [["a", "b", "c"]]
        # Cancelled while gathered: it never reaches the thread.
        gathered = submit(batcher, "d", 1)
        gathered.cancel()
        assert gathered.finished and model.cancelled == ["d"]
        assert batcher.load == 0


async def test_what_an_idle_replica_gets_in_one_tick_starts_in_one_step() -> None:
    async with running(max_batch_size=8) as (batcher, model):
        items = []
        for rid in ("a", "b", "c"):
            items.append(submit(batcher, rid, 2))
            hog_the_event_loop(0.01)  # lets the thread run: it must not step "a" alone
        for item in items:
            assert await read_all(item) == [0, 1]
        assert model.steps == [["a", "b", "c"]] * 2
        # Busy, the replica takes new work at once: it joins the step after the running one.
        first = submit(batcher, "d", 10_000, buffer=10_000)
        await first.next_reply()
        model.gate.clear()
        model.entered.clear()
        await trio.to_thread.run_sync(model.entered.wait)  # a step of "d" runs
        late = submit(batcher, "e", 1)
        assert batcher._gathering is None
        model.gate.set()
        assert await read_all(late) == [0]
        assert ["d", "e"] in model.steps
        first.cancel()
        await first.done.wait()


class EndRecordingModel(LoopModel):
    """Also records, at ``on_sequence_end``, how many steps the thread had run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps_at_end: list[int] = []

    def on_sequence_end(self, state: Any, reason: str) -> None:
        self.steps_at_end.append(len(self.steps))
        super().on_sequence_end(state, reason)


async def test_sequence_cancel_ends_after_the_request_left_the_thread() -> None:
    settings = recording_settings(implementation=EndRecordingModel, reply_buffer=4)
    with trio.fail_after(TIMEOUT):
        async with actorserve.open_engine([settings]) as engine:
            model = engine.model("rec")
            assert isinstance(model, EndRecordingModel)
            model.step_time = 0.0005
            await engine.infer(request("open", 0, sequence_id="s", sequence_start=True))
            async with engine.infer_stream(request("long", 10_000, sequence_id="s")) as stream:
                await stream.__anext__()
                response = await engine.infer(request("cancel", 0, sequence_id="s", sequence_cancel=True))
                assert response.parameters == {"sequence_id": "s", "sequence_cancelled": True}
                with pytest.raises(SequenceNotFound, match="was cancelled"):
                    async for _ in stream:
                        pass
            await trio.testing.wait_all_tasks_blocked()  # the actor ends after its reader
            assert model.ended == [("s", "cancelled")]
            assert model.cancelled == ["long"]
            # on_sequence_end ran once the request was out of the batch: no later step has it.
            (at_end,) = model.steps_at_end
            assert all("long" not in step for step in model.steps[at_end:])
            stats = await engine.statistics("rec")
            assert (stats.waiting, stats.running) == (0, 0)


async def test_the_doorbell_hands_the_task_every_call_posted_from_a_thread_in_order() -> None:
    doorbell = Doorbell()
    got: list[int] = []

    def poster() -> None:
        for i in range(200):
            doorbell.post(got.append, i)

    try:
        with trio.fail_after(TIMEOUT):
            thread = threading.Thread(target=poster)
            thread.start()
            while len(got) < 200:  # bounded by fail_after; a wake may find its calls taken
                await doorbell.wait()
                for call, argument in doorbell.take():
                    call(argument)
            thread.join()
            assert got == list(range(200))
            doorbell.ring()  # a ring with nothing posted: the task wakes, takes nothing
            await doorbell.wait()
            assert doorbell.take() == []
    finally:
        doorbell.close()
