"""The ``transformers`` runtime against ``transformers`` itself: greedy text through the
engine, REST (generate, generate_stream, infer) and the OpenAI routes equals
``model.generate(do_sample=False)`` for tiny GPT-2 and Llama checkpoints built here, alone
and with 16 concurrent requests of different lengths; seeds, stop strings, EOS, usage,
sequences, the cache budget, cancellation and parameter errors (the prefix cache
and the budget's fairness: test_llm_cache.py)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import trio
from support.servers import start_server
from support.tiny_llm import build

import actorserve
from actorserve import BadInput, InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.models.llm import TransformersModel
from actorserve.models.llm.state import Detokenizer
from actorserve.modelsettings import model_settings_from_dict
from actorserve.server.composition import serve
from actorserve.settings import Settings

pytest.importorskip("transformers")

TIMEOUT = 60.0
#: the runtime picks CUDA when there is one; the oracle runs where it runs. The tests load
#: in float32 everywhere (bf16, the CUDA default, is checked on its own below): greedy
#: equality token for token across batch shapes holds in float32, not in bf16.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PROMPTS = [
    "ROMEO:\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "K",
    "What light through yonder window breaks? ",
    "To be, or not to be",
    "JULIET:\nO Romeo, Romeo! wherefore art thou",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 2,
    "é ü — “quotes” 日本",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llm")
    return {arch: build(root / arch, arch, dtype="float32") for arch in ("gpt2", "llama")}


class Oracle:
    """``transformers``' own greedy generation of a checkpoint."""

    def __init__(self, folder: Path, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
        self.model = model.to(DEVICE).eval()
        self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)

    def ids(self, prompt: str, max_tokens: int) -> tuple[list[int], list[int]]:
        ids = self.tok(prompt, return_tensors="pt").input_ids.to(DEVICE)
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
            )
        return ids[0].tolist(), out[0, ids.shape[1] :].tolist()

    def text(self, prompt: str, max_tokens: int) -> str:
        prompt_ids, new = self.ids(prompt, max_tokens)
        if new and new[-1] == self.tok.eos_token_id:
            new = new[:-1]
        decode = partial(self.tok.decode, skip_special_tokens=True)
        return str(decode(prompt_ids + new))[len(decode(prompt_ids)) :]


@pytest.fixture(scope="module")
def oracles(folders: dict[str, Path]) -> dict[str, Oracle]:
    return {arch: Oracle(folder) for arch, folder in folders.items()}


def request(prompt: str, **parameters: Any) -> InferenceRequest:
    data = np.empty(1, dtype=object)
    data[0] = prompt.encode()
    return InferenceRequest([tensor_from_numpy("text_input", data, "BYTES")], parameters=parameters)


@asynccontextmanager
async def llm_engine(folder: Path, **parameters: Any) -> AsyncIterator[tuple[Engine, TransformersModel]]:
    data = {
        "name": "llm",
        "implementation": "transformers",
        "parameters": {"dtype": "float32", **parameters},
        "sequence": {"idle_timeout_ms": 60_000, "max_sequences": 64},
    }
    with trio.fail_after(TIMEOUT):
        async with actorserve.open_engine([model_settings_from_dict(data, folder=folder)]) as engine:
            model = engine.model("llm")
            assert isinstance(model, TransformersModel)
            yield engine, model


async def text(engine: Engine, prompt: str, **parameters: Any) -> str:
    response = await engine.infer(request(prompt, **parameters), model="llm")
    return str(response.outputs[0].data[0].decode())


async def pieces(engine: Engine, prompt: str, **parameters: Any) -> list[str]:
    async with engine.infer_stream(request(prompt, **parameters), model="llm") as responses:
        return [r.outputs[0].data[0].decode() async for r in responses]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
