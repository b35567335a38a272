"""Metrics and auth in the multi-process shape (``--api-workers 2``): the numbers a scrape
shows are the server's (every front and the engine), whichever front answers it; one
generated token (a 0600 file whose path, never the token, is logged) works on every front,
over REST and gRPC; the parent removes the token file and the metrics folder on exit."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.scrape import parse, value
from support.servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

STARTUP_TIMEOUT = 60.0

MODELS = {
    "identity": {"implementation": "actorserve.models.identity.IdentityModel"},
    "streamer": {"implementation": "actorserve.models.streamer.StreamerModel"},
    "accumulator": {
        "implementation": "actorserve.models.accumulator.AccumulatorModel",
        "sequence": {"idle_timeout_ms": 600000, "max_sequences": 1},
    },
}


class Cluster:
    def __init__(self, server: ServerProcess, http_url: str, grpc_target: str, token_file: Path) -> None:
        self.server = server
        self.http_url = http_url
        self.grpc_target = grpc_target
        self.token_file = token_file

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.token_file.read_text().strip()}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    for name, settings in MODELS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    server = start_server(
        "--http-port", "0", "--grpc-port", "0", "--api-workers", "2", "--auth-metrics", str(tmp_path)
    )
    try:
        server.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc_target = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        token_file = Path(server.wait_for(r"management token generated: .* token in (\S+)")[1])
        yield Cluster(server, http_url, grpc_target, token_file)
    finally:
        server.stop()


def scrape(cluster: Cluster) -> str:
    """One scrape on a new connection (so either front may answer)."""
    with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
        reply = client.get("/metrics", headers=cluster.auth)
    assert reply.status_code == 200, reply.text
    return reply.text


def test_metrics_are_the_servers_whichever_front_answers(cluster: Cluster) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}
    for _ in range(20):  # a new connection each time: the kernel spreads them over the fronts
        with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
            assert client.post("/v2/models/identity/infer", json=body).status_code == 200
    with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
        stream = client.post(
            "/v2/models/streamer/infer_stream", json={"inputs": [], "parameters": {"n_tokens": 4}}
        )
        assert (stream.status_code, stream.text.count("data: ")) == (200, 4)
        add = {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [1]}]}
        url = "/v2/models/accumulator/infer"
        assert (
            client.post(
                url, json={**add, "parameters": {"sequence_id": "a", "sequence_start": True}}
            ).status_code
            == 200
        )
        refused = client.post(url, json={**add, "parameters": {"sequence_id": "b", "sequence_start": True}})
        assert refused.status_code == 429
    with grpcclient.InferenceServerClient(cluster.grpc_target) as c:
        one = grpcclient.InferInput("INPUT0", [1], "FP32")
        one.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        c.infer("identity", [one])
    scrapes = [parse(scrape(cluster)) for _ in range(6)]
    for s in scrapes:  # every scrape, whichever front answered, shows the same totals
        rest = {"model": "identity", "version": "1", "transport": "rest"}
        assert value(s, "actorserve_requests_total", outcome="success", **rest) == 20
        assert value(s, "actorserve_request_duration_seconds_count", **rest) == 20
        assert (
            value(
                s,
                "actorserve_requests_total",
                model="identity",
                version="1",
                transport="grpc",
                outcome="success",
            )
            == 1
        )
        streamer = {"model": "streamer", "version": "1", "transport": "rest"}
        assert value(s, "actorserve_time_to_first_response_seconds_count", **streamer) == 1
        assert value(s, "actorserve_time_between_responses_seconds_count", **streamer) == 3
        accumulator = {"model": "accumulator", "version": "1"}
        assert value(s, "actorserve_sequences_open", **accumulator) == 1  # from the engine process
        assert value(s, "actorserve_sequences_started_total", **accumulator) == 1
        assert value(s, "actorserve_rejected_requests_total", reason="max_sequences", **accumulator) == 1
        assert value(s, "actorserve_batch_size_count", **accumulator) == 1
        # the engine and the fronts that served a request (at least the one scraping)
        assert 2 <= value(s, "actorserve_processes") <= 3
        assert value(s, "actorserve_process_resident_memory_bytes") > 30_000_000


def test_one_generated_token_for_every_front_and_both_transports(cluster: Cluster) -> None:
    mode = stat.S_IMODE(os.stat(cluster.token_file).st_mode)
    assert mode == 0o600
    token = cluster.token_file.read_text().strip()
    assert len(token) >= 32 and token not in cluster.server.text()
    for _ in range(6):  # new connections: both fronts
        with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
            missing = client.post("/v2/repository/models/streamer/load")
            wrong = client.post(
                "/v2/repository/models/streamer/load", headers={"Authorization": "Bearer nope"}
            )
            metrics = client.get("/metrics")
            right = client.post("/v2/repository/models/streamer/load", headers=cluster.auth)
        for reply in (missing, wrong, metrics):
            assert (reply.status_code, reply.json(), reply.headers["www-authenticate"]) == (
                401,
                {"error": "unauthorized"},
                "Bearer",
            )
        assert (right.status_code, right.json()) == (200, {})
    with grpcclient.InferenceServerClient(cluster.grpc_target) as c:
        with pytest.raises(InferenceServerException) as refused:
            c.unload_model("streamer")
        assert (str(refused.value.status()), refused.value.message()) == (
            "StatusCode.UNAUTHENTICATED",
            "unauthorized",
        )
        c.unload_model("streamer", headers={"authorization": cluster.auth["Authorization"]})
        assert c.is_model_ready("streamer") is False  # unloaded: false, as Triton answers


def test_the_parent_removes_the_token_file_and_the_metrics_folder(cluster: Cluster) -> None:
    engine_pid = int(cluster.server.wait_for(r"engine process started \(pid (\d+)\)")[1])
    environ = Path(f"/proc/{engine_pid}/environ").read_bytes().split(b"\0")
    (folder,) = [
        Path(v.split(b"=", 1)[1].decode()) for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
    ]
    scrape(cluster)
    assert cluster.token_file.exists() and any(folder.glob("*.db"))
    cluster.server.stop()
    assert not folder.exists()
    assert cluster.server.process.returncode == 0
    assert not cluster.token_file.exists()
    assert not cluster.token_file.parent.exists()
