"""Sequence races at the actors (issue 14): two events at the same instant, in each order.

Idle expiry vs a queued request, cancel vs end, expiry vs a new request, eviction under
``max_sequences`` and unload during streams. Each test places the racing events
explicitly (no checkpoint between them, or a callback at the exact moment a request
finishes) and checks, after the race: every hook ran exactly once, no batch slot is held
or released twice, every caller got a final answer naming the sequence and why, and the
model keeps serving. Time is trio's MockClock (autojump).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from support.models import request
from support.rel_sequences import (
    check_invariants,
    hook_model,
    hook_settings,
    outcome,
    queue,
    seq,
    supervisor,
)

import actorserve
from actorserve import SequenceConflict, SequenceNotFound
from actorserve.actors.inflight import Inflight

# -- idle expiry vs a queued request -----------------------------------------------------


@pytest.mark.parametrize("order", ["request_first", "expiry_first"])
async def test_idle_expiry_vs_queued_request(autojump_clock: trio.testing.MockClock, order: str) -> None:
    """A request queued at the instant the idle deadline passes keeps the sequence
    alive if it was queued before the reaper looked; otherwise it hears 'expired'."""
    async with actorserve.open_engine([hook_settings(idle_timeout_ms=1000)]) as engine:
        await engine.infer(seq("open", "s", start=True))
        await trio.sleep(0.5)
        sup = supervisor(engine)
        autojump_clock.jump(0.5)  # exactly at the idle deadline; nobody has run yet
        if order == "request_first":
            item = await queue(engine, seq("late", "s"))
            sup.expire_due(trio.current_time())  # the reaper's look, right after it
            assert await outcome(item) == "ok:1"
            await check_invariants(engine)
            assert hook_model(engine).ended == []
            last = await engine.infer(seq("end", "s", end=True))
            assert last.outputs[1].data.tolist() == [3]
        else:
            sup.expire_due(trio.current_time())
            with pytest.raises(SequenceNotFound, match="'s' expired"):
                await queue(engine, seq("late", "s"))
        await check_invariants(engine)
        assert hook_model(engine).ended == [("s", "ended" if order == "request_first" else "expired")]


# -- cancel vs end -------------------------------------------------------------------


@pytest.mark.parametrize("when", ["queued", "running", "finishing", "after"])
async def test_cancel_vs_end(autojump_clock: trio.testing.MockClock, when: str) -> None:
    """``sequence_cancel`` racing the request that ends the sequence: before it runs,
    while it runs, at the instant its last output is handed out, and after. Whichever
    wins, the hook runs once with that reason and both callers get a final answer."""
    async with actorserve.open_engine([hook_settings(reply_buffer=2)]) as engine:
        model = hook_model(engine)
        await engine.infer(seq("open", "s", 0, start=True))
        sup = supervisor(engine)
        cancel_answer: list[str] = []

        def cancel_now() -> None:
            try:
                cancel_answer.append(f"cancelled {sup.cancel('s')}")
            except SequenceNotFound as exc:
                cancel_answer.append(str(exc))

        if when == "queued":
            running = await queue(engine, seq("busy", "s", 3))
            end = await queue(engine, seq("end", "s", 2, end=True))
            cancel_now()
            assert await outcome(end) == "SequenceNotFound: sequence 's' was cancelled"
            assert (await outcome(running)).endswith("sequence 's' was cancelled")
            expected = ["cancelled s"], [("s", "cancelled")]
        elif when == "running":
            end = await queue(engine, seq("end", "s", 100, end=True))
            await end.next_reply()
            cancel_now()
            assert (await outcome(end)).endswith("SequenceNotFound: sequence 's' was cancelled")
            assert model.cancelled == ["end"]
            expected = ["cancelled s"], [("s", "cancelled")]
        elif when == "finishing":
            end = await queue(engine, seq("end", "s", 2, end=True))
            end.on_finish = cancel_now  # called the moment its last output is handed out
            assert await outcome(end) == "ok:2"
            expected = ["sequence 's' has ended"], [("s", "ended")]
        else:
            assert await outcome(await queue(engine, seq("end", "s", 2, end=True))) == "ok:2"
            await trio.testing.wait_all_tasks_blocked()
            cancel_now()
            expected = ["sequence 's' has ended"], [("s", "ended")]
        await check_invariants(engine)
        assert (cancel_answer, model.ended) == expected
        assert (await engine.infer(seq("next", "t", start=True, end=True))).outputs[1].data.tolist() == [1]


# -- expiry vs a new request -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["continue", "cancel", "restart"])
async def test_idle_expiry_vs_new_request(autojump_clock: trio.testing.MockClock, kind: str) -> None:
    """Right after the reaper expired a sequence (its actor has not finished yet), a
    request of that id hears 'expired', and a new ``sequence_start`` of that id opens a
    fresh sequence (not 'already open')."""
    async with actorserve.open_engine([hook_settings(idle_timeout_ms=1000)]) as engine:
        model = hook_model(engine)
        await engine.infer(seq("open", "s", start=True))
        autojump_clock.jump(1.0)
        supervisor(engine).expire_due(trio.current_time())
        if kind == "continue":
            with pytest.raises(SequenceNotFound, match="sequence 's' expired"):
                await queue(engine, seq("next", "s"))
        elif kind == "cancel":  # not "cancelled": it expired, and its hook says so
            with pytest.raises(SequenceNotFound, match="sequence 's' expired"):
                supervisor(engine).cancel("s")
        else:
            item = await queue(engine, seq("again", "s", start=True))
            assert await outcome(item) == "ok:1"
            answer = await engine.infer(seq("end", "s", end=True))
            assert answer.outputs[1].data.tolist() == [2]  # the new state, not the old
        await check_invariants(engine)
        assert model.ended == [("s", "expired")] + ([("s", "ended")] if kind == "restart" else [])


async def test_total_time_expiry_vs_running_request_and_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``max_duration_ms`` passes while a request streams: the request gets 'expired',
    leaves the batch (one on_request_cancelled), and a start of the same id while the
    old actor still waits for that is a new sequence."""
    settings = hook_settings(idle_timeout_ms=0, max_duration_ms=1000, reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine:
        model = hook_model(engine)
        await engine.infer(seq("open", "s", 0, start=True))
        long = await queue(engine, seq("long", "s", 10_000))
        await long.next_reply()  # running, then paused (its reader is slow)
        autojump_clock.jump(1.0)
        supervisor(engine).expire_due(trio.current_time())  # the total time passed
        again = await queue(engine, seq("again", "s", 1, start=True, end=True))
        assert (await outcome(long)).endswith("sequence 's' expired")
        assert await outcome(again) == "ok:1"
        await check_invariants(engine)
        assert model.ended == [("s", "expired"), ("s", "ended")]
        assert model.cancelled == ["long"]


@pytest.mark.parametrize("how", ["cancel", "evict"])
async def test_request_right_after_cancel_or_eviction_hears_why(
    autojump_clock: trio.testing.MockClock, how: str
) -> None:
    """Between a cancel (or an eviction) and the moment its actor has finished (its
    running request still leaving the batch), a request for that id is told the
    sequence was cancelled (evicted), not 'is not open (unknown id)' (found through
    --api-workers 2, where the frames make that window wide)."""
    settings = hook_settings(reply_buffer=1, max_sequences=1, evict_idle=True)
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("open", "s", 0, start=True))
        running = None
        if how == "cancel":
            running = await queue(engine, seq("long", "s", 1000))
            await running.next_reply()
            supervisor(engine).cancel("s")
            why = "was cancelled"
        else:
            await queue(engine, seq("t", "t", 1, start=True))  # evicts idle 's' (max_sequences=1)
            why = "was evicted"
        with pytest.raises(SequenceNotFound, match=f"sequence 's' {why}"):
            await queue(engine, seq("late", "s"))
        if running is not None:
            assert (await outcome(running)).endswith("sequence 's' was cancelled")
        await check_invariants(engine)
        assert hook_model(engine).ended[0] == ("s", "cancelled" if how == "cancel" else "evicted")


