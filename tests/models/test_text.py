"""The ``text`` model: determinism in a batch, stop strings, max_tokens, sequences,
chunked prefill, cancellation and parameter errors (through the engine, in-process), and
the generate extension through a real REST server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import trio
import trio.testing
from httpx_sse import aconnect_sse

import actorserve
from actorserve import BadInput, InferenceRequest, ModelSettings, SequenceNotFound
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.models import builtin_settings
from actorserve.models.text import Generation, TextModel, TextState, sample_rows
from actorserve.models.textlm.network import TextLMCore, generate
from actorserve.server.composition import serve
from actorserve.settings import Settings

TIMEOUT = 60.0

PROMPTS = [
    "ROMEO:\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "K",
    "What light through yonder window breaks? ",
    "To be, or not to be",
    "JULIET:\nO Romeo, Romeo! wherefore art thou",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 3,
]


def text_settings(**parameters: Any) -> ModelSettings:
    (builtin,) = [m for m in builtin_settings() if m.name == "text"]
    return ModelSettings(
        name="text",
        implementation=TextModel,
        parameters={**builtin.parameters, **parameters},
        sequence=builtin.sequence,
        inputs=builtin.inputs,
        outputs=builtin.outputs,
    )


def request(prompt: str | None, request_id: str | None = None, **parameters: Any) -> InferenceRequest:
    inputs = []
    if prompt is not None:
        data = np.empty(1, dtype=object)
        data[0] = prompt.encode()
        inputs.append(tensor_from_numpy("text_input", data, "BYTES"))
    return InferenceRequest(inputs, id=request_id, parameters=parameters)


@asynccontextmanager
async def text_engine(**parameters: Any) -> AsyncIterator[tuple[Engine, TextModel]]:
    with trio.fail_after(TIMEOUT):
        async with actorserve.open_engine([text_settings(**parameters)]) as engine:
            model = engine.model("text")
            assert isinstance(model, TextModel)
            yield engine, model


async def chunks(engine: Engine, req: InferenceRequest) -> list[str]:
    async with engine.infer_stream(req, model="text") as responses:
        return [r.outputs[0].data[0].decode() async for r in responses]


async def text(engine: Engine, prompt: str | None, **parameters: Any) -> str:
    response = await engine.infer(request(prompt, **parameters), model="text")
    (output,) = response.outputs
    assert (output.name, output.shape, output.datatype) == ("text_output", (1,), "BYTES")
    return str(output.data[0].decode())


StepLog = list[list[tuple[str | None, int, int, int, int]]]


def record_steps(model: TextModel) -> StepLog:
    """Wrap the model's step: for each step, (request id, characters fed before, after,
    characters generated before, after) of every item."""
    log: StepLog = []
    step = model.step

    def recording(batch: list[Generation]) -> Any:
        before = [(w.fed, w.generated) for w in batch]
        outputs = step(batch)
        log.append(
            [(w.request.id, b[0], w.fed, b[1], w.generated) for w, b in zip(batch, before, strict=True)]
        )
        return outputs

    model.step = recording  # type: ignore[method-assign]
    return log


# -- sampling ---------------------------------------------------------------------------------


def test_sample_rows_is_the_single_row_sampler_row_by_row() -> None:
    torch.manual_seed(0)
    n, vocab = 300, 65
    logits = torch.randn(n, vocab, dtype=torch.float32) * torch.rand(n, 1) * 8
    logits[::7, 3] = logits[::7, 5]  # ties
    temperatures = [[0.0, 0.3, 0.8, 1.0, 2.5][i % 5] for i in range(n)]
    top_ks = [[0, 1, 5, 64, 65, 200][i % 6] for i in range(n)]
    seeds = range(1000, 1000 + n)
    draws = [
        torch.rand((), generator=TextLMCore.make_generator(s), dtype=torch.float64).item() if t > 0 else -1.0
        for s, t in zip(seeds, temperatures, strict=True)
    ]
    single = [
        TextLMCore.sample(logits[i], temperatures[i], top_ks[i], TextLMCore.make_generator(s))
        for i, s in enumerate(seeds)
    ]
    assert sample_rows(logits, temperatures, top_ks, draws) == single
    top_ps = [[1.0, 0.0, 0.3, 0.9, 0.999][i % 5 if i % 2 else (i // 2) % 5] for i in range(n)]
    nucleus = [
        TextLMCore.sample(logits[i], temperatures[i], top_ks[i], TextLMCore.make_generator(s), top_ps[i])
        for i, s in enumerate(seeds)
    ]
    assert sample_rows(logits, temperatures, top_ks, draws, top_ps) == nucleus
    assert nucleus != single  # top_p changed some choices
    argmax = logits.argmax(dim=1).tolist()
    assert [nucleus[i] for i in range(n) if top_ps[i] == 0.0] == [
        argmax[i] for i in range(n) if top_ps[i] == 0.0
    ]


def test_draws_ahead_are_the_generator_sequence() -> None:
    """A request draws uniforms in blocks; they are the numbers scalar draws would give."""
    work = Generation(
        request(""), TextState(), [], max_tokens=150, temperature=0.8, top_k=0, seed=42, stop=()
    )
    drawn = []
    for _ in range(150):
        drawn.append(work.next_draw())
        work.generated += 1
    generator = TextLMCore.make_generator(42)
    assert drawn == [torch.rand((), generator=generator, dtype=torch.float64).item() for _ in range(150)]


# -- generation -------------------------------------------------------------------------------


async def test_seeded_text_is_the_reference_generator() -> None:
    async with text_engine() as (engine, model):
        got = await text(engine, "ROMEO:\n", max_tokens=100, seed=1234, temperature=0.8)
        assert got == generate(model.core, "ROMEO:\n", 100, temperature=0.8, seed=1234)
        assert got.startswith("Has it is this face, and I have shes born. Come,\n")


async def test_seeded_text_alone_equals_text_in_a_batch_of_32() -> None:
    def params(i: int) -> dict[str, Any]:
        return {
            "max_tokens": 40 + 7 * (i % 5),
            "temperature": [0.0, 0.5, 0.8, 1.0][i % 4],
            "top_k": [0, 0, 10][i % 3],
            "seed": 100 + i,
        }

    prompts = [PROMPTS[i % len(PROMPTS)] + str(i) for i in range(32)]
    async with text_engine(prefill_chunk=16) as (engine, model):
        steps = record_steps(model)
        alone = [await text(engine, prompts[i], **params(i)) for i in range(32)]
        target_alone = await text(engine, "ROMEO:\n", max_tokens=100, seed=1234)
        assert max(len(s) for s in steps) == 1
        steps.clear()
        together: dict[int, str] = {}

        async def one(i: int) -> None:
            if i == 32:
                together[i] = "".join(await chunks(engine, request("ROMEO:\n", max_tokens=100, seed=1234)))
            else:
                together[i] = "".join(await chunks(engine, request(prompts[i], **params(i))))

        async with trio.open_nursery() as nursery:
            for i in range(33):
                nursery.start_soon(one, i)
    assert max(len(s) for s in steps) == 33  # all of them were stepped together
    assert together[32] == target_alone
    assert [together[i] for i in range(32)] == alone


async def test_random_seed_when_absent() -> None:
    async with text_engine() as (engine, _):
        texts = {await text(engine, "ROMEO:\n", max_tokens=30, temperature=1.0) for _ in range(4)}
        assert len(texts) > 1
        assert {len(t) for t in texts} == {30}


async def test_max_tokens_is_the_exact_number_of_characters() -> None:
    async with text_engine() as (engine, _):
        for n in (1, 2, 17, 64):
            streamed = await chunks(engine, request("ROMEO:\n", max_tokens=n, seed=5))
            assert [len(c) for c in streamed] == [1] * n
            assert await text(engine, "ROMEO:\n", max_tokens=n, seed=5) == "".join(streamed)
        assert len(await text(engine, "ROMEO:\n", seed=5)) == 64  # the default
        # The last response says why the request ended.
        async with engine.infer_stream(request("ROMEO:\n", max_tokens=3), model="text") as responses:
            assert [r.parameters async for r in responses] == [{}, {}, {"finish_reason": "length"}]
        # Nothing to generate: one empty response (it carries a new sequence's id).
        assert await chunks(engine, request("ROMEO:\n", max_tokens=0)) == [""]
        assert await text(engine, "ROMEO:\n", max_tokens=0) == ""
        assert len(await text(engine, "", max_tokens=5)) == 5  # an empty prompt starts at a newline


async def test_stop_strings_end_generation_and_are_not_output() -> None:
    async with text_engine() as (engine, _):
        full = await text(engine, "ROMEO:\n", max_tokens=120, temperature=0)
        at = full.index("\n")
        assert 0 < at < 100
        assert await text(engine, "ROMEO:\n", max_tokens=120, temperature=0, stop="\n") == full[:at]
        word = full[at + 1 : at + 4]
        first = min(full.index(word), at)
        assert (
            await text(engine, "ROMEO:\n", max_tokens=120, temperature=0, stop=[word, "\n"]) == full[:first]
        )
        # A stop string that starts to match and then does not: the held characters come
        # out later, the whole text is unchanged.
        teaser = full[10:13] + "#"
        streamed = await chunks(engine, request("ROMEO:\n", max_tokens=120, temperature=0, stop=teaser))
        assert "".join(streamed) == full
        assert len(streamed) < 120
        assert max(len(c) for c in streamed) >= 3
        stopped = await engine.infer(
            request("ROMEO:\n", max_tokens=120, temperature=0, stop="\n"), model="text"
        )
        assert stopped.parameters == {"finish_reason": "stop"}
        # A stop string that is the very first text: one empty response.
        assert await chunks(engine, request("ROMEO:\n", max_tokens=120, temperature=0, stop=full[:2])) == [""]


async def test_bad_parameters_are_bad_input() -> None:
    async with text_engine() as (engine, _):
        cases: list[tuple[InferenceRequest, str]] = [
            (request("a", max_tokens=-1), "parameter 'max_tokens': expected an integer in [0, 2048], got -1"),
            (
                request("a", max_tokens=2049),
                "parameter 'max_tokens': expected an integer in [0, 2048], got 2049",
            ),
            (request("a", max_tokens=1.5), "parameter 'max_tokens': expected an integer, got 1.5"),
            (
                request("a", temperature=-0.1),
                "parameter 'temperature': expected a number >= 0.0, got -0.1",
            ),
            (request("a", temperature="hot"), "parameter 'temperature': expected a number, got 'hot'"),
            (request("a", top_k=-1), "parameter 'top_k': expected an integer >= 0, got -1"),
            (request("a", seed="x"), "parameter 'seed': expected an integer, got 'x'"),
            (request("a", stop=5), "parameter 'stop': expected a string or a list of strings, got 5"),
            (
                request("a", stop=["a", 1]),
                "parameter 'stop': expected a string or a list of strings, got ['a', 1]",
            ),
            (
                request("a", stop=[""]),
                "parameter 'stop': expected at most 16 non-empty strings of at most 256 characters, got ['']",
            ),
            (
                InferenceRequest([tensor_from_numpy("text_input", np.array([1, 2], dtype=np.int64))]),
                "input 'text_input' of model 'text': expected BYTES, got INT64",
            ),
            (
                request("x" * 16385),
                "input 'text_input': 16385 characters, more than 16384 (max_prompt_chars)",
            ),
        ]
        for req, message in cases:
            with pytest.raises(BadInput) as caught:
                await engine.infer(req, model="text")
            assert caught.value.message == message


async def test_unary_infer_merges_the_stream_into_one_text() -> None:
    async with text_engine() as (engine, _):
        streamed = await chunks(engine, request("JULIET:\n", "r1", max_tokens=25, seed=9))
        response = await engine.infer(request("JULIET:\n", "r1", max_tokens=25, seed=9), model="text")
        assert response.id == "r1"
        assert [(t.name, t.shape, t.datatype) for t in response.outputs] == [("text_output", (1,), "BYTES")]
        assert response.outputs[0].data[0].decode() == "".join(streamed)


# -- sequences --------------------------------------------------------------------------------


async def test_sequence_continues_from_its_state() -> None:
    greedy = {"temperature": 0, "max_tokens": 40}
    async with text_engine() as (engine, model):
        whole = await text(engine, "First Citizen:\nabcd", **greedy)
        # Text sent piece by piece, nothing generated in between.
        assert (
            await text(engine, "First Citizen:\nab", sequence_id="s1", sequence_start=True, max_tokens=0)
            == ""
        )
        assert await text(engine, "cd", sequence_id="s1", sequence_end=True, **greedy) == whole
        # With text generated in between: the state holds it too.
        first = await text(
            engine, "ROMEO:\n", sequence_id="s2", sequence_start=True, temperature=0, max_tokens=30
        )
        second = await text(engine, "JULIET:\n", sequence_id="s2", **greedy)
        assert second == await text(engine, "ROMEO:\n" + first + "JULIET:\n", **greedy)
        # An empty prompt continues right where the generation stopped.
        third = await text(engine, "", sequence_id="s2", sequence_end=True, **greedy)
        assert (
            third == (await text(engine, "ROMEO:\n" + first + "JULIET:\n", temperature=0, max_tokens=80))[40:]
        )
        # Without a sequence every request starts fresh.
        assert await text(engine, "cd", **greedy) == await text(engine, "cd", **greedy)
        assert model.sequences == {}


async def test_sequence_end_frees_the_state() -> None:
    async with text_engine() as (engine, model):
        started = await engine.infer(request("ROMEO:\n", max_tokens=3, sequence_start=True), model="text")
        sequence_id = started.parameters["sequence_id"]
        state = model.sequences[sequence_id]
        assert state.hidden is not None
        assert state.hidden.shape == (2, 384)
        assert state.hidden.untyped_storage().nbytes() == 2 * 384 * 4  # its own memory, not a batch's
        assert len(state.pending) == 1  # the last character, read at the next request
        await engine.infer(
            request("x", max_tokens=2, sequence_id=sequence_id, sequence_end=True), model="text"
        )
        assert model.sequences == {}
        assert (state.hidden, state.pending) == (None, [])
        with pytest.raises(SequenceNotFound):
            await engine.infer(request("x", sequence_id=sequence_id), model="text")
        # A cancelled sequence frees its state too.
        await engine.infer(request("a", max_tokens=1, sequence_id="c", sequence_start=True), model="text")
        assert list(model.sequences) == ["c"]
        await engine.infer(request(None, sequence_id="c", sequence_cancel=True), model="text")
        await trio.testing.wait_all_tasks_blocked()  # the sequence's actor ends in its own task
        assert model.sequences == {}


async def test_cancelled_request_stops_and_keeps_what_was_generated() -> None:
    async with text_engine() as (engine, model):
        full = await text(engine, "ROMEO:\n", temperature=0, max_tokens=300)
        steps = record_steps(model)
        cancelled = trio.Event()
        on_cancel = model.on_request_cancelled

        def recording(work: Generation) -> None:
            on_cancel(work)
            cancelled.set()

        model.on_request_cancelled = recording  # type: ignore[method-assign]
        req = request("ROMEO:\n", "long", sequence_id="s", sequence_start=True, temperature=0, max_tokens=300)
        got = ""
        async with engine.infer_stream(req, model="text") as responses:
            async for response in responses:
                got += response.outputs[0].data[0].decode()
                if len(got) == 20:
                    break
        await cancelled.wait()
        assert (await engine.statistics("text")).running == 0
        stepped = [row for s in steps for row in s if row[0] == "long"]
        generated = stepped[-1][4]
        # It left the batch at once: it was stepped once per generated character, no more.
        assert len(stepped) == generated
        # Characters generated but still in flight (buffered, not read) are in the state:
        # the sequence continues after the last one generated.
        assert 20 <= generated < 300
        after = await text(engine, "", sequence_id="s", sequence_end=True, temperature=0, max_tokens=20)
        assert after == full[generated : generated + 20]
        assert got == full[:20]


# -- continuous batching ----------------------------------------------------------------------


async def test_chunked_prefill_interleaves_with_running_decodes() -> None:
    long_prompt = (PROMPTS[1] * 3)[:100]
    async with text_engine(prefill_chunk=8) as (engine, model):
        steps = record_steps(model)
        got: dict[str, str] = {}
        first = trio.Event()

        async def stream(req: InferenceRequest) -> None:
            out = ""
            async with engine.infer_stream(req, model="text") as responses:
                async for response in responses:
                    out += response.outputs[0].data[0].decode()
                    first.set()
            got[str(req.id)] = out

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, request("ROMEO:\n", "running", temperature=0, max_tokens=400))
            await first.wait()
            nursery.start_soon(stream, request(long_prompt, "new", temperature=0, max_tokens=5))
        alone = {
            "running": await text(engine, "ROMEO:\n", temperature=0, max_tokens=400),
            "new": await text(engine, long_prompt, temperature=0, max_tokens=5),
        }
    assert got == alone
    prefilling = [
        s for s in steps if any(rid == "new" and after - before > 1 for rid, before, after, _, _ in s)
    ]
    # 100 characters, 8 per step: 12 steps of 8, then the last 4 (that step also samples
    # the first new character)...
    assert [
        [(after - before, gen_after) for rid, before, after, _, gen_after in s if rid == "new"]
        for s in prefilling
    ] == [[(8, 0)]] * 12 + [[(4, 1)]]
    # ...and in each of those steps the running stream read one character and made one.
    for s in prefilling:
        assert [
            (after - before, gen_after - gen_before)
            for rid, before, after, gen_before, gen_after in s
            if rid == "running"
        ] == [(1, 1)]


# -- through the REST transport -------------------------------------------------------------


@pytest.fixture
async def http(nursery: trio.Nursery) -> AsyncIterator[tuple[httpx.AsyncClient, TextModel]]:
    settings = Settings(models=(text_settings(),), host="127.0.0.1", http_port=0, grpc_port=None)
    server = await nursery.start(partial(serve, settings))
    assert server.http_url is not None
    model = server.engine.model("text")
    assert isinstance(model, TextModel)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        yield client, model


async def sse(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> tuple[httpx.Response, list[Any]]:
    async with aconnect_sse(client, method, url, **kwargs) as source:
        return source.response, [event async for event in source.aiter_sse()]


async def test_generate_extension_over_rest(http: tuple[httpx.AsyncClient, TextModel]) -> None:
    client, model = http
    expected = generate(model.core, "ROMEO:\n", 50, temperature=0.8, seed=1234)
    body = {"id": "g", "text_input": "ROMEO:\n", "parameters": {"max_tokens": 50, "seed": 1234}}
    reply = await client.post("/v2/models/text/generate", json=body)
    assert reply.json() == {"id": "g", "model_name": "text", "model_version": "1", "text_output": expected}

    response, events = await sse(client, "POST", "/v2/models/text/generate_stream", json=body)
    assert response.headers["content-type"] == "text/event-stream"
    assert [json.loads(e.data) for e in events] == [
        {"id": "g", "model_name": "text", "model_version": "1", "text_output": c} for c in expected
    ]

    # A browser's EventSource: query parameters, and an end event.
    query = {"text_input": "ROMEO:\n", "max_tokens": "50", "temperature": "0.8", "seed": "1234"}
    response, events = await sse(client, "GET", "/v2/models/text/generate_stream", params=query)
    assert [e.event for e in events] == ["message"] * 50 + ["end"]
    assert "".join(json.loads(e.data)["text_output"] for e in events[:-1]) == expected

    # stop strings, as a string or a list
    cut = expected.index("\n")
    for stop in ("\n", ["\n", "#"]):
        body = {"text_input": "ROMEO:\n", "parameters": {"max_tokens": 50, "seed": 1234, "stop": stop}}
        assert (await client.post("/v2/models/text/generate", json=body)).json()["text_output"] == expected[
            :cut
        ]

    # OIP tensors on infer: one text_output
    oip = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["ROMEO:\n"]}],
        "parameters": {"max_tokens": 50, "seed": 1234},
    }
    outputs = (await client.post("/v2/models/text/infer", json=oip)).json()["outputs"]
    assert outputs == [{"name": "text_output", "datatype": "BYTES", "shape": [1], "data": [expected]}]


async def test_generate_errors_and_sequences_over_rest(http: tuple[httpx.AsyncClient, TextModel]) -> None:
    client, model = http
    reply = await client.post(
        "/v2/models/text/generate", json={"text_input": "a", "parameters": {"temperature": -1}}
    )
    assert (reply.status_code, reply.json()) == (
        400,
        {"error": "parameter 'temperature': expected a number >= 0.0, got -1"},
    )
    query = {"text_input": "a", "max_tokens": "-3"}
    reply = await client.get("/v2/models/text/generate_stream", params=query)
    assert (reply.status_code, reply.json()) == (
        400,
        {"error": "parameter 'max_tokens': expected an integer in [0, 2048], got -3"},
    )
    # A sequence over GET streams: start, continue with the id, end.
    greedy = {"max_tokens": "30", "temperature": "0"}
    start = {"text_input": "ROMEO:\n", "sequence_start": "true", **greedy}
    response, events = await sse(client, "GET", "/v2/models/text/generate_stream", params=start)
    sequence_id = response.headers["sequence-id"]
    first = "".join(json.loads(e.data)["text_output"] for e in events[:-1])
    assert list(model.sequences) == [sequence_id]
    more = {"text_input": "JULIET:\n", "sequence_id": sequence_id, "sequence_end": "true", **greedy}
    response, events = await sse(client, "GET", "/v2/models/text/generate_stream", params=more)
    second = "".join(json.loads(e.data)["text_output"] for e in events[:-1])
    assert second == generate(model.core, "ROMEO:\n" + first + "JULIET:\n", 30, temperature=0)
    await trio.testing.wait_all_tasks_blocked()  # the sequence's actor ends in its own task
    assert model.sequences == {}
