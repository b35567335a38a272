"""A plain model's stream, run by its own task into a bounded buffer (actors/pumped.py):
responses made without a wait between them are read as one batch, a paced or slow step is
never held back, the reader's pace is backpressure and not a step timeout, and errors
come after the responses before them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import numpy as np
import pytest
import trio
import trio.testing

import actorserve
from actorserve import InferenceRequest, InferenceResponse, Model, ModelFailed, ModelSettings
from actorserve.actors.plain import DEADLINE_SLACK
from actorserve.actors.pumped import GATHER, ROUND, Pumped
from actorserve.api import ResponseIterator
from actorserve.codecs import tensor_from_numpy


class Scripted(Model):
    """Streams ``n`` responses (``index`` = k); before response k it waits ``waits[k]``
    seconds (a sleep), or computes inline for ``inline[k]`` seconds (the clock jumps with
    no checkpoint); ``hang_at`` sleeps forever there, ``fail_at`` raises there. Counts what
    it made and whether it was closed."""

    made: ClassVar[list[int]] = []
    closed: ClassVar[list[bool]] = []

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            p = request.parameters
            n = int(p.get("n", 5))
            waits = dict(p.get("waits", {}))
            inline = dict(p.get("inline", {}))
            try:
                for k in range(n):
                    if str(k) in waits:
                        await trio.sleep(waits[str(k)])
                    if str(k) in inline:
                        trio.lowlevel.current_clock().jump(inline[str(k)])  # type: ignore[attr-defined]
                    if p.get("hang_at") == k:
                        await trio.sleep_forever()
                    if p.get("fail_at") == k:
                        raise RuntimeError(f"broke at {k}")
                    Scripted.made.append(k)
                    yield self.response(request, [tensor_from_numpy("index", np.array([k], dtype=np.int64))])
            finally:
                Scripted.closed.append(True)


def settings(**changes: object) -> ModelSettings:
    return ModelSettings(name="scripted", implementation=Scripted, **changes)  # type: ignore[arg-type]


def ask(**parameters: object) -> InferenceRequest:
    return InferenceRequest([], id="r", parameters=dict(parameters))


def indexes(batch: list[InferenceResponse]) -> list[int]:
    return [int(r.outputs[0].data[0]) for r in batch]


async def until_error(responses: ResponseIterator, error: type[Exception], match: str) -> list[int]:
    """The indexes read before ``responses`` raised ``error`` (matching ``match``)."""
    got: list[int] = []
    with pytest.raises(error, match=match):
        for _ in range(100):
            got += indexes(await responses.next_batch())
    return got


@pytest.fixture(autouse=True)
def _reset() -> None:
    Scripted.made.clear()
    Scripted.closed.clear()


async def test_responses_made_without_a_wait_are_read_as_one_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([settings()]) as engine:
        async with engine.infer_stream(ask(n=5), model="scripted") as responses:
            first, rest = await responses.next_batch(), await responses.next_batch()
            assert indexes(first) == [0]  # the first at once (time to first token)
            assert indexes(rest) == [1, 2, 3, 4]  # the others together
            assert {r.id for r in first + rest} == {"r"}
            with pytest.raises(StopAsyncIteration):
                await responses.next_batch()


async def test_a_paced_step_is_never_held_back(autojump_clock: trio.testing.MockClock) -> None:
    waits = {str(k): 0.01 for k in range(1, 4)}
    async with actorserve.open_engine([settings()]) as engine:
        async with engine.infer_stream(ask(n=4, waits=waits), model="scripted") as responses:
            start = trio.current_time()
            seen = []
            async for response in responses:
                seen.append((indexes([response])[0], round(trio.current_time() - start, 6)))
    # each response is read the moment it is made, not with the next one
    assert seen == [(0, 0.0), (1, 0.01), (2, 0.02), (3, 0.03)]


async def test_a_slow_inline_step_holds_back_the_response_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A model computing inline (no wait) for longer than GATHER per response: the
    response before a slow inline step leaves with the next one, as everything on the
    event loop waits for such a step; the first leaves at once."""
    inline = {str(k): GATHER * 4 for k in range(1, 3)}
    async with actorserve.open_engine([settings()]) as engine:
        async with engine.infer_stream(ask(n=3, inline=inline), model="scripted") as responses:
            batches = [indexes(await responses.next_batch()) for _ in range(2)]
    assert batches == [[0], [1, 2]]


async def test_a_waiting_step_is_not_delayed_by_the_reader(autojump_clock: trio.testing.MockClock) -> None:
    """Each response of a paced model is read as it is made, and the model's next wait
    starts at once: 10 responses 10 ms apart take 100 ms, whatever the reader does
    between them (here: nothing but read)."""
    waits = {str(k): 0.01 for k in range(10)}
    async with actorserve.open_engine([settings()]) as engine:
        start = trio.current_time()
        async with engine.infer_stream(ask(n=10, waits=waits), model="scripted") as responses:
            got = [(i, round(trio.current_time() - start, 6)) async for i in _indexes(responses)]
    assert got == [(k, round(0.01 * (k + 1), 6)) for k in range(10)]


