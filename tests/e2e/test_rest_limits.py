"""Body size limits (``Settings.max_body_bytes``): 413 from Content-Length before
reading, while reading a chunked body, and while inflating a compressed one; on both
front doors."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from actorserve.server.composition import Server

LIMIT = 2048
TOO_LARGE = {"error": f"the request body is larger than {LIMIT} bytes (max_body_bytes)"}


@pytest.fixture(params=["fast", "quart"])
async def small_client(
    request: pytest.FixtureRequest, launch: Callable[..., Awaitable[Server]]
) -> AsyncIterator[httpx.AsyncClient]:
    small = await launch(fast_path=request.param == "fast", max_body_bytes=LIMIT)
    async with httpx.AsyncClient(base_url=str(small.http_url), timeout=20) as c:
        yield c


def padded(size: int) -> bytes:
    """A valid identity request body of exactly ``size`` bytes."""
    tensor: dict[str, Any] = {"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}
    head = json.dumps({"inputs": [tensor], "parameters": {"pad": ""}}).encode()
    return head.replace(b'"pad": ""', b'"pad": "' + b"x" * (size - len(head)) + b'"')


async def test_body_at_the_limit_is_served(small_client: httpx.AsyncClient) -> None:
    reply = await small_client.post("/v2/models/identity/infer", content=padded(LIMIT))
    assert reply.status_code == 200


async def test_content_length_over_the_limit_is_413(small_client: httpx.AsyncClient) -> None:
    reply = await small_client.post("/v2/models/identity/infer", content=padded(LIMIT + 1))
    assert (reply.status_code, reply.json()) == (413, TOO_LARGE)


async def test_chunked_body_over_the_limit_is_413(small_client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        data = padded(LIMIT + 500)
        for i in range(0, len(data), 256):
            yield data[i : i + 256]

    reply = await small_client.post("/v2/models/identity/infer", content=chunks())
    assert (reply.status_code, reply.json()) == (413, TOO_LARGE)


async def test_chunked_body_under_the_limit_is_served(small_client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        data = padded(LIMIT)
        for i in range(0, len(data), 100):
            yield data[i : i + 100]

    reply = await small_client.post("/v2/models/identity/infer", content=chunks())
    assert (reply.status_code, reply.json()["outputs"][0]["data"]) == (200, [1])


async def test_gzip_body_inflating_over_the_limit_is_413(small_client: httpx.AsyncClient) -> None:
    bomb = gzip.compress(padded(LIMIT * 4))
    assert len(bomb) < LIMIT
    reply = await small_client.post(
        "/v2/models/identity/infer", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert (reply.status_code, reply.json()) == (413, TOO_LARGE)


async def test_413_on_streaming_endpoints_too(small_client: httpx.AsyncClient) -> None:
    for path in ("/v2/models/streamer/infer_stream", "/v2/models/streamer/generate"):
        reply = await small_client.post(path, content=padded(LIMIT + 1))
        assert (reply.status_code, reply.json()) == (413, TOO_LARGE)
