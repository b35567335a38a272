"""The engine API: routing, versions, load/unload, MLServer-style streams, plain models
in sequences."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from support.models import Count, RecordingModel, recording_settings, request

import actorserve
from actorserve import InferenceRequest, ModelNotFound, ModelSettings, SequenceNotFound, StepOutput
from actorserve.api import ModelState, ModelStatistics
from actorserve.codecs import tensor_from_numpy
from actorserve.models import builtin_settings


def builtin(name: str) -> ModelSettings:
    return next(m for m in builtin_settings() if m.name == name)


def prompt(text: str, **parameters: object) -> InferenceRequest:
    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return InferenceRequest(
        [tensor_from_numpy("text_input", data, "BYTES")], id=text, parameters=dict(parameters)
    )


async def test_unknown_model_and_version() -> None:
    async with actorserve.open_engine([builtin("identity")]) as engine:
        with pytest.raises(ModelNotFound, match="'nope' is not loaded"):
            await engine.infer(request("r"), model="nope")
        with pytest.raises(ModelNotFound, match="no version '9'"):
            await engine.infer(request("r"), model="identity", version="9")


async def test_versions_load_unload_and_default() -> None:
    v1 = attrs.evolve(builtin("identity"), version="1")
    v2 = attrs.evolve(builtin("identity"), version="2")
    async with actorserve.open_engine([v1, v2]) as engine:
        x = InferenceRequest([tensor_from_numpy("INPUT0", np.array([1.0], dtype=np.float32))])
        assert (await engine.infer(x, model="identity")).model_version == "2"  # newest by default
        await engine.set_default_version("identity", "1")
        assert (await engine.infer(x, model="identity")).model_version == "1"
        assert (await engine.metadata("identity")).versions == ("1", "2")
        await engine.unload("identity", "1")
        assert [m.version for m in await engine.models()] == ["2"]
        # the chosen default is gone: the newest serves (it used to fail "no version '1'")
        assert (await engine.infer(x, model="identity")).model_version == "2"
        assert (await engine.describe("identity")).default_version == "2"
        await engine.unload("identity")
        assert await engine.models() == []
        assert await engine.ready()  # nothing loaded is not "not ready"
        await engine.load(v1)
        assert (await engine.model_info("identity")).ready


async def test_mlserver_style_stream_of_requests() -> None:
    async with actorserve.open_engine([builtin("streamer"), recording_settings()]) as engine:

        async def requests() -> AsyncIterator[InferenceRequest]:
            yield prompt("a", n_tokens=2)
            yield prompt("b", n_tokens=1)

        async with engine.stream(requests(), model="streamer") as responses:
            texts = [r.outputs[0].data[0] async for r in responses]
        assert texts == [b"a:0", b"a:1", b"b:0"]

        async def batch_requests() -> AsyncIterator[InferenceRequest]:
            yield request("x", 2)
            yield request("y", 1)

        async with engine.stream(batch_requests(), model="rec") as responses:
            got = [(r.id, int(r.outputs[0].data[0])) async for r in responses]
        assert got == [("x", 0), ("x", 1), ("y", 0)]


async def test_plain_model_sequences_run_in_order(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([builtin("streamer")]) as engine:
        first = await engine.infer(prompt("p", n_tokens=1, sequence_start=True), model="streamer")
        sid = first.parameters["sequence_id"]
        order: list[bytes] = []

        async def run(text: str) -> None:
            async with engine.infer_stream(
                prompt(text, n_tokens=3, delay=0.1, sequence_id=sid), model="streamer"
            ) as rs:
                async for r in rs:
                    order.append(r.outputs[0].data[0])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "a")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(run, "b")
        assert order == [b"a:0", b"a:1", b"a:2", b"b:0", b"b:1", b"b:2"]
        await engine.infer(prompt("c", n_tokens=0, sequence_id=sid, sequence_end=True), model="streamer")
        with pytest.raises(SequenceNotFound, match="has ended"):
            await engine.infer(prompt("d", sequence_id=sid), model="streamer")


async def test_plain_model_sequence_cancel_stops_running_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([builtin("streamer")]) as engine:
        await engine.infer(prompt("p", n_tokens=0, sequence_id="s", sequence_start=True), model="streamer")
        async with engine.infer_stream(
            prompt("long", n_tokens=100, delay=1, sequence_id="s"), model="streamer"
        ) as rs:
            await rs.__anext__()
            await engine.infer(prompt("x", sequence_id="s", sequence_cancel=True), model="streamer")
            with pytest.raises(SequenceNotFound, match="cancelled"):
                async for _ in rs:
                    pass


async def test_streamer_and_identity_contracts() -> None:
    async with actorserve.open_engine([builtin("streamer"), builtin("identity")]) as engine:
        unary = await engine.infer(prompt("hi", n_tokens=3), model="streamer")
        assert unary.outputs[0].data.tolist() == [b"hi:0", b"hi:1", b"hi:2"]
        assert unary.outputs[1].data.tolist() == [0, 1, 2] and unary.id == "hi"
        default = await engine.infer(InferenceRequest([], parameters={"n_tokens": 1}), model="streamer")
        assert default.outputs[0].data.tolist() == [b"tok:0"]
        with pytest.raises(actorserve.BadInput, match="n_tokens"):
            await engine.infer(prompt("hi", n_tokens=-1), model="streamer")
        x = tensor_from_numpy("INPUT0", np.arange(6, dtype=np.int32).reshape(2, 3))
        y = tensor_from_numpy("INPUT1", np.array([b"a"], dtype=object), "BYTES")
        out = await engine.infer(
            InferenceRequest(
                [x, y], parameters={"p": 1, "sequence_id": 0}, outputs=[actorserve.RequestedOutput("OUTPUT1")]
            ),
            model="identity",
        )
        assert [t.name for t in out.outputs] == ["OUTPUT1"] and out.parameters == {"p": 1}
        with pytest.raises(actorserve.BadInput, match="unknown requested output 'OUT9'"):
            await engine.infer(
                InferenceRequest([x], outputs=[actorserve.RequestedOutput("OUT9")]), model="identity"
            )


async def test_startup_error_reaches_an_embedder_as_itself() -> None:
    import socket

    from actorserve.server.composition import serve
    from actorserve.settings import Settings

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        settings = Settings(models=(builtin("identity"),), http_port=port, grpc_port=None)
        with pytest.raises(OSError):  # not an ExceptionGroup wrapping it
            await serve(settings)
    finally:
        taken.close()


# -- what the engine tells about its models (statistics, idle, loading) --------------------


async def test_statistics_count_requests_steps_and_sequences(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings(reply_buffer=1), builtin("streamer")]) as engine:
        assert await engine.statistics("rec") == ModelStatistics("rec", "1", inflight=0)
        await engine.infer(request("a", 3, sequence_id="s", sequence_start=True))
        await engine.infer(request("b", 1, sequence_id="s", sequence_end=True))
        await engine.infer(request("c", 0, sequence_id="t", sequence_start=True))
        async with engine.infer_stream(request("d", 10)) as stream:
            await stream.__anext__()
            await trio.testing.wait_all_tasks_blocked()
            busy = await engine.statistics("rec")
        assert (busy.inflight, busy.waiting, busy.running) == (1, 0, 1)
        assert (busy.open_sequences, busy.sequences_started, busy.queued) == (1, 2, 0)
        assert busy.sequences_ended == {"ended": 1}
        assert all(type(reason) is str for reason in busy.sequences_ended)
        assert busy.steps >= 5 and busy.items_stepped >= 5
        async with engine.infer_stream(prompt("p", n_tokens=5, delay=1), model="streamer") as stream:
            await stream.__anext__()
            plain = await engine.statistics("streamer")
        assert (plain.inflight, plain.running, plain.waiting, plain.steps) == (1, 1, 0, 0)


class HeldStep(RecordingModel):
    """Its step blocks (in its worker thread) while request ``hold`` is in it, until
    the test sets ``release``."""

    step_in_thread = True

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.holding = threading.Event()
        self.release = threading.Event()

    def step(self, batch: list[Count]) -> list[StepOutput]:
        if any(work.request.id == "hold" for work in batch):
            self.holding.set()
            self.release.wait(10)
        return super().step(batch)


async def test_wait_idle_waits_for_what_a_caller_left_in_a_batch() -> None:
    settings = recording_settings(implementation=HeldStep, reply_buffer=1)
    async with actorserve.open_engine([settings]) as engine:
        with trio.fail_after(10):
            await engine.wait_idle()  # nothing in flight: at once
        model = engine.model("rec")
        assert isinstance(model, HeldStep)
        async with engine.infer_stream(request("hold", 5)):
            await trio.to_thread.run_sync(model.holding.wait)
        # The caller left while its item is in a running step: it leaves at the next.
        stats = await engine.statistics("rec")
        # still in the batcher (the step loop reports the admission with the step's outputs)
        assert (stats.inflight, stats.waiting + stats.running) == (0, 1)
        idle = trio.Event()

        async def waiter() -> None:
            await engine.wait_idle()
            assert model.cancelled == ["hold"]  # dropped from the batch, the model told
            idle.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert not idle.is_set()
            model.release.set()
            with trio.fail_after(10):
                await idle.wait()
        stats = await engine.statistics("rec")
        assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0)


async def test_a_loading_model_is_listed_and_not_ready() -> None:
    loaded = trio.Event()

    class SlowToLoad(actorserve.Model):
        async def load(self) -> None:
            await loaded.wait()

    async with actorserve.open_engine([builtin("identity")]) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(engine.load, ModelSettings(name="slow", implementation=SlowToLoad))
        await trio.testing.wait_all_tasks_blocked()
        info = await engine.model_info("slow")
        assert (info.state, info.ready) == (ModelState.LOADING, False)
        assert not await engine.ready()
        with pytest.raises(actorserve.ModelNotReady):
            await engine.infer(request("r"), model="slow")
        with pytest.raises(actorserve.ModelNotReady):
            engine.model("slow")
        loaded.set()
        await trio.testing.wait_all_tasks_blocked()
        assert (await engine.model_info("slow")).state is ModelState.READY
        assert await engine.ready()
        assert isinstance(engine.model("slow"), SlowToLoad)


async def test_model_gives_each_replica(autojump_clock: trio.testing.MockClock) -> None:
    async with actorserve.open_engine([recording_settings(workers=2)]) as engine:
        first, second = engine.model("rec", replica=0), engine.model("rec", replica=1)
        assert first is not second and first is engine.model("rec")
        with pytest.raises(actorserve.ModelNotReady, match="no replica 2"):
            engine.model("rec", replica=2)
        with pytest.raises(ModelNotFound):
            engine.model("nope")


async def test_plain_model_request_queued_in_a_cancelled_sequence_hears_why(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([builtin("streamer")]) as engine:
        await engine.infer(prompt("p", n_tokens=0, sequence_id="s", sequence_start=True), model="streamer")
        outcome: list[str] = []

        async def queued() -> None:
            with pytest.raises(SequenceNotFound, match="'s' was cancelled") as info:
                await engine.infer(prompt("q", n_tokens=1, sequence_id="s"), model="streamer")
            outcome.append(str(info.value))

        async with engine.infer_stream(
            prompt("long", n_tokens=100, delay=1, sequence_id="s"), model="streamer"
        ) as rs:
            await rs.__anext__()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(queued)
                await trio.testing.wait_all_tasks_blocked()
                assert (await engine.statistics("streamer")).queued == 1
                await engine.infer(prompt("x", sequence_id="s", sequence_cancel=True), model="streamer")
        assert outcome == ["sequence 's' was cancelled"]
        assert (await engine.statistics("streamer")).sequences_ended == {"cancelled": 1}
