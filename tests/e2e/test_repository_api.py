"""The OIP repository extension and Triton's model endpoints, as Triton's clients use
them: ``tritonclient.http`` and ``tritonclient.grpc`` (``load_model`` with a config
override, ``unload_model``, ``get_model_repository_index``, ``get_model_config``,
``get_inference_statistics``) and raw requests, on one real server (REST and gRPC on
127.0.0.1 port 0)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest
import trio
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import TIMEOUT, Launch
from tritonclient.utils import InferenceServerException

from actorserve.server.composition import Server

T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


@pytest.fixture
async def both(launch: Launch) -> Server:
    """A server with REST and gRPC."""
    return await launch(grpc_port=0)


def http_client(server: Server) -> httpclient.InferenceServerClient:
    assert server.http_address is not None
    host, port = server.http_address
    return httpclient.InferenceServerClient(f"{host}:{port}", network_timeout=30)


def grpc_client(server: Server) -> grpcclient.InferenceServerClient:
    assert server.grpc_address is not None
    host, port = server.grpc_address
    return grpcclient.InferenceServerClient(f"{host}:{port}")


def counter_body(n: int) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [0]}], "parameters": {"n": n}}


def row(name: str, state: str = "READY", reason: str = "", version: str = "1") -> dict[str, str]:
    return {"name": name, "version": version, "state": state, "reason": reason}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_load_unload_and_index_through_tritonclient(both: Server, protocol: str) -> None:
    def scenario() -> dict[str, Any]:
        c = http_client(both) if protocol == "http" else grpc_client(both)
        seen: dict[str, Any] = {}
        c.unload_model("streamer", unload_dependents=True)  # ignored (a note in the log)
        index = (
            c.get_model_repository_index()
            if protocol == "http"
            else c.get_model_repository_index(as_json=True)["models"]
        )
        seen["after_unload"] = [m for m in index if m["name"] == "streamer"]
        seen["ready_after_unload"] = c.is_model_ready("streamer")  # False over both, as Triton
        seen["ready_unknown"] = c.is_model_ready("no_such_model")
        c.load_model("streamer")
        seen["ready_after_load"] = c.is_model_ready("streamer")
        c.load_model("counter", config=json.dumps({"workers": 3, "max_batch_time": 0.002}))
        seen["config"] = (
            c.get_model_config("counter")
            if protocol == "http"
            else c.get_model_config("counter", as_json=True)["config"]
        )
        try:
            c.load_model("counter", config="{not json")
        except InferenceServerException as exc:
            seen["bad_config"] = exc.message()
        try:
            c.load_model("counter", config=json.dumps({"implementation": "x.Y"}))
        except InferenceServerException as exc:
            seen["bad_field"] = exc.message()
        return seen

    seen = await in_thread(scenario)
    grpc = protocol == "grpc"
    assert seen["after_unload"] == [row("streamer", "UNAVAILABLE", "unloaded")]
    assert (seen["ready_after_unload"], seen["ready_unknown"]) == (False, False)
    assert seen["ready_after_load"] is True
    config = seen["config"]
    assert config["instance_group"] == [{"name": "counter", "kind": "KIND_CPU", "count": 3}]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": "2000" if grpc else 2000}
    assert seen["bad_config"].startswith("parameters.config is not valid JSON: ")
    assert seen["bad_field"].startswith(
        "model 'counter': parameters.config: cannot set implementation (settable: "
    )
    description = await both.engine.describe("counter")
    assert (description.workers, len(description.replicas)) == (3, 3)


async def test_repository_routes_over_raw_http(launch: Launch) -> None:
    both = await launch(grpc_port=0, allow_load_overrides=("note",))  # the operator lets 'note' be set
    async with httpx.AsyncClient(base_url=str(both.http_url), timeout=TIMEOUT) as client:
        index = (await client.post("/v2/repository/index", json={"ready": True})).json()
        assert [m["name"] for m in index] == [
            "accumulator",
            "counter",
            "failing",
            "gate",
            "identity",
            "streamer",
        ]
        before = (await client.get("/v2/repository/models/accumulator")).json()
        body = {"parameters": {"config": {"sequence": {"max_queue": 3}, "parameters": {"note": "x"}}}}
        assert (await client.post("/v2/repository/models/accumulator/load", json=body)).json() == {}
        described = (await client.get("/v2/repository/models/accumulator")).json()
        assert before["max_queue"] != 3
        assert (described["max_queue"], described["idle_timeout_ms"]) == (
            3,
            before["idle_timeout_ms"],
        )  # merged
        files = {"parameters": {"file:1/model.py": "eA=="}}
        refused = await client.post("/v2/repository/models/accumulator/load", json=files)
        assert (refused.status_code, refused.json()) == (
            400,
            {"error": "loading model files from the request (file:1/model.py) is not supported"},
        )
        not_object = await client.post(
            "/v2/repository/models/accumulator/load", json={"parameters": {"config": [1]}}
        )
        assert not_object.json() == {
            "error": "parameters.config must be a JSON object of model-settings.json fields"
        }
        unload = await client.post(
            "/v2/repository/models/gate/unload", json={"parameters": {"unload_dependents": True}}
        )
        assert (unload.status_code, unload.json()) == (200, {})
        assert (
            row("gate", "UNAVAILABLE", "unloaded")
            in (await client.post("/v2/repository/index", json={})).json()
        )
        assert (await client.get("/v2/models/identity/ready")).status_code == 200  # the others still serve


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_config_and_statistics_through_tritonclient(both: Server, protocol: str) -> None:
    async with httpx.AsyncClient(base_url=str(both.http_url), timeout=TIMEOUT) as client:
        for n in (1, 2, 3):
            assert (await client.post("/v2/models/counter/infer", json=counter_body(n))).status_code == 200
        bad_n = await client.post("/v2/models/counter/infer", json=counter_body(0))  # begin refuses n < 1
        assert bad_n.status_code == 400

    def scenario() -> tuple[Any, Any, Any]:
        c = http_client(both) if protocol == "http" else grpc_client(both)
        if protocol == "http":
            return (
                c.get_model_config("accumulator"),
                c.get_inference_statistics("counter"),
                c.get_inference_statistics(),
            )
        return (
            c.get_model_config("accumulator", as_json=True)["config"],
            c.get_inference_statistics("counter", as_json=True),
            c.get_inference_statistics(as_json=True),
        )

    config, stats, every = await in_thread(scenario)
    grpc = protocol == "grpc"

    def num(value: int) -> Any:
        return str(value) if grpc else value  # protobuf's JSON writes 64-bit integers as strings

    assert config["name"] == "accumulator"
    assert config["backend"] == "actorserve"
    assert config["input"] == [
        {"name": "INPUT", "data_type": "TYPE_INT64", "dims": [num(1)] if grpc else [1]}
    ]
    assert config["instance_group"] == [{"name": "accumulator", "kind": "KIND_CPU", "count": 1}]
    assert config["sequence_batching"] == {
        "max_sequence_idle_microseconds": num(600_000_000),
        "iterative_sequence": True,
    }
    (model,) = stats["model_stats"]
    assert (model["name"], model["version"]) == ("counter", "1")
    inference = model["inference_stats"]
    assert inference["success"]["count"] == num(3)
    assert inference["fail"]["count"] == num(1)  # n=0, refused by the model's begin
    assert inference["queue"]["count"] == num(3)
    assert int(model["inference_count"]) == 1 + 2 + 3  # one per item per step
    assert int(inference["compute_infer"]["count"]) == int(model["execution_count"]) >= 3
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in model["batch_stats"]}
    assert sum(size * count for size, count in sizes.items()) == 6
    assert int(model["last_inference"]) > 1_700_000_000_000
    assert [m["name"] for m in every["model_stats"]] == [
        "accumulator",
        "counter",
        "failing",
        "gate",
        "identity",
        "streamer",
    ]


async def test_config_and_stats_over_raw_http(both: Server) -> None:
    async with httpx.AsyncClient(base_url=str(both.http_url), timeout=TIMEOUT) as client:
        config = (await client.get("/v2/models/identity/versions/1/config")).json()
        assert config == {
            "name": "identity",
            "platform": config["platform"],
            "backend": "actorserve",
            "max_batch_size": 0,
            "input": config["input"],
            "output": config["output"],
            "instance_group": [{"name": "identity", "kind": "KIND_CPU", "count": 1}],
        }
        stats = (await client.get("/v2/models/identity/versions/1/stats")).json()
        assert stats["model_stats"][0]["inference_stats"]["success"] == {"count": 0, "ns": 0}
        missing = await client.get("/v2/models/nope/config")
        assert (missing.status_code, missing.json()) == (404, {"error": "model 'nope' is not loaded"})
        wrong = await client.get("/v2/models/identity/versions/7/stats")
        assert (wrong.status_code, wrong.json()) == (404, {"error": "model 'identity' has no version '7'"})
