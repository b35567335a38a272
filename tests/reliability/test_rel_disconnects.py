"""Disconnect storms (issue 14): SSE and gRPC streams cut at random points (half the
request body sent, the request sent and nothing read, mid-stream) leave nothing behind:
0 requests in flight, 0 batch slots held, 0 waiting, and the server's trio task count back
to its baseline, all read from ``GET /metrics``; and a sequence whose request was cut
takes its next request. In one process and through ``--api-workers 2``. The full-size
storm (1,000 + 1,000) is ``python benchmarks/soak.py disconnects``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import pytest
import trio
from support.rel_load import (
    RestConn,
    cut_sequences,
    grpc_storm,
    in_asyncio_thread,
    sse_storm,
    streamer_case,
)
from support.scrape import parse
from support.servers import ServerProcess, start_server

from actorserve import BatchModel, InferenceRequest, ModelSettings, StepOutput
from actorserve.codecs import tensor_from_numpy
from actorserve.metrics import REFRESH_INTERVAL, count_tasks
from actorserve.model import int_parameter
from actorserve.models import builtin_settings
from actorserve.server.composition import Server, serve
from actorserve.settings import SequenceSettings, Settings

SETTLE_TIMEOUT = 20.0


@attrs.define
class Tick:
    request: InferenceRequest
    n: int
    k: int = 0


class TickModel(BatchModel[None, Tick]):
    """A streaming BatchModel: parameter ``n`` responses, one per step, output ``index``."""

    default_max_batch_size = 16
    request_parameters = frozenset({"n"})

    def begin(self, request: InferenceRequest, state: None) -> Tick:
        return Tick(request, int_parameter(request, "n", 3, minimum=1, maximum=1000))

    def step(self, batch: list[Tick]) -> list[StepOutput]:
        out = []
        for work in batch:
            tensor = tensor_from_numpy("index", np.array([work.k], dtype=np.int64))
            work.k += 1
            out.append(StepOutput(self.response(work.request, [tensor]), done=work.k >= work.n))
        return out


def live_work(text: str) -> dict[str, float]:
    """The non-zero gauges of live work in an exposition, and the task count."""
    samples = parse(text)
    busy = {}
    for (name, labels), value in samples.items():
        if (
            name
            in (
                "actorserve_requests_in_flight",
                "actorserve_model_requests_in_flight",
                "actorserve_batch_waiting",
                "actorserve_batch_running",
            )
            and value
        ):
            busy[f"{name}{dict(labels)}"] = value
    busy["tasks"] = sum(value for (name, _), value in samples.items() if name == "actorserve_tasks")
    return busy


async def settled(client: httpx.AsyncClient, baseline_tasks: float) -> dict[str, float]:
    """Scrape until no live work is left and the task count is back at the baseline (or
    the timeout); the last reading."""
    reading: dict[str, float] = {}
    with trio.move_on_after(SETTLE_TIMEOUT):
        while True:
            reading = live_work((await client.get("/metrics")).text)
            if reading == {"tasks": reading["tasks"]} and reading["tasks"] <= baseline_tasks:
                break
            await trio.sleep(0.2)
    return reading


async def baseline(client: httpx.AsyncClient) -> float:
    """The task count of a quiet server: the highest of 5 scrapes taken after every
    process has refreshed its gauges at least once since the last call (the scraping
    front counts the scrape's own tasks, so readings jitter by one or two)."""
    await trio.sleep(2 * REFRESH_INTERVAL)
    counts = []
    for _ in range(5):
        reading = live_work((await client.get("/metrics")).text)
        assert reading == {"tasks": reading["tasks"]}, reading
        counts.append(reading["tasks"])
        await trio.sleep(REFRESH_INTERVAL / 3)
    assert min(counts) > 0
    return max(counts)


async def storm_and_check(
    http_url: str, grpc_host: str, grpc_port: int, streams: int, sequences: int
) -> None:
    host, port = http_url.removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=http_url, timeout=30) as client:  # one kept-alive scraper
        # warm every path once, so lazily made series and caches are in the baseline
        await sse_storm(host, int(port), streamer_case(3), 3, seed=0)
        await in_asyncio_thread(partial(grpc_storm, grpc_host, grpc_port, streamer_case(3), 3, 0))
        await cut_sequences(host, int(port), 1, "warm")
        base = await baseline(client)

        cuts: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:

            async def sse(name: str, case: Any) -> None:
                cuts[f"sse {name}"] = await sse_storm(host, int(port), case, streams, seed=1)

            async def grpc(name: str, case: Any) -> None:
                storm = partial(grpc_storm, grpc_host, grpc_port, case, streams, 2)
                cuts[f"grpc {name}"] = await in_asyncio_thread(storm)

            nursery.start_soon(sse, "streamer", streamer_case(20, delay=0.002))
            nursery.start_soon(grpc, "streamer", streamer_case(20, delay=0.002))
            nursery.start_soon(cut_sequences, host, int(port), sequences, "cut")
        for name, counts in cuts.items():  # every kind of cut happened
            assert {"body", "first", "mid"} <= set(counts), (name, counts)

        reading = await settled(client, base)
        assert set(reading) == {"tasks"} and reading["tasks"] <= base, (
            f"leftovers after the storm: {reading} (baseline {base} tasks), cuts {cuts}"
        )
        # the streams' models still serve
        done = await client.post(
            "/v2/models/streamer/infer", json={"inputs": [], "parameters": {"n_tokens": 3}}
        )
        assert done.status_code == 200, done.text


