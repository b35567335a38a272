"""Issue 33, section 2: a TorchServe model seen through the other doors. A handler that
fails was answered HTTP 200 over OIP, its ``ts_status: 503`` buried in the response
parameters (the playground showed "done"); the status must be the HTTP / gRPC status on
every door. And TorchServe's describe said ``"loadedAtStartup": false`` for every model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from actorserve.torchserve import archive_settings

Launch = Any

HANDLER = (
    "def handle(data, context):\n"
    "    if data is None:\n        return None\n"
    "    body = data[0].get('body')\n"
    "    if body == b'four':\n"
    "        context.set_response_status(404, 'no such thing')\n"
    "        return ['missing']\n"
    "    if body == b'fine':\n        return ['ok']\n"
    "    raise ValueError('no')\n"
)


def handler_folder(folder: Path, name: str) -> Path:
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": name, "handler": "h.py"}})
    )
    (folder / "h.py").write_text(HANDLER)
    return folder


def oip(body: str) -> dict[str, Any]:
    return {"inputs": [{"name": "body", "shape": [1], "datatype": "BYTES", "data": [body]}]}


def grpc_infer(address: str, body: bytes) -> str:
    """The gRPC status of ModelInfer (``OK`` and the body when it answered)."""
    client = grpcclient.InferenceServerClient(address)
    try:
        data = grpcclient.InferInput("body", [1], "BYTES")
        data.set_data_from_numpy(np.array([body], dtype=object))
        result = client.infer("broken", [data])
        return f"OK {result.as_numpy('body')!r}"
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"
    finally:
        client.close()


async def test_a_failing_handler_is_an_error_status_on_every_door(tmp_path: Path, launch: Launch) -> None:
    server = await launch(archive_settings(handler_folder(tmp_path / "broken", "broken")))
    failed = "model 'broken': the handler answered 503: Prediction failed"
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        fine = await client.post("/v2/models/broken/infer", json=oip("fine"))
        assert fine.status_code == 200, fine.text
        for route in ("infer", "generate"):  # the playground's raw OIP mode posts to these
            reply = await client.post(f"/v2/models/broken/{route}", json=oip("x"))
            assert (reply.status_code, reply.json()) == (500, {"error": failed}), route
        missing = await client.post("/v2/models/broken/infer", json=oip("four"))
        assert (missing.status_code, missing.json()) == (
            400,
            {"error": "model 'broken': the handler answered 404: no such thing"},
        )
        # a stream that fails before its first event is answered as one error
        streamed = await client.post("/v2/models/broken/infer_stream", json=oip("x"))
        assert (streamed.status_code, streamed.json()) == (500, {"error": failed})
        # TorchServe's own door answers as TorchServe does
        ts = await client.post("/predictions/broken", content=b"x")
        assert (ts.status_code, ts.json()["message"]) == (503, "Prediction failed")
        ts_missing = await client.post("/predictions/broken", content=b"four")
        assert (ts_missing.status_code, ts_missing.json()["message"]) == (404, "no such thing")
    assert server.grpc_address is not None
    address = "{}:{}".format(*server.grpc_address)
    assert await trio.to_thread.run_sync(grpc_infer, address, b"fine") == "OK array([b'ok'], dtype=object)"
    assert await trio.to_thread.run_sync(grpc_infer, address, b"x") == f"StatusCode.INTERNAL {failed}"


async def test_describe_says_which_models_were_loaded_at_startup(
    tmp_path: Path, store: Path, launch: Launch
) -> None:
    server = await launch(archive_settings(handler_folder(tmp_path / "broken", "broken")))
    handler_folder(store / "later", "later")
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        registered = await client.post("/models", params={"url": "later"})
        assert registered.status_code == 200, registered.text
        for name, expected in (("broken", True), ("ts_stateful", True), ("later", False)):
            described = (await client.get(f"/models/{name}")).json()
            assert [d["loadedAtStartup"] for d in described] == [expected], name
        oip_described = (await client.get("/v2/repository/models/later")).json()
        assert oip_described["loaded_at_startup"] is False