async def test_greedy_equals_generate_alone_and_16_at_once(
    arch: str, folders: dict[str, Path], oracles: dict[str, Oracle]
) -> None:
    oracle = oracles[arch]
    cases = [(PROMPTS[i % len(PROMPTS)], 6 + 3 * i) for i in range(16)]
    expected = [oracle.text(p, n) for p, n in cases]
    assert any(len(e) > 10 for e in expected)
    # a prefill chunk smaller than the prompts: long prompts are read over several steps
    async with llm_engine(folders[arch], prefill_chunk=8) as (engine, _):
        assert [await text(engine, p, temperature=0, max_tokens=n) for p, n in cases[:4]] == expected[:4]
        got: dict[int, list[str]] = {}

        async def one(i: int) -> None:
            await trio.sleep(i * 0.005)  # join a running batch at different steps
            prompt, n = cases[i]
            got[i] = await pieces(engine, prompt, temperature=0, max_tokens=n)

        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(one, i)
        assert ["".join(got[i]) for i in range(16)] == expected
        # arriving together with prompts of one length: their prefill is one forward
        same = [PROMPTS[4], PROMPTS[1], PROMPTS[4]]
        burst: dict[int, str] = {}

        async def together(i: int) -> None:
            burst[i] = await text(engine, same[i % 3], temperature=0, max_tokens=5 + i)

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(together, i)
        assert [burst[i] for i in range(6)] == [oracle.text(same[i % 3], 5 + i) for i in range(6)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="checks the CUDA defaults; no GPU here")
async def test_cuda_loads_in_bf16_by_default_and_greedy_matches(folders: dict[str, Path]) -> None:
    """On a GPU with bf16 the runtime loads in bf16 unless told otherwise; one greedy
    request matches transformers' own bf16 generate on the same device."""
    oracle = Oracle(folders["llama"], dtype=torch.bfloat16)
    data = {"name": "llm", "implementation": "transformers"}
    with trio.fail_after(TIMEOUT):
        async with actorserve.open_engine(
            [model_settings_from_dict(data, folder=folders["llama"])]
        ) as engine:
            model = engine.model("llm")
            assert isinstance(model, TransformersModel)
            assert model.device.type == "cuda"
            assert model.dtype == torch.bfloat16
            for prompt in PROMPTS[:3]:
                assert await text(engine, prompt, temperature=0, max_tokens=8) == oracle.text(prompt, 8)


def test_detokenizer_pieces_are_final_and_whole_characters(oracles: dict[str, Oracle]) -> None:
    tok = oracles["gpt2"].tok
    prompt = tok("naïve “café” ")["input_ids"]
    rng = np.random.default_rng(0)
    for _ in range(20):
        new = [int(t) for t in rng.integers(0, len(tok), 30)]
        detok = Detokenizer(tok, prompt)
        out = [detok.add(t) for t in new] + [detok.flush()]
        decode = partial(tok.decode, skip_special_tokens=True)
        assert "".join(out) == decode(prompt + new)[len(decode(prompt)) :]
        assert all(not p.endswith("\ufffd") for p in out[:-1])


async def test_seeded_text_is_the_same_alone_and_in_a_batch(folders: dict[str, Path]) -> None:
    sampled = {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 1234, "max_tokens": 24}
    async with llm_engine(folders["gpt2"]) as (engine, _):
        alone = await text(engine, "ROMEO:\n", **sampled)
        assert alone != await text(engine, "ROMEO:\n", **{**sampled, "seed": 99})
        got: list[str] = []

        async def other(i: int) -> None:
            await text(engine, PROMPTS[i], temperature=1.0, seed=i, max_tokens=20 + i)

        async def mine() -> None:
            await trio.sleep(0.01)
            got.append(await text(engine, "ROMEO:\n", **sampled))

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(other, i)
            nursery.start_soon(mine)
        assert got == [alone]