# -- eviction under max_sequences --------------------------------------------------------


async def test_eviction_skips_a_sequence_with_a_queued_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The least recently used sequence gets a request at the instant a new start needs
    room: the next idle one is evicted instead, and the queued request runs."""
    settings = hook_settings(max_sequences=2, evict_idle=True)
    async with actorserve.open_engine([settings]) as engine:
        model = hook_model(engine)
        await engine.infer(seq("a", "a", start=True))
        await engine.infer(seq("b", "b", start=True))
        queued = await queue(engine, seq("a2", "a"))
        await queue(engine, seq("c", "c", start=True))  # needs room now
        assert await outcome(queued) == "ok:1"
        with pytest.raises(SequenceNotFound, match="'b' was evicted"):
            await engine.infer(seq("b2", "b"))
        await check_invariants(engine)
        assert model.ended == [("b", "evicted")]


async def test_a_sequence_whose_last_request_just_finished_is_evictable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At the instant a sequence's request finishes (its caller has the answer, its actor
    has not woken up yet) the sequence counts as idle, so a start that needs room evicts
    it instead of being refused with 429 (it was refused when the start came first)."""
    async with actorserve.open_engine([hook_settings(max_sequences=1, evict_idle=True)]) as engine:
        sup = supervisor(engine)
        await engine.infer(seq("open", "s", 0, start=True))
        item = await queue(engine, seq("last", "s", 1))
        idle_at_finish: list[bool] = []
        item.on_finish = lambda: idle_at_finish.append(sup.actor("s").idle)  # type: ignore[union-attr]
        assert await outcome(item) == "ok:1"
        assert idle_at_finish == [True]
        started = await queue(engine, seq("t", "t", 1, start=True))
        assert await outcome(started) == "ok:1"
        await check_invariants(engine)
        assert hook_model(engine).ended == [("s", "evicted")]


