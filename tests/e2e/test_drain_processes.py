"""The scale-in drain (``--drain-timeout``) in the multi-process shape, under real
processes: on SIGTERM the parent has the engine drain; both fronts then answer not
ready, refuse new sequence starts (REST 503 + Retry-After, gRPC UNAVAILABLE) and serve
the open sequences to their end; then every process stops, long before the timeout."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

STARTUP_TIMEOUT = 60.0
URL = "/v2/models/accumulator/infer"
MODELS = {
    "identity": {"implementation": "actorserve.models.identity.IdentityModel"},
    "accumulator": {
        "implementation": "actorserve.models.accumulator.AccumulatorModel",
        "sequence": {"idle_timeout_ms": 600000},
    },
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    for name, settings in MODELS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    server = start_server(
        *("--http-port", "0", "--grpc-port", "0", "--api-workers", "2", "--no-auth"),
        *("--replica-id", "r-mp", "--drain-timeout", "60", str(tmp_path)),
    )
    try:
        server.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc_target = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        yield server, http_url, grpc_target
    finally:
        server.stop()


def add(value: int) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]}


def total(reply: httpx.Response) -> int:
    assert reply.status_code == 200, reply.text
    value: int = reply.json()["outputs"][0]["data"][0]
    return value


def grpc_add(client: grpcclient.InferenceServerClient, value: int, sid: str, **flags: bool) -> int:
    data = grpcclient.InferInput("INPUT", [1], "INT64")
    data.set_data_from_numpy(np.array([value], dtype=np.int64))
    result = client.infer("accumulator", [data], sequence_id=sid, **flags)
    return int(result.as_numpy("OUTPUT")[0])


def fresh(http_url: str) -> httpx.Client:
    """A client whose every request opens a new connection, so both fronts answer."""
    return httpx.Client(base_url=http_url, timeout=10, limits=httpx.Limits(max_keepalive_connections=0))


def until(predicate: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_sigterm_drains_the_open_sequences_across_the_fronts(cluster: tuple[ServerProcess, str, str]) -> None:
    server, http_url, grpc_target = cluster
    grpc = grpcclient.InferenceServerClient(grpc_target)
    with fresh(http_url) as client:
        opened = client.post(URL, json=add(1), headers={"sequence-start": "true"})
        sid = opened.headers["sequence-id"]
        assert total(opened) == 1
        assert grpc_add(grpc, 10, "g-1", sequence_start=True) == 10
        assert "actorserve_draining 0.0" in client.get("/metrics").text.splitlines()
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.wait_for(r"draining: the engine serves its open sequences for up to 60\.0 s")
        until(lambda: client.get("/v2/health/ready").status_code == 503)
        readiness = {client.get("/v2/health/ready").status_code for _ in range(6)}  # both fronts
        refused = [client.post(URL, json=add(1), headers={"sequence-start": "true"}) for _ in range(4)]
        with pytest.raises(InferenceServerException) as grpc_refused:
            grpc_add(grpc, 1, "g-2", sequence_start=True)
        grpc_ready = grpc.is_server_ready()
        plain = client.post("/v2/models/identity/infer", json=identity_body())
        scrape = client.get("/metrics").text.splitlines()
        steps = [total(client.post(URL, json=add(2), headers={"sequence-id": sid})) for _ in range(2)]
        grpc_steps = [grpc_add(grpc, 20, "g-1"), grpc_add(grpc, 30, "g-1", sequence_end=True)]
        assert server.process.poll() is None  # the REST sequence is still open: still serving
        last = client.post(URL, json=add(3), headers={"sequence-id": sid, "sequence-end": "true"})
        assert total(last) == 8
    grpc.close()
    assert server.process.wait(timeout=20) == 0
    assert time.monotonic() - started < 30  # the last end let it stop: not the 60 s timeout
    assert readiness == {503}
    for reply in refused:
        assert (reply.status_code, reply.headers["retry-after"], reply.json()) == (
            503,
            "1",
            {"error": "replica 'r-mp' is draining: start the sequence on another replica"},
        )
        assert reply.headers["actorserve-replica"] == "r-mp"
    assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"
    assert "is draining" in (grpc_refused.value.message() or "")
    assert grpc_ready is False and plain.status_code == 200
    assert "actorserve_draining 1.0" in scrape
    assert (steps, grpc_steps) == ([3, 5], [30, 60])


def identity_body() -> dict[str, Any]:
    tensors = [{"name": n, "datatype": "INT32", "shape": [1], "data": [1]} for n in ("INPUT0", "INPUT1")]
    return {"inputs": tensors}
