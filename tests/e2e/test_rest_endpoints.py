"""Health, metadata, readiness, repository and routing endpoints over real HTTP."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import actorserve
from actorserve.engine.repository import ModelRepository
from actorserve.models import builtin_settings as builtin_models
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings


async def test_health(client: httpx.AsyncClient) -> None:
    live = await client.get("/v2/health/live")
    ready = await client.get("/v2/health/ready")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})


@pytest.mark.parametrize("path", ["/v2", "/v2/"])
async def test_server_metadata(client: httpx.AsyncClient, path: str) -> None:
    reply = await client.get(path)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "name": "actorserve",
        "version": actorserve.__version__,
        "extensions": [
            "binary_tensor_data",
            "generate",
            "model_repository",
            "parameters",
            "sequence",
            "streaming",
        ],
    }


@pytest.mark.parametrize("path", ["/v2/models/accumulator", "/v2/models/accumulator/versions/1"])
async def test_model_metadata(client: httpx.AsyncClient, path: str) -> None:
    reply = await client.get(path)
    assert reply.status_code == 200
    assert reply.json() == {
        "name": "accumulator",
        "versions": ["1"],
        "platform": "actorserve/AccumulatorModel",
        "inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1]}],
        "outputs": [{"name": "OUTPUT", "datatype": "INT64", "shape": [1]}],
        "parameters": {"request_parameters": ""},  # it reads no parameter of its own
    }


async def test_model_metadata_declares_request_parameters_and_text_generation(
    client: httpx.AsyncClient,
) -> None:
    """What a generic client (the playground) needs to offer exactly what a model takes."""
    streamer = (await client.get("/v2/models/streamer")).json()
    assert streamer["parameters"] == {
        "request_parameters": "delay,n_tokens,usage",
        "text_generation.input": "text_input",
        "text_generation.output": "text_output",
        "text_generation.max_tokens": "n_tokens",
        "text_generation.sampling": "",
        "text_generation.stop": False,
        "text_generation.usage": True,
        "text_generation.chat": False,
    }
    # A model that declares nothing says nothing: any parameter passes.
    assert "parameters" not in (await client.get("/v2/models/identity")).json()


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v2/models/nope", "model 'nope' is not loaded"),
        ("/v2/models/identity/versions/7", "model 'identity' has no version '7'"),
        ("/v2/models/nope/ready", "model 'nope' is not loaded"),
        ("/v2/models/identity/versions/7/ready", "model 'identity' has no version '7'"),
    ],
)
async def test_unknown_model_or_version_is_404(client: httpx.AsyncClient, path: str, error: str) -> None:
    reply = await client.get(path)
    assert (reply.status_code, reply.json()) == (404, {"error": error})


async def test_model_ready(client: httpx.AsyncClient) -> None:
    for path in ("/v2/models/identity/ready", "/v2/models/identity/versions/1/ready"):
        reply = await client.get(path)
        assert (reply.status_code, reply.json()) == (200, {"name": "identity", "version": "1", "ready": True})


async def test_model_not_ready_is_503(client: httpx.AsyncClient, server: Server) -> None:
    loaded = trio.Event()

    class SlowToLoad(actorserve.Model):
        async def load(self) -> None:
            await loaded.wait()

    async with trio.open_nursery() as nursery:  # a model whose load() still runs
        nursery.start_soon(
            server.engine.load, actorserve.ModelSettings(name="slow", implementation=SlowToLoad)
        )
        await trio.testing.wait_all_tasks_blocked()
        assert (await server.engine.model_info("slow")).state == "LOADING"
        try:
            reply = await client.get("/v2/models/slow/ready")
            health = await client.get("/v2/health/ready")
        finally:
            loaded.set()
    assert reply.status_code == 503
    assert reply.json() == {"error": "model 'slow' version '1' is not ready (loading)"}
    assert reply.headers["retry-after"] == "1"
    assert (health.status_code, health.json()) == (503, {"error": "not ready: slow:1"})
    assert (await client.get("/v2/models/slow/ready")).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", "/nope", 404, "no such endpoint: GET /nope"),
        (
            "GET",
            "/v2/models/identity/infer/extra",
            404,
            "no such endpoint: GET /v2/models/identity/infer/extra",
        ),
        ("GET", "/v2/models/identity/infer", 405, "method GET is not allowed on /v2/models/identity/infer"),
        ("DELETE", "/v2/health/live", 405, "method DELETE is not allowed on /v2/health/live"),
        (
            "PUT",
            "/v2/models/streamer/generate_stream",
            405,
            "method PUT is not allowed on /v2/models/streamer/generate_stream",
        ),
    ],
)
async def test_unknown_routes_and_methods_answer_json(
    client: httpx.AsyncClient, method: str, path: str, status: int, error: str
) -> None:
    reply = await client.request(method, path)
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"error": error}


def index_of(*names: str, state: str = "READY") -> list[dict[str, str]]:
    return [{"name": n, "version": "1", "state": state, "reason": ""} for n in names]


async def test_repository_index(client: httpx.AsyncClient) -> None:
    everything = index_of("accumulator", "counter", "failing", "gate", "identity", "streamer")
    assert (await client.get("/v2/repository/index")).json() == everything
    assert (await client.post("/v2/repository/index")).json() == everything
    assert (await client.post("/v2/repository/index", json={})).json() == everything
    assert (await client.post("/v2/repository/index", json={"ready": True})).json() == everything
    bad = await client.post("/v2/repository/index", json=[1])
    assert (bad.status_code, bad.json()) == (
        400,
        {"error": "the repository index request must be a JSON object"},
    )


async def test_unload_then_load_a_builtin(client: httpx.AsyncClient, server: Server) -> None:
    unloaded = await client.post("/v2/repository/models/identity/unload")
    assert (unloaded.status_code, unloaded.json()) == (200, {})
    gone = await client.get("/v2/models/identity")
    assert (gone.status_code, gone.json()) == (404, {"error": "model 'identity' is not loaded"})
    index = (await client.get("/v2/repository/index")).json()
    assert {"name": "identity", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index
    assert [m["name"] for m in (await client.post("/v2/repository/index", json={"ready": True})).json()] == [
        "accumulator",
        "counter",
        "failing",
        "gate",
        "streamer",
    ]
    loaded = await client.post("/v2/repository/models/identity/load", json={})
    assert (loaded.status_code, loaded.json()) == (200, {})
    assert (await client.get("/v2/models/identity/ready")).status_code == 200
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1], "data": [3]}]}
    assert (await client.post("/v2/models/identity/infer", json=body)).json()["outputs"][0]["data"] == [3]


async def test_load_unknown_is_404_and_unload_unknown_is_404(client: httpx.AsyncClient) -> None:
    load = await client.post("/v2/repository/models/nope/load")
    unload = await client.post("/v2/repository/models/nope/unload")
    assert (load.status_code, load.json()) == (404, {"error": "model 'nope' is not in the model repository"})
    assert (unload.status_code, unload.json()) == (404, {"error": "model 'nope' is not loaded"})


def write_model(folder: Path, name: str, settings: dict[str, Any] | str) -> None:
    (folder / name).mkdir(parents=True, exist_ok=True)
    text = settings if isinstance(settings, str) else json.dumps(settings)
    (folder / name / "model-settings.json").write_text(text)


async def test_load_finds_models_added_to_the_model_folders(tmp_path: Path, nursery: trio.Nursery) -> None:
    write_model(
        tmp_path, "echo", {"name": "echo", "implementation": "actorserve.models.identity.IdentityModel"}
    )
    repository = ModelRepository((tmp_path,))
    settings = Settings(models=tuple(repository.discover()), http_port=0, grpc_port=None, no_auth=True)
    server: Server = await nursery.start(partial(serve, settings, repository=repository))
    async with httpx.AsyncClient(base_url=str(server.http_url)) as client:
        assert [m["name"] for m in (await client.get("/v2/repository/index")).json()] == ["echo"]
        write_model(
            tmp_path, "late", {"name": "late", "implementation": "actorserve.models.identity.IdentityModel"}
        )
        write_model(tmp_path, "broken", "{not json")
        index = (await client.get("/v2/repository/index")).json()
        assert [(m["name"], m["state"], m["reason"][:10]) for m in index] == [
            ("broken", "UNAVAILABLE", str(tmp_path)[:10]),
            ("echo", "READY", ""),
            ("late", "UNAVAILABLE", "not loaded"),
        ]
        assert (await client.post("/v2/repository/models/late/load")).status_code == 200
        ready = (await client.post("/v2/repository/index", json={"ready": True})).json()
        assert [m["name"] for m in ready] == ["echo", "late"]
        broken = await client.post("/v2/repository/models/broken/load")
        assert broken.status_code == 400
        assert broken.json()["error"].startswith(
            f"{tmp_path / 'broken' / 'model-settings.json'}: invalid JSON"
        )
        write_model(tmp_path, "ghost", {"name": "ghost", "implementation": "no_such_module.Model"})
        ghost = await client.post("/v2/repository/models/ghost/load")
        why = "model 'ghost': cannot import 'no_such_module.Model': No module named 'no_such_module'"
        assert (ghost.status_code, ghost.json()) == (400, {"error": why})
        index = (await client.get("/v2/repository/index")).json()
        assert {"name": "ghost", "version": "1", "state": "UNAVAILABLE", "reason": why} in index
        assert (await client.get("/v2/models/echo/ready")).status_code == 200  # the rest keeps serving
        missing = await client.post("/v2/repository/models/identity/load")  # not configured here
        assert missing.status_code == 404
    server.shutdown()


async def test_builtins_only_settings(nursery: trio.Nursery) -> None:
    settings = Settings(models=tuple(builtin_models()), http_port=0, grpc_port=None)
    server: Server = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=str(server.http_url)) as client:
        index = (await client.get("/v2/repository/index")).json()
    assert index == index_of(*sorted(m.name for m in builtin_models()))
    server.shutdown()