async def test_eviction_vs_expiry_and_busy(autojump_clock: trio.testing.MockClock) -> None:
    """An expired sequence whose actor has not finished is the one evicted (its hook
    still says 'expired', once); with every sequence busy a start is refused (429)."""
    settings = hook_settings(max_sequences=2, evict_idle=True, idle_timeout_ms=1000, reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine:
        model = hook_model(engine)
        await engine.infer(seq("a", "a", start=True))
        await trio.sleep(0.5)
        await engine.infer(seq("b", "b", start=True))
        autojump_clock.jump(0.5)
        supervisor(engine).expire_due(trio.current_time())  # 'a' is stopped, not gone
        c = await queue(engine, seq("c", "c", 1000, start=True))
        b = await queue(engine, seq("b2", "b", 1000))
        await c.next_reply()
        await b.next_reply()
        with pytest.raises(actorserve.Overloaded, match="max_sequences"):
            await queue(engine, seq("d", "d", start=True))
        c.cancel()
        b.cancel()
        await check_invariants(engine)
        assert model.ended == [("a", "expired")]
        assert sorted(model.cancelled) == ["b2", "c"]


# -- unload during streams -------------------------------------------------------------


@pytest.mark.parametrize("grace", [0.0, 5.0])
async def test_unload_during_streams(autojump_clock: trio.testing.MockClock, grace: float) -> None:
    """Unloading a model while sequences stream (and one waits queued): every caller
    gets a final answer (the ones that finish within the grace period a result, the
    rest an error naming the sequence), each sequence's hook runs once ('shutdown'),
    and the model loads and serves again."""
    settings = hook_settings(reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine:
        model = hook_model(engine)
        items = []
        for sid in ("x", "y", "z"):
            await engine.infer(seq("open", sid, 0, start=True))
            items.append(await queue(engine, seq(f"{sid}-stream", sid, 3 if sid == "x" else 10_000)))
        items.append(await queue(engine, seq("y-queued", "y", 1)))
        for item in items[:3]:
            await item.next_reply()
        answers: list[str] = []
        async with trio.open_nursery() as nursery:

            async def read(item: object) -> None:
                answers.append(await outcome(item))  # type: ignore[arg-type]

            for item in items:
                nursery.start_soon(read, item)
            await engine.unload("rec", grace=grace)
        if grace:
            assert answers.count("ok:2") == 1  # x finished within the grace period
        errors = [a for a in answers if not a.startswith("ok")]
        assert len(errors) == len(answers) - answers.count("ok:2") >= 3
        for answer in errors:
            assert "was shut down" in answer or "unloaded" in answer, answer
            assert "'y'" in answer or "'z'" in answer or "'x'" in answer, answer
        assert sorted(model.ended) == [("x", "shutdown"), ("y", "shutdown"), ("z", "shutdown")]
        assert model.doubles == []
        await engine.load(settings)
        await check_invariants(engine)  # the new replica: nothing open, nothing held
        reply = await engine.infer(seq("new", "x", 2, start=True, end=True))
        assert reply.outputs[1].data.tolist() == [1, 2]


async def test_unload_racing_unload_and_reload_keeps_the_new_model(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two unloads of the same model overlap (one waits for a stream to drain), and the
    model is loaded again before the slower one resumes: the slower one must not take
    the new version away (it did: 'model not loaded' with the new host still running)."""
    settings = hook_settings(reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine, trio.open_nursery() as nursery:
        await engine.infer(seq("open", "s", 0, start=True))
        async with engine.infer_stream(seq("held", "s", 1000)) as stream:  # in flight
            await stream.__anext__()
            slow_done = trio.Event()

            async def slow_unload() -> None:
                await engine.unload("rec", grace=100)
                slow_done.set()

            nursery.start_soon(slow_unload)
            await trio.testing.wait_all_tasks_blocked()
            await engine.unload("rec", grace=0)
            await engine.load(settings)
            with pytest.raises(SequenceNotFound, match="'s' was shut down"):
                async for _ in stream:
                    pass
        await slow_done.wait()  # the held request left: the slow unload resumed
        await check_invariants(engine)
        reply = await engine.infer(seq("after", "t", 2, start=True, end=True))
        assert reply.outputs[1].data.tolist() == [1, 2]
        assert [m.name for m in await engine.models()].count("rec") == 1


async def test_unload_of_an_unknown_version_is_not_found(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([hook_settings()]) as engine:
        with pytest.raises(actorserve.ModelNotFound, match="model 'rec' has no version '7'"):
            await engine.unload("rec", "7")
        assert (await engine.infer(seq("r", "s", start=True, end=True))).outputs[1].data.tolist() == [1]


async def test_sequence_start_vs_unload_is_refused_clearly(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([hook_settings()]) as engine:
        await engine.unload("rec", grace=0)
        with pytest.raises(actorserve.ModelNotFound):
            await engine.infer(seq("r", "s", start=True), model="rec")


async def test_start_with_the_id_of_a_cancelled_sequence(autojump_clock: trio.testing.MockClock) -> None:
    """Cancel then start the same id at once (its old actor still leaving the batch)."""
    async with actorserve.open_engine([hook_settings(reply_buffer=1)]) as engine:
        model = hook_model(engine)
        await engine.infer(seq("open", "s", 0, start=True))
        long = await queue(engine, seq("long", "s", 1000))
        await long.next_reply()
        supervisor(engine).cancel("s")
        fresh = await queue(engine, seq("fresh", "s", 1, start=True))
        assert (await outcome(long)).endswith("sequence 's' was cancelled")
        assert await outcome(fresh) == "ok:1"
        with pytest.raises(SequenceConflict):
            await queue(engine, seq("dup", "s", 1, start=True))
        await check_invariants(engine)
        assert model.ended == [("s", "cancelled")]


async def test_a_start_that_streams_nothing_still_returns_the_server_made_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A unary request whose step produced no response (n_tokens=0) starting a sequence
    without an id: the answer carries the id the server made (it had none, so the
    client could not continue, end or cancel the sequence; found by the soak run)."""
    async with actorserve.open_engine([hook_settings()]) as engine:
        reply = await engine.infer(request("r", 0, sequence_start=True))
        sid = reply.parameters["sequence_id"]
        assert isinstance(sid, str) and sid
        assert reply.id == "r"
        last = await engine.infer(seq("end", sid, 1, end=True))
        assert last.outputs[1].data.tolist() == [1]
        await check_invariants(engine)


def test_a_second_leave_is_logged_and_never_makes_a_count_negative(caplog: pytest.LogCaptureFixture) -> None:
    """The in-flight count (drain and wait_idle wait on it) cannot go below zero: a
    leave without its enter is logged as the bug it is, and changes nothing."""
    parent = Inflight()
    child = Inflight(parent)
    child.enter()
    child.leave()
    child.leave()
    assert (child.count, parent.count) == (0, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "a request left an in-flight count twice (count stays 0)"
    ]