async def test_stop_eos_usage_and_finish_reason(folders: dict[str, Path], oracles: dict[str, Oracle]) -> None:
    oracle = oracles["llama"]
    prompt = "To be, or not to be"
    whole = oracle.text(prompt, 30)
    async with llm_engine(folders["llama"]) as (engine, _):
        stop = whole[5:8]
        cut = whole.index(stop)
        got = await pieces(engine, prompt, temperature=0, max_tokens=30, stop=[stop, "\x00never"])
        assert "".join(got) == whole[:cut]
        response = await engine.infer(request(prompt, temperature=0, max_tokens=7, usage=True), model="llm")
        prompt_ids, new = oracle.ids(prompt, 7)
        assert response.parameters["finish_reason"] == (
            "stop" if new[-1] == oracle.tok.eos_token_id else "length"
        )
        assert response.parameters["prompt_tokens"] == len(prompt_ids)
        assert response.parameters["completion_tokens"] == len(new)
        # EOS: "ROMEO:\n" ends with it within a few tokens on this checkpoint
        _, new = oracle.ids("ROMEO:\n", 40)
        if oracle.tok.eos_token_id in new:
            response = await engine.infer(request("ROMEO:\n", temperature=0, max_tokens=40), model="llm")
            assert response.parameters["finish_reason"] == "stop"
            assert response.outputs[0].data[0].decode() == oracle.text("ROMEO:\n", 40)


async def test_bad_parameters_and_a_prompt_past_the_context(folders: dict[str, Path]) -> None:
    async with llm_engine(folders["gpt2"], max_tokens_limit=100) as (engine, _):
        for parameters, message in [
            ({"temperature": -1}, "parameter 'temperature'"),
            ({"max_tokens": 101}, "parameter 'max_tokens': expected an integer in [0, 100]"),
            ({"top_p": 2}, "parameter 'top_p'"),
            ({"stop": 3}, "parameter 'stop'"),
            ({"nope": 1}, "nope"),
        ]:
            with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
                await text(engine, "a", **parameters)
        with pytest.raises(BadInput, match=r"the model's context is 256 tokens \(max_context\)"):
            await text(engine, "To be, or not to be, " * 200)
        assert await text(engine, "a", max_tokens=0) == ""


async def test_sequence_continues_as_resending_the_history(folders: dict[str, Path]) -> None:
    greedy = {"temperature": 0, "max_tokens": 12}
    async with llm_engine(folders["llama"]) as (engine, model):
        first = await text(engine, "ROMEO:\n", sequence_id="s", sequence_start=True, **greedy)
        assert len(model.sequences["s"].ids) > 0
        second = await text(engine, "JULIET:\nAy me", sequence_id="s", **greedy)
        assert second == await text(engine, "ROMEO:\n" + first + "JULIET:\nAy me", **greedy)
        third = await text(engine, " and thou", sequence_id="s", sequence_end=True, **greedy)
        assert third == await text(
            engine, "ROMEO:\n" + first + "JULIET:\nAy me" + second + " and thou", **greedy
        )
        assert model.sequences == {}


