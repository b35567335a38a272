"""``python -m actorserve --api-workers 2 <model store>``: TorchServe archives in the store
are served, and its REST and gRPC doors work through the engine process (sequences
across fronts, a streaming handler chunked, registration at run time)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from support.servers import ServerProcess, start_server

import actorserve.models

MakeArchive = Any
STARTUP_TIMEOUT = 60.0


@pytest.fixture
def cluster(store: Path, make_archive: MakeArchive) -> Iterator[tuple[ServerProcess, str, str]]:
    shutil.copytree(Path(actorserve.models.__file__).parent / "ts_stateful", store / "ts_stateful")
    make_archive("streaming", "streaming_handler.py", "handler:\n  prefix: 'v2-'\n", version="2.0")
    (store / "streaming.mar").rename(
        store.parent / "streaming-2.mar"
    )  # its version 2.0, registered at run time
    make_archive("streaming", "streaming_handler.py", "handler:\n  prefix: 'm-'\n")
    make_archive("later", "streaming_handler.py", "handler:\n  prefix: 'l-'\n")
    (store / "later.mar").rename(store.parent / "later.mar")  # registered at run time
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        "2",
        "--no-auth",
        "--allow-load-overrides",
        "url",
        str(store),
    )  # later.mar: outside the store
    try:
        server.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc_address = re.search(r"gRPC listening on (\S+:\d+)", server.text())
        assert grpc_address is not None, server.text()
        yield server, http_url, grpc_address[1]
    finally:
        server.stop()


def test_torchserve_doors_through_the_engine_process(
    cluster: tuple[ServerProcess, str, str], store: Path, pb: Any
) -> None:
    _, http_url, grpc_address = cluster
    header = "ts_request_sequence_id"
    with httpx.Client(base_url=http_url, timeout=20) as client:
        assert client.get("/ping").json() == {"status": "Healthy"}
        first = client.post("/predictions/ts_stateful", content=b"2")
        sequence_id = first.headers[header]
        total = 2
        for value in (4, 6, 8, 10):  # a new connection each time: any front serves it
            with httpx.Client(base_url=http_url, timeout=20) as other:
                reply = other.post(
                    "/predictions/ts_stateful", content=str(value).encode(), headers={header: sequence_id}
                )
            total += value
            assert reply.text == str(total)
        with client.stream("POST", "/predictions/streaming", content=b"z") as stream:
            assert list(stream.iter_raw()) == [b"m-z:0", b"m-z:1", b"m-z:2", b"m-z:done"]
        scaled = client.put("/models/streaming", params={"min_worker": "2"})  # across the engine link
        assert scaled.json() == {"status": "Workers scaled to 2 for model: streaming"}
        assert len(client.get("/models/streaming").json()[0]["workers"]) == 2
        registered = client.post("/models", params={"url": str(store.parent / "later.mar")})
        assert registered.status_code == 200, registered.text
        two = client.post("/models", params={"url": str(store.parent / "streaming-2.mar")})
        assert two.json() == {"status": 'Model "streaming" Version: 2.0 registered with 1 initial workers'}
        # 1.0, registered first, stays the default on every front
        assert [d["modelVersion"] for d in client.get("/models/streaming").json()] == ["1.0"]
        assert client.post("/predictions/streaming", content=b"d").text == "m-d:0m-d:1m-d:2m-d:done"
        assert client.post("/predictions/streaming/2.0", content=b"d").text == "v2-d:0v2-d:1v2-d:2v2-d:done"
        missing = client.post("/predictions/streaming/9", content=b"d").json()["message"]
        assert missing == "Model version: 9 does not exist for model: streaming"
        assert client.post("/predictions/nope", content=b"d").json()["message"] == "Model not found: nope"
        assert client.post("/predictions/later", content=b"a").text == "l-a:0l-a:1l-a:2l-a:done"
    with grpc.insecure_channel(grpc_address) as chan:
        stub = pb.inference_pb2_grpc.InferenceAPIsServiceStub(chan)
        request = pb.inference_pb2.PredictionsRequest(model_name="streaming", input={"data": b"g"})
        assert [r.prediction for r in stub.StreamPredictions(request)] == [
            b"m-g:0",
            b"m-g:1",
            b"m-g:2",
            b"m-g:done",
        ]
        assert stub.Predictions(request).prediction == b"m-g:0"  # unary: the first response, as TorchServe
        listed = pb.management_pb2_grpc.ManagementAPIsServiceStub(chan).ListModels(
            pb.management_pb2.ListModelsRequest()
        )
        assert '"later"' in listed.msg


def test_stream_predictions2_answers_keep_their_order_across_the_link(
    cluster: tuple[ServerProcess, str, str], pb: Any
) -> None:
    """Requests of a sequence sent at once over StreamPredictions2: their answers come
    back from the engine process together (one frame) and must still be written in
    request order (the running sums rise)."""
    _, _, grpc_address = cluster
    ids, count = ["a", "b", "c"], 40

    def feed() -> Iterator[Any]:
        for n in range(count):
            for sequence in ids:
                flags = {"ts_request_sequence_start": b"true"} if n == 0 else {}
                yield pb.inference_pb2.PredictionsRequest(
                    model_name="ts_stateful", sequence_id=sequence, input={"data": b"2", **flags}
                )

    with grpc.insecure_channel(grpc_address) as chan:
        stub = pb.inference_pb2_grpc.InferenceAPIsServiceStub(chan)
        answers = [(r.sequence_id, r.prediction) for r in stub.StreamPredictions2(feed(), timeout=60)]
    for sequence in ids:
        assert [int(p) for s, p in answers if s == sequence] == [2 * (k + 1) for k in range(count)], sequence
