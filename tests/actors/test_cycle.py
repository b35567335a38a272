"""The batch cycle on its own: plain synchronous rounds, no event loop, no thread.

Each test hands work over the way the batcher does (``submit``, ``cancel``,
``consumed``, ``delivered``) and reads what each round's :class:`StepReport` says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from support.models import RecordingModel, recording_settings, request

from actorserve.actors.cycle import MAX_AHEAD, BatchCycle, StepReport
from actorserve.actors.mailbox import Mailbox
from actorserve.actors.workitem import WorkItem


def cycle_of(max_batch_size: int = 4, **settings: Any) -> tuple[BatchCycle, RecordingModel]:
    model = RecordingModel(recording_settings(max_batch_size=max_batch_size, **settings))
    return BatchCycle(model, max_batch_size=max_batch_size, name="test cycle"), model


def item_of(cycle: BatchCycle, rid: str, n_tokens: int, *, buffer: int = 64) -> WorkItem:
    item = WorkItem(request(rid, n_tokens), Mailbox(buffer, name=rid))
    item.work = cycle.model.begin(item.request, None)
    return item


def ids(items: list[WorkItem]) -> list[str]:
    return [str(item.request.id) for item in items]


def round_of(cycle: BatchCycle) -> StepReport:
    """One round, acknowledged at once (as the event loop would)."""
    report = cycle.run_once()
    assert report is not None
    cycle.delivered()
    return report


def test_a_round_admits_up_to_the_batch_size_steps_and_lets_finished_items_go() -> None:
    cycle, model = cycle_of(max_batch_size=2)
    a, b, c = (item_of(cycle, rid, n) for rid, n in (("a", 1), ("b", 2), ("c", 1)))
    cycle.submit([a, b, c])
    first = round_of(cycle)
    assert (ids(first.admitted), ids(first.batch), ids(first.left), first.dropped) == (
        ["a", "b"],
        ["a", "b"],
        ["a"],
        [],
    )
    assert isinstance(first.outputs, list) and [o.done for o in first.outputs] == [True, False]
    assert first.idle_after is None and first.step_ns > 0
    second = round_of(cycle)  # a's slot is refilled before the step
    assert (ids(second.admitted), ids(second.batch), ids(second.left)) == (["c"], ["b", "c"], ["b", "c"])
    assert second.idle_after == 3  # nothing scheduled after taking 3 submissions
    assert cycle.run_once() is None  # nothing changed: no report
    assert model.steps == [["a", "b"], ["b", "c"]]


def test_an_item_without_credit_sits_out_until_its_reader_takes_a_response() -> None:
    cycle, model = cycle_of()
    slow, fast = item_of(cycle, "slow", 10, buffer=2), item_of(cycle, "fast", 4)
    cycle.submit([slow, fast])
    for _ in range(4):
        round_of(cycle)
    # slow produced 2 responses nobody read: it sat out the last two steps
    assert model.steps == [["slow", "fast"], ["slow", "fast"], ["fast"], ["fast"]]
    assert slow.paused and (slow.produced, slow.consumed) == (2, 0)
    assert cycle.run_once() is None
    cycle.consumed(slow)
    assert not slow.paused
    assert ids(round_of(cycle).batch) == ["slow"]
    assert cycle.run_once() is None and slow.paused


def test_a_cancelled_item_is_dropped_before_the_next_step() -> None:
    cycle, model = cycle_of()
    keep, quit_, waiting = item_of(cycle, "keep", 5), item_of(cycle, "quit", 5), item_of(cycle, "w", 5)
    cycle.submit([keep, quit_])
    round_of(cycle)
    cycle.cancel(quit_)
    cycle.submit([waiting])
    cycle.cancel(waiting)  # cancelled before it was ever admitted
    report = round_of(cycle)
    assert ids(report.dropped) == ["quit", "w"] and ids(report.left) == ["quit", "w"]
    assert ids(report.batch) == ["keep"] and report.admitted == []
    assert model.steps == [["keep", "quit"], ["keep"]]
    assert model.cancelled == []  # the event loop tells the model, not the cycle


def test_a_failing_step_lets_its_items_go_and_only_those_it_raises_for() -> None:
    cycle, _ = cycle_of()
    bad = WorkItem(request("bad", 3, fail_on=True), Mailbox(4))
    bad.work = cycle.model.begin(bad.request, None)
    cycle.submit([bad])
    alone = round_of(cycle)  # a batch of one: the step's own exception
    assert isinstance(alone.outputs, ValueError)
    assert ids(alone.left) == ["bad"] and alone.idle_after == 1
    worse = WorkItem(request("worse", 3, fail_on=True), Mailbox(4))
    worse.work = cycle.model.begin(worse.request, None)
    cycle.submit([worse, item_of(cycle, "good", 3)])
    isolated = round_of(cycle)  # stepped again item by item: only "worse" fails
    assert isinstance(isolated.outputs, list) and isolated.outputs[0].error is not None
    assert ids(isolated.left) == ["worse"] and isolated.idle_after is None


def test_rounds_plan_no_step_while_the_event_loop_is_max_ahead_reports_behind() -> None:
    cycle, model = cycle_of()
    cycle.submit([item_of(cycle, "long", 100)])
    for _ in range(MAX_AHEAD + 1):
        report = cycle.run_once()  # never acknowledged
        assert report is not None and report.batch
    assert cycle.run_once() is None
    assert len(model.steps) == MAX_AHEAD + 1
    cycle.delivered()
    assert ids(round_of(cycle).batch) == ["long"]


def test_on_step_runs_before_each_step_and_its_failure_fails_the_step() -> None:
    cycle, model = cycle_of()
    seen: list[list[str]] = []

    def on_step(batch: list[WorkItem]) -> None:
        seen.append(ids(batch))
        if len(seen) == 2:
            raise RuntimeError("on_step exploded")

    cycle.on_step = on_step
    cycle.submit([item_of(cycle, "a", 5)])
    assert isinstance(round_of(cycle).outputs, list)
    failed = round_of(cycle)
    assert isinstance(failed.outputs, RuntimeError) and ids(failed.left) == ["a"]
    assert seen == [["a"], ["a"]] and model.steps == [["a"]]


def test_stop_ends_the_rounds_and_wakes_the_driver() -> None:
    cycle, _ = cycle_of()
    woken: list[int] = []
    cycle.on_wake = lambda: woken.append(1)
    cycle.submit([item_of(cycle, "a", 5)])
    cycle.stop()
    assert cycle.run_once() is None
    assert len(woken) == 2


class RacingMailbox(Mailbox[Any]):
    """A reply mailbox that runs ``hook`` once, when the planner reads its capacity for
    the ``at``-th time: a reader taking a response at that moment, on another thread."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.hook: Callable[[], None] | None = None
        self.at = 1
        self.reads = 0

    @property
    def capacity(self) -> int:
        self.reads += 1
        if self.hook is not None and self.reads == self.at:
            self.hook()
        return super().capacity


