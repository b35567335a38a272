"""The benchmark model repository loads and keeps the contracts the harness checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import actorserve
from actorserve.codecs import tensor_from_numpy
from actorserve.models.matmul import forward, weights
from actorserve.settings import discover_models

REPO = Path(__file__).resolve().parents[1] / "benchmarks" / "models"


async def test_benchmark_repository_contracts() -> None:
    models = discover_models(REPO)
    assert sorted(m.name for m in models) == ["identity", "matmul", "matmul_batched", "stepper", "streamer"]
    x = np.random.default_rng(0).standard_normal((1, 1024), dtype=np.float32)
    expected = forward(x, weights())
    text = np.empty(1, dtype=object)
    text[0] = b"hello"
    async with actorserve.open_engine(models) as engine:
        for name in ("matmul", "matmul_batched"):
            request = actorserve.InferenceRequest([tensor_from_numpy("x", x)])
            y = (await engine.infer(request, model=name)).outputs[0]
            assert y.shape == (1, 16)
            np.testing.assert_allclose(y.data, expected, rtol=1e-5)
        request = actorserve.InferenceRequest(
            [tensor_from_numpy("text_input", text, "BYTES")], id="s1", parameters={"n_tokens": 3}
        )
        async with engine.infer_stream(request, model="stepper") as stream:
            got = [(r.outputs[0].data[0], int(r.outputs[1].data[0]), r.id) async for r in stream]
        assert got == [(b"hello:0", 0, "s1"), (b"hello:1", 1, "s1"), (b"hello:2", 2, "s1")]
        unary = await engine.infer(request, model="stepper")
        assert unary.outputs[0].shape == (3,) and unary.outputs[1].data.tolist() == [0, 1, 2]


async def test_matmul_computes_the_same_inline_and_in_a_thread() -> None:
    import attrs

    (matmul,) = [m for m in discover_models(REPO) if m.name == "matmul"]
    x = np.random.default_rng(1).standard_normal((2, 1024), dtype=np.float32)
    expected = forward(x, weights())
    for compute in ("inline", "thread"):
        settings = attrs.evolve(matmul, parameters={"compute": compute})
        async with actorserve.open_engine([settings]) as engine:
            y = (
                await engine.infer(actorserve.InferenceRequest([tensor_from_numpy("x", x)]), model="matmul")
            ).outputs[0]
            np.testing.assert_allclose(y.data, expected, rtol=1e-5)
            assert engine.model("matmul").inline is (compute == "inline")
