"""Sequence races, randomized (issue 14): seeded random schedules of start / request /
end / cancel / disconnect / idle / evict / unload events against the actors, under
trio's MockClock, with the invariants checked after every step.

Each seed gives one schedule: a handful of sequence ids shared by many concurrent
clients, so starts collide with open ids, requests queue behind running ones, cancels
meet ends, idle and total-time deadlines pass while requests arrive, ``max_sequences``
evicts, and the model is unloaded and loaded again under load. After every step: no
hook ran twice, every state started is open or ended exactly once. At the end: every
client got exactly one final answer (a result, or an error that names its sequence and
why), no batch slot is held, and the model still serves a new sequence.

``ACTORSERVE_SCHEDULE_SEEDS=N`` runs N seeds instead of the CI default (a local hunt).
"""

from __future__ import annotations

import os
import random
import re

import pytest
import trio
import trio.lowlevel
import trio.testing
from support.rel_sequences import HookModel, check_invariants, hook_settings, seq

import actorserve
from actorserve import InferenceRequest

SEEDS = int(os.environ.get("ACTORSERVE_SCHEDULE_SEEDS", "16"))
STEPS = 60
IDS = ("a", "b", "c", "d", "e", "f")

#: Every final answer a client may get. Errors name the sequence and why, or say that
#: the model is being unloaded, or that a bound was reached (429).
ANSWERS = re.compile(
    r"ok:\d+|cancelled:\w|left"
    r"|SequenceNotFound: sequence '\w' (has ended|was cancelled|expired|was evicted \(max_sequences reached\)"
    r"|was shut down|is not open \(unknown id; start it with sequence_start\))"
    r"|SequenceNotFound: unknown sequence '\w': it is not open on this server \([^)]*\); start it with sequence_start"
    r"|SequenceNotHeld: sequence '\w' is not open on replica '[^']+' \(unknown id; [^)]*; start it with sequence_start\)"
    r"|SequenceConflict: sequence '\w' is already open"
    r"|Overloaded: (sequence '\w' already has \d+ requests queued \(max_queue\)"
    r"|model 'rec' version '1': \d+ sequences are open \(max_sequences\))"
    r"|ModelNotFound: model 'rec' is not loaded|ModelNotReady: model 'rec' is not ready"
    r"|ShuttingDown: model 'rec' version '1' is shutting down"
)


class Schedule:
    """One seeded schedule: spawns clients, records one answer per client."""

    def __init__(self, engine: actorserve.Engine, rng: random.Random, scale: float = 1.0) -> None:
        self.engine = engine
        self.scale = scale
        self.rng = rng
        self.answers: dict[str, list[str]] = {}
        self.models: list[HookModel] = []
        self.unloading = False
        self.note_model()

    def note_model(self) -> None:
        model = self.engine.model("rec")
        assert isinstance(model, HookModel)
        if model not in self.models:
            self.models.append(model)

    def answer(self, rid: str, text: str) -> None:
        self.answers.setdefault(rid, []).append(text)

    async def client(self, rid: str, req: InferenceRequest, leave_after: int | None) -> None:
        """Send ``req``; read every response (or leave after ``leave_after``)."""
        await trio.sleep(self.rng.choice([0, 0, 0.001, 0.01, 0.05]) * self.scale)
        count = 0
        try:
            with trio.fail_after(60):
                async with self.engine.infer_stream(req, model="rec") as responses:
                    if req.parameters.get("sequence_cancel"):
                        async for response in responses:
                            self.answer(rid, f"cancelled:{response.parameters['sequence_id']}")
                        return
                    async for _ in responses:
                        count += 1
                        if leave_after is not None and count >= leave_after:
                            self.answer(rid, "left")
                            return
            self.answer(rid, f"ok:{count}")
        except actorserve.ActorServeError as exc:
            self.answer(rid, f"{type(exc).__name__}: {exc}")

    async def unload_and_load(self) -> None:
        try:
            await self.engine.unload("rec", grace=self.rng.choice([0, 0.1]) * self.scale)
            await trio.sleep(self.rng.choice([0, 0.01]) * self.scale)
            await self.engine.load(self.settings)
            self.note_model()
        finally:
            self.unloading = False

    def step(self, nursery: trio.Nursery, n: int) -> None:
        rng = self.rng
        sid = rng.choice(IDS)
        rid = f"r{n}"
        op = rng.choices(
            ["start", "request", "end", "start_end", "cancel", "disconnect", "unload"],
            weights=[6, 6, 3, 1, 2, 2, 0 if self.unloading else 0.3],
        )[0]
        tokens = rng.randint(0, 4)
        leave = None
        if op == "unload":
            self.unloading = True  # one at a time (overlapping ones: test_rel_sequence_races)
            nursery.start_soon(self.unload_and_load)
            return
        if op == "start":
            req = seq(rid, sid, tokens, start=True)
        elif op == "request":
            req = seq(rid, sid, tokens)
        elif op == "end":
            req = seq(rid, sid, tokens, end=True)
        elif op == "start_end":
            req = seq(rid, sid, tokens, start=True, end=True)
        elif op == "cancel":
            req = seq(rid, sid, 0, cancel=True)
        else:
            req = seq(rid, sid, 20)
            leave = rng.randint(0, 3) or None
            if leave is None:  # leave before the first response
                nursery.start_soon(self.disconnect_early, rid, req)
                return
        nursery.start_soon(self.client, rid, req, leave)

    async def disconnect_early(self, rid: str, req: InferenceRequest) -> None:
        with trio.move_on_after(self.rng.choice([0, 0.001, 0.02]) * self.scale):
            await self.client(rid, req, None)
            return
        self.answer(rid, "left")

    settings = hook_settings()


