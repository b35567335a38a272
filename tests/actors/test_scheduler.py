"""The batch scheduler, property-tested with no event loop."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actorserve.actors.scheduler import Scheduler, rank_of


class SchedulerMachine(RuleBasedStateMachine):
    """Random submit/admit/step/finish/cancel/pause against a model of the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.max = 3
        self.scheduler: Scheduler[int] = Scheduler(self.max)
        self.next_key = 0
        self.sequence_of: dict[int, int | None] = {}
        self.rank: dict[int, int] = {}
        self.submitted_order: list[int] = []
        self.admitted: set[int] = set()
        self.paused: set[int] = set()
        self.missed_steps: dict[int, int] = {}

    @rule(sequence=st.one_of(st.none(), st.integers(0, 3)), priority=st.one_of(st.none(), st.integers(0, 3)))
    def submit(self, sequence: int | None, priority: int | None) -> None:
        key = self.next_key
        self.next_key += 1
        self.scheduler.submit(key, sequence, priority)
        self.sequence_of[key] = sequence
        self.rank[key] = rank_of(priority)
        self.submitted_order.append(key)

    @rule()
    def admit(self) -> None:
        before = set(self.admitted)
        new = self.scheduler.admit()
        assert not set(new) & before
        self.admitted |= set(new)
        waiting = [k for k in self.submitted_order if k not in self.admitted]
        busy = {self.sequence_of[k] for k in self.admitted} - {None}

        def admissible(key: int) -> bool:
            """Free to run now: no sequence, or its sequence idle and no earlier request
            of it waiting."""
            sequence = self.sequence_of[key]
            if sequence is None:
                return True
            return sequence not in busy and not any(
                self.sequence_of[k] == sequence for k in waiting if k < key
            )

        left = [k for k in waiting if admissible(k)]
        # Admission fills every free slot unless the waiting items' sequences are busy.
        if left:
            assert len(self.admitted) == self.max
        # By priority, then first come, first served, among admissible items.
        for key in new:
            better = [k for k in left if (self.rank[k], k) < (self.rank[key], key)]
            assert not better, (key, better)
            # a sequence's requests are admitted in the order they came
            sequence = self.sequence_of[key]
            assert sequence is None or not any(self.sequence_of[k] == sequence for k in waiting if k < key)

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


def test_higher_priorities_are_admitted_first_and_fifo_within_one() -> None:
    """Triton's priority: 1 is the highest; none (or 0) is the default, below them all."""
    scheduler: Scheduler[str] = Scheduler(1)
    for key, priority in [("d1", None), ("p3a", 3), ("d2", 0), ("p1", 1), ("p3b", 3)]:
        scheduler.submit(key, priority=priority)
    order = []
    for _ in range(5):
        (key,) = scheduler.admit()
        order.append(key)
        scheduler.finish(key)
    assert order == ["p1", "p3a", "p3b", "d1", "d2"]


def test_a_sequence_runs_in_order_whatever_its_priorities() -> None:
    scheduler: Scheduler[str] = Scheduler(2)
    scheduler.submit("a1", "a", priority=5)
    scheduler.submit("a2", "a", priority=1)
    scheduler.submit("b1", "b", priority=2)
    assert scheduler.admit() == ["b1", "a1"]
    scheduler.cancel("b1")
    assert scheduler.admit() == []
    scheduler.finish("a1")
    assert scheduler.admit() == ["a2"]
    assert len(scheduler) == 1
