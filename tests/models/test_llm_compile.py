"""The ``transformers`` runtime's bucketed and compiled decode, and its dtype choice:
greedy text token for token equal to eager and to ``transformers``' own ``generate`` in
float32 (uncompiled buckets with rows joining, leaving and the cache growing; the
inductor-compiled decode of the smallest shape of a one-layer Llama, compiled once); rows
joining and leaving compile nothing more; a compile that fails falls back with one
WARNING; ``dtype`` ``auto`` follows the CPU's bf16 support, bf16 produces text, and the
model's metadata shows what it runs with. CUDA graphs are checked only where CUDA is."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import trio
from support.tiny_llm import Oracle, build

import actorserve
from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.models.llm import TransformersModel, compiled
from actorserve.models.llm.compiled import capacity_bucket, choose_compile, choose_dtype, rows_bucket
from actorserve.modelsettings import model_settings_from_dict

pytest.importorskip("transformers")

#: the inductor compile of the one-layer Llama (one bucket) on a busy 2-core machine: 15 to
#: 110 s cold, seconds with inductor's on-disk cache warm
COMPILE_TIMEOUT = 600.0
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


async def text(engine: Engine, prompt: str, **parameters: Any) -> str:
    data = np.empty(1, dtype=object)
    data[0] = prompt.encode()
    request = InferenceRequest([tensor_from_numpy("text_input", data, "BYTES")], parameters=parameters)
    response = await engine.infer(request, model="llm")
    return str(response.outputs[0].data[0].decode())


@asynccontextmanager
async def llm_engine(folder: Path, **parameters: Any) -> AsyncIterator[tuple[Engine, TransformersModel]]:
    """test_llm's engine, bounded by the compile's timeout."""
    data = {"name": "llm", "implementation": "transformers", "parameters": {"dtype": "float32", **parameters}}
    with trio.fail_after(COMPILE_TIMEOUT):
        async with actorserve.open_engine([model_settings_from_dict(data, folder=folder)]) as engine:
            model = engine.model("llm")
            assert isinstance(model, TransformersModel)
            yield engine, model


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("llm_compile") / "llama", "llama", dtype="float32")


@pytest.fixture(scope="module")
def oracle(llama: Path) -> Oracle:
    return Oracle(llama)


@pytest.fixture(scope="module")
def llama_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer Llama for the inductor compile: its C++ kernels are most of the
    suite's longest test (7 kernels to compile against 10 for two layers, each seconds of
    ``g++`` on a busy machine, cold in every run: the cache is in pytest's folder). The
    layers are the same code repeated: the two-layer model checks the bucketed forward
    (the function compiled) over several layers' caches, uncompiled."""
    return build(tmp_path_factory.mktemp("llm_compile") / "llama_1", "llama", dtype="float32", layers=1)


async def concurrent(engine: Any, cases: list[tuple[str, int]], *, stagger: float = 0.0) -> list[str]:
    got: dict[int, str] = {}

    async def one(i: int) -> None:
        await trio.sleep(i * stagger)  # join a running batch at different steps
        prompt, n = cases[i]
        got[i] = await text(engine, prompt, temperature=0, max_tokens=n)

    async with trio.open_nursery() as nursery:
        for i in range(len(cases)):
            nursery.start_soon(one, i)
    return [got[i] for i in range(len(cases))]


def test_buckets() -> None:
    assert [rows_bucket(n) for n in (1, 2, 3, 5, 8, 9, 32)] == [2, 2, 4, 8, 8, 16, 32]
    assert [capacity_bucket(n) for n in (1, 64, 65, 129, 300)] == [64, 64, 128, 256, 512]


async def test_bucketed_decode_equals_generate_as_rows_join_leave_and_grow(
    llama: Path, oracle: Oracle
) -> None:
    """Uncompiled (``compile_after`` not reached): the bucketed forward alone, over 12
    requests that join at different steps, leave at different lengths and pass the first
    length bucket (64 positions)."""
    cases = [(PROMPTS[i % len(PROMPTS)], 5 + 7 * i) for i in range(12)]
    expected = [oracle.text(p, n) for p, n in cases]
    async with llm_engine(llama, compile="inductor", compile_after=1_000_000, prefill_chunk=8) as (
        engine,
        model,
    ):
        assert model.decoder is not None
        assert await concurrent(engine, cases, stagger=0.005) == expected
        assert model.decoder.compiled_steps == 0 and not model.decoder.ready
        assert {capacity for _, capacity in model.decoder.steps} >= {64, 128}
    async with llm_engine(llama, compile="eager") as (engine, model):
        assert model.decoder is None
        assert await concurrent(engine, cases[:4]) == expected[:4]


