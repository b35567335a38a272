"""TorchServe's management API is management: its REST paths under ``/models`` and its
gRPC ``ManagementAPIsService`` need the bearer token (no token, a wrong one, the right
one); its inference (``/predictions``, ``Predictions``) only with --auth-inference, and
``/ping`` never (docs/security.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import trio

from actorserve.server.composition import Server
from actorserve.torchserve.archive import archive_settings

HANDLERS = Path(__file__).parent / "handlers"

TOKEN = "ts-token-for-tests"
HEADERS: list[dict[str, str]] = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {TOKEN}"}]


async def test_rest_management_paths_need_the_token(launch: Any) -> None:
    server: Server = await launch(no_auth=False, token=TOKEN)
    routes = [
        ("GET", "/models"),
        ("GET", "/models/ts_stateful"),
        ("PUT", "/models/ts_stateful?min_worker=1&synchronous=true"),
        ("POST", "/models?url=missing.mar"),
        ("DELETE", "/models/nope"),
        ("PUT", "/models/nope/1.0/set-default"),
    ]
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=20) as client:
        for method, path in routes:
            statuses = [(await client.request(method, path, headers=h)).status_code for h in HEADERS]
            assert statuses[:2] == [401, 401] and statuses[2] != 401, (method, path, statuses)
        assert (await client.get("/ping")).status_code == 200


async def test_grpc_management_service_needs_the_token(pb: SimpleNamespace, launch: Any) -> None:
    server: Server = await launch(no_auth=False, token=TOKEN, auth_inference=True)
    assert server.grpc_address is not None
    target = "{}:{}".format(*server.grpc_address)
    m = pb.management_pb2

    def scenario() -> list[str]:
        out = []
        with grpc.insecure_channel(target) as chan:
            stub = pb.management_pb2_grpc.ManagementAPIsServiceStub(chan)
            inference = pb.inference_pb2_grpc.InferenceAPIsServiceStub(chan)
            for headers in HEADERS:
                metadata = [(k.lower(), v) for k, v in headers.items()]
                calls = [
                    (stub.ListModels, m.ListModelsRequest()),
                    (stub.DescribeModel, m.DescribeModelRequest(model_name="ts_stateful")),
                    (inference.Predictions, pb.inference_pb2.PredictionsRequest(model_name="nope")),
                ]
                for call, request in calls:
                    try:
                        call(request, metadata=metadata)
                        out.append("OK")
                    except grpc.RpcError as exc:
                        out.append(exc.code().name)
            health = inference.Ping(pb.inference_pb2.google_dot_protobuf_dot_empty__pb2.Empty())
            out.append("ping " + ("OK" if health is not None else "?"))
        return out

    results = await trio.to_thread.run_sync(scenario)
    assert results[:6] == ["UNAUTHENTICATED"] * 6
    assert results[6:8] == ["OK", "OK"] and results[8] != "UNAUTHENTICATED"  # the right token: past auth
    assert results[9] == "ping OK"


async def test_a_handler_never_sees_the_clients_credentials(launch: Any, store: Path) -> None:
    """Issue 30, finding 7: the bearer token (and cookies, ...) stay in the front; the
    handler gets every other header."""
    folder = store / "headers"
    (folder / "MAR-INF").mkdir(parents=True)
    shutil.copy(HANDLERS / "headers_handler.py", folder / "headers_handler.py")
    manifest = {"runtime": "python", "model": {"modelName": "headers", "handler": "headers_handler.py"}}
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    server: Server = await launch(archive_settings(folder), no_auth=False, token=TOKEN, auth_inference=True)
    sent = {
        "Authorization": f"Bearer {TOKEN}",
        "Cookie": "session=secret",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "X-Api-Key": "secret",
        "X-Kept": "yes",
    }
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=20) as client:
        for path in ("/predictions/headers", "/predictions/headers/"):
            answer = await client.post(path, content=b"x", headers=sent)
            assert answer.status_code == 200, answer.text
            seen = set(json.loads(answer.text))
            assert "x-kept" in seen and "content-length" in seen
            assert not seen & {"authorization", "cookie", "proxy-authorization", "x-api-key"}, seen
