"""Flow across the engine link: cancel and disconnect reach the engine's batch, a slow
front bounds what the engine buffers, frames carry everything waiting, and a lost
engine fails calls clearly."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing
from link_support import engine_and_path, link_models, prompt, served, socket_path
from support.models import GateModel, RecordingModel, request

import actorserve
from actorserve import ShuttingDown
from actorserve.ipc import LinkLimits, open_engine_client


def rec_steps_with(model: RecordingModel, rid: str) -> int:
    return sum(rid in step for step in model.steps)


async def test_leaving_a_stream_early_takes_the_request_out_of_the_batch() -> None:
    async with engine_and_path() as (engine, path), open_engine_client(path) as client:
        model = engine.model("rec")
        assert isinstance(model, RecordingModel)
        async with client.infer_stream(request("long", 10_000), model="rec") as responses:
            await responses.next_batch()
        await engine.wait_idle()
        stats = await engine.statistics("rec")
        assert (stats.inflight, stats.running, stats.waiting) == (0, 0, 0)
        assert model.cancelled == ["long"]
        assert rec_steps_with(model, "long") < 200  # stopped at the window, far from 10000
        # the same through the client's own view
        assert (await client.statistics("rec")).inflight == 0


async def test_cancel_leaves_within_one_step(autojump_clock: trio.testing.MockClock) -> None:
    """While a front holds a stream open the engine keeps stepping it; once the front
    leaves, the request is in no step after the cancel arrives."""
    limits = LinkLimits(window=2)
    async with (
        engine_and_path(limits=limits, reply_buffer=2) as (engine, path),
        open_engine_client(path, limits=limits) as client,
    ):
        model = engine.model("rec")
        assert isinstance(model, RecordingModel)
        async with client.infer_stream(request("held", 1000), model="rec") as responses:
            await responses.next_batch()
            await trio.testing.wait_all_tasks_blocked()
            steps_while_held = rec_steps_with(model, "held")
        await trio.testing.wait_all_tasks_blocked()  # the cancel crossed and was served
        assert model.cancelled == ["held"]
        assert rec_steps_with(model, "held") <= steps_while_held + 1
        assert (await engine.statistics("rec")).inflight == 0


async def test_a_slow_front_bounds_what_the_engine_buffers(autojump_clock: trio.testing.MockClock) -> None:
    limits = LinkLimits(window=4)
    async with (
        engine_and_path(limits=limits, reply_buffer=3) as (engine, path),
        open_engine_client(path, limits=limits) as client,
    ):
        model = engine.model("rec")
        assert isinstance(model, RecordingModel)
        async with client.infer_stream(request("slow", 500), model="rec") as responses:
            taken = len(await responses.next_batch())
            await trio.sleep(5)  # a front that does not read: nothing grows without bound
            stepped = rec_steps_with(model, "slow")
            # the window, the item's reply buffer and what one pull drained: far from 500
            assert stepped <= taken + 40
            stats = await engine.statistics("rec")
            assert (stats.running, stats.inflight) == (1, 1)
            await trio.sleep(5)
            assert rec_steps_with(model, "slow") == stepped
            # reading on: everything arrives, exactly once and in order
            indexes = [int(r.output("index").data[0]) for r in await responses.next_batch()]
            async for r in responses:
                indexes.append(int(r.output("index").data[0]))
        assert indexes == list(range(taken, 500))


async def test_one_frame_carries_every_response_waiting(autojump_clock: trio.testing.MockClock) -> None:
    """A front that reads slowly: its window (2) is used up, the engine stops pulling,
    the request's replies pile up in the engine (the model's reply_buffer, 64); one
    acknowledgement brings all of them in one frame, and one next_batch returns them.
    (One pull may also overshoot the window by everything it found waiting.)"""
    limits = LinkLimits(window=2)
    async with engine_and_path(limits=limits) as (_, path), open_engine_client(path, limits=limits) as client:
        before = client.link_statistics().frames_received
        batches: list[int] = []
        async with client.infer_stream(request("r", 200), model="rec") as responses:
            while True:
                await trio.testing.wait_all_tasks_blocked()  # a slow reader: all waiting arrives
                frames = client.link_statistics().frames_received
                try:
                    batches.append(len(await responses.next_batch()))
                except StopAsyncIteration:
                    break
                await trio.testing.wait_all_tasks_blocked()
                # everything the acknowledgement released came in (at most) one frame
                assert client.link_statistics().frames_received - frames <= 1
        assert sum(batches) == 200 and max(batches) >= 64, batches
        assert client.link_statistics().frames_received - before <= 8, batches


async def test_many_streams_share_frames_and_messages() -> None:
    """Eight streams stepped together: each step's outputs reach the front together, in
    one frame and (their entries joined) one StreamOutputs message."""
    async with engine_and_path(max_batch_size=8) as (engine, path), open_engine_client(path) as client:
        model = engine.model("rec")
        assert isinstance(model, RecordingModel)
        before = client.link_statistics().frames_received
        messages_before = client.link_statistics().messages_received
        counts: list[int] = []

        async def run(i: int) -> None:
            async with client.infer_stream(request(f"s{i}", 30), model="rec") as responses:
                counts.append(sum([len(batch) async for batch in _batches(responses)]))

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(run, i)
        frames = client.link_statistics().frames_received - before
        messages = client.link_statistics().messages_received - messages_before - 16  # Opened, End
        assert counts == [30] * 8
        assert frames < 8 * 30 / 4, frames  # without gathering: one per response (240)
        # one per stream per step would be 240; a stream's Opened or End queued between two
        # outputs splits a StreamOutputs message, so a frame may hold two (not a bound of 1)
        assert messages < 8 * 30 / 4, (messages, frames)


async def _batches(responses):  # type: ignore[no-untyped-def]
    while True:
        try:
            yield await responses.next_batch()
        except StopAsyncIteration:
            return


async def test_unary_cancel_and_front_disconnect_cancel_in_the_engine() -> None:
    async with engine_and_path() as (engine, path):
        gate = engine.model("gate")
        assert isinstance(gate, GateModel)
        async with open_engine_client(path) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(client.infer, prompt("u", gate="g", n_tokens=3), model="gate")
                )
                await gate.started["u"].wait()
                nursery.cancel_scope.cancel()
            await gate.left["u"].wait()
            assert gate.outcome["u"] == "cancelled"
            assert client.link_statistics().open_calls == 0
        # a front that goes away with a stream open
        async with open_engine_client(path) as client:
            stream = client.infer_stream(prompt("d", gate="g", n_tokens=3), model="gate")
            responses = await stream.__aenter__()
            await responses.next_batch()
        await gate.left["d"].wait()  # the connection closed under the open stream
        assert gate.outcome["d"] == "cancelled"
        await engine.wait_idle()


async def test_the_engine_going_away_fails_open_and_later_calls() -> None:
    with socket_path() as path:
        async with actorserve.open_engine(link_models()) as engine:
            async with served(engine, path) as link, open_engine_client(path) as client:
                async with client.infer_stream(prompt("x", gate="g", n_tokens=5), model="gate") as responses:
                    assert len(await responses.next_batch()) == 1
                    link.cancel()  # the engine side closes every connection
                    with pytest.raises(ShuttingDown, match="the engine closed the connection"):
                        await responses.next_batch()
                await client.wait_closed()
                assert client.closed
                with pytest.raises(ShuttingDown, match="not reachable"):
                    await client.ready()
                with pytest.raises(ShuttingDown):
                    async with client.infer_stream(prompt("y"), model="streamer"):
                        pass
            await engine.wait_idle()  # the engine cancelled the stream it served


async def test_nothing_listening() -> None:
    with socket_path() as path, pytest.raises(OSError):
        async with open_engine_client(path):
            pass
