"""The management API in the multi-process shape (``--api-workers 2``): every new
EngineAPI method crosses the engine link (describe, workers, default version, config,
statistics, load with an override, the index after an unload, repository polling),
over REST and gRPC, served by whichever front accepts the connection."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
from support.servers import ServerProcess, start_server

STARTUP_TIMEOUT = 60.0
IDENTITY = "actorserve.models.identity.IdentityModel"


def write_model(root: Path, name: str, settings: dict[str, object]) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    write_model(tmp_path, "accumulator", {"implementation": "actorserve.models.accumulator.AccumulatorModel"})
    write_model(tmp_path, "identity", {"implementation": IDENTITY})
    write_model(
        tmp_path,
        "identity2",
        {"name": "identity", "implementation": IDENTITY, "parameters": {"version": "2"}},
    )
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        "2",
        "--poll-repository",
        "0.1",
        "--no-auth",
        str(tmp_path),
    )
    try:
        server.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        yield server, http_url, grpc
    finally:
        server.stop()


def accumulate(client: httpx.Client, value: int, **sequence: object) -> httpx.Response:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT64", "data": [value]}],
        "parameters": sequence,
    }
    return client.post("/v2/models/accumulator/infer", json=body)


def test_management_across_the_engine_link(cluster: tuple[ServerProcess, str, str], tmp_path: Path) -> None:
    server, http_url, grpc = cluster
    with httpx.Client(base_url=http_url, timeout=30) as client:
        assert accumulate(client, 2, sequence_id="a", sequence_start=True).status_code == 200
        described = client.get("/v2/repository/models/accumulator").json()
        assert (described["workers"], described["open_sequences"], described["batched"]) == (1, 1, True)
        up = client.post("/v2/repository/models/accumulator/workers", json={"workers": 2}).json()
        assert (up["workers"], len(up["replicas"])) == (2, 2)
        assert accumulate(client, 3, sequence_id="b", sequence_start=True).status_code == 200  # on replica 1
        down = client.post(
            "/v2/repository/models/accumulator/workers", json={"workers": 1, "grace_period": 1}
        )
        assert (down.json()["workers"], down.json()["open_sequences"]) == (1, 1)
        gone = accumulate(client, 1, sequence_id="b")
        assert (gone.status_code, gone.json()) == (404, {"error": "sequence 'b' was shut down"})
        assert accumulate(client, 1, sequence_id="a").status_code == 200

        assert client.get("/v2/repository/models/identity").json()["default_version"] == "2"
        chosen = client.post("/v2/repository/models/identity/default_version", json={"version": "1"}).json()
        assert chosen["default_version"] == "1"
        config = client.get("/v2/models/accumulator/config").json()
        assert config["instance_group"] == [{"name": "accumulator", "kind": "KIND_CPU", "count": 1}]
        stats = client.get("/v2/models/accumulator/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 3
        assert stats["inference_stats"]["fail"]["count"] == 1
        override = {"parameters": {"config": json.dumps({"max_pending": 9})}}
        assert client.post("/v2/repository/models/identity/load", json=override).json() == {}
        assert client.get("/v2/repository/models/identity/versions/1").json()["max_pending"] == 9
        assert client.post("/v2/repository/models/accumulator/unload").json() == {}
        index = client.post("/v2/repository/index", json={}).json()
        assert {"name": "accumulator", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index

        grpc_client = grpcclient.InferenceServerClient(grpc)
        try:
            grpc_config = grpc_client.get_model_config("identity", as_json=True)["config"]
            grpc_stats = grpc_client.get_inference_statistics("identity", "1", as_json=True)["model_stats"]
        finally:
            grpc_client.close()
        assert grpc_config["name"] == "identity"
        assert [s["version"] for s in grpc_stats] == ["1"]

        write_model(tmp_path, "late", {"implementation": IDENTITY})  # --poll-repository 0.1
        deadline = time.monotonic() + 20
        while client.get("/v2/models/late/ready").status_code != 200:
            assert time.monotonic() < deadline, server.text()
            time.sleep(0.05)
