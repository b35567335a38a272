"""CORS (``--cors-allow-origin``) over real HTTP: preflight answered for allowed origins
and refused for others, the headers on Quart routes, on the raw infer path and on a
streaming (SSE) response; nothing added for a request without ``Origin`` or when CORS
is off."""

from __future__ import annotations

import httpx
import pytest
from e2e.conftest import TIMEOUT, Launch
from httpx_sse import aconnect_sse

ALLOWED = "https://app.example.com"
BODY = {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1], "data": [1]}]}


def preflight_headers(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, sequence-id",
    }


@pytest.mark.parametrize("fast_path", [True, False])
async def test_allowed_origin(launch: Launch, fast_path: bool) -> None:
    server = await launch(fast_path=fast_path, cors_allow_origin=(ALLOWED, "http://localhost:3000"))
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for path in (
            "/v2/models/identity/infer",
            "/v2/repository/index",
            "/v2/models/streamer/generate_stream",
        ):
            pre = await client.options(path, headers=preflight_headers(ALLOWED))
            assert pre.status_code == 204, path
            assert pre.headers["access-control-allow-origin"] == ALLOWED
            assert pre.headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
            assert pre.headers["access-control-allow-headers"] == "content-type, sequence-id"
            assert pre.headers["access-control-max-age"] == "600"
        origin = {"Origin": ALLOWED}
        infer = await client.post("/v2/models/identity/infer", json=BODY, headers=origin)
        meta = await client.get("/v2/models/identity", headers=origin)
        missing = await client.get("/v2/models/nope", headers=origin)  # errors too
        for reply in (infer, meta, missing):
            assert reply.headers["access-control-allow-origin"] == ALLOWED
            assert reply.headers["vary"] == "Origin"
            assert "Sequence-Id" in reply.headers["access-control-expose-headers"]
        assert (infer.status_code, meta.status_code, missing.status_code) == (200, 200, 404)
        stream_body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["ab"]}]}
        async with aconnect_sse(
            client, "POST", "/v2/models/streamer/infer_stream", json=stream_body, headers=origin
        ) as source:
            assert source.response.headers["access-control-allow-origin"] == ALLOWED
            events = [event async for event in source.aiter_sse()]
        assert events and all(e.event == "message" for e in events)
        plain = await client.post("/v2/models/identity/infer", json=BODY)
        assert "access-control-allow-origin" not in plain.headers


async def test_other_origins_are_refused_and_any_origin_can_be_allowed(launch: Launch) -> None:
    server = await launch(cors_allow_origin=(ALLOWED,))
    anyone = await launch(cors_allow_origin=("*",))
    off = await launch()
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        url = f"{server.http_url}/v2/models/identity/infer"
        refused = await client.options(url, headers=preflight_headers("https://evil.example"))
        assert (refused.status_code, refused.json()) == (
            403,
            {"error": "origin 'https://evil.example' is not allowed (--cors-allow-origin)"},
        )
        other = await client.post(url, json=BODY, headers={"Origin": "https://evil.example"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        star = await client.options(
            f"{anyone.http_url}/v2/models/identity/infer", headers=preflight_headers("https://x.example")
        )
        assert (star.status_code, star.headers["access-control-allow-origin"]) == (204, "*")
        none = await client.options(
            f"{off.http_url}/v2/models/identity/infer", headers=preflight_headers(ALLOWED)
        )
        assert none.status_code == 405 and "access-control-allow-origin" not in none.headers
