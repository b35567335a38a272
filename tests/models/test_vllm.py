"""The ``vllm`` runtime (vLLM's engine stepped by our batcher) against ``transformers``'
own greedy ``generate`` in fp32, on a tiny Llama built here: the engine alone and 16
requests joining and leaving, every front door, a continued sequence equals re-sending
the history, cancel and disconnect free vLLM's request, bad engine arguments are a 400.

Runs where vLLM imports (its own virtual environment: .ci/install-vllm); with
ACTORSERVE_REQUIRE_VLLM=1 (set by .ci/run once it installed vLLM) a missing vLLM fails
instead of skipping."""

from __future__ import annotations

import json
import os
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
from support.tiny_llm import build

import actorserve
from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.models.vllm import VLLMModel
from actorserve.models.vllm.threads import step_threads
from actorserve.modelsettings import model_settings_from_dict
from actorserve.server.composition import serve
from actorserve.settings import Settings

if os.environ.get("ACTORSERVE_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (required: an ImportError fails the run)
else:
    pytest.importorskip("vllm")

TIMEOUT = 120.0
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
#: small and exact: fp32, no compilation (start-up in seconds), a small KV cache
ENGINE = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "seed": 0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # width 128 / 4 heads: a head size vLLM's CPU attention has kernels for (32)
    return build(tmp_path_factory.mktemp("vllm") / "llama", "llama", width=128, dtype="float32")


class Oracle:
    """``transformers``' own greedy generation of the checkpoint."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
        self.model.eval()
        self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)

    def text(self, prompt: str, max_tokens: int) -> str:
        ids = self.tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
            )
        new = out[0, ids.shape[1] :].tolist()
        if new and new[-1] == self.tok.eos_token_id:
            new = new[:-1]
        prompt_ids = ids[0].tolist()
        decode = partial(self.tok.decode, skip_special_tokens=True)
        return str(decode(prompt_ids + new))[len(decode(prompt_ids)) :]


@pytest.fixture(scope="module")
def oracle(folder: Path) -> Oracle:
    return Oracle(folder)


def settings_data(**parameters: Any) -> dict[str, Any]:
    return {
        "name": "llm",
        "implementation": "vllm",
        "parameters": {"engine": ENGINE, "kv_cache_budget_mb": 64, **parameters},
        "sequence": {"idle_timeout_ms": 60_000, "max_sequences": 64},
    }


def request(prompt: str, **parameters: Any) -> InferenceRequest:
    data = np.empty(1, dtype=object)
    data[0] = prompt.encode()
    return InferenceRequest([tensor_from_numpy("text_input", data, "BYTES")], parameters=parameters)


@asynccontextmanager
async def vllm_engine(folder: Path, **parameters: Any) -> AsyncIterator[tuple[Engine, VLLMModel]]:
    with trio.fail_after(TIMEOUT):
        async with actorserve.open_engine(
            [model_settings_from_dict(settings_data(**parameters), folder=folder)]
        ) as engine:
            model = engine.model("llm")
            assert isinstance(model, VLLMModel)
            yield engine, model


async def text(engine: Engine, prompt: str, **parameters: Any) -> str:
    response = await engine.infer(request(prompt, **parameters), model="llm")
    return str(response.outputs[0].data[0].decode())


async def pieces(engine: Engine, prompt: str, **parameters: Any) -> list[str]:
    async with engine.infer_stream(request(prompt, **parameters), model="llm") as responses:
        return [r.outputs[0].data[0].decode() async for r in responses]


async def until_vllm_holds(model: VLLMModel, count: int) -> None:
    """Wait (bounded) until vLLM's scheduler holds ``count`` requests."""
    for _ in range(500):
        if model.vllm_requests() == count:
            return
        await trio.sleep(0.01)
    assert model.vllm_requests() == count


async def test_greedy_equals_generate_alone_and_16_at_once(folder: Path, oracle: Oracle) -> None:
    cases = [(PROMPTS[i % len(PROMPTS)], 6 + 3 * i) for i in range(16)]
    expected = [oracle.text(p, n) for p, n in cases]
    assert any(len(e) > 10 for e in expected)
    async with vllm_engine(folder) as (engine, model):
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
        assert model.vllm_requests() == 0


async def test_one_engine_step_per_token_no_step_when_idle_and_the_step_threads(
    folder: Path, oracle: Oracle
) -> None:
    """A stream is stepped once per token (plus the one step vLLM's async scheduling
    spends before its first output), an idle engine is not stepped, and the step thread
    runs torch with ``parameters.threads`` OpenMP threads (default: the CPUs less one,
    vLLM's own rule; at torch's default of one per CPU a token cost 4x the CPU)."""
    cpus = len(os.sched_getaffinity(0))
    assert step_threads() == max(1, cpus - 1)
    async with vllm_engine(folder, threads=2) as (engine, model):
        before = model.engine_steps
        response = await engine.infer(
            request("ROMEO:\n", temperature=0, max_tokens=24, usage=True), model="llm"
        )
        assert response.outputs[0].data[0].decode() == oracle.text("ROMEO:\n", 24)
        tokens = response.parameters["completion_tokens"]
        assert 0 < model.engine_steps - before <= tokens + 1
        assert model.running_threads == 2
        idle = model.engine_steps
        await trio.sleep(0.05)
        assert model.engine_steps == idle


async def test_stop_usage_seed_and_max_tokens_zero(folder: Path, oracle: Oracle) -> None:
    async with vllm_engine(folder) as (engine, model):
        full = oracle.text("ROMEO:\n", 20)
        stop = full[5:8]
        response = await engine.infer(
            request("ROMEO:\n", temperature=0, max_tokens=20, stop=[stop], usage=True), model="llm"
        )
        assert response.outputs[0].data[0].decode() == full[: full.find(stop)]
        assert response.parameters["finish_reason"] == "stop"
        assert response.parameters["prompt_tokens"] == len(oracle.tok("ROMEO:\n").input_ids)
        assert await text(engine, "ROMEO:\n", max_tokens=0) == ""
        seeded = [await text(engine, "ROMEO:\n", temperature=1.0, seed=7, max_tokens=12) for _ in range(2)]
        assert seeded[0] == seeded[1]
        await until_vllm_holds(model, 0)  # the request a stop string ended is aborted


async def test_sequence_continues_as_resending_the_history(folder: Path) -> None:
    greedy = {"temperature": 0, "max_tokens": 12}
    async with vllm_engine(folder) as (engine, _):
        first = await text(engine, "ROMEO:\n", sequence_id="s", sequence_start=True, **greedy)
        second = await text(engine, "JULIET:\nAy me", sequence_id="s", **greedy)
        assert second == await text(engine, "ROMEO:\n" + first + "JULIET:\nAy me", **greedy)
        third = await text(engine, " and thou", sequence_id="s", sequence_end=True, **greedy)
        assert third == await text(
            engine, "ROMEO:\n" + first + "JULIET:\nAy me" + second + " and thou", **greedy
        )


async def test_engine_arguments_are_not_a_load_override_unless_allowed(
    nursery: trio.Nursery, folder: Path
) -> None:
    settings = Settings(
        models=(model_settings_from_dict(settings_data(), folder=folder),),
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        no_auth=True,
    )
    server = await nursery.start(partial(serve, settings))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        body = {"parameters": {"config": {"parameters": {"engine": {"max_model_len": 128}}}}}
        reply = await client.post("/v2/repository/models/llm/load", json=body)
        assert reply.status_code == 400, reply.text
        assert "'engine' cannot be set by a load request" in reply.text
        assert "--allow-load-overrides engine" in reply.text


async def test_cancel_frees_vllms_request(folder: Path) -> None:
    greedy = {"temperature": 0, "max_tokens": 200}
    async with vllm_engine(folder) as (engine, model):
        async with trio.open_nursery() as nursery:
            long = trio.Event()

            async def other() -> None:  # keeps the batch stepping
                async with engine.infer_stream(request("To be", **greedy), model="llm") as responses:
                    async for _ in responses:
                        long.set()

            nursery.start_soon(other)
            await long.wait()
            async with engine.infer_stream(request("ROMEO:\n", **greedy), model="llm") as responses:
                await responses.__anext__()
                assert model.vllm_requests() == 2
                usage = model.kv_cache_usage()  # vLLM's own: two running requests hold blocks
                assert usage is not None and 0 < usage <= 1
            await until_vllm_holds(model, 1)
            nursery.cancel_scope.cancel()
        await until_vllm_holds(model, 0)  # the last one left with nothing else stepping


async def test_bad_engine_arguments_are_a_400_and_the_doors(
    nursery: trio.Nursery, folder: Path, oracle: Oracle
) -> None:
    """REST generate / generate_stream / infer, TorchServe /predictions, the OpenAI routes
    through the openai client (chat through the tokenizer's template), gRPC
    ModelStreamInfer; a load with an unknown engine argument is a 400 naming it."""
    import openai
    import tritonclient.grpc as grpcclient

    settings = Settings(
        models=(model_settings_from_dict(settings_data(), folder=folder),),
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
        no_auth=True,
        allow_load_overrides=("engine",),
    )
    server = await nursery.start(partial(serve, settings))
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
        reply = await client.post("/predictions/llm", json={"text_input": "ROMEO:\n", **params})
        assert reply.status_code == 200, reply.text
        decoder, text_body, at, said = json.JSONDecoder(), reply.text, 0, ""
        while at < len(text_body):
            doc, at = decoder.raw_decode(text_body, at)
            said += "".join(doc["text_output"])
        assert said == expected
        # a client that disconnects mid-stream: vLLM's request is aborted
        model = server.engine.model("llm")
        assert isinstance(model, VLLMModel)
        long = {"text_input": "ROMEO:\n", "parameters": {"max_tokens": 200, "temperature": 0}}
        async with client.stream("POST", "/v2/models/llm/generate_stream", json=long) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    break
            assert model.vllm_requests() == 1
        await until_vllm_holds(model, 0)
        # the operator let `engine` through (allow_load_overrides): an unknown argument is a 400
        bad = {"parameters": {"config": {"parameters": {"engine": {"no_such_argument": 1}}}}}
        reply = await client.post("/v2/repository/models/llm/load", json=bad)
        assert reply.status_code == 400, reply.text
        assert "unknown vLLM engine argument(s) 'no_such_argument'" in reply.text
        reserved = {"parameters": {"config": {"parameters": {"engine": {"model": "/elsewhere"}}}}}
        reply = await client.post("/v2/repository/models/llm/load", json=reserved)
        assert reply.status_code == 400 and "'model'" in reply.text, reply.text

    ai = openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    completion = await trio.to_thread.run_sync(
        lambda: ai.completions.create(model="llm", prompt="ROMEO:\n", max_tokens=20, temperature=0)
    )
    assert completion.choices[0].text == expected
    messages = [{"role": "system", "content": "Speak."}, {"role": "user", "content": "Who is there?"}]
    rendered = oracle.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

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

    def grpc_stream() -> str:
        got: list[str] = []
        done = threading.Event()

        def callback(result: Any, error: Any) -> None:
            if error is not None:
                got.append(f"error: {error}")
                done.set()
                return
            got.append(result.as_numpy("text_output")[0].decode())
            if result.get_response().parameters.get("finish_reason") is not None:
                done.set()

        with grpcclient.InferenceServerClient("{}:{}".format(*server.grpc_address)) as client:
            text_input = grpcclient.InferInput("text_input", [1], "BYTES")
            text_input.set_data_from_numpy(np.array([b"ROMEO:\n"], dtype=object))
            client.start_stream(callback)
            client.async_stream_infer("llm", [text_input], parameters={"max_tokens": 20, "temperature": 0})
            assert done.wait(TIMEOUT)
            client.stop_stream()
        return "".join(got)

    assert await trio.to_thread.run_sync(grpc_stream) == expected
