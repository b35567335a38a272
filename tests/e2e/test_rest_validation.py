"""Declared inputs and parameters enforced over REST, and model code reloaded by a load
request, against a real server on port 0."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from conftest import TIMEOUT, Launch, rest_settings

from actorserve.engine.repository import ModelRepository
from actorserve.models import builtin_settings as builtin_models
from actorserve.server.composition import Server, serve


@pytest.fixture
async def text_client(launch: Launch) -> Any:
    server = await launch(models=tuple(m for m in builtin_models() if m.name == "text"))
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        yield client


def body(
    name: str = "text_input", datatype: str = "BYTES", data: list[Any] | None = None, **parameters: Any
) -> dict[str, Any]:
    return {
        "inputs": [{"name": name, "datatype": datatype, "shape": [1], "data": data or ["ROMEO:"]}],
        "parameters": {"max_tokens": 2, "seed": 1, **parameters},
    }


async def test_an_input_called_prompt_is_refused_naming_text_input(text_client: httpx.AsyncClient) -> None:
    reply = await text_client.post("/v2/models/text/infer", json=body("prompt"))
    assert (reply.status_code, reply.json()) == (
        400,
        {"error": "model 'text' has no input 'prompt' (expected text_input)"},
    )


async def test_int64_data_for_a_bytes_input_is_refused(text_client: httpx.AsyncClient) -> None:
    reply = await text_client.post("/v2/models/text/infer", json=body(datatype="INT64", data=[7]))
    assert (reply.status_code, reply.json()) == (
        400,
        {"error": "input 'text_input' of model 'text': expected BYTES, got INT64"},
    )


async def test_a_misspelt_parameter_is_refused_naming_the_known_ones(text_client: httpx.AsyncClient) -> None:
    expected = {
        "error": "model 'text' has no parameter 'max_tokenz'; its parameters are: max_tokens, seed, stop, temperature, top_k, top_p, usage"
    }
    for path in ("/v2/models/text/infer", "/v2/models/text/generate_stream"):
        reply = await text_client.post(path, json=body(max_tokenz=5))
        assert (reply.status_code, reply.json()) == (400, expected), path
    generate = await text_client.post(
        "/v2/models/text/generate", json={"text_input": "a", "parameters": {"max_tokenz": 5}}
    )
    assert (generate.status_code, generate.json()) == (400, expected)


async def test_what_the_text_model_declares_still_works(text_client: httpx.AsyncClient) -> None:
    """Sequence and transport parameters pass; text_input is optional."""
    reply = await text_client.post(
        "/v2/models/text/infer",
        json=body(stop=["\n\n"], temperature=0, top_k=3, binary_data_output=False),
        headers={"sequence-start": "true", "sequence-id": "7", "sequence-end": "true"},
    )
    assert reply.status_code == 200, reply.text
    no_prompt = await text_client.post(
        "/v2/models/text/infer", json={"inputs": [], "parameters": {"max_tokens": 1}}
    )
    assert no_prompt.status_code == 200, no_prompt.text


ECHO = """
from actorserve import Model
from actorserve.codecs import tensor_from_numpy
import numpy as np

class Echo(Model):
    async def predict(self, request):
        return self.response(request, [tensor_from_numpy("version", np.array([{version}], dtype=np.int64))])
"""


async def test_a_load_request_after_an_edit_serves_the_new_code(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    folder = tmp_path / "echo"
    folder.mkdir()
    (folder / "model-settings.json").write_text(json.dumps({"name": "echo", "implementation": "echo.Echo"}))
    (folder / "echo.py").write_text(ECHO.format(version=1))
    repository = ModelRepository((tmp_path,))
    settings = rest_settings(models=tuple(repository.discover()))
    server: Server = await nursery.start(partial(serve, settings, repository=repository))
    request = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [0]}]}
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        first = await client.post("/v2/models/echo/infer", json=request)
        assert first.json()["outputs"][0]["data"] == [1]
        (folder / "echo.py").write_text(ECHO.format(version=2))
        loaded = await client.post("/v2/repository/models/echo/load")
        assert (loaded.status_code, loaded.json()) == (200, {})
        second = await client.post("/v2/models/echo/infer", json=request)
        assert second.json()["outputs"][0]["data"] == [2]
        (folder / "echo.py").write_text("def broken(:\n")
        broken = await client.post("/v2/repository/models/echo/load")
        assert (broken.status_code, broken.json()) == (
            400,
            {
                "error": "model 'echo': cannot import 'echo.Echo': SyntaxError: invalid syntax (echo/echo.py, line 1)"
            },
        )
        still = await client.post("/v2/models/echo/infer", json=request)
        assert still.json()["outputs"][0]["data"] == [2]
