"""Shutdown under load and idle (issue 14), in one process (``serve``): in-flight requests
finish within the grace period, new ones get 503 with ``Retry-After`` (in the API's own
error shape), every stream still running when the grace period ends gets a last message
saying the server is shutting down (OIP SSE ``event: error``, and ``event: end`` on GET
streams; OpenAI's error event and ``[DONE]``; TorchServe's terminating chunk; gRPC
UNAVAILABLE), never a bare cut; an idle server stops at once.

The same through ``python -m actorserve`` (``--api-workers 0`` and ``2``) is in
test_rel_shutdown_processes.py.
"""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import trio
from support.rel_shutdown import SHUTTING_DOWN, GrpcStream, shutdown_settings, start, wait_until

from actorserve.server.composition import END_MARGIN

GRACE = 0.5
#: the grace period an idle server must not wait for
IDLE_GRACE = 10.0
TIMEOUT = 20.0


async def _sse(client: httpx.AsyncClient, method: str, path: str, box: list[str], **kwargs: object) -> None:
    async with client.stream(method, path, **kwargs) as response:  # type: ignore[arg-type]
        assert response.status_code == 200
        async for line in response.aiter_lines():
            box.append(line)


def _last_events(lines: list[str], count: int) -> list[str]:
    return [line for line in lines if line][-count:]


async def test_sigterm_under_load_finishes_in_flight_refuses_new_and_ends_every_stream(
    nursery: trio.Nursery,
) -> None:
    running = await start(nursery, shutdown_settings(grace_period=GRACE))
    server = running.server
    assert server.http_url is not None and server.grpc_address is not None
    post: list[str] = []
    get: list[str] = []
    openai: list[str] = []
    unary: dict[str, httpx.Response] = {}
    ts_chunks: list[bytes] = []
    grpc = GrpcStream("{}:{}".format(*server.grpc_address))
    async with (
        httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client,
        trio.open_nursery() as clients,
    ):
        first = await client.post(
            "/predictions/ts_stateful",
            content=b"1",
            headers={"ts_request_sequence_id": "s", "ts_request_sequence_start": "true"},
        )
        assert first.status_code == 200

        async def torchserve() -> None:  # an odd input streams until the sequence ends
            async with client.stream(
                "POST", "/predictions/ts_stateful", content=b"3", headers={"ts_request_sequence_id": "s"}
            ) as response:
                async for chunk in response.aiter_raw():  # a cut raises here
                    ts_chunks.append(chunk)

        async def short() -> None:  # 5 tokens x 20 ms: finishes within the grace period
            reply = await client.post(
                "/v2/models/slow/generate", json={"text_input": "u", "parameters": {"n_tokens": 5}}
            )
            unary["reply"] = reply

        clients.start_soon(
            partial(
                _sse,
                client,
                "POST",
                "/v2/models/slow/generate_stream",
                post,
                json={"text_input": "p", "parameters": {"n_tokens": 10_000}},
            )
        )
        clients.start_soon(
            _sse, client, "GET", "/v2/models/slow/generate_stream?text_input=g&n_tokens=10000", get
        )
        clients.start_soon(
            partial(
                _sse,
                client,
                "POST",
                "/v1/completions",
                openai,
                json={"model": "slow", "prompt": "o", "max_tokens": 10_000, "stream": True},
            )
        )
        clients.start_soon(torchserve)
        await trio.to_thread.run_sync(grpc.open)
        await wait_until(
            lambda: (
                len(post) > 2 and len(get) > 2 and len(openai) > 2 and bool(ts_chunks) and grpc.results > 0
            )
        )
        before = (await server.engine.statistics("slow")).running
        clients.start_soon(short)
        with trio.fail_after(TIMEOUT):  # the short request is in flight (running in the model)
            while (await server.engine.statistics("slow")).running <= before:  # noqa: ASYNC110 (a counter: no event)
                await trio.sleep(0.005)
        server.shutdown()
        stopped_at = trio.current_time()
        # new requests, new connections: 503 with Retry-After, each API in its own shape
        async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as fresh:
            oip = await fresh.post("/v2/models/streamer/generate", json={"text_input": "x"})
            oai = await fresh.post("/v1/completions", json={"model": "streamer", "prompt": "x"})
            ts = await fresh.post("/predictions/streamer", content=b"x")
        assert (oip.status_code, oip.headers["retry-after"], oip.json()) == (
            503,
            "1",
            {"error": SHUTTING_DOWN},
        )
        assert (oai.status_code, oai.json()["error"]["message"]) == (503, SHUTTING_DOWN)
        assert (ts.status_code, ts.json()["type"], ts.json()["message"]) == (
            503,
            "ServiceUnavailableException",
            SHUTTING_DOWN,
        )
        # the streams would need 200 s (10,000 tokens x 20 ms): a bound far below that
        # proves they were cut at the grace period, with room for a loaded machine
        with trio.fail_after(GRACE + END_MARGIN + 30):
            await running.returned.wait()
        elapsed = trio.current_time() - stopped_at
        await trio.to_thread.run_sync(lambda: grpc.ended.wait(TIMEOUT))
        grpc.close()
    assert elapsed >= GRACE  # the in-flight work had its grace period
    assert unary["reply"].status_code == 200
    assert len(unary["reply"].json()["text_output"]) == 5
    shutting_down = f'data: {{"error":"{SHUTTING_DOWN}","status":503}}'
    assert _last_events(post, 2) == ["event: error", shutting_down]
    assert _last_events(get, 4) == ["event: error", shutting_down, "event: end", "data: {}"]
    assert json.loads(_last_events(openai, 2)[0][len("data: ") :])["error"]["message"] == SHUTTING_DOWN
    assert _last_events(openai, 1) == ["data: [DONE]"]
    assert ts_chunks  # and the body ended with its terminating chunk: no exception above
    assert grpc.error.status() == "StatusCode.UNAVAILABLE"
    assert SHUTTING_DOWN in grpc.error.message()


@pytest.mark.parametrize("grpc_open", [False, True])
async def test_an_idle_server_stops_at_once(nursery: trio.Nursery, grpc_open: bool) -> None:
    """Nothing in flight: no wait for the grace period (10 s here), even with a kept-alive
    HTTP connection and an open ModelStreamInfer call that runs no request."""
    running = await start(nursery, shutdown_settings(grace_period=IDLE_GRACE))
    server = running.server
    assert server.http_url is not None and server.grpc_address is not None
    grpc = GrpcStream("{}:{}".format(*server.grpc_address))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        assert (await client.get("/v2/health/ready")).status_code == 200  # the connection stays open
        if grpc_open:
            grpc.n_tokens = 0
            await trio.to_thread.run_sync(grpc.open)
        server.shutdown()
        stopped_at = trio.current_time()
        with trio.fail_after(TIMEOUT):
            await running.returned.wait()
    elapsed = trio.current_time() - stopped_at
    grpc.close()
    # ~0.05 s: the grace period (10 s) was not waited for (a bound on behaviour, not speed)
    assert elapsed < IDLE_GRACE / 4, elapsed
