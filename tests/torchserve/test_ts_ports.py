"""TorchServe's extra ports (``--ts-inference-grpc-port``, ``--ts-management-grpc-port``,
``--ts-management-http-port``): each serves only its own API, behind the same token as
the main ports, in one process and with ``--api-workers 2``; off unless asked; a port in
use fails the start, naming it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
import trio
from support.servers import ROOT, ServerProcess, start_server

import actorserve.models
from actorserve.server.composition import Server
from actorserve.server.listeners import ListenError, open_listeners
from actorserve.settings import Settings

Launch = Any
TOKEN = "ts-ports-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
NOT_FOUND = {
    "code": 404,
    "type": "ResourceNotFoundException",
    "message": "Requested resource is not found, please refer to API document.",
}


def grpc_calls(pb: SimpleNamespace, inference_target: str, management_target: str) -> list[str]:
    """Every call TorchServe's client script makes on each service, on both extra ports:
    what each answered (a result, or the status name). Blocking: run it in a thread."""
    empty = pb.inference_pb2.google_dot_protobuf_dot_empty__pb2.Empty()
    predict = pb.inference_pb2.PredictionsRequest(model_name="ts_stateful", input={"data": b"4"})
    out: list[Any] = []
    for target in (inference_target, management_target):
        with grpc.insecure_channel(target) as chan:
            out += _each_call(pb, chan, empty, predict)
    return out


def _each_call(pb: SimpleNamespace, chan: grpc.Channel, empty: Any, predict: Any) -> list[Any]:
    inference = pb.inference_pb2_grpc.InferenceAPIsServiceStub(chan)
    management = pb.management_pb2_grpc.ManagementAPIsServiceStub(chan)
    listing = pb.management_pb2.ListModelsRequest()
    calls = [
        lambda: json.loads(inference.Ping(empty).health)["status"],
        lambda: inference.Predictions(predict).prediction.decode(),
        lambda: [r.prediction.decode() for r in inference.StreamPredictions(predict)],
        lambda: [
            m["modelName"]
            for m in json.loads(
                management.ListModels(listing, metadata=[("authorization", f"Bearer {TOKEN}")]).msg
            )["models"]
        ],
        lambda: chan.unary_unary("/inference.GRPCInferenceService/ServerLive")(
            b""
        ),  # Triton's: main port only
    ]
    out = []
    for call in calls:
        try:
            out.append(call())
        except grpc.RpcError as exc:
            out.append(exc.code().name)
    return out


#: inference port: TorchServe's inference service only; management port: its management only
EXPECTED_GRPC = [
    "Healthy",
    "4",
    ["4"],
    "UNIMPLEMENTED",
    "UNIMPLEMENTED",
    "UNIMPLEMENTED",
    "UNIMPLEMENTED",
    "UNIMPLEMENTED",
    ["ts_stateful"],
    "UNIMPLEMENTED",
]


def rest_calls(url: str) -> list[tuple[int, Any]]:
    """The management port: its paths with and without the token, /ping, and what it does
    not serve."""
    out = []
    requests = [
        ("GET", "/models", {}),
        ("GET", "/models", {"Authorization": "Bearer nope"}),
        ("GET", "/models", BEARER),
        ("GET", "/models/ts_stateful", {}),
        ("DELETE", "/models/nope", BEARER),
        ("GET", "/ping", {}),
        ("POST", "/predictions/ts_stateful", BEARER),
        ("GET", "/v2/health/live", {}),
        ("GET", "/metrics", BEARER),
    ]
    for method, path, headers in requests:
        # a connection each, as curl makes: a POST answered before its body arrived (the
        # 404) closes its connection, and a client reusing it would see the close
        with httpx.Client(base_url=url, timeout=20) as client:
            reply = client.request(method, path, headers=headers, content=b"2" if method == "POST" else None)
            body = reply.json()
            if isinstance(body, dict) and "models" in body:
                body = [m["modelName"] for m in body["models"]]
            out.append((reply.status_code, body))
    return out


EXPECTED_REST = [
    (401, {"error": "unauthorized"}),
    (401, {"error": "unauthorized"}),
    (200, ["ts_stateful"]),
    (401, {"error": "unauthorized"}),
    (404, {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}),
    (200, {"status": "Healthy"}),
    (404, NOT_FOUND),
    (404, NOT_FOUND),
    (404, NOT_FOUND),
]


def address(where: tuple[str, int]) -> str:
    return "{}:{}".format(*where)


async def test_in_process_extra_ports_serve_only_their_api(pb: SimpleNamespace, launch: Launch) -> None:
    server: Server = await launch(
        no_auth=False,
        token=TOKEN,
        ts_inference_grpc_port=0,
        ts_management_grpc_port=0,
        ts_management_http_port=0,
    )
    extra = server.extra_addresses
    assert set(extra) == {"ts_inference_grpc", "ts_management_grpc", "ts_management_http"}
    assert len({port for _, port in [*extra.values(), server.grpc_address, server.http_address]}) == 5  # type: ignore[misc]
    targets = address(extra["ts_inference_grpc"]), address(extra["ts_management_grpc"])
    assert await trio.to_thread.run_sync(grpc_calls, pb, *targets) == EXPECTED_GRPC
    # the main gRPC port keeps both services (and Triton's)
    assert server.grpc_address is not None
    main = await trio.to_thread.run_sync(
        grpc_calls, pb, address(server.grpc_address), address(server.grpc_address)
    )
    assert main[:4] == ["Healthy", "4", ["4"], ["ts_stateful"]] and main[4] != "UNIMPLEMENTED"
    url = "http://" + address(extra["ts_management_http"])
    assert await trio.to_thread.run_sync(rest_calls, url) == EXPECTED_REST
    async with httpx.AsyncClient(
        base_url=str(server.http_url), timeout=20
    ) as client:  # the main port still has both
        assert (await client.get("/models", headers=BEARER)).status_code == 200
        assert (await client.post("/predictions/ts_stateful", content=b"2")).text == "2"


async def test_extra_grpc_ports_without_the_main_one(pb: SimpleNamespace, launch: Launch) -> None:
    server: Server = await launch(grpc_port=None, ts_inference_grpc_port=0, ts_management_grpc_port=0)
    assert server.grpc_address is None
    targets = (
        address(server.extra_addresses["ts_inference_grpc"]),
        address(server.extra_addresses["ts_management_grpc"]),
    )
    assert await trio.to_thread.run_sync(grpc_calls, pb, *targets) == EXPECTED_GRPC


async def test_extra_ports_are_off_unless_asked(launch: Launch) -> None:
    server: Server = await launch()
    assert server.extra_addresses == {}
    assert Settings().ts_inference_grpc_port is None
    assert Settings().ts_management_grpc_port is None
    assert Settings().ts_management_http_port is None


@pytest.mark.parametrize(
    ("setting", "transport"),
    [
        ("ts_inference_grpc_port", "TorchServe inference gRPC"),
        ("ts_management_grpc_port", "TorchServe management gRPC"),
        ("ts_management_http_port", "TorchServe management REST"),
    ],
)
def test_an_extra_port_in_use_is_named(setting: str, transport: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as info:
            open_listeners(Settings(http_port=0, grpc_port=0, **{setting: port}))
    assert str(info.value) == f"cannot listen on 127.0.0.1:{port} ({transport}): address already in use"


def test_the_command_line_fails_before_any_child_starts_on_a_port_in_use() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORSERVE_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "actorserve",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--api-workers",
                "2",
                "--no-auth",
                "--ts-management-http-port",
                port,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=ROOT,
        )
    assert result.returncode == 1, result.stderr
    error = f"actorserve: error: cannot listen on 127.0.0.1:{port} (TorchServe management REST): address already in use"
    assert [line for line in result.stderr.splitlines() if "error" in line] == [error]
    assert "process started" not in result.stderr


@pytest.fixture
def fronts(store: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    shutil.copytree(Path(actorserve.models.__file__).parent / "ts_stateful", store / "ts_stateful")
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        "2",
        "--token-file",
        str(tokens),
        "--ts-inference-grpc-port",
        "0",
        "--ts-management-grpc-port",
        "0",
        "--ts-management-http-port",
        "0",
        str(store),
    )
    try:
        server.wait_for(r"serving with 2 front process", 60.0)
        yield server
    finally:
        server.stop()


def test_extra_ports_with_front_processes(fronts: ServerProcess, pb: SimpleNamespace) -> None:
    inference = fronts.wait_for(r"processes: TorchServe inference gRPC listening on (\S+:\d+)")[1]
    management = fronts.wait_for(r"processes: TorchServe management gRPC listening on (\S+:\d+)")[1]
    url = fronts.wait_for(r"processes: TorchServe management REST listening on (http://\S+)")[1]
    assert grpc_calls(pb, inference, management) == EXPECTED_GRPC
    assert rest_calls(url) == EXPECTED_REST
    # the fronts serve the extra ports on the sockets they inherited; the parent names each once
    assert len([line for line in fronts.log if "TorchServe inference gRPC listening" in line]) == 1