def storm_models() -> tuple[ModelSettings, ...]:
    builtin = {m.name: m for m in builtin_settings()}
    accumulator = attrs.evolve(builtin["accumulator"], sequence=SequenceSettings(idle_timeout_ms=600_000))
    return builtin["streamer"], accumulator, ModelSettings(name="ticker", implementation=TickModel)


async def test_a_storm_of_cut_streams_leaves_no_task_slot_or_request_behind(nursery: trio.Nursery) -> None:
    settings = Settings(http_port=0, grpc_port=0, host="127.0.0.1", models=storm_models(), no_auth=True)
    server: Server = await nursery.start(serve, settings)
    assert server.http_url is not None and server.grpc_address is not None
    await storm_and_check(server.http_url, *server.grpc_address, streams=100, sequences=20)
    # and a BatchModel's slots: the ticker stream cut mid-batch gives its slot back
    host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
    ticker = attrs.evolve(streamer_case(20), model="ticker", parameters=lambda k: {"n": 20})
    await sse_storm(host, int(port), ticker, 60, seed=3)
    await in_asyncio_thread(partial(grpc_storm, *server.grpc_address, ticker, 60, 4))
    with trio.fail_after(SETTLE_TIMEOUT):
        await server.engine.wait_idle()  # type: ignore[attr-defined]
    async with httpx.AsyncClient(base_url=server.http_url) as client:
        reading = live_work((await client.get("/metrics")).text)
    assert set(reading) == {"tasks"}, reading


@pytest.fixture
def two_fronts(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    models = {
        "streamer": {"implementation": "actorserve.models.streamer.StreamerModel"},
        "accumulator": {
            "implementation": "actorserve.models.accumulator.AccumulatorModel",
            "sequence": {"idle_timeout_ms": 600000},
        },
    }
    for name, settings in models.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    server = start_server("--http-port", "0", "--grpc-port", "0", "--api-workers", "2", str(tmp_path))
    try:
        server.wait_for(r"serving with 2 front process", 60)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc_target = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        yield server, http_url, grpc_target
    finally:
        server.stop()


async def test_a_storm_through_two_api_workers_leaves_nothing_behind(
    two_fronts: tuple[ServerProcess, str, str],
) -> None:
    _, http_url, grpc_target = two_fronts
    grpc_host, grpc_port = grpc_target.rsplit(":", 1)
    await storm_and_check(http_url, grpc_host, int(grpc_port), streams=60, sequences=12)


async def test_a_connection_the_client_closed_ends_at_once_not_after_the_keep_alive_timeout(
    nursery: trio.Nursery,
) -> None:
    """hypercorn kept the connection task (and socket) of a client that hung up until its
    keep-alive timeout: after a storm the task count stayed up for that long, and a
    server scraped on new connections never got back to its baseline."""
    settings = Settings(
        http_port=0,
        grpc_port=None,
        host="127.0.0.1",
        models=storm_models()[:1],
        no_auth=True,
        keep_alive_timeout=30,
    )
    server: Server = await nursery.start(serve, settings)
    assert server.http_address is not None
    await trio.sleep(0.1)
    before = count_tasks()
    conns = [RestConn(*server.http_address) for _ in range(5)]
    body = b'{"inputs": [], "parameters": {"n_tokens": 2}}'
    for conn in conns:
        status, _, _ = await conn.call("/v2/models/streamer/infer", body, stream=False)
        assert status == 200
    assert count_tasks() > before  # five kept-alive connections
    for conn in conns:
        await conn.aclose()
    for _ in range(60):  # 3 s, not the 30 s of the keep-alive timeout
        if count_tasks() <= before:
            break
        await trio.sleep(0.05)
    assert count_tasks() <= before
