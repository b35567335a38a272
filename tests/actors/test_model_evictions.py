"""A BatchModel asks the engine to end idle sequences as ``evicted``
(:meth:`BatchModel.evict_sequence`), from ``begin`` or ``step``, on either thread."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from support.models import Count, Counter, RecordingModel, recording_settings, request

import actorserve
from actorserve import Overloaded, SequenceNotFound, SequenceSettings
from actorserve.actors.supervisor import Supervisor
from actorserve.evictions import EvictionRequests
from actorserve.types import InferenceRequest

WHY = "memory_budget of model 'ev' reached"


class EvictingModel(RecordingModel):
    """The recording model; a request's ``evict`` parameter (ids, comma-separated) asks
    the engine to evict those sequences, in ``step`` (``evict_in`` = "step", the default)
    or in ``begin``."""

    def _ask(self, work: Count, where: str) -> None:
        params = work.request.parameters
        if params.get("evict") and params.get("evict_in", "step") == where:
            for sequence_id in str(params["evict"]).split(","):
                assert self.evict_sequence(sequence_id, WHY)

    def begin(self, request: InferenceRequest, state: Counter | None) -> Count:
        work = super().begin(request, state)
        self._ask(work, "begin")
        return work

    def step(self, batch: list[Count]) -> list[actorserve.StepOutput]:
        for work in batch:
            if work.emitted == 0:
                self._ask(work, "step")
        return super().step(batch)


class ThreadedEvictingModel(EvictingModel):
    step_in_thread = True


def seq(request_id: str, sid: str, n_tokens: int = 1, **params: Any) -> InferenceRequest:
    return request(request_id, n_tokens, model="ev", sequence_id=sid, **params)


def supervisor_of(engine: actorserve.Engine) -> Supervisor:
    supervisor = engine.host("ev").supervisor
    assert supervisor is not None
    return supervisor


def settings(implementation: type[RecordingModel] = EvictingModel) -> actorserve.ModelSettings:
    # no evict_idle: only the model's requests end sequences here
    return recording_settings("ev", implementation=implementation, sequence=SequenceSettings(max_sequences=3))


@pytest.mark.parametrize("where", ["step", "begin"])
async def test_model_evicts_idle_sequences_and_frees_their_slots(
    where: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with actorserve.open_engine([settings()]) as engine:
        model = engine.model("ev")
        assert isinstance(model, EvictingModel)
        for sid in ("a", "b", "c"):
            await engine.infer(seq(sid, sid, sequence_start=True))
        with pytest.raises(Overloaded, match="max_sequences"):
            await engine.infer(seq("d", "d", sequence_start=True))
        # c asks for a and b: both idle, both end as evicted (unknown ids are ignored)
        await engine.infer(seq("c2", "c", evict="a,b,nope", evict_in=where))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(model.ended) == [("a", "evicted"), ("b", "evicted")]
        supervisor = supervisor_of(engine)
        assert len(supervisor) == 1 and supervisor.statistics().ended == {"evicted": 2}
        with pytest.raises(SequenceNotFound, match=rf"^sequence 'a' was evicted \({WHY}\)$"):
            await engine.infer(seq("a2", "a"))
        await engine.infer(seq("d", "d", sequence_start=True))  # the slots are free again
        # and an evicted id can be opened again, afresh
        response = await engine.infer(seq("a3", "a", 2, sequence_start=True))
        assert response.outputs[1].data.tolist() == [1, 2]


async def test_a_busy_sequence_is_not_evicted(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([settings()]) as engine:
        model = engine.model("ev")
        assert isinstance(model, EvictingModel)
        await engine.infer(seq("a", "a", sequence_start=True))
        # a asks for itself while its request runs: it stays open, its request finishes
        response = await engine.infer(seq("a2", "a", 3, evict="a"))
        assert response.outputs[0].data.tolist() == [0, 1, 2]
        await trio.testing.wait_all_tasks_blocked()
        assert model.ended == [] and len(supervisor_of(engine)) == 1
        assert len(model.evictions) == 0  # taken, not left to act on later
        await engine.infer(seq("a3", "a", sequence_end=True))
        assert model.ended == [("a", "ended")]


async def test_evictions_asked_from_the_step_thread() -> None:
    with trio.fail_after(10):
        async with actorserve.open_engine([settings(ThreadedEvictingModel)]) as engine:
            model = engine.model("ev")
            assert isinstance(model, ThreadedEvictingModel)
            await engine.infer(seq("a", "a", sequence_start=True))
            await engine.infer(seq("b", "b", 2, sequence_start=True, evict="a"))
            for _ in range(200):  # the engine acts on the event loop, soon after the step
                if model.ended:
                    break
                await trio.sleep(0.005)
            assert model.ended == [("a", "evicted")]
            with pytest.raises(SequenceNotFound, match=rf"'a' was evicted \({WHY}\)"):
                await engine.infer(seq("a2", "a"))


def test_eviction_requests_are_bounded_and_wake_once() -> None:
    woken: list[int] = []
    requests = EvictionRequests(limit=2)
    assert requests.add("a", "x")
    requests.listen(lambda: woken.append(1))
    assert woken == [1]  # a request already waited
    assert requests.add("b", "y") and requests.add("a", "z")  # asking again is asking once
    assert not requests.add("c", "x")  # full
    assert woken == [1]  # once until taken
    assert requests.take() == {"a": "z", "b": "y"}
    assert requests.add("c", "x") and woken == [1, 1]
    requests.listen(None)
    assert requests.take() == {"c": "x"} and requests.add("d", "x") and woken == [1, 1]
