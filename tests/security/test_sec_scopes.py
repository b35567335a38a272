"""Issue 30, finding 1: tokens have a scope. An inference token (``<token> inference`` in a
token file, ``ACTORSERVE_INFERENCE_TOKEN``) may infer on every door, never load, unload,
register or scale: a management route answers it 403 (gRPC PERMISSION_DENIED) on every
door and port, OIP REST, TorchServe REST (main and management port), Triton gRPC,
TorchServe gRPC and actorserve.v1.Management; a management token may do both. Real
servers on 127.0.0.1 port 0, both process shapes."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from e2e.conftest import rest_models
from support.servers import start_server
from tritonclient.utils import InferenceServerException

from actorserve.models import builtin_settings
from actorserve.proto.actorserve.v1 import ModelDescription, SetWorkersRequest
from actorserve.proto.torchserve.org.pytorch.serve.grpc import inference as ts_inference
from actorserve.proto.torchserve.org.pytorch.serve.grpc import management as ts_management
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings
from actorserve.transport.auth import FORBIDDEN

T = TypeVar("T")
TIMEOUT = 30.0
BOSS, READER = "management-token-for-tests", "inference-token-for-tests"
FORBIDDEN_REPLY = (403, {"error": FORBIDDEN})
IDENTITY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def in_thread(fn: Callable[[], T]) -> T:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


@pytest.fixture
async def scoped(nursery: trio.Nursery, tmp_path: Path) -> Server:
    """Every door and port, inference and metrics guarded, the tokens from a token file
    (a management one) and the settings (an inference one)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the operator\n{BOSS}\n")
    ts_stateful = [m for m in builtin_settings() if m.name == "ts_stateful"]
    settings = Settings(
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
        ts_inference_grpc_port=0,
        ts_management_grpc_port=0,
        ts_management_http_port=0,
        models=(*rest_models(), *ts_stateful),
        token_file=str(tokens),
        inference_token=READER,
        auth_inference=True,
        auth_metrics=True,
    )
    server: Server = await nursery.start(partial(serve, settings))
    return server


async def test_rest_management_routes_refuse_an_inference_token(scoped: Server) -> None:
    management_port = "http://{}:{}".format(*scoped.extra_addresses["ts_management_http"])
    async with httpx.AsyncClient(base_url=str(scoped.http_url), timeout=TIMEOUT) as client:
        for method, url in (
            ("POST", "/v2/repository/models/identity/load"),
            ("POST", "/v2/repository/models/identity/unload"),
            ("GET", "/v2/repository/models/identity"),
            ("POST", "/v2/repository/models/identity/workers"),
            ("POST", "/models?url=ts_stateful"),
            ("PUT", "/models/ts_stateful?min_worker=1"),
            ("DELETE", "/models/ts_stateful"),
            ("GET", "/models"),
            ("POST", f"{management_port}/models?url=ts_stateful"),
            ("DELETE", f"{management_port}/models/ts_stateful"),
        ):
            reply = await client.request(method, url, headers=bearer(READER))
            assert (reply.status_code, reply.json()) == FORBIDDEN_REPLY, (method, url, reply.text)
            assert "www-authenticate" not in reply.headers
        assert (await client.get("/v2/models/identity/ready")).status_code == 200  # nothing unloaded
        # it infers on every REST door, and reads the metrics
        infer = await client.post("/v2/models/identity/infer", json=IDENTITY, headers=bearer(READER))
        assert infer.status_code == 200, infer.text
        completion = {"model": "streamer", "prompt": "x", "max_tokens": 2}
        assert (
            await client.post("/v1/completions", json=completion, headers=bearer(READER))
        ).status_code == 200
        ts = await client.post("/predictions/ts_stateful", content=b"2", headers=bearer(READER))
        assert (ts.status_code, ts.text) == (200, "2")
        assert (await client.get("/metrics", headers=bearer(READER))).status_code == 200
        # a management token may do both
        infer = await client.post("/v2/models/identity/infer", json=IDENTITY, headers=bearer(BOSS))
        assert infer.status_code == 200
        unload = await client.post("/v2/repository/models/identity/unload", headers=bearer(BOSS))
        assert unload.status_code == 200


