"""Bearer-token auth on a real server (one process; the multi-process shape is in
test_multiprocess_ops.py): every management route and RPC with no token, a wrong token
and the right one; --auth-inference, --auth-metrics, --no-auth; where tokens come from;
the generated token file."""

from __future__ import annotations

import logging
import os
import stat
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, Launch, rest_settings
from e2e.grpc_fixtures import in_asyncio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from tritonclient.utils import InferenceServerException

from actorserve.proto.actorserve.v1 import (
    DescribeModelRequest,
    ManagementStub,
    SetDefaultVersionRequest,
    SetWorkersRequest,
)
from actorserve.server.composition import Server, serve
from actorserve.server.tokens import read_tokens
from actorserve.settings import Settings, SettingsError
from actorserve.transport.auth import Guard, Scope
from actorserve.transport.grpc import TritonGrpc
from actorserve.transport.openai import OpenAIRoutes
from actorserve.transport.rest.management_routes import auth_scope as management_scope
from actorserve.transport.torchserve import TorchServeInference, TorchServeManagement
from actorserve.transport.torchserve.grpc_services import TorchServeGrpc

TOKEN = "s3cret-token-for-tests"
RIGHT = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-token"}
UNAUTHORIZED = (401, {"error": "unauthorized"}, "Bearer")

IDENTITY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}


def no_auth_header(reply: httpx.Response) -> tuple[int, Any, str | None]:
    return reply.status_code, reply.json(), reply.headers.get("www-authenticate")


async def secured(launch: Launch, **changes: Any) -> Server:
    return await launch(no_auth=False, token=TOKEN, grpc_port=0, **changes)


def grpc_status(call: Any) -> str:
    try:
        call()
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"
    return "OK"


# -- REST ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers", [{}, WRONG, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}]
)
async def test_management_routes_refuse_a_missing_or_wrong_token(
    launch: Launch, headers: dict[str, str]
) -> None:
    server = await secured(launch)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for path in (
            "/v2/repository/models/identity/load",
            "/v2/repository/models/identity/unload",
            "/v2/repository/models/identity/anything-added-later",  # by prefix, before routing
        ):
            assert no_auth_header(await client.post(path, headers=headers)) == UNAUTHORIZED, path
        assert (await client.get("/v2/models/identity/ready")).status_code == 200  # nothing was unloaded
        preflight = await client.options(
            "/v2/repository/models/identity/load"
        )  # a CORS preflight passes auth
        assert preflight.status_code == 405


async def test_management_routes_accept_the_right_token(launch: Launch) -> None:
    server = await secured(launch)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        unloaded = await client.post("/v2/repository/models/identity/unload", headers=RIGHT)
        assert (unloaded.status_code, unloaded.json()) == (200, {})
        assert (await client.get("/v2/models/identity/ready")).status_code == 404
        lower = {"authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive
        loaded = await client.post("/v2/repository/models/identity/load", headers=lower)
        assert (loaded.status_code, loaded.json()) == (200, {})
        unknown = await client.post("/v2/repository/models/identity/anything-added-later", headers=RIGHT)
        assert unknown.status_code == 404  # past auth, no such route


async def test_open_routes_need_no_token(launch: Launch) -> None:
    server = await secured(launch)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for path in (
            "/v2/health/live",
            "/v2/health/ready",
            "/v2",
            "/v2/models/identity",
            "/v2/models/identity/ready",
            "/v2/repository/index",
            "/metrics",
            "/v2/docs/dataplane.json",
            "/",
        ):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.post("/v2/repository/index", json={})).status_code == 200
        assert (await client.post("/v2/models/identity/infer", json=IDENTITY)).status_code == 200


