"""Model faults through ``python -m actorserve --api-workers 2`` (an engine process and
two fronts): a gRPC stream (tritonclient) and SSE carrying requests of which some
raise, answer malformed output or hang past ``step_timeout``. Only those fail, each
with an error naming the model; the hung replica is replaced; the server keeps serving
and never exits."""

from __future__ import annotations

import json
import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from httpx_sse import connect_sse
from support import scrape
from support.servers import ServerProcess, start_server

STARTUP_TIMEOUT = 60.0
TIMEOUT = 20.0
STEP_TIMEOUT = 1.0
SUPPORT = Path(__file__).resolve().parents[1] / "support" / "rel_faults.py"


def fault_folder(root: Path, step_timeout: float) -> Path:
    """Model folders ``faulty`` (BatchModel, 2 replicas) and ``faulty_plain`` (Model),
    each with its own copy of tests/support/rel_faults.py as ``faults.py``."""
    models = {
        "faulty": {"implementation": "faults.FaultyBatchModel", "workers": 2},
        "faulty_plain": {"implementation": "faults.FaultyModel"},
    }
    for name, settings in models.items():
        folder = root / name
        folder.mkdir(parents=True)
        shutil.copy(SUPPORT, folder / "faults.py")
        data = {"name": name, "step_timeout": step_timeout, **settings}
        (folder / "model-settings.json").write_text(json.dumps(data))
    return root


class Cluster:
    def __init__(self, server: ServerProcess, http_url: str, grpc_target: str) -> None:
        self.server = server
        self.http_url = http_url
        self.grpc_target = grpc_target


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = fault_folder(tmp_path_factory.mktemp("models"), STEP_TIMEOUT)
    server = start_server("--http-port", "0", "--grpc-port", "0", "--api-workers", "2", str(folder))
    try:
        server.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc_target = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        yield Cluster(server, http_url, grpc_target)
    finally:
        server.stop()


def dummy() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("x", [1], "INT64")
    tensor.set_data_from_numpy(np.array([0], dtype=np.int64))
    return [tensor]


def stream(cluster: Cluster, model: str, requests: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    """Send every request on one gRPC stream; request id -> its results ("k" values, or
    the error's message), once each has ended (an error, or its last response)."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    out: dict[str, list[Any]] = {rid: [] for rid in requests}
    with grpcclient.InferenceServerClient(cluster.grpc_target) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for request_id, parameters in requests.items():
            client.async_stream_infer(model, dummy(), request_id=request_id, parameters=parameters)
        open_ = {rid: p.get("n", 2) for rid, p in requests.items()}
        deadline = time.monotonic() + TIMEOUT
        while open_:
            result, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                message = error.message()
                owner = next(rid for rid in open_ if rid in message or rid.startswith("x"))
                out[owner].append(message)
                del open_[owner]
                continue
            response = result.get_response()
            k = int(result.as_numpy("k")[0])
            out[response.id].append(k)
            if k == open_.get(response.id):
                del open_[response.id]
        client.stop_stream()
    return out


def test_grpc_stream_fails_only_the_faulty_requests_and_replaces_a_hung_replica(cluster: Cluster) -> None:
    requests = {f"good-{k}": {"n": 3} for k in range(4)}
    requests["raise-1"] = {"fault": "raise", "n": 3}
    got = stream(cluster, "faulty", requests)
    assert got.pop("raise-1") == ["model 'faulty' failed: RuntimeError: step broke on raise-1"]
    assert got == {f"good-{k}": [1, 2, 3] for k in range(4)}
    # malformed output in the middle of a request's stream (its id is not in the message)
    got = stream(cluster, "faulty", {"good": {"n": 3}, "x-dtype": {"fault": "dtype", "at": 2, "n": 3}})
    assert got["good"] == [1, 2, 3]
    assert got["x-dtype"] == [
        1,
        "model 'faulty' returned a malformed answer: output 'y': FP32 data has numpy dtype object (expected float32)",
    ]
    # a hang: only that request fails, at the deadline; the model goes on serving
    started = time.monotonic()
    got = stream(cluster, "faulty", {"x-hang": {"fault": "hang", "hang": 4, "n": 1}})
    assert got["x-hang"] == [
        f"model 'faulty': a step ran past its step_timeout of {STEP_TIMEOUT:g} s; "
        "the replica was declared hung and is being replaced"
    ]
    assert time.monotonic() - started < 3.5
    for _ in range(3):
        got = stream(cluster, "faulty", {f"after-{k}": {"n": 2} for k in range(6)})
        assert all(v == [1, 2] for v in got.values()), got
    with httpx.Client(base_url=cluster.http_url, timeout=TIMEOUT) as client:
        for k in range(4):
            reply = client.post(
                "/v2/models/faulty/infer", json={"id": f"u{k}", "inputs": [], "parameters": {"n": 1}}
            )
            assert reply.status_code == 200, reply.text
    cluster.server.wait_for(r"loading a replica in place of the hung one")
    # counted by the engine process, summed by the front that answers the scrape
    with httpx.Client(base_url=cluster.http_url, timeout=TIMEOUT) as client:
        samples = scrape.parse(client.get("/metrics").text)
    replaced = {
        reason: scrape.value(
            samples, "actorserve_replica_replacements_total", model="faulty", version="1", reason=reason
        )
        for reason in ("hung", "recycled")
    }
    assert replaced == {"hung": 1.0, "recycled": 0.0}
    assert cluster.server.process.poll() is None


def test_sse_through_a_front_ends_with_one_error_event_naming_the_model(cluster: Cluster) -> None:
    cases = {
        "faulty": (
            {"fault": "raise", "at": 3, "n": 5},
            "model 'faulty' failed: RuntimeError: step broke on s-faulty",
        ),
        "faulty_plain": (
            {"fault": "raise", "n": 2},
            "model 'faulty_plain' failed: RuntimeError: predict broke on s-faulty_plain",
        ),
    }
    with httpx.Client(base_url=cluster.http_url, timeout=TIMEOUT) as client:
        for model, (parameters, message) in cases.items():
            body = {"id": f"s-{model}", "inputs": [], "parameters": parameters}
            with connect_sse(client, "POST", f"/v2/models/{model}/infer_stream", json=body) as source:
                assert source.response.status_code == 200
                events = list(source.iter_sse())
            assert [e.event for e in events] == ["message", "message", "error"]
            assert json.loads(events[-1].data) == {"error": message, "status": 500}
            reply = client.post(f"/v2/models/{model}/infer", json={"inputs": [], "parameters": {"n": 1}})
            assert reply.status_code == 200, reply.text
        stats = client.get("/v2/models/faulty/stats").json()
        assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] >= 1
    assert cluster.server.process.poll() is None