async def check_hooks(schedule: Schedule) -> None:
    await trio.lowlevel.checkpoint()
    for model in schedule.models:
        assert model.doubles == []
        started = len(model.states)
        assert started == len(model.ended) + len(model.live)
        assert sorted(model.cancelled) == sorted(set(model.cancelled))


async def run_schedule(seed: int, *, threaded: bool = False, scale: float = 1.0) -> None:
    """One schedule; ``threaded``: the model steps in a worker thread (real clock, every
    time in the schedule multiplied by ``scale``)."""
    rng = random.Random(seed)
    settings = hook_settings(
        threaded=threaded,
        idle_timeout_ms=int(rng.choice([300, 1000, 0]) * scale),
        max_duration_ms=int(rng.choice([0, 0, 2500]) * scale),
        max_sequences=rng.choice([2, 3, 4]),
        evict_idle=rng.random() < 0.6,
        max_queue=rng.choice([1, 2, 4]),
        reply_buffer=rng.choice([1, 2]),
        max_batch_size=rng.choice([1, 2, 4]),
    )
    async with actorserve.open_engine([settings]) as engine:
        schedule = Schedule(engine, rng, scale)
        schedule.settings = settings
        async with trio.open_nursery() as nursery:
            for n in range(STEPS):
                for _ in range(rng.choice([1, 1, 2, 3])):
                    schedule.step(nursery, n * 10 + _)
                await trio.sleep(rng.choice([0, 0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.6]) * scale)
                await check_hooks(schedule)
        # every client answered exactly once, with an answer that says why
        for rid, answers in schedule.answers.items():
            assert len(answers) == 1, (rid, answers)
            assert ANSWERS.fullmatch(answers[0]), (rid, answers[0])
        await check_invariants(engine)
        for model in schedule.models[:-1]:  # unloaded: every sequence ended (shutdown at the latest)
            assert model.live == set()
        # it keeps serving: cancel what is left open, then a fresh sequence start to end
        for sid in IDS:
            try:
                await engine.infer(seq("bye", sid, cancel=True), model="rec")
            except actorserve.SequenceNotFound:
                pass
        await check_invariants(engine)
        assert schedule.models[-1].live == set()
        reply = await engine.infer(seq("final", "zz", 2, start=True, end=True), model="rec")
        assert reply.outputs[1].data.tolist() == [1, 2]
        await check_invariants(engine)


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_random_schedule(autojump_clock: trio.testing.MockClock, seed: int) -> None:
    await run_schedule(seed)


THREADED_SEEDS = int(os.environ.get("ACTORSERVE_SCHEDULE_THREADED_SEEDS", "3"))


@pytest.mark.parametrize("seed", range(THREADED_SEEDS))
async def test_random_schedule_threaded(seed: int) -> None:
    """The same schedules with the model stepping in its worker thread (the step loop's
    own cancel and report paths), on the real clock with every time scaled by 0.05."""
    await run_schedule(1000 + seed, threaded=True, scale=0.05)
