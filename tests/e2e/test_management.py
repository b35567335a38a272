"""Management beyond the OIP over a real server: describe a model, set its workers at
run time (REST and the ``actorserve.v1.Management`` gRPC service), set its default
version; and scaling 1 -> 3 -> 1 while 32 streams and 32 sequences run."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from e2e.conftest import TIMEOUT, Launch
from e2e.grpc_fixtures import in_asyncio
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from httpx_sse import aconnect_sse

from actorserve import InferenceRequest, InferenceResponse, Model, ModelSettings
from actorserve.models.identity import IdentityModel
from actorserve.proto.actorserve.v1 import (
    DescribeModelRequest,
    ManagementStub,
    SetDefaultVersionRequest,
    SetWorkersRequest,
)


def counter_body(n: int, **parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [0]}],
        "parameters": {"n": n, **parameters},
    }


async def test_describe_workers_and_default_version_over_rest(launch: Launch) -> None:
    server = await launch()
    await server.engine.load(ModelSettings(name="identity", version="2", implementation=IdentityModel))
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        described = (await client.get("/v2/repository/models/counter")).json()
        assert described.pop("implementation").endswith("conftest.CountingBatchModel")
        assert described == {
            "name": "counter",
            "version": "1",
            "state": "READY",
            "reason": "",
            "default_version": "1",
            "versions": ["1"],
            "platform": "",
            "batched": True,
            "workers": 2,
            "max_batch_size": 8,
            "max_batch_time": 0.0,
            "max_pending": 1024,
            "idle_timeout_ms": 60_000,
            "max_duration_ms": 0,
            "max_queue": 16,
            "max_sequences": 1024,
            "evict_idle": False,
            "open_sequences": 0,
            "inflight": 0,
            "queued": 0,
            "replicas": [
                {"index": 0, "waiting": 0, "running": 0, "sequences": 0},
                {"index": 1, "waiting": 0, "running": 0, "sequences": 0},
            ],
            "requires_sequence": False,
            "loaded_at_startup": True,
        }
        scaled = (
            await client.post("/v2/repository/models/counter/versions/1/workers", json={"workers": 3})
        ).json()
        assert (scaled["workers"], len(scaled["replicas"])) == (3, 3)
        replicas: set[int] = set()

        async def run() -> None:
            replicas.update((await _stream(client, counter_body(300)))[1])

        async with trio.open_nursery() as nursery:  # new requests reach the new replica too
            for _ in range(3):
                nursery.start_soon(run)
        assert len(replicas) == 3
        plain = (
            await client.post("/v2/repository/models/identity/versions/2/workers", json={"workers": 2})
        ).json()
        assert (plain["workers"], [r["index"] for r in plain["replicas"]]) == (2, [0, 1])
        down = await client.post(
            "/v2/repository/models/identity/versions/2/workers", json={"workers": 1, "grace_period": 1}
        )
        assert (down.json()["workers"], len(down.json()["replicas"])) == (1, 1)
        for bad, why in [
            ({"workers": 0}, "'workers' must be an integer >= 1, got 0"),
            ({"workers": "3"}, "'workers' must be an integer >= 1, got '3'"),
            ({"workers": 2, "grace_period": -1}, "'grace_period' must be a number of seconds >= 0, got -1"),
        ]:
            refused = await client.post("/v2/repository/models/counter/workers", json=bad)
            assert (refused.status_code, refused.json()) == (400, {"error": why})
        unknown = await client.post("/v2/repository/models/nope/workers", json={"workers": 2})
        assert (unknown.status_code, unknown.json()) == (404, {"error": "model 'nope' is not loaded"})

        assert (await client.get("/v2/repository/models/identity")).json()["default_version"] == "2"
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1], "data": [1]}]}
        assert (await client.post("/v2/models/identity/infer", json=body)).json()["model_version"] == "2"
        chosen = await client.post("/v2/repository/models/identity/default_version", json={"version": 1})
        assert (chosen.json()["default_version"], chosen.json()["version"], chosen.json()["versions"]) == (
            "1",
            "1",
            ["1", "2"],
        )
        assert (await client.post("/v2/models/identity/infer", json=body)).json()["model_version"] == "1"
        missing = await client.post("/v2/repository/models/identity/default_version", json={"version": "9"})
        assert (missing.status_code, missing.json()) == (
            404,
            {"error": "model 'identity' has no version '9'"},
        )
        empty = await client.post("/v2/repository/models/identity/default_version", json={})
        assert (empty.status_code, empty.json()) == (
            400,
            {"error": "'version' must be a model version, got None"},
        )


async def test_management_service_over_grpc(launch: Launch) -> None:
    server = await launch(grpc_port=0)
    assert server.grpc_address is not None
    host, port = server.grpc_address

    async def calls() -> list[Any]:
        channel = Channel(host, port)
        try:
            stub = ManagementStub(channel)
            out: list[Any] = [await stub.describe_model(DescribeModelRequest(name="counter"))]
            out.append(
                await stub.set_workers(SetWorkersRequest(name="counter", workers=3, grace_seconds=1.0))
            )
            out.append(await stub.set_workers(SetWorkersRequest(name="counter", workers=1)))
            out.append(await stub.set_default_version(SetDefaultVersionRequest(name="counter", version="1")))
            for bad in (
                SetWorkersRequest(name="counter", workers=0),
                SetWorkersRequest(name="nope", workers=1),
            ):
                try:
                    await stub.set_workers(bad)
                except GRPCError as exc:
                    out.append((exc.status, exc.message))
            return out
        finally:
            channel.close()

    described, up, down, default, zero, nope = await in_asyncio(calls)
    assert (described.name, described.state, described.workers, described.batched) == (
        "counter",
        "READY",
        2,
        True,
    )
    assert (described.max_batch_size, described.sequence.max_queue, len(described.replicas)) == (8, 16, 2)
    assert (up.workers, [r.index for r in up.replicas]) == (3, [0, 1, 2])
    assert (down.workers, len(down.replicas)) == (1, 1)
    assert (default.default_version, list(default.versions)) == ("1", ["1"])
    assert zero == (Status.INVALID_ARGUMENT, "workers must be >= 1, got 0")
    assert nope == (Status.NOT_FOUND, "model 'nope' is not loaded")


async def _stream(
    client: httpx.AsyncClient, body: dict[str, Any], started: trio.Semaphore | None = None
) -> tuple[list[int], set[int], Any]:
    """The ``k`` and ``replica`` outputs of one infer_stream, and its error (or None);
    ``started`` is released at its first event."""
    ks: list[int] = []
    replicas: set[int] = set()
    async with aconnect_sse(client, "POST", "/v2/models/counter/infer_stream", json=body) as source:
        if source.response.status_code != 200:
            await source.response.aread()
            return ks, replicas, (source.response.status_code, source.response.json())
        async for event in source.aiter_sse():
            data = json.loads(event.data)
            if event.event == "error":
                return ks, replicas, data
            outputs = {o["name"]: o["data"][0] for o in data["outputs"]}
            if not ks and started is not None:
                started.release()
            ks.append(outputs["k"])
            replicas.add(outputs["replica"])
    return ks, replicas, None


async def test_scaling_1_3_1_while_streams_and_sequences_run(launch: Launch) -> None:
    server = await launch(grace_period=10.0)
    engine = server.engine
    await engine.set_workers("counter", 1)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    streams: dict[str, tuple[list[int], set[int], Any]] = {}
    sequences: dict[int, dict[str, Any]] = {}
    scaled_down = trio.Event()
    n = 120

    running = trio.Semaphore(0, max_value=64)  # released by each stream's first event

    async def stream(key: str) -> None:
        streams[key] = await _stream(client, counter_body(n), running)

    async def sequence(i: int, opened: trio.Semaphore) -> None:
        record: dict[str, Any] = {"replica": None, "requests": 0, "error": None}
        sequences[i] = record
        ks, replicas, error = await _stream(client, counter_body(3, sequence_id=f"s{i}", sequence_start=True))
        assert (ks, error, len(replicas)) == ([0, 1, 2], None, 1)
        record["replica"] = replicas.pop()
        record["requests"] = 1
        opened.release()
        rounds_after = 0
        while rounds_after < 3:
            if scaled_down.is_set():
                rounds_after += 1
            ks, replicas, error = await _stream(client, counter_body(3, sequence_id=f"s{i}"))
            if error is not None:
                assert ks in ([], [0, 1, 2]), ks  # a request either ran whole or not at all
                record["error"] = error
                return
            assert (ks, replicas) == ([0, 1, 2], {record["replica"]})
            record["requests"] += 1
        ks, _, error = await _stream(client, counter_body(1, sequence_id=f"s{i}", sequence_end=True))
        assert (ks, error) == ([0], None)

    with trio.fail_after(60):
        async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT, limits=limits) as client:
            # 1 -> 3 while 32 streams run
            async with trio.open_nursery() as nursery:
                for i in range(32):
                    nursery.start_soon(stream, f"up{i}")
                for _ in range(32):  # every stream is running when the workers change
                    await running.acquire()
                up = await client.post("/v2/repository/models/counter/workers", json={"workers": 3})
                assert (up.status_code, up.json()["workers"]) == (200, 3)
            # 3 -> 1 while 32 more streams and 32 sequences run
            opened = trio.Semaphore(0, max_value=32)
            async with trio.open_nursery() as nursery:
                for i in range(32):
                    nursery.start_soon(sequence, i, opened)
                for _ in range(32):
                    await opened.acquire()
                described = (await client.get("/v2/repository/models/counter")).json()
                pinned = [r["sequences"] for r in described["replicas"]]
                assert sorted(pinned) == [10, 11, 11]  # spread over the replicas
                kept_replica = engine.model("counter").replica  # replica 0 stays
                for i in range(32):
                    nursery.start_soon(stream, f"down{i}")
                for _ in range(32):
                    await running.acquire()
                down = await client.post("/v2/repository/models/counter/workers", json={"workers": 1})
                assert (down.status_code, down.json()["workers"], len(down.json()["replicas"])) == (200, 1, 1)
                scaled_down.set()
            after = (await client.get("/v2/repository/models/counter")).json()

    assert sorted(streams) == sorted([f"up{i}" for i in range(32)] + [f"down{i}" for i in range(32)])
    for key, (ks, _, error) in streams.items():
        assert (key, ks, error) == (key, list(range(n)), None)  # none lost, none duplicated
    survivors = [i for i, r in sequences.items() if r["replica"] == kept_replica]
    removed = [i for i, r in sequences.items() if r["replica"] != kept_replica]
    assert (len(survivors), len(removed)) == (pinned[0], 32 - pinned[0])
    for i in survivors:
        assert sequences[i]["error"] is None
    for i in removed:
        assert sequences[i]["error"] == (404, {"error": f"sequence 's{i}' was shut down"})
    assert (after["open_sequences"], after["inflight"], after["queued"]) == (0, 0, 0)
    stats = await engine.statistics("counter")
    assert stats.sequences_ended == {"ended": pinned[0], "shutdown": 32 - pinned[0]}
    with trio.fail_after(TIMEOUT):
        await engine.wait_idle()


@pytest.mark.parametrize("workers", [1, 2])
async def test_scaling_a_plain_model_keeps_serving(launch: Launch, workers: int) -> None:
    server = await launch()
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1], "data": [5]}]}
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        async with trio.open_nursery() as nursery:

            async def hammer() -> None:
                for _ in range(20):
                    reply = await client.post("/v2/models/identity/infer", json=body)
                    assert reply.json()["outputs"][0]["data"] == [5]

            for _ in range(8):
                nursery.start_soon(hammer)
            for target in (3, workers, 1):
                await client.post("/v2/repository/models/identity/workers", json={"workers": target})
    assert (await server.engine.describe("identity")).workers == 1


class OneReplicaOnly(Model):
    """Loads once; every further replica fails to load (a GPU that is full, say)."""

    loaded = 0

    async def load(self) -> None:
        if OneReplicaOnly.loaded:
            raise MemoryError("no room for another replica")
        OneReplicaOnly.loaded += 1

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        return self.response(request, [])


async def test_a_replica_that_fails_to_load_is_a_clear_error_and_the_model_keeps_serving(
    launch: Launch,
) -> None:
    server = await launch()
    await server.engine.load(ModelSettings(name="single", implementation=OneReplicaOnly))
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        failed = await client.post("/v2/repository/models/single/workers", json={"workers": 2})
        assert (failed.status_code, failed.json()) == (
            500,
            {
                "error": "model 'single' failed to load a new replica: MemoryError: no room for another replica"
            },
        )
        described = (await client.get("/v2/repository/models/single")).json()
        assert (described["state"], described["workers"], len(described["replicas"])) == ("READY", 1, 1)
        assert (await client.post("/v2/models/single/infer", json={"inputs": []})).status_code == 200