def ts_call(address: tuple[str, int], method: str, request: Any, reply: Any, token: str) -> str:
    with grpc.insecure_channel("{}:{}".format(*address)) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=reply.parse)
        try:
            call(request, timeout=TIMEOUT, metadata=(("authorization", f"Bearer {token}"),))
        except grpc.RpcError as exc:
            return f"{exc.code().name} {exc.details()}"
        return "OK"


async def test_grpc_management_methods_refuse_an_inference_token(scoped: Server) -> None:
    assert scoped.grpc_address is not None
    main = scoped.grpc_address
    denied = f"PERMISSION_DENIED {FORBIDDEN}"

    def triton(token: str) -> list[str]:
        headers = {"authorization": f"Bearer {token}"}
        out = []
        with grpcclient.InferenceServerClient("{}:{}".format(*main)) as c:
            for call in (
                lambda: c.load_model("identity", headers=headers),
                lambda: c.unload_model("accumulator", headers=headers),
            ):
                try:
                    call()
                    out.append("OK")
                except InferenceServerException as exc:
                    out.append(f"{str(exc.status()).removeprefix('StatusCode.')} {exc.message()}")
            one = grpcclient.InferInput("INPUT0", [1], "FP32")
            one.set_data_from_numpy(np.array([1.0], dtype=np.float32))
            out.append(str(c.infer("identity", [one], headers=headers).as_numpy("OUTPUT0")))
        return out

    assert await in_thread(partial(triton, READER)) == [denied, denied, "[1.]"]
    management = "/org.pytorch.serve.grpc.management.ManagementAPIsService/"
    register = ts_management.RegisterModelRequest(url="ts_stateful", model_name="other")
    predict = ts_inference.PredictionsRequest(model_name="ts_stateful", input={"body": b"2"})
    workers = SetWorkersRequest(name="identity", workers=1)
    for address in (main, scoped.extra_addresses["ts_management_grpc"]):
        for method, request, reply in (
            (management + "RegisterModel", register, ts_management.ManagementResponse),
            (management + "ListModels", ts_management.ListModelsRequest(), ts_management.ManagementResponse),
        ):
            assert await in_thread(partial(ts_call, address, method, request, reply, READER)) == denied
    set_workers = "/actorserve.v1.Management/SetWorkers"
    assert await in_thread(partial(ts_call, main, set_workers, workers, ModelDescription, READER)) == denied
    assert await in_thread(partial(ts_call, main, set_workers, workers, ModelDescription, BOSS)) == "OK"
    predictions = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"
    for address in (main, scoped.extra_addresses["ts_inference_grpc"]):
        answer = partial(ts_call, address, predictions, predict, ts_inference.PredictionResponse, READER)
        assert await in_thread(answer) == "OK"
    assert await in_thread(partial(triton, BOSS)) == ["OK", "OK", "[1.]"]


def test_scopes_reach_the_front_processes(tmp_path: Path) -> None:
    """The multi-process shape: the parent hands each token to the fronts with its scope."""
    env = {**os.environ, "ACTORSERVE_TOKEN": BOSS, "ACTORSERVE_INFERENCE_TOKEN": READER}
    args = ("--http-port", "0", "--grpc-port", "off", "--api-workers", "1", "--auth-inference")
    server = start_server(*args, env=env)
    try:
        url = server.wait_for(r"processes: REST listening on (http://\S+)", 60)[1]
        with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
            load = client.post("/v2/repository/models/identity/load", headers=bearer(READER))
            assert (load.status_code, load.json()) == FORBIDDEN_REPLY
            assert client.post("/v2/repository/models/identity/load").status_code == 401
            infer = client.post("/v2/models/identity/infer", json=IDENTITY, headers=bearer(READER))
            assert infer.status_code == 200, infer.text
            assert client.post("/v2/repository/models/identity/load", headers=bearer(BOSS)).status_code == 200
    finally:
        server.stop()
    assert BOSS not in server.text() and READER not in server.text()