async def test_a_slow_reader_is_backpressure_not_a_step_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([settings(reply_buffer=4, step_timeout=1.0)]) as engine:
        async with engine.infer_stream(ask(n=10), model="scripted") as responses:
            await trio.sleep(30)  # the buffer fills; the model waits, for far past its step_timeout
            assert Scripted.made == [0, 1, 2, 3]
            got = []
            for _ in range(20):
                try:
                    got += indexes(await responses.next_batch())
                except StopAsyncIteration:
                    break
                await trio.sleep(5)
    assert got == list(range(10))


async def test_a_step_past_its_timeout_fails_after_the_responses_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([settings(step_timeout=2.0)]) as engine:
        async with engine.infer_stream(ask(n=5, hang_at=2), model="scripted") as responses:
            start = trio.current_time()
            assert await until_error(
                responses, ModelFailed, "no response within its step_timeout of 2 s"
            ) == [0, 1]
            assert 2.0 <= trio.current_time() - start <= 2.0 * (1 + DEADLINE_SLACK)
            with pytest.raises(StopAsyncIteration):
                await responses.next_batch()
    assert Scripted.closed == [True]


async def test_a_model_error_comes_after_the_responses_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([settings()]) as engine:
        async with engine.infer_stream(ask(n=5, fail_at=3), model="scripted") as responses:
            assert await until_error(responses, ModelFailed, "broke at 3") == [0, 1, 2]
            with pytest.raises(StopAsyncIteration):
                await responses.next_batch()


async def test_leaving_the_stream_closes_the_model(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([settings(reply_buffer=2)]) as engine:
        async with engine.infer_stream(ask(n=100, waits={"5": 1.0}), model="scripted") as responses:
            assert indexes(await responses.next_batch())[0] == 0
        assert Scripted.closed == [True]
        assert len(Scripted.made) < 100
        assert (await engine.statistics("scripted")).running == 0


async def test_an_error_in_the_reader_leaves_as_itself(autojump_clock: trio.testing.MockClock) -> None:
    """The producer's nursery does not wrap what the reader raises in a group."""
    async with actorserve.open_engine([settings()]) as engine:
        with pytest.raises(KeyError):
            async with engine.infer_stream(ask(n=3), model="scripted") as responses:
                await responses.next_batch()
                raise KeyError("the reader's own")
        assert Scripted.closed == [True]


async def test_fast_steps_that_add_up_past_the_timeout_do_not_time_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Steps share a deadline while they are quick, but each step still gets its own
    whole step_timeout: 200 steps of a fifth of GATHER each, that also checkpoint, run
    well past a step_timeout of ten steps."""
    inline = {str(k): GATHER / 5 for k in range(200)}
    waits = {str(k): 0 for k in range(200)}
    async with actorserve.open_engine([settings(step_timeout=GATHER * 2)]) as engine:
        async with engine.infer_stream(ask(n=200, inline=inline, waits=waits), model="scripted") as responses:
            got = [i async for i in _indexes(responses)]
    assert got == list(range(200))


async def _indexes(responses: ResponseIterator) -> AsyncIterator[int]:
    async for response in responses:
        yield int(response.outputs[0].data[0])


async def test_many_inline_streams_share_a_round_so_a_new_stream_s_first_response_is_not_held(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """16 streams computing inline (10 us a response, never waiting) each hold the loop
    for their gather before the reader's turn; shared out (ROUND among the streams) a
    scheduler round stays near ROUND, and a stream that starts among them has its first
    response within a few rounds (virtual time: MockClock), not after 16 x GATHER."""
    busy = {str(k): 0.00001 for k in range(5000)}
    first_after: list[float] = []
    async with actorserve.open_engine([settings(max_pending=64)]) as engine:

        async def drain() -> None:
            async with engine.infer_stream(ask(n=5000, inline=busy), model="scripted") as responses:
                async for _ in responses:
                    pass

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(drain)
            await trio.sleep(0.005)  # every stream is producing
            assert Pumped.active == 16
            start = trio.current_time()
            async with engine.infer_stream(ask(n=1, inline={"0": 0.00001}), model="scripted") as responses:
                await responses.next_batch()
                first_after.append(trio.current_time() - start)
            nursery.cancel_scope.cancel()
    assert Pumped.active == 0
    assert first_after[0] <= 3 * ROUND, first_after  # 1.9 ms; 8.3 ms with each stream a whole GATHER