def test_a_credit_that_races_the_planner_is_never_lost() -> None:
    """The reader's credit takes no lock unless the item sits out; the planner marks it
    before it looks at the count again, so a credit given mid-plan is seen by one side."""
    for at, stepped_now in ((1, True), (2, False)):
        cycle, model = cycle_of()
        cycle.cond = threading.Condition(threading.RLock())  # the hook runs on the planner's thread
        replies = RacingMailbox(1)
        item = WorkItem(request("r", 5), replies)
        item.work = cycle.model.begin(item.request, None)
        cycle.submit([item])
        round_of(cycle)  # produced 1 of its 1 credit
        replies.reads = 0
        replies.hook = lambda item=item, cycle=cycle: cycle.consumed(item)
        replies.at = at  # 1: before the planner marks it paused; 2: after
        report = cycle.run_once()  # None: nothing to step this round
        assert (report is not None and ids(report.batch) == ["r"]) is stepped_now
        assert not item.paused  # either way it is not left sitting out
        if not stepped_now:
            assert ids(round_of(cycle).batch) == ["r"]
        assert len(model.steps) == 2


def test_a_reader_credit_does_not_wait_for_the_planner_lock() -> None:
    cycle, _ = cycle_of()
    item = item_of(cycle, "r", 5)
    cycle.submit([item])
    round_of(cycle)
    with cycle.cond:  # the driver holds it while it plans
        cycle.consumed(item)  # the event loop's credit goes through at once
    assert item.consumed == 1
