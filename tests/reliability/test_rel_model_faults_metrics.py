"""Model faults (issue 14): replica replacements are counted in Prometheus, not only
logged. ``actorserve_replica_replacements_total{model,version,reason}`` reads 1 with
``reason="hung"`` once a step ran past ``step_timeout`` and its replica was replaced,
and 1 with ``reason="recycled"`` once a replica admitted ``max_requests_per_replica``
requests and a fresh one took its place; read from ``GET /metrics`` of a real server
(this process's shape; test_rel_model_faults_processes.py reads it
through a front of ``--api-workers 2``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import httpx
import pytest
import trio
from support.rel_faults import fault_models
from support.scrape import Samples, parse, value

from actorserve.server.composition import Server, serve
from actorserve.settings import Settings

TIMEOUT = 10.0
STEP_TIMEOUT = 0.5
METRIC = "actorserve_replica_replacements_total"


@pytest.fixture
async def client(nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        http_port=0, grpc_port=None, host="127.0.0.1", no_auth=True, models=fault_models(STEP_TIMEOUT)
    )
    server: Server = await nursery.start(partial(serve, settings))
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as c:
        yield c


async def replacements(client: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    """(model, reason) -> the counter, for the two BatchModels."""
    reply = await client.get("/metrics")
    assert reply.status_code == 200
    samples: Samples = parse(reply.text)
    return {
        (model, reason): value(samples, METRIC, model=model, version="1", reason=reason)
        for model in ("faulty", "leaky")
        for reason in ("hung", "recycled")
    }


async def until(client: httpx.AsyncClient, expected: dict[tuple[str, str], float]) -> None:
    """Scrape until the counters read ``expected`` (the host replaces in the background)."""
    got: dict[tuple[str, str], float] = {}
    with trio.move_on_after(TIMEOUT):
        while got != expected:
            got = await replacements(client)
            if got != expected:
                await trio.sleep(0.05)
    assert got == expected


async def test_hung_and_recycled_replicas_are_counted_in_metrics(client: httpx.AsyncClient) -> None:
    zero = {(m, r): 0.0 for m in ("faulty", "leaky") for r in ("hung", "recycled")}
    assert await replacements(client) == zero  # every series exists from the start

    body = {"id": "stuck", "inputs": [], "parameters": {"fault": "hang", "hang": 1.0, "n": 1}}
    reply = await client.post("/v2/models/faulty/infer", json=body)
    assert reply.status_code == 500 and "declared hung" in reply.json()["error"]
    await until(client, {**zero, ("faulty", "hung"): 1.0})
    # the replacement serves
    reply = await client.post("/v2/models/faulty/infer", json={"inputs": [], "parameters": {"n": 1}})
    assert reply.status_code == 200

    # leaky is recycled every 5 admitted requests: the 6th request starts the recycling
    for k in range(6):
        reply = await client.post(
            "/v2/models/leaky/infer", json={"id": f"r{k}", "inputs": [], "parameters": {"n": 1}}
        )
        assert reply.status_code == 200, reply.text
    await until(client, {**zero, ("faulty", "hung"): 1.0, ("leaky", "recycled"): 1.0})
