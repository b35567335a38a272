"""CORS (``--cors-allow-origin``) over real HTTP: preflight answered for allowed origins
and refused for others, the headers on Quart routes, on the raw infer path and on a
streaming (SSE) response; nothing added for a request without ``Origin`` or when CORS
is off."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
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
        assert (refused.status_code, refused.json()) == (403, {"error": refused_text("https://evil.example")})
        other = await client.post(url, json=BODY, headers={"Origin": "https://evil.example"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
        star = await client.options(
            f"{anyone.http_url}/v2/models/identity/infer", headers=preflight_headers("https://x.example")
        )
        assert (star.status_code, star.headers["access-control-allow-origin"]) == (204, "*")
        none = await client.options(
            f"{off.http_url}/v2/models/identity/infer", headers=preflight_headers(ALLOWED)
        )
        assert none.status_code == 403 and "access-control-allow-origin" not in none.headers
        own = off.http_url
        assert own is not None
        same = await client.options(f"{own}/v2/models/identity/infer", headers=preflight_headers(own))
        assert same.status_code == 405  # its own origin: no CORS involved, the door answers


def refused_text(origin: str) -> str:
    return f"origin {origin!r} may not use this server: it is not the server's own and not allowed (--cors-allow-origin)"


async def raw_exchange(url: str, head: bytes) -> bytes:
    """Send ``head`` (a request head whose body never comes) and read the answer."""
    host, port = url.removeprefix("http://").split(":")
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(head)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = await stream.receive_some()
                if not chunk:
                    break
                answer += chunk
            return answer


@pytest.mark.parametrize("cors", [(), (ALLOWED,)])
async def test_a_simple_request_from_another_origin_is_refused_unread(
    launch: Launch, cors: tuple[str, ...]
) -> None:
    """Issue 30, finding 8: a page of another origin can send a text/plain POST without a
    preflight; it is refused 403 before its body is read, in each door's error shape,
    with CORS on or off, while the server's own pages (the playground) and allowed
    origins are served."""
    server = await launch(cors_allow_origin=cors)
    own = str(server.http_url)
    evil = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    body = json.dumps(BODY)
    completion = json.dumps({"model": "streamer", "prompt": "x", "max_tokens": 2})
    async with httpx.AsyncClient(base_url=own, timeout=TIMEOUT) as client:
        oip = await client.post("/v2/models/identity/infer", content=body, headers=evil)
        assert (oip.status_code, oip.json()) == (403, {"error": refused_text("https://evil.example")})
        openai = await client.post("/v1/completions", content=completion, headers=evil)
        assert openai.status_code == 403
        assert openai.json()["error"]["message"] == refused_text("https://evil.example")
        torchserve = await client.post("/predictions/identity", content=b"1", headers=evil)
        assert torchserve.status_code == 403 and torchserve.json()["code"] == 403
        for origin in ("null", own.replace("127.0.0.1", "localhost"), own.replace("http:", "https:")):
            reply = await client.post("/v2/models/identity/infer", content=body, headers={"Origin": origin})
            assert reply.status_code == 403, origin
        # the server's own origin (the playground), and behind a TLS proxy
        mine = await client.post("/v2/models/identity/infer", content=body, headers={"Origin": own})
        assert mine.status_code == 200
        proxied = {"Origin": own.replace("http:", "https:"), "X-Forwarded-Proto": "https"}
        assert (
            await client.post("/v2/models/identity/infer", content=body, headers=proxied)
        ).status_code == 200
        allowed = await client.post("/v2/models/identity/infer", content=body, headers={"Origin": ALLOWED})
        assert allowed.status_code == (200 if cors else 403)
    # refused before the body is read: the answer comes while the body never does
    host = own.removeprefix("http://")
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: {host}\r\nOrigin: https://evil.example\r\n"
        "Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    assert (await raw_exchange(own, head)).startswith(b"HTTP/1.1 403 ")