async def test_cache_budget_drops_the_least_recently_used_idle_cache_and_the_sequence_goes_on(
    folders: dict[str, Path],
) -> None:
    greedy = {"temperature": 0, "max_tokens": 4}
    # gpt2 here: 2 layers x (keys + values) x 64 floats x 4 bytes = 1 KiB per token. A
    # request reserves its prompt + max_tokens: a keeps 11 tokens, b 13 (reserving 14 fits
    # beside a in 34), c reserves 19: room for it drops a's cache (least recently used)
    # but not b's. a stays open (soft eviction) and reads its text again when it goes on.
    async with llm_engine(folders["gpt2"], kv_cache_budget_mb=34 / 1024) as (engine, model):
        first = await text(engine, "ROMEO:\nI", sequence_id="a", sequence_start=True, **greedy)
        await text(engine, "JULIET:\nAy", sequence_id="b", sequence_start=True, **greedy)
        assert model.cache_bytes() <= 34 * 1024
        supervisor = engine.host("llm").supervisor
        assert supervisor is not None and len(supervisor) == 2
        await text(engine, "First Citizen:\nBefore we", sequence_id="c", sequence_start=True, **greedy)
        assert sorted(model.sequences) == ["a", "b", "c"] and len(supervisor) == 3
        assert model.sequences["a"].kv is None and model.sequences["a"].text == "ROMEO:\nI" + first
        assert model.sequences["b"].kv is not None and model.sequences["c"].kv is not None
        assert model.cache_statistics().dropped_caches == 1
        assert supervisor.statistics().ended == {}
        assert model.cache_bytes() <= 34 * 1024
        # a goes on: it reads its whole text again, and answers as if never dropped
        before = model.cache_statistics().prefilled_tokens
        more = await text(engine, " me", sequence_id="a", **greedy)
        assert more == await text(engine, "ROMEO:\nI" + first + " me", **greedy)
        assert model.cache_statistics().prefilled_tokens - before > len(model.tokenizer(" me")["input_ids"])
        assert model.cache_bytes() <= 34 * 1024
        await text(engine, " me", sequence_id="b", **greedy)
    # the same turns with room for every cache: the same answer
    async with llm_engine(folders["gpt2"]) as (engine, model):
        assert await text(engine, "ROMEO:\nI", sequence_id="a", sequence_start=True, **greedy) == first
        await text(engine, "JULIET:\nAy", sequence_id="b", sequence_start=True, **greedy)
        await text(engine, "First Citizen:\nBefore we", sequence_id="c", sequence_start=True, **greedy)
        assert model.cache_statistics().dropped_caches == 0
        assert await text(engine, " me", sequence_id="a", **greedy) == more


async def test_cancelled_request_leaves_and_its_sequence_goes_on(folders: dict[str, Path]) -> None:
    greedy = {"temperature": 0, "max_tokens": 200}
    async with llm_engine(folders["gpt2"]) as (engine, model):
        start = request("ROMEO:\n", sequence_id="s", sequence_start=True, **greedy)
        async with engine.infer_stream(start, model="llm") as responses:
            sent = [(await responses.__anext__()).outputs[0].data[0].decode() for _ in range(3)]
        # the sequence keeps what the model said before it saw the cancel (maybe more than
        # the 3 pieces read here); an empty turn waits for that in the sequence's order
        assert await text(engine, "", sequence_id="s", max_tokens=0) == ""
        history = model.sequences["s"].text
        assert history.startswith("ROMEO:\n" + "".join(sent)) and not model.sequences["s"].busy
        more = await text(
            engine, "\nJULIET:", sequence_id="s", sequence_end=True, temperature=0, max_tokens=8
        )
        assert more == await text(engine, history + "\nJULIET:", temperature=0, max_tokens=8)


# -- through the servers ------------------------------------------------------------------------