async def test_compiled_decode_equals_eager_and_generate_without_recompiles(llama_1: Path) -> None:
    """The inductor-compiled decode of the smallest length bucket (64), compiled once in
    the background while the uncompiled forward answers; then 1, 2 and 3 rows, joining
    and leaving, run compiled with no other compile (the one-layer model)."""
    cases = [(PROMPTS[0], 12), (PROMPTS[2], 20), (PROMPTS[4], 8)]
    oracle = Oracle(llama_1)
    expected = [oracle.text(p, n) for p, n in cases]
    async with llm_engine(llama_1, compile="inductor", compile_after=0) as (engine, model):
        decoder = model.decoder
        assert decoder is not None
        # the first steps answer uncompiled while the bucket compiles
        assert await text(engine, cases[0][0], temperature=0, max_tokens=12) == expected[0]
        await trio.to_thread.run_sync(decoder.close, COMPILE_TIMEOUT)
        assert not decoder.failed and decoder.ready == {(0, 64)}
        before = decoder.compiled_steps
        assert await concurrent(engine, cases) == expected
        assert [await text(engine, p, temperature=0, max_tokens=n) for p, n in cases] == expected
        assert decoder.compiled_steps - before >= 10
        assert decoder.ready == {(0, 64)} and len(decoder.compile_seconds) == 1
        meta = await engine.metadata("llm")
        assert meta.parameters["compile"] == "inductor"
        assert meta.parameters["dtype"] == "float32" and meta.parameters["device"] == "cpu"


async def test_a_failing_compile_falls_back_to_eager_with_one_warning(
    llama: Path, oracle: Oracle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: compiled.Decoder) -> Any:
        raise RuntimeError("no C++ compiler (test)")

    monkeypatch.setattr(compiled.Decoder, "_compiled", broken)
    cases = [(PROMPTS[i], 10 + i) for i in range(3)]
    expected = [oracle.text(p, n) for p, n in cases]
    with caplog.at_level(logging.WARNING, logger="actorserve.models.llm.compiled"):
        async with llm_engine(llama, compile="inductor", compile_after=0) as (engine, model):
            assert model.decoder is not None
            assert await text(engine, *cases[0][:1], temperature=0, max_tokens=cases[0][1]) == expected[0]
            await trio.to_thread.run_sync(model.decoder.close, 30.0)
            assert model.decoder.failed
            assert await concurrent(engine, cases) == expected
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no C++ compiler (test)" in warnings[0].getMessage()


def test_auto_compile_is_eager_until_compiling_measured_faster() -> None:
    assert choose_compile("auto", torch.device("cpu")) == "eager"
    assert choose_compile("auto", torch.device("cuda")) == "eager"
    assert choose_compile("cudagraphs", torch.device("cuda")) == "cudagraphs"
    assert choose_compile("inductor", torch.device("cpu")) == "inductor"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        choose_compile("cudagraphs", torch.device("cpu"))
    with pytest.raises(ValueError, match="expected one of"):
        choose_compile("fast", torch.device("cpu"))


def test_auto_dtype_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(compiled, "cpu_has_bf16", lambda: True)
    assert choose_dtype(None, cpu) == choose_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(compiled, "cpu_has_bf16", lambda: False)
    assert choose_dtype(None, cpu) == choose_dtype("auto", cpu) == torch.float32
    assert choose_dtype("float16", cpu) == torch.float16
    with pytest.raises(ValueError, match="expected one of"):
        choose_dtype("fp8", cpu)


async def test_bf16_runs_and_auto_picks_what_the_cpu_has(llama: Path) -> None:
    """bf16 is not token-exact to float32: it is checked to run and give text (a seed
    gives the same text again); ``auto`` loads what the CPU supports."""
    async with llm_engine(llama, dtype="bfloat16", compile="eager") as (engine, model):
        assert model.dtype == torch.bfloat16
        alone = await text(engine, PROMPTS[0], temperature=0, max_tokens=16)
        assert alone  # random weights over byte-level tokens: any text, U+FFFD included
        sampled = await text(engine, PROMPTS[3], temperature=1.0, seed=7, max_tokens=16)
        assert sampled == await text(engine, PROMPTS[3], temperature=1.0, seed=7, max_tokens=16)
        meta = await engine.metadata("llm")
        assert meta.parameters["dtype"] == "bfloat16" and meta.parameters["compile"] == "eager"
    async with llm_engine(llama, dtype="auto", compile="eager") as (engine, model):
        assert model.dtype == (torch.bfloat16 if compiled.cpu_has_bf16() else torch.float32)
        assert await text(engine, PROMPTS[1], temperature=0, max_tokens=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU; none here")
async def test_cuda_graphs_decode_equals_generate(llama: Path, oracle: Oracle) -> None:
    """On a GPU: the decode compiled with CUDA graphs (``reduce-overhead``) gives
    ``generate``'s greedy text in float32, as rows join and leave."""
    cases = [(PROMPTS[i], 8 + 4 * i) for i in range(4)]
    expected = [oracle.text(p, n) for p, n in cases]
    with trio.fail_after(COMPILE_TIMEOUT):
        async with llm_engine(llama, compile="cudagraphs", compile_after=0) as (engine, model):
            assert model.decoder is not None and model.decoder.mode == "cudagraphs"
            for _ in range(3):
                assert await concurrent(engine, cases) == expected
            assert not model.decoder.failed and model.decoder.compiled_steps > 0
