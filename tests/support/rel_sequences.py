"""Helpers of the sequence-race tests (issue 14): a model that checks its hooks run
exactly once, the invariants checked after every race, and a way to queue a request in a
sequence's mailbox without yielding (so a test places the racing event right after it)."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

import trio
import trio.testing

import actorserve
from actorserve import InferenceRequest, ModelSettings, SequenceSettings
from actorserve.actors.host import ModelHost
from actorserve.actors.replies import new_item
from actorserve.actors.sequence import Job
from actorserve.actors.supervisor import Supervisor
from actorserve.actors.workitem import WorkItem
from actorserve.api import RequestControl
from support.models import Count, Counter, RecordingModel, recording_settings, request


class HookModel(RecordingModel):
    """A :class:`RecordingModel` that also notes double calls of its hooks: a state
    ended twice, a request told twice that it was cancelled."""

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.live: set[int] = set()  # id() of the states not ended yet
        self.doubles: list[str] = []

    def new_state(self, sequence_id: str) -> Counter:
        state = super().new_state(sequence_id)
        self.live.add(id(state))
        return state

    def on_sequence_end(self, state: Counter, reason: str) -> None:
        if id(state) not in self.live:
            self.doubles.append(f"on_sequence_end({state.sequence_id!r}, {reason!r}) twice")
        self.live.discard(id(state))
        super().on_sequence_end(state, reason)

    def on_request_cancelled(self, work: Count) -> None:
        if str(work.request.id) in self.cancelled:
            self.doubles.append(f"on_request_cancelled({work.request.id!r}) twice")
        super().on_request_cancelled(work)


class ThreadedHookModel(HookModel):
    """The same, stepped in a worker thread like a real model (real clock only:
    MockClock's autojump would jump while the thread steps)."""

    step_in_thread = True


def hook_settings(name: str = "rec", *, threaded: bool = False, **sequence: Any) -> ModelSettings:
    overrides: dict[str, Any] = {"implementation": ThreadedHookModel if threaded else HookModel}
    if "reply_buffer" in sequence:
        overrides["reply_buffer"] = sequence.pop("reply_buffer")
    if "max_batch_size" in sequence:
        overrides["max_batch_size"] = sequence.pop("max_batch_size")
    return recording_settings(name, sequence=SequenceSettings(**sequence), **overrides)


def seq(request_id: str, sid: Any, n_tokens: int = 1, **flags: Any) -> InferenceRequest:
    """A request of sequence ``sid``; ``start``/``end``/``cancel`` become ``sequence_*``."""
    control = {"start", "end", "cancel"}
    params = {(f"sequence_{k}" if k in control else k): v for k, v in flags.items()}
    return request(request_id, n_tokens, sequence_id=sid, **params)


def hook_model(engine: actorserve.Engine, name: str = "rec") -> HookModel:
    model = engine.model(name)
    assert isinstance(model, HookModel)
    return model


def supervisor(engine: actorserve.Engine, name: str = "rec") -> Supervisor:
    host: ModelHost = engine.host(name)
    assert host.supervisor is not None
    return host.supervisor


async def queue(engine: actorserve.Engine, req: InferenceRequest, name: str = "rec") -> WorkItem:
    """Put ``req`` in its sequence's mailbox as the runner does, without a checkpoint
    (unless it starts a sequence): the actor has not seen it when this returns."""
    item = new_item(req, 8)
    control = RequestControl.from_parameters(req.parameters)
    actor = await supervisor(engine, name).submit(Job(item), control)
    item.sequence_id = actor.id
    return item


async def outcome(item: WorkItem) -> str:
    """How ``item`` ended for its caller: ``ok:<n responses>`` or ``<Error>: message``."""
    count = 0
    with trio.fail_after(60):
        while True:
            try:
                await item.next_reply()
            except StopAsyncIteration:
                return f"ok:{count}"
            except actorserve.ActorServeError as exc:
                return f"{type(exc).__name__}: {exc}"
            count += 1


async def check_invariants(engine: actorserve.Engine, name: str = "rec", *, quiet: bool = True) -> None:
    """After a race: no hook ran twice, every state that ended ended once, and (with
    ``quiet``: nothing in flight) no batch slot is held and every open sequence is one
    whose state has not ended."""
    await trio.testing.wait_all_tasks_blocked()
    model = hook_model(engine, name)
    if quiet and model.step_in_thread:  # the thread may still hold a step's report
        with trio.move_on_after(10):
            # a look at counters many paths change (no event to wait on), bounded
            while not await _quiet(engine, name):  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert model.doubles == []
    started, ended = Tally(model.states), Tally(sid for sid, _ in model.ended)
    for sid, count in ended.items():
        assert count <= started[sid], f"{sid!r} ended {count} times, started {started[sid]}"
    stats = await engine.statistics(name)
    assert stats.open_sequences == len(model.live)
    assert sum(stats.sequences_ended.values()) == len(model.ended)
    assert stats.sequences_started == len(model.states)
    if quiet:
        assert (stats.inflight, stats.waiting, stats.running, stats.queued) == (0, 0, 0, 0)
        for batcher in engine.host(name).batchers:
            assert batcher.load == 0


async def _quiet(engine: actorserve.Engine, name: str) -> bool:
    stats = await engine.statistics(name)
    return (stats.inflight, stats.waiting, stats.running, stats.queued) == (0, 0, 0, 0)
