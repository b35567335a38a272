"""The batch scheduler, property-tested with no event loop."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actorserve.actors.scheduler import Scheduler


class SchedulerMachine(RuleBasedStateMachine):
    """Random submit/admit/step/finish/cancel/pause against a model of the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.max = 3
        self.scheduler: Scheduler[int] = Scheduler(self.max)
        self.next_key = 0
        self.sequence_of: dict[int, int | None] = {}
        self.submitted_order: list[int] = []
        self.admitted: set[int] = set()
        self.paused: set[int] = set()
        self.missed_steps: dict[int, int] = {}

    @rule(sequence=st.one_of(st.none(), st.integers(0, 3)))
    def submit(self, sequence: int | None) -> None:
        key = self.next_key
        self.next_key += 1
        self.scheduler.submit(key, sequence)
        self.sequence_of[key] = sequence
        self.submitted_order.append(key)

    @rule()
    def admit(self) -> None:
        before = set(self.admitted)
        new = self.scheduler.admit()
        assert not set(new) & before
        self.admitted |= set(new)
        waiting = [k for k in self.submitted_order if k not in self.admitted]
        # Admission fills every free slot unless the waiting items' sequences are busy.
        busy = {self.sequence_of[k] for k in self.admitted} - {None}
        admissible = [k for k in waiting if self.sequence_of[k] is None or self.sequence_of[k] not in busy]
        if admissible:
            assert len(self.admitted) == self.max
        # First come, first served among admissible items.
        for key in new:
            earlier = [
                k
                for k in waiting
                if k < key and (self.sequence_of[k] is None or self.sequence_of[k] not in busy)
            ]
            assert not earlier, (key, earlier)

    @rule()
    def step(self) -> None:
        planned = self.scheduler.plan(self.paused)
        assert set(planned) == self.admitted - self.paused  # no admitted item starves
        assert len(planned) <= self.max

    @precondition(lambda self: bool(self.admitted))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.admitted)))
        self.scheduler.finish(key)
        self.admitted.discard(key)
        self.paused.discard(key)
        self.submitted_order.remove(key)

    @precondition(lambda self: bool(self.submitted_order))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.submitted_order))
        self.scheduler.cancel(key)
        self.admitted.discard(key)
        self.paused.discard(key)
        self.submitted_order.remove(key)

    @precondition(lambda self: bool(self.admitted))
    @rule(data=st.data())
    def toggle_pause(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.admitted)))
        self.paused ^= {key}

    @invariant()
    def bounded(self) -> None:
        assert self.scheduler.running == len(self.admitted) <= self.max
        assert len(self.scheduler) == len(self.submitted_order)

    @invariant()
    def one_request_per_sequence(self) -> None:
        sequences = [self.sequence_of[k] for k in self.admitted if self.sequence_of[k] is not None]
        assert len(sequences) == len(set(sequences))


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


def test_sequence_item_waits_without_blocking_others() -> None:
    scheduler: Scheduler[str] = Scheduler(4)
    scheduler.submit("a1", "a")
    scheduler.submit("a2", "a")
    scheduler.submit("b1", "b")
    assert scheduler.admit() == ["a1", "b1"]
    scheduler.finish("a1")
    assert scheduler.admit() == ["a2"]


def test_finished_slot_refilled_next_admit() -> None:
    scheduler: Scheduler[int] = Scheduler(2)
    for key in range(4):
        scheduler.submit(key)
    assert scheduler.admit() == [0, 1]
    scheduler.finish(0)
    assert scheduler.plan() == [1]
    assert scheduler.admit() == [2]
    assert scheduler.plan() == [1, 2]
