"""Continuous batching, observed through a model that records every step."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing
from support.models import RecordingModel, ThreadedRecordingModel, recording_settings, request

import actorserve
from actorserve import ModelFailed, Overloaded


def model_of(engine: actorserve.Engine, name: str = "rec", replica: int = 0) -> RecordingModel:
    model = engine.model(name, replica=replica)
    assert isinstance(model, RecordingModel)
    return model


async def test_new_streams_join_at_the_next_step_after_a_slot_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lengths = {f"s{i}": 3 + i for i in range(10)}  # 10 streams of different lengths
    async with actorserve.open_engine([recording_settings(max_batch_size=4)]) as engine:
        model = model_of(engine)
        submitted_at: dict[str, int] = {}
        received: dict[str, list[int]] = {}

        async def client(rid: str) -> None:
            async with engine.infer_stream(request(rid, lengths[rid])) as stream:
                submitted_at[rid] = len(model.steps)
                received[rid] = [int(r.outputs[0].data[0]) async for r in stream]

        async with trio.open_nursery() as nursery:
            for rid in lengths:
                nursery.start_soon(client, rid)

    assert received == {rid: list(range(n)) for rid, n in lengths.items()}
    finished_at = {rid: max(i for i, s in enumerate(model.steps) if rid in s) for rid in lengths}
    for i, step in enumerate(model.steps):
        assert len(step) <= 4
        eligible = [r for r in lengths if submitted_at[r] <= i and finished_at[r] >= i]
        # The batch is full whenever work is waiting: a freed slot is refilled at once.
        assert len(step) == min(4, len(eligible)), (i, step, eligible)
    for rid in lengths:  # once admitted, a stream is in every step until it is done
        appearances = [i for i, s in enumerate(model.steps) if rid in s]
        assert appearances == list(range(appearances[0], appearances[0] + lengths[rid]))


async def test_cancelled_stream_is_absent_from_the_next_step(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings(max_batch_size=4)]) as engine:
        model = model_of(engine)
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(engine.infer, request(f"other{i}", 50))
            async with engine.infer_stream(request("quitter", 1000)) as stream:
                await stream.__anext__()
                await stream.__anext__()
            steps_at_exit = len(model.steps)
        assert all("quitter" not in step for step in model.steps[steps_at_exit:])
        assert len(model.steps) > steps_at_exit  # the others went on stepping
        assert model.cancelled == ["quitter"]
        stats = await engine.statistics("rec")
        assert (stats.waiting, stats.running) == (0, 0)


async def test_slow_reader_sits_out_without_stalling_the_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([recording_settings(max_batch_size=4, reply_buffer=2)]) as engine:
        model = model_of(engine)
        async with engine.infer_stream(request("slow", 20)) as slow:
            await trio.testing.wait_all_tasks_blocked()
            fast = await engine.infer(request("fast", 30))  # runs to the end while "slow" is unread
            assert fast.outputs[0].data.tolist() == list(range(30))
            slow_steps_meanwhile = sum("slow" in s for s in model.steps)
            assert slow_steps_meanwhile <= 3  # filled its buffer of 2, then sat out
            assert [int(r.outputs[0].data[0]) async for r in slow] == list(range(20))


async def test_step_failure_fails_that_step_and_replica_keeps_serving() -> None:
    settings = recording_settings(implementation=ThreadedRecordingModel, max_batch_size=4)
    async with actorserve.open_engine([settings]) as engine:
        with pytest.raises(ModelFailed, match="step exploded"):
            await engine.infer(request("bad", 3, fail_on=True))
        response = await engine.infer(request("good", 3))
        assert response.outputs[0].data.tolist() == [0, 1, 2]


async def test_threaded_steps_batch_many_streams() -> None:
    settings = recording_settings(implementation=ThreadedRecordingModel, max_batch_size=8)
    async with actorserve.open_engine([settings]) as engine:
        results: dict[str, list[int]] = {}

        async def client(rid: str, n: int) -> None:
            async with engine.infer_stream(request(rid, n)) as stream:
                results[rid] = [int(r.outputs[0].data[0]) async for r in stream]

        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(client, f"t{i}", 20 + i)
        assert results == {f"t{i}": list(range(20 + i)) for i in range(16)}
        model = model_of(engine)
        assert max(len(s) for s in model.steps) == 8
        assert len(model.steps) < sum(20 + i for i in range(16)) / 4  # really batched


async def test_caller_scope_cancel_reaches_the_batcher(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings(reply_buffer=1)]) as engine:
        model = model_of(engine)
        with trio.move_on_after(5):
            async with engine.infer_stream(request("unary", 10**9)) as stream:
                await stream.__anext__()
                await trio.sleep_forever()  # paused after one reply: the clock jumps
        await trio.testing.wait_all_tasks_blocked()
        assert model.cancelled == ["unary"]
        stats = await engine.statistics("rec")
        assert (stats.waiting, stats.running, stats.inflight) == (0, 0, 0)


async def test_max_batch_time_gathers_after_idle(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(max_batch_size=4, max_batch_time=0.005)
    async with actorserve.open_engine([settings]) as engine:
        model = model_of(engine)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.infer, request("a", 1))
            await trio.sleep(0.002)
            nursery.start_soon(engine.infer, request("b", 1))
            nursery.start_soon(engine.infer, request("c", 1))
        assert len(model.steps) == 1 and sorted(model.steps[0]) == ["a", "b", "c"]


async def test_pending_limit_is_overloaded(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(max_batch_size=1, max_pending=2, reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine:
        async with engine.infer_stream(request("running", 100)) as _running:
            await trio.testing.wait_all_tasks_blocked()
            async with engine.infer_stream(request("w1", 1)), engine.infer_stream(request("w2", 1)):
                with pytest.raises(Overloaded, match="already wait"):
                    async with engine.infer_stream(request("w3", 1)):
                        pass


async def test_workers_pin_sequences_and_spread_other_work(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings(workers=2, max_batch_size=2)]) as engine:
        assert (await engine.model_info("rec")).workers == 2

        async def sequence(sid: str) -> None:
            for k in range(5):
                await engine.infer(
                    request(f"{sid}-{k}", 2, sequence_id=sid, sequence_start=k == 0, sequence_end=k == 4)
                )

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(sequence, f"q{i}")
            for i in range(6):
                nursery.start_soon(engine.infer, request(f"free{i}", 5))
        replica_of: dict[str, set[int]] = {}
        for index in range(2):
            for step in model_of(engine, replica=index).steps:
                for rid in step:
                    replica_of.setdefault(rid.split("-")[0], set()).add(index)
        for i in range(6):
            assert len(replica_of[f"q{i}"]) == 1  # a sequence never changes replica
        assert {i for s in replica_of.values() for i in s} == {0, 1}


async def test_thousand_interleaved_sequences_sum_exactly(autojump_clock: trio.testing.MockClock) -> None:
    import numpy as np

    from actorserve.codecs import tensor_from_numpy
    from actorserve.models import builtin_settings

    accumulator = next(m for m in builtin_settings() if m.name == "accumulator")
    async with actorserve.open_engine([accumulator]) as engine:
        sums: dict[int, list[int]] = {}

        async def client(sid: int) -> None:
            values = [(sid * 7 + k * 13) % 101 - 50 for k in range(5)]
            got = []
            for k, value in enumerate(values):
                req = actorserve.InferenceRequest(
                    [tensor_from_numpy("INPUT", np.array([value], dtype=np.int64))],
                    parameters={"sequence_id": sid, "sequence_start": k == 0, "sequence_end": k == 4},
                    model_name="accumulator",
                )
                got.append(int((await engine.infer(req)).outputs[0].data[0]))
                await trio.lowlevel.checkpoint()
            sums[sid] = got
            assert got == list(np.cumsum(values))

        async with trio.open_nursery() as nursery:
            for sid in range(1, 1001):
                nursery.start_soon(client, sid)
        assert len(sums) == 1000
        assert (await engine.statistics("accumulator")).open_sequences == 0


async def test_waiting_requests_start_in_priority_order_when_a_slot_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A full batch (max_batch_size 1, its item held: its reader takes nothing and its
    reply buffer is 1), five requests waiting with mixed Triton priorities: they start
    highest first (1 before 2; none and 0 are the default, last), first come first
    served within one priority."""
    settings = recording_settings(max_batch_size=1, reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine:
        model = model_of(engine)
        waiting = [("d1", None), ("p2a", 2), ("d0", 0), ("p1", 1), ("p2b", 2)]
        async with trio.open_nursery() as nursery:
            async with engine.infer_stream(request("hold", 3)) as stream:
                await stream.__anext__()  # admitted: the only slot is held
                for rid, priority in waiting:
                    parameters = {} if priority is None else {"priority": priority}
                    nursery.start_soon(engine.infer, request(rid, 1, **parameters))
                    await trio.testing.wait_all_tasks_blocked()
                assert model.steps == [["hold"], ["hold"]]  # then paused: the slot stays held
                assert len([r async for r in stream]) == 2  # the rest of "hold": the slot frees
    started = list(dict.fromkeys(step[0] for step in model.steps))
    assert started == ["hold", "p1", "p2a", "p2b", "d1", "d0"]
