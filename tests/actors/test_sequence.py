"""Sequence actors and the supervisor, driven by trio's MockClock (autojump)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from support.models import RecordingModel, recording_settings, request

import actorserve
from actorserve import (
    Overloaded,
    SequenceConflict,
    SequenceNotFound,
    SequenceSettings,
)
from actorserve.api import EndReason


def seq(request_id: str, sid: Any, n_tokens: int = 1, **flags: Any) -> actorserve.InferenceRequest:
    control = {"start", "end", "cancel"}
    params = {(f"sequence_{k}" if k in control else k): v for k, v in flags.items()}
    return request(request_id, n_tokens, sequence_id=sid, **params)


def model_of(engine: actorserve.Engine, name: str = "rec") -> RecordingModel:
    model = engine.model(name)
    assert isinstance(model, RecordingModel)
    return model


async def test_requests_of_a_sequence_run_in_order_and_keep_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([recording_settings()]) as engine:
        first = await engine.infer(seq("r1", "s", 3, start=True))
        assert first.outputs[1].data.tolist() == [1, 2, 3]
        assert first.parameters["sequence_id"] == "s"
        last = await engine.infer(seq("r2", "s", 2, end=True))
        assert last.outputs[1].data.tolist() == [4, 5]
        assert model_of(engine).ended == [("s", "ended")]
        with pytest.raises(SequenceNotFound, match="'s' has ended"):
            await engine.infer(seq("r3", "s"))


async def test_second_request_waits_in_mailbox_while_first_streams(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([recording_settings()]) as engine:
        await engine.infer(seq("open", "s", 0, start=True))
        order: list[str] = []
        async with engine.infer_stream(seq("a", "s", 3)) as a:
            first = await a.__anext__()
            order.append(f"a{first.outputs[0].data[0]}")
            async with trio.open_nursery() as nursery:

                async def second() -> None:
                    async with engine.infer_stream(seq("b", "s", 2)) as b:
                        async for r in b:
                            order.append(f"b{r.outputs[0].data[0]}")

                nursery.start_soon(second)
                async for r in a:
                    order.append(f"a{r.outputs[0].data[0]}")
        assert order == ["a0", "a1", "a2", "b0", "b1"]
        # Never two requests of one sequence in the same step.
        for step in model_of(engine).steps:
            assert not {"a", "b"} <= set(step)


async def test_server_made_id(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings()]) as engine:
        response = await engine.infer(request("r", 1, sequence_start=True))
        sid = response.parameters["sequence_id"]
        assert isinstance(sid, str) and sid
        again = await engine.infer(seq("r2", sid, 1, end=True))
        assert again.outputs[1].data.tolist() == [2]


async def test_unknown_sequence_and_conflict(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings()]) as engine:
        with pytest.raises(SequenceNotFound, match="unknown sequence 'nope': it is not open"):
            await engine.infer(seq("r", "nope"))
        await engine.infer(seq("r", 7, start=True))
        with pytest.raises(SequenceConflict, match="'7' is already open"):
            await engine.infer(seq("r", 7, start=True))
        # integer and string ids name the same sequence
        response = await engine.infer(seq("r", "7", end=True))
        assert response.outputs[1].data.tolist() == [2]


async def test_idle_expiry(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(sequence=SequenceSettings(idle_timeout_ms=1000))
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("r1", "s", start=True))
        await trio.sleep(0.9)
        await engine.infer(seq("r2", "s"))  # a request resets the idle timer
        await trio.sleep(0.9)
        await engine.infer(seq("r3", "s"))
        await trio.sleep(1.01)
        with pytest.raises(SequenceNotFound, match="'s' expired"):
            await engine.infer(seq("r4", "s"))
        assert model_of(engine).ended == [("s", "expired")]
        assert (await engine.statistics("rec")).open_sequences == 0


async def test_max_duration_expires_a_busy_sequence(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(sequence=SequenceSettings(idle_timeout_ms=0, max_duration_ms=5000))
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("r0", "s", start=True))
        start = trio.current_time()
        sent = 0
        with pytest.raises(SequenceNotFound, match="expired"):
            while True:
                await engine.infer(seq(f"r{sent}", "s"))
                sent += 1
                await trio.sleep(0.5)
        assert 4.5 <= trio.current_time() - start <= 5.5
        assert sent >= 9
        await trio.testing.wait_all_tasks_blocked()
        assert model_of(engine).ended == [("s", "expired")]


async def test_timeouts_off_keep_sequence_open(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(sequence=SequenceSettings(idle_timeout_ms=0, max_duration_ms=0))
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("r", "s", start=True))
        await trio.sleep(10 * 24 * 3600)
        response = await engine.infer(seq("r", "s", end=True))
        assert response.outputs[1].data.tolist() == [2]


async def test_mailbox_overflow_is_overloaded(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(reply_buffer=1, sequence=SequenceSettings(max_queue=1))
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("open", "s", 0, start=True))
        async with engine.infer_stream(seq("running", "s", 100)) as running:
            await running.__anext__()  # running, then paused: nobody reads its replies
            async with trio.open_nursery() as nursery:
                queued_started = trio.Event()

                async def queued() -> None:
                    async with engine.infer_stream(seq("queued", "s", 1)) as q:
                        queued_started.set()
                        assert [r.id async for r in q] == ["queued"]

                nursery.start_soon(queued)
                await queued_started.wait()
                with pytest.raises(Overloaded, match="max_queue"):
                    await engine.infer(seq("third", "s"))
                count = 1 + len([r async for r in running])
                assert count == 100


async def test_cancel_mid_stream_ends_sequence(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(reply_buffer=2)
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("open", "s", 0, start=True))
        model = model_of(engine)
        async with engine.infer_stream(seq("long", "s", 1000)) as stream:
            await stream.__anext__()
            cancel_response = await engine.infer(seq("cancel", "s", cancel=True))
            assert cancel_response.parameters == {"sequence_id": "s", "sequence_cancelled": True}
            steps_at_cancel = len(model.steps)
            with pytest.raises(SequenceNotFound, match="was cancelled"):
                async for _ in stream:
                    pass
        assert all("long" not in step for step in model.steps[steps_at_cancel + 1 :])
        await trio.testing.wait_all_tasks_blocked()
        assert model.ended == [("s", "cancelled")]
        with pytest.raises(SequenceNotFound, match="was cancelled"):
            await engine.infer(seq("late", "s"))


async def test_caller_going_away_cancels_request_not_sequence(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings(reply_buffer=1)]) as engine:
        await engine.infer(seq("open", "s", 1, start=True))
        model = model_of(engine)
        with trio.move_on_after(1):
            async with engine.infer_stream(seq("gone", "s", 1000)) as stream:
                await stream.__anext__()
                await trio.sleep_forever()
        # the batcher drops it at the next step and tells the model
        await trio.testing.wait_all_tasks_blocked()
        stats = await engine.statistics("rec")
        assert (stats.waiting, stats.running) == (0, 0)
        assert model.cancelled == ["gone"]
        assert model.ended == []
        response = await engine.infer(seq("again", "s", 1, end=True))
        # the sequence kept its state: 1 + the tokens "gone" produced before it left
        assert response.outputs[1].data[0] > 2
        assert model.ended == [("s", "ended")]


async def test_max_sequences_refuses_or_evicts(autojump_clock: trio.testing.MockClock) -> None:
    refuse = recording_settings("refuse", sequence=SequenceSettings(max_sequences=2))
    evict = recording_settings("evict", sequence=SequenceSettings(max_sequences=2, evict_idle=True))
    async with actorserve.open_engine([refuse, evict]) as engine:
        for name in ("refuse", "evict"):
            await engine.infer(seq("a", "a", start=True), model=name)
            await trio.sleep(1)
            await engine.infer(seq("b", "b", start=True), model=name)
            await trio.sleep(1)
            await engine.infer(seq("a2", "a"), model=name)  # "b" is now least recently used
        with pytest.raises(Overloaded, match="max_sequences"):
            await engine.infer(seq("c", "c", start=True), model="refuse")
        await engine.infer(seq("c", "c", start=True), model="evict")
        with pytest.raises(SequenceNotFound, match="'b' was evicted"):
            await engine.infer(seq("b2", "b"), model="evict")
        assert model_of(engine, "evict").ended == [("b", "evicted")]


async def test_hook_failure_fails_that_sequence_only(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings()]) as engine:
        await engine.infer(seq("a", "a", start=True))
        await engine.infer(seq("b", "b", start=True))
        with pytest.raises(actorserve.ModelFailed, match="begin exploded"):
            await engine.infer(seq("boom", "a", begin_error=True))
        with pytest.raises(SequenceNotFound, match="'a' failed"):
            await engine.infer(seq("a2", "a"))
        response = await engine.infer(seq("b2", "b", end=True))
        assert response.outputs[1].data.tolist() == [2]
        assert model_of(engine).ended == [("a", "failed"), ("b", "ended")]


async def test_shutdown_ends_every_sequence_and_leaves_no_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tasks_before = trio.lowlevel.current_statistics().tasks_living
    ended: list[tuple[str, str]] = []
    async with actorserve.open_engine([recording_settings(reply_buffer=1)]) as engine:
        model = model_of(engine)
        ended = model.ended
        for sid in ("x", "y", "z"):
            await engine.infer(seq("r", sid, start=True))
        async with trio.open_nursery() as nursery:

            async def stuck() -> None:
                with pytest.raises(actorserve.ActorServeError):
                    async with engine.infer_stream(seq("busy", "x", 1000)) as s:
                        await s.__anext__()
                        await engine.aclose(grace=0)
                        async for _ in s:
                            pass

            nursery.start_soon(stuck)
    assert sorted(ended) == [("x", "shutdown"), ("y", "shutdown"), ("z", "shutdown")]
    assert trio.lowlevel.current_statistics().tasks_living == tasks_before


async def test_every_exit_path_calls_on_sequence_end_exactly_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = recording_settings(
        sequence=SequenceSettings(idle_timeout_ms=1000, max_sequences=3, evict_idle=True)
    )
    async with actorserve.open_engine([settings]) as engine:
        model = model_of(engine)
        await engine.infer(seq("r", "ended", start=True, end=True))
        await engine.infer(seq("r", "cancelled", start=True))
        await engine.infer(seq("r", "cancelled", cancel=True))
        await engine.infer(seq("r", "expired", start=True))
        await trio.sleep(2)
        await engine.infer(seq("r", "failed", start=True))
        with pytest.raises(actorserve.ModelFailed):
            await engine.infer(seq("r", "failed", begin_error=True))
        for sid in ("e1", "e2", "e3", "e4"):
            await engine.infer(seq("r", sid, start=True))
            await trio.sleep(0.1)
        await engine.infer(seq("r", "shutdown", start=True))
    reasons = dict(model.ended)
    assert len(reasons) == len(model.ended)  # exactly once per sequence
    assert reasons["ended"] == "ended"
    assert reasons["cancelled"] == "cancelled"
    assert reasons["expired"] == "expired"
    assert reasons["failed"] == "failed"
    assert reasons["e1"] == "evicted" and reasons["e2"] == "evicted"
    assert reasons["shutdown"] == "shutdown"
    assert sorted(model.states) == sorted(reasons)
    assert all(type(reason) is EndReason for reason in reasons.values())  # a StrEnum
