"""The EngineAPI across the engine link: an engine served by serve_fronts on a Unix
socket and EngineClients in the same trio run. Same answers as in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import numpy as np
import pytest
import trio
from link_support import add, engine_and_path, prompt, served, socket_path
from support.models import request

import actorserve
from actorserve import BadInput, InferenceRequest, ModelNotFound, RequestedOutput, SequenceNotFound
from actorserve.api import ModelState, ResponseIterator
from actorserve.codecs import tensor_from_numpy
from actorserve.errors import ModelFailed
from actorserve.ipc import LinkLimits, open_engine_client
from actorserve.model import Model
from actorserve.settings import ModelSettings
from actorserve.types import InferenceResponse


async def test_unary_methods_answer_as_the_engine_does() -> None:
    async with engine_and_path() as (engine, path), open_engine_client(path) as client:
        assert await client.ready() is True
        assert await client.models() == await engine.models()
        assert await client.model_info("rec") == await engine.model_info("rec")
        assert (await client.model_info("accumulator")).state is ModelState.READY
        assert await client.metadata("identity") == await engine.metadata("identity")
        assert await client.repository_index() == await engine.repository_index()
        await client.infer(request("r1", 3), model="rec")
        stats = await client.statistics("rec")
        assert stats == await engine.statistics("rec")
        assert (stats.inflight, stats.items_stepped) == (0, 3)
        await client.set_default_version("rec", "1")
        await client.wait_idle()
        await client.unload("gate", grace=0)
        assert "gate" not in [m.name for m in await engine.models()]
        with pytest.raises(ModelNotFound, match="'gate' is not loaded"):
            await client.model_info("gate")


async def test_infer_keeps_tensors_ids_and_parameters() -> None:
    async with engine_and_path() as (_, path), open_engine_client(path) as client:
        x = tensor_from_numpy("INPUT0", np.arange(6, dtype=np.int32).reshape(2, 3))
        y = tensor_from_numpy("INPUT1", np.array([b"a", b""], dtype=object), "BYTES")
        out = await client.infer(
            InferenceRequest(
                [x, y], id="q", parameters={"p": 1, "f": 0.5, "s": "x", "b": True, "l": [1, "a"]}
            ),
            model="identity",
        )
        assert (out.model_name, out.model_version, out.id) == ("identity", "1", "q")
        assert out.parameters == {"p": 1, "f": 0.5, "s": "x", "b": True, "l": [1, "a"]}
        assert out.outputs[0].data.tolist() == [[0, 1, 2], [3, 4, 5]] and out.outputs[0].datatype == "INT32"
        assert out.outputs[1].data.tolist() == [b"a", b""]
        only = await client.infer(
            InferenceRequest([x, y], outputs=[RequestedOutput("OUTPUT1")]), model="identity"
        )
        assert [t.name for t in only.outputs] == ["OUTPUT1"]
        unary = await client.infer(prompt("hi", n_tokens=3), model="streamer")
        assert unary.outputs[0].data.tolist() == [b"hi:0", b"hi:1", b"hi:2"]


async def test_infer_stream_of_the_streamer() -> None:
    async with engine_and_path() as (_, path), open_engine_client(path) as client:
        async with client.infer_stream(prompt("hi", n_tokens=5), model="streamer") as responses:
            got = [
                (r.id, r.output("text_output").data.tolist(), r.output("index").data.tolist())
                async for r in responses
            ]
        assert got == [("hi", [f"hi:{k}".encode()], [k]) for k in range(5)]
        # a batched model, several streams at once, every response exactly once and in order
        results: dict[str, list[int]] = {}

        async def run(rid: str, n: int) -> None:
            async with client.infer_stream(request(rid, n), model="rec") as stream:
                results[rid] = [int(r.output("index").data[0]) async for r in stream]

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(run, f"s{i}", 10 + i)
        assert results == {f"s{i}": list(range(10 + i)) for i in range(6)}
        assert client.link_statistics().open_calls == 0


async def test_accumulator_sequences_over_two_connections() -> None:
    async with (
        engine_and_path() as (engine, path),
        open_engine_client(path) as a,
        open_engine_client(path) as b,
    ):
        first = await a.infer(add(1, sequence_id="s1", sequence_start=True), model="accumulator")
        assert first.parameters["sequence_id"] == "s1" and first.outputs[0].data.tolist() == [1]
        assert (await b.infer(add(2, sequence_id="s1"), model="accumulator")).outputs[0].data.tolist() == [3]
        assert (await a.infer(add(3, sequence_id="s1"), model="accumulator")).outputs[0].data.tolist() == [6]
        # queued in order through both connections before any is read: served in that order
        async with AsyncExitStack() as stack:
            streams: list[ResponseIterator] = []
            for k in range(8):
                client = (a, b)[k % 2]
                streams.append(
                    await stack.enter_async_context(
                        client.infer_stream(add(10 + k, sequence_id="s1"), model="accumulator")
                    )
                )
            sums = [int((await s.next_batch())[0].outputs[0].data[0]) for s in streams]
        expected, total = [], 6
        for k in range(8):
            total += 10 + k
            expected.append(total)
        assert sums == expected
        last = await b.infer(add(0, sequence_id="s1", sequence_end=True), model="accumulator")
        assert last.outputs[0].data.tolist() == [total]
        with pytest.raises(SequenceNotFound, match="'s1' has ended"):
            await a.infer(add(1, sequence_id="s1"), model="accumulator")
        assert (await engine.statistics("accumulator")).sequences_ended == {"ended": 1}


async def test_errors_keep_their_class() -> None:
    async with engine_and_path() as (_, path), open_engine_client(path) as client:
        with pytest.raises(ModelNotFound, match="'nope' is not loaded"):
            await client.infer(request("r"), model="nope")
        with pytest.raises(ModelNotFound, match="no version '9'"):
            async with client.infer_stream(request("r"), model="rec", version="9"):
                pass
        with pytest.raises(BadInput, match="is stateful: send a sequence_id"):
            await client.infer(add(1), model="accumulator")
        with pytest.raises(BadInput, match="n_tokens"):
            async with client.infer_stream(prompt("x", n_tokens=-1), model="streamer") as responses:
                await responses.next_batch()
        with pytest.raises(SequenceNotFound):
            await client.infer(add(1, sequence_id="unknown"), model="accumulator")
        with pytest.raises(SequenceNotFound):
            async with client.infer_stream(request("r", sequence_id="unknown"), model="rec") as responses:
                await responses.next_batch()
        # a stream that fails after some responses: those first, then the error
        async with client.infer_stream(request("bad", 3, fail_on=True), model="rec") as responses:
            with pytest.raises(Exception, match="step exploded") as info:
                await responses.next_batch()
        assert type(info.value).__name__ == "ModelFailed"
        assert await client.ready()  # the link survives every one of them
        assert client.link_statistics().open_calls == 0


async def test_stream_of_requests() -> None:
    async with engine_and_path() as (_, path), open_engine_client(path) as client:

        async def prompts() -> AsyncIterator[InferenceRequest]:
            for text, n in (("a", 2), ("b", 1), ("c", 3)):
                yield prompt(text, n_tokens=n)

        async with client.stream(prompts(), model="streamer") as responses:
            texts = [r.outputs[0].data[0] async for r in responses]
        assert texts == [b"a:0", b"a:1", b"b:0", b"c:0", b"c:1", b"c:2"]

        async def many() -> AsyncIterator[InferenceRequest]:
            for i in range(40):  # more than the window: the engine grants credit as it takes them
                yield request(f"x{i}", 1)

        async with client.stream(many(), model="rec") as responses:
            ids = [r.id async for r in responses]
        assert ids == [f"x{i}" for i in range(40)]

        async def broken() -> AsyncIterator[InferenceRequest]:
            yield request("y", 1)
            raise RuntimeError("the request source broke")

        with pytest.raises(RuntimeError, match="source broke"):
            async with client.stream(broken(), model="rec") as responses:
                async for _ in responses:
                    pass
        with pytest.raises(ModelNotFound):
            async with client.stream(many(), model="nope"):
                pass
        assert client.link_statistics().open_calls == 0


class GrowingModel(Model):
    """Streams one BYTES output per size in parameter ``sizes`` (that many bytes, all
    ``x``), its shape growing with each response; parameter ``tag`` tags each one."""

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for asked in requests:
            for k, size in enumerate(asked.parameters["sizes"]):
                data = np.array([b"x" * size] * (k + 1), dtype=object)
                yield self.response(
                    asked, [tensor_from_numpy("out", data, "BYTES")], {"tag": f"{asked.id}:{k}"}
                )


async def test_a_stream_whose_output_cannot_cross_fails_alone() -> None:
    """Shapes that change every response cross as they change; a response past the link's
    frame limit fails its own stream (the model's fault, named), and another stream on
    the same connection goes on."""
    limits = LinkLimits(max_frame_bytes=64 * 1024)
    settings = [ModelSettings(name="growing", implementation=GrowingModel)]
    async with actorserve.open_engine(settings) as engine:
        with socket_path() as path:
            async with served(engine, path, limits=limits), open_engine_client(path, limits=limits) as client:
                big = InferenceRequest([], id="big", parameters={"sizes": [10, 100_000, 10]})
                fine = InferenceRequest([], id="fine", parameters={"sizes": [1, 2, 3]})
                async with client.infer_stream(fine, model="growing") as ok:
                    async with client.infer_stream(big, model="growing") as failing:
                        first = await failing.__anext__()
                        assert first.parameters == {"tag": "big:0"} and first.outputs[0].shape == (1,)
                        with pytest.raises(ModelFailed, match="exceeds the engine link's limit"):
                            await failing.__anext__()
                    got = [r async for r in ok]
                assert [r.parameters["tag"] for r in got] == ["fine:0", "fine:1", "fine:2"]
                assert [r.outputs[0].data.tolist() for r in got] == [[b"x"], [b"xx"] * 2, [b"xxx"] * 3]
                assert {(r.model_name, r.model_version, r.id) for r in got} == {("growing", "1", "fine")}