async def test_every_front_door(
    nursery: trio.Nursery, folders: dict[str, Path], oracles: dict[str, Oracle]
) -> None:
    """REST generate / generate_stream / infer, the OpenAI routes through the openai
    client (chat through the tokenizer's template), gRPC ModelStreamInfer."""
    import openai
    import tritonclient.grpc as grpcclient

    data = {
        "name": "llm",
        "implementation": "actorserve.models.llm.TransformersModel",
        "parameters": {"dtype": "float32"},
    }
    settings = Settings(
        models=(model_settings_from_dict(data, folder=folders["gpt2"]),),
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
    )
    server = await nursery.start(partial(serve, settings))
    oracle = oracles["gpt2"]
    expected = oracle.text("ROMEO:\n", 20)
    params = {"max_tokens": 20, "temperature": 0}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        body = {"text_input": "ROMEO:\n", "parameters": params}
        reply = await client.post("/v2/models/llm/generate", json=body)
        assert reply.json()["text_output"] == expected
        reply = await client.post("/v2/models/llm/generate_stream", json=body)
        events = [json.loads(e.removeprefix("data: ")) for e in reply.text.split("\n\n") if e]
        assert "".join(e["text_output"] for e in events) == expected
        tensor = {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["ROMEO:\n"]}
        outputs = (
            await client.post("/v2/models/llm/infer", json={"inputs": [tensor], "parameters": params})
        ).json()
        assert outputs["outputs"][0]["data"] == [expected]
        reply = await client.post(
            "/v2/models/llm/generate", json={"text_input": "a", "parameters": {"top_k": -1}}
        )
        assert reply.status_code == 400 and "top_k" in reply.json()["error"]

    ai = openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    completion = await trio.to_thread.run_sync(
        lambda: ai.completions.create(model="llm", prompt="ROMEO:\n", max_tokens=20, temperature=0)
    )
    assert completion.choices[0].text == expected
    messages = [{"role": "system", "content": "Speak."}, {"role": "user", "content": "Who is there?"}]
    rendered = oracle.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|endoftext|>system: Speak.")

    def chat() -> str:
        stream = ai.chat.completions.create(
            model="llm",
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert await trio.to_thread.run_sync(chat) == oracle.text(rendered, 16)
    with pytest.raises(openai.BadRequestError, match="unknown role"):
        bad = [{"role": "developer", "content": "x"}]
        await trio.to_thread.run_sync(
            lambda: ai.chat.completions.create(model="llm", messages=bad, max_tokens=2)  # type: ignore[arg-type]
        )

    def grpc_stream() -> str:
        pieces: list[str] = []
        done = threading.Event()

        def callback(result: Any, error: Any) -> None:
            if error is not None:
                pieces.append(f"error: {error}")
                done.set()
                return
            pieces.append(result.as_numpy("text_output")[0].decode())
            if result.get_response().parameters.get("finish_reason") is not None:
                done.set()

        with grpcclient.InferenceServerClient("{}:{}".format(*server.grpc_address)) as client:
            text_input = grpcclient.InferInput("text_input", [1], "BYTES")
            text_input.set_data_from_numpy(np.array([b"ROMEO:\n"], dtype=object))
            client.start_stream(callback)
            client.async_stream_infer("llm", [text_input], parameters={"max_tokens": 20, "temperature": 0})
            assert done.wait(TIMEOUT)
            client.stop_stream()
        return "".join(pieces)

    assert await trio.to_thread.run_sync(grpc_stream) == expected


def test_without_the_extra_the_error_names_it(
    folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    settings = model_settings_from_dict(
        {"name": "llm", "implementation": "transformers"}, folder=folders["gpt2"]
    )
    with pytest.raises(BadInput, match=r"needs the extra: pip install 'actorserve\[llm\]'"):
        TransformersModel(settings)._load()


def test_one_command_with_fronts_and_an_engine_process(
    folders: dict[str, Path], oracles: dict[str, Oracle]
) -> None:
    """``python -m actorserve FOLDER`` (the model folder says ``"transformers"``) with a
    front process: generate and chat answer as transformers does."""
    server = start_server(
        "--http-port", "0", "--grpc-port", "off", "--api-workers", "1", str(folders["gpt2"])
    )
    try:
        url = server.wait_for(r"REST listening on (http://\S+)", TIMEOUT)[1]
        oracle = oracles["gpt2"]
        with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
            body = {"text_input": "ROMEO:\n", "parameters": {"max_tokens": 12, "temperature": 0}}
            reply = client.post("/v2/models/gpt2/generate", json=body)
            assert reply.json()["text_output"] == oracle.text("ROMEO:\n", 12), reply.text
            messages = [{"role": "user", "content": "Who is there?"}]
            chat = {"model": "gpt2", "messages": messages, "max_tokens": 10, "temperature": 0}
            reply = client.post("/v1/chat/completions", json=chat)
            rendered = oracle.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert reply.json()["choices"][0]["message"]["content"] == oracle.text(rendered, 10), reply.text
    finally:
        server.stop()
