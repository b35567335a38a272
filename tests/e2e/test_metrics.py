"""``GET /metrics`` of an embedded server (one process): exact values after a known set of
requests over REST and gRPC, parsed with prometheus-client's parser; and the example
Grafana dashboard names only metrics that exist. The multi-process shape is in
test_multiprocess_ops.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, CountingBatchModel, FailingModel, Launch
from support.scrape import names, parse, value

from actorserve import ModelSettings
from actorserve.models import builtin_settings
from actorserve.server.composition import Server
from actorserve.settings import SequenceSettings

ROOT = Path(__file__).resolve().parents[2]


def metrics_models() -> tuple[ModelSettings, ...]:
    builtin = {m.name: m for m in builtin_settings()}
    return (
        builtin["identity"],
        ModelSettings(name="counter", implementation=CountingBatchModel, max_batch_size=8),
        ModelSettings(
            name="accumulator",
            implementation=builtin["accumulator"].implementation,
            sequence=SequenceSettings(max_sequences=1),
        ),
        ModelSettings(name="failing", implementation=FailingModel),
    )


def identity_body() -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}


def add(value: int, **parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}],
        "parameters": parameters,
    }


async def known_requests(client: httpx.AsyncClient, grpc_target: str | None) -> None:
    """3 identity infers, 1 for a model that does not exist, a counter stream of 3
    responses, a sequence of 2 requests, a second sequence refused (max_sequences=1), a
    failing model, and (with gRPC) 2 identity infers over gRPC."""
    for _ in range(3):
        assert (await client.post("/v2/models/identity/infer", json=identity_body())).status_code == 200
    assert (await client.post("/v2/models/nope/infer", json=identity_body())).status_code == 404
    stream = await client.post("/v2/models/counter/infer_stream", json={"inputs": [], "parameters": {"n": 3}})
    assert (stream.status_code, stream.text.count("data: ")) == (200, 3)
    url = "/v2/models/accumulator/infer"
    assert (await client.post(url, json=add(1, sequence_id="m1", sequence_start=True))).status_code == 200
    refused = await client.post(url, json=add(1, sequence_id="m2", sequence_start=True))
    assert refused.status_code == 429, refused.text
    assert (await client.post(url, json=add(2, sequence_id="m1", sequence_end=True))).status_code == 200
    assert (await client.post("/v2/models/failing/infer", json={"inputs": []})).status_code == 500
    if grpc_target is not None:

        def over_grpc() -> None:
            with grpcclient.InferenceServerClient(grpc_target) as c:
                for _ in range(2):
                    one = grpcclient.InferInput("INPUT0", [1], "FP32")
                    one.set_data_from_numpy(np.array([1.0], dtype=np.float32))
                    c.infer("identity", [one])

        await trio.to_thread.run_sync(over_grpc)


def check_known_values(text: str) -> None:
    """What :func:`known_requests` leaves in the exposition (the same in both shapes)."""
    s = parse(text)

    def requests(model: str, version: str, transport: str, outcome: str) -> float:
        return value(
            s, "actorserve_requests_total", model=model, version=version, transport=transport, outcome=outcome
        )

    assert requests("identity", "1", "rest", "success") == 3
    assert requests("identity", "1", "grpc", "success") == 2
    assert requests("", "", "rest", "invalid") == 1  # the unknown model: no label from the client
    assert requests("counter", "1", "rest", "success") == 1
    assert requests("accumulator", "1", "rest", "success") == 2
    assert requests("accumulator", "", "rest", "overloaded") == 1
    assert requests("failing", "", "rest", "failed") == 1
    assert (
        value(s, "actorserve_request_duration_seconds_count", model="identity", version="1", transport="rest")
        == 3
    )
    assert (
        value(s, "actorserve_request_duration_seconds_count", model="identity", version="1", transport="grpc")
        == 2
    )
    # one stream of 3 responses: one first response, two gaps between responses
    stream = {"model": "counter", "version": "1", "transport": "rest"}
    assert value(s, "actorserve_time_to_first_response_seconds_count", **stream) == 1
    assert value(s, "actorserve_time_between_responses_seconds_count", **stream) == 2
    assert (
        value(
            s,
            "actorserve_time_to_first_response_seconds_count",
            model="identity",
            version="1",
            transport="rest",
        )
        == 0
    )
    # the engine: the counter stepped its one request 3 times, one item a step
    counter = {"model": "counter", "version": "1"}
    assert value(s, "actorserve_batch_size_count", **counter) == 3
    assert value(s, "actorserve_batch_size_sum", **counter) == 3
    assert value(s, "actorserve_step_duration_seconds_count", **counter) == 3
    assert value(s, "actorserve_queue_duration_seconds_count", **counter) == 1
    sequence = {"model": "accumulator", "version": "1"}
    assert value(s, "actorserve_sequences_started_total", **sequence) == 1
    assert value(s, "actorserve_sequences_ended_total", reason="ended", **sequence) == 1
    assert value(s, "actorserve_sequences_ended_total", reason="expired", **sequence) == 0
    assert value(s, "actorserve_sequences_open", **sequence) == 0
    assert value(s, "actorserve_rejected_requests_total", reason="max_sequences", **sequence) == 1
    assert value(s, "actorserve_rejected_requests_total", reason="mailbox_full", **sequence) == 0
    assert value(s, "actorserve_process_cpu_seconds_total") > 0
    assert value(s, "actorserve_process_resident_memory_bytes") > 10_000_000


@pytest.fixture
async def metrics_server(launch: Launch) -> Server:
    return await launch(models=metrics_models(), grpc_port=0)


async def scrape(client: httpx.AsyncClient) -> str:
    reply = await client.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return reply.text


async def test_metric_values_after_known_requests(metrics_server: Server) -> None:
    assert metrics_server.grpc_address is not None
    target = "{}:{}".format(*metrics_server.grpc_address)
    async with httpx.AsyncClient(base_url=str(metrics_server.http_url), timeout=TIMEOUT) as client:
        before = parse(await scrape(client))
        assert value(before, "actorserve_sequences_open", model="accumulator", version="1") == 0
        assert (
            value(
                before,
                "actorserve_requests_total",
                model="identity",
                version="1",
                transport="rest",
                outcome="success",
            )
            == 0
        )
        await known_requests(client, target)
        check_known_values(await scrape(client))
        # an open sequence shows, and ends with reason shutdown when the model unloads
        accumulate = "/v2/models/accumulator/infer"
        assert (
            await client.post(accumulate, json=add(1, sequence_id="m3", sequence_start=True))
        ).status_code == 200
        assert (
            value(parse(await scrape(client)), "actorserve_sequences_open", model="accumulator", version="1")
            == 1
        )
        await metrics_server.engine.unload("accumulator", grace=0)
        after = parse(await scrape(client))
    labels = {"model": "accumulator", "version": "1"}
    assert value(after, "actorserve_sequences_open", **labels) == 0
    assert value(after, "actorserve_sequences_ended_total", reason="shutdown", **labels) == 1


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 10
    return {name for expr in exprs for name in re.findall(r"\bactorserve_[a-z_]+", expr)}


async def test_every_dashboard_query_names_a_metric_that_exists(metrics_server: Server) -> None:
    async with httpx.AsyncClient(base_url=str(metrics_server.http_url), timeout=TIMEOUT) as client:
        await known_requests(client, None)
        exposed = names(parse(await scrape(client)))
    wanted = dashboard_metrics()
    assert wanted - exposed == set()
    documented = (ROOT / "docs" / "metrics.md").read_text()
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in exposed}
    assert {f for f in families if f"`{f}" not in documented} == set()  # every metric is documented


async def test_metrics_route_allows_only_get(metrics_server: Server) -> None:
    async with httpx.AsyncClient(base_url=str(metrics_server.http_url), timeout=TIMEOUT) as client:
        reply = await client.post("/metrics")
    assert (reply.status_code, reply.json()) == (405, {"error": "method POST is not allowed on /metrics"})


async def test_grpc_stream_requests_are_counted_each(metrics_server: Server) -> None:
    """Each request of a ModelStreamInfer call is one request: its first response and
    the gaps between its responses are recorded under transport grpc."""
    assert metrics_server.grpc_address is not None
    target = "{}:{}".format(*metrics_server.grpc_address)

    def scenario() -> list[Any]:
        errors: list[Any] = []
        with grpcclient.InferenceServerClient(target) as c:
            c.start_stream(callback=lambda result, error: errors.append(error))
            for _ in range(2):
                c.async_stream_infer("counter", [], parameters={"n": 4})
            c.async_stream_infer("nope", [])
            c.stop_stream()
        return errors

    errors = await trio.to_thread.run_sync(scenario)
    assert sorted(str(e.message()) if e is not None else "" for e in errors) == [""] * 8 + [
        "model 'nope' is not loaded"
    ]
    async with httpx.AsyncClient(base_url=str(metrics_server.http_url), timeout=TIMEOUT) as client:
        s = parse(await scrape(client))
    grpc = {"model": "counter", "version": "1", "transport": "grpc"}
    assert value(s, "actorserve_requests_total", outcome="success", **grpc) == 2
    assert value(s, "actorserve_time_to_first_response_seconds_count", **grpc) == 2
    assert value(s, "actorserve_time_between_responses_seconds_count", **grpc) == 6
    assert value(s, "actorserve_request_duration_seconds_count", **grpc) == 2
    assert (
        value(s, "actorserve_requests_total", model="", version="", transport="grpc", outcome="invalid") == 1
    )