async def test_auth_inference_guards_every_inference_route(launch: Launch) -> None:
    server = await secured(launch, auth_inference=True)
    routes = [
        ("POST", "/v2/models/identity/infer", IDENTITY),
        ("POST", "/v2/models/identity/versions/1/infer", IDENTITY),
        ("POST", "/v2/models/streamer/infer_stream", {"inputs": [], "parameters": {"n_tokens": 2}}),
        ("POST", "/v2/models/streamer/generate", {"text_input": "a", "parameters": {"n_tokens": 2}}),
        ("POST", "/v2/models/streamer/generate_stream", {"text_input": "a", "parameters": {"n_tokens": 2}}),
        ("GET", "/v2/models/streamer/generate_stream?text_input=a", None),
    ]
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for method, path, body in routes:
            for headers in ({}, WRONG):
                reply = await client.request(method, path, json=body, headers=headers)
                assert no_auth_header(reply) == UNAUTHORIZED, (path, headers)
            assert (await client.request(method, path, json=body, headers=RIGHT)).status_code == 200, path
        # metadata and health stay open
        assert (await client.get("/v2/models/identity")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200


async def test_auth_metrics_guards_metrics(launch: Launch) -> None:
    server = await secured(launch, auth_metrics=True)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        assert no_auth_header(await client.get("/metrics")) == UNAUTHORIZED
        assert no_auth_header(await client.get("/metrics", headers=WRONG)) == UNAUTHORIZED
        assert (await client.get("/metrics", headers=RIGHT)).status_code == 200
        assert (await client.post("/v2/models/identity/infer", json=IDENTITY)).status_code == 200


async def test_no_auth_opens_the_management_routes(launch: Launch) -> None:
    server = await launch(no_auth=True)
    assert server.settings.token_file is None  # nothing generated
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        assert (await client.post("/v2/repository/models/identity/unload")).status_code == 200


# -- gRPC ----------------------------------------------------------------------------------


async def test_repository_rpcs_with_no_wrong_and_right_token(launch: Launch) -> None:
    server = await secured(launch)
    assert server.grpc_address is not None
    target = "{}:{}".format(*server.grpc_address)

    def scenario() -> list[str]:
        with grpcclient.InferenceServerClient(target) as c:
            results = []
            for headers in (None, {"authorization": "Bearer nope"}):
                results.append(grpc_status(lambda h=headers: c.unload_model("identity", headers=h)))
                results.append(grpc_status(lambda h=headers: c.load_model("identity", headers=h)))
            right = {"authorization": f"Bearer {TOKEN}"}
            results.append(grpc_status(lambda: c.unload_model("identity", headers=right)))
            results.append(grpc_status(lambda: c.load_model("identity", headers=right)))
            results.append(grpc_status(lambda: c.get_model_repository_index()))  # open
            results.append(grpc_status(lambda: c.get_model_metadata("identity")))  # open
            return results

    unauthenticated = "StatusCode.UNAUTHENTICATED unauthorized"
    assert await trio.to_thread.run_sync(scenario) == [unauthenticated] * 4 + ["OK"] * 4


async def test_auth_inference_guards_model_infer_and_stream_infer(launch: Launch) -> None:
    server = await secured(launch, auth_inference=True)
    assert server.grpc_address is not None
    target = "{}:{}".format(*server.grpc_address)

    def infer(c: grpcclient.InferenceServerClient, headers: dict[str, str] | None) -> None:
        one = grpcclient.InferInput("INPUT0", [1], "FP32")
        one.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        c.infer("identity", [one], headers=headers)

    def stream(c: grpcclient.InferenceServerClient, headers: dict[str, str] | None) -> str:
        results: list[Any] = []
        c.start_stream(callback=lambda result, error: results.append(error), headers=headers)
        one = grpcclient.InferInput("INPUT0", [1], "FP32")
        one.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        try:
            c.async_stream_infer("identity", [one])
        except InferenceServerException:
            pass  # the call already failed: the callback has the status
        c.stop_stream()
        (error,) = results
        return "OK" if error is None else f"{error.status()} {error.message()}"

    def scenario() -> list[str]:
        right = {"authorization": f"Bearer {TOKEN}"}
        with grpcclient.InferenceServerClient(target) as c:
            return [
                grpc_status(lambda: infer(c, None)),
                grpc_status(lambda: infer(c, {"authorization": "Bearer nope"})),
                grpc_status(lambda: infer(c, right)),
                stream(c, None),
                stream(c, right),
            ]

    assert await trio.to_thread.run_sync(scenario) == [
        "StatusCode.UNAUTHENTICATED unauthorized",
        "StatusCode.UNAUTHENTICATED unauthorized",
        "OK",
        "StatusCode.UNAUTHENTICATED unauthorized",
        "OK",
    ]


async def test_grpc_health_and_reflection_need_no_token(launch: Launch) -> None:
    # probes carry no token, as REST's /v2/health/* need none (docs/security.md)
    from e2e.test_grpc_probes import check, reflect
    from grpclib.reflection.v1 import reflection_pb2

    server = await secured(launch, auth_inference=True)
    assert server.grpc_address is not None
    target = "{}:{}".format(*server.grpc_address)

    def scenario() -> list[Any]:
        (listed,) = reflect(
            target, reflection_pb2, [reflection_pb2.ServerReflectionRequest(list_services="")]
        )
        return [check(target, ""), check(target, "identity"), len(listed.list_services_response.service)]

    assert await trio.to_thread.run_sync(scenario) == ["SERVING", "SERVING", 7]


def test_the_guard_covers_management_services_by_name() -> None:
    # gRPC: each door says which of its methods are in which scope, the guard which scopes need a token
    guard = Guard([TOKEN])
    assert TritonGrpc.auth_scope("/actorserve.v1.Management/SetWorkers") is Scope.MANAGEMENT
    assert TritonGrpc.auth_scope("/inference.GRPCInferenceService/RepositoryModelLoad") is Scope.MANAGEMENT
    assert TritonGrpc.auth_scope("/inference.GRPCInferenceService/RepositoryIndex") is None
    assert guard.needs(TritonGrpc.auth_scope("/inference.GRPCInferenceService/ModelInfer")) is None
    assert management_scope("/v2/repository/models/m/versions/2/default") is Scope.MANAGEMENT
    assert management_scope("/v2/repository/index") is None
    assert (
        Guard([TOKEN], inference=True).needs(
            TritonGrpc.auth_scope("/inference.GRPCInferenceService/ModelStreamInfer")
        )
        is Scope.INFERENCE
    )
    assert Guard([TOKEN], management=False).needs(Scope.MANAGEMENT) is None
    openai = Guard([TOKEN], inference=True)
    # REST: each door says which of its paths are in which scope, after its own normalisation
    assert OpenAIRoutes.auth_scope("/v1/chat/completions") is Scope.INFERENCE
    assert OpenAIRoutes.auth_scope("/v1/completions/") is Scope.INFERENCE  # the door ignores the slash
    assert OpenAIRoutes.auth_scope("/v1/models") is None
    assert openai.needs(Scope.INFERENCE) is Scope.INFERENCE and guard.needs(Scope.INFERENCE) is None
    assert guard.needs(Scope.MANAGEMENT) is Scope.MANAGEMENT and guard.needs(None) is None
    # TorchServe's APIs
    assert TorchServeManagement.auth_scope("/models") is Scope.MANAGEMENT
    assert TorchServeManagement.auth_scope("/models/m/1.0") is Scope.MANAGEMENT
    assert TorchServeManagement.auth_scope("/modelsx") is None
    assert TorchServeInference.auth_scope("/predictions/m/1.0") is Scope.INFERENCE
    assert TorchServeInference.auth_scope("/predictions/m/") is Scope.INFERENCE
    assert TorchServeInference.auth_scope("/ping") is None
    ts_management = "/org.pytorch.serve.grpc.management.ManagementAPIsService/ScaleWorker"
    ts_inference = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/"
    assert guard.needs(TorchServeGrpc.auth_scope(ts_management)) is Scope.MANAGEMENT
    assert openai.needs(TorchServeGrpc.auth_scope(ts_inference + "Predictions")) is Scope.INFERENCE
    assert openai.needs(TorchServeGrpc.auth_scope(ts_inference + "StreamPredictions2")) is Scope.INFERENCE
    assert TorchServeGrpc.auth_scope(ts_inference + "Ping") is None
    assert not guard.allows(None) and not guard.allows("Bearer") and not guard.allows("Bearer é")
    assert guard.allows(f"Bearer {TOKEN}") and guard.allows(f"  bearer   {TOKEN} ".encode())


# -- where tokens come from ------------------------------------------------------------------


def test_token_file_holds_several_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# the operators\nfirst-token\n\n  second-token  \nreader inference\nboss management\n")
    assert read_tokens(Settings(token_file=str(path), token="from-env")) == (
        ("from-env", Scope.MANAGEMENT),
        ("first-token", Scope.MANAGEMENT),
        ("second-token", Scope.MANAGEMENT),
        ("reader", Scope.INFERENCE),
        ("boss", Scope.MANAGEMENT),
    )
    for bad in ("zq9 admin\n", "zq9 inference extra\n"):
        (tmp_path / "bad").write_text(bad)
        with pytest.raises(SettingsError, match="a line is '<token>' or '<token> <scope>'") as refused:
            read_tokens(Settings(token_file=str(tmp_path / "bad")))
        assert "zq9" not in str(refused.value)  # never echoes a token
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(SettingsError, match="no token in it"):
        read_tokens(Settings(token_file=str(tmp_path / "empty")))
    with pytest.raises(SettingsError, match="cannot read"):
        read_tokens(Settings(token_file=str(tmp_path / "missing")))


async def test_every_token_of_the_file_is_accepted(launch: Launch, tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("one\ntwo\n")
    server = await launch(no_auth=False, token_file=str(path))
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for token in ("one", "two"):
            reply = await client.post(
                "/v2/repository/models/identity/unload", headers={"Authorization": f"Bearer {token}"}
            )
            assert (
                reply.status_code == 404 if token == "two" else reply.status_code == 200
            )  # unloaded by "one"
        assert (await client.post("/v2/repository/models/identity/load", headers=WRONG)).status_code == 401


async def test_a_generated_token_is_in_a_private_file_that_goes_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "actorserve.server.tokens")
    settings = rest_settings(no_auth=False)
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(partial(serve, settings))
        assert server.settings.token_file is not None
        path = trio.Path(server.settings.token_file)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        token = (await path.read_text()).strip()
        assert str(path) in caplog.text and token not in caplog.text
        async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
            headers = {"Authorization": f"Bearer {token}"}
            assert (
                await client.post("/v2/repository/models/identity/unload", headers=headers)
            ).status_code == 200
        server.shutdown()
    assert not await path.exists() and not await path.parent.exists()


# -- the management API beyond the OIP (docs/management.md) -----------------------------------


async def test_every_management_route_of_the_repository_api(launch: Launch) -> None:
    server = await secured(launch)
    routes = [
        ("GET", "/v2/repository/models/identity", None),
        ("GET", "/v2/repository/models/identity/versions/1", None),
        ("POST", "/v2/repository/models/identity/workers", {"workers": 1}),
        ("POST", "/v2/repository/models/identity/versions/1/workers", {"workers": 1}),
        ("POST", "/v2/repository/models/identity/default_version", {"version": "1"}),
        ("POST", "/v2/repository/models/identity/unload", None),
        ("POST", "/v2/repository/models/identity/load", None),
    ]
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for method, path, body in routes:
            for headers in ({}, WRONG):
                reply = await client.request(method, path, json=body, headers=headers)
                assert no_auth_header(reply) == UNAUTHORIZED, (path, headers)
            reply = await client.request(method, path, json=body, headers=RIGHT)
            assert reply.status_code == 200, (path, reply.text)
        # Triton's config and statistics are metadata: open
        for path in ("/v2/models/identity/config", "/v2/models/identity/stats", "/v2/models/stats"):
            assert (await client.get(path)).status_code == 200, path


async def test_every_rpc_of_the_management_service(launch: Launch) -> None:
    server = await secured(launch)
    assert server.grpc_address is not None
    host, port = server.grpc_address

    async def calls(metadata: dict[str, str] | None) -> list[str]:
        channel = Channel(host, port)
        try:
            stub = ManagementStub(channel)
            requests = [
                (stub.describe_model, DescribeModelRequest(name="identity")),
                (stub.set_workers, SetWorkersRequest(name="identity", workers=1)),
                (stub.set_default_version, SetDefaultVersionRequest(name="identity", version="1")),
            ]
            out = []
            for call, request in requests:
                try:
                    await call(request, metadata=metadata)
                    out.append("OK")
                except GRPCError as exc:
                    out.append(f"{exc.status.name} {exc.message}")
            return out
        finally:
            channel.close()

    assert await in_asyncio(partial(calls, None)) == ["UNAUTHENTICATED unauthorized"] * 3
    assert (
        await in_asyncio(partial(calls, {"authorization": "Bearer nope"}))
        == ["UNAUTHENTICATED unauthorized"] * 3
    )
    assert await in_asyncio(partial(calls, {"authorization": f"Bearer {TOKEN}"})) == ["OK"] * 3
