"""Issue 19, finding 10: the OpenAI proxy read upstream answers of any size (a whole
answer, an error body, one SSE line without end). Each is now cut at the model's
``parameters.extra.max_response_bytes`` with an error naming it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from actorserve.models.openai_proxy import OpenAIProxyModel
from actorserve.server.composition import Server, serve
from actorserve.settings import ModelSettings, Settings

MIB = 1024 * 1024
#: chunks an endless upstream sends at most (every loop is bounded): 64 MiB
CHUNKS = 64
TIMEOUT = 20.0


class FloodingUpstream:
    """An upstream whose answers never end: the first path segment picks which part
    floods (a 200 body, a 500 body, one SSE line), 1 MiB at a time."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    async def __call__(
        self, scope: Any, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        kind = scope["path"].split("/")[1]
        status = 500 if kind == "error" else 200
        content_type = b"text/event-stream" if kind == "line" else b"application/json"
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]}
        )
        first = b'data: {"choices": [{"text": "' if kind == "line" else b'{"choices": [{"text": "'
        await send({"type": "http.response.body", "body": first, "more_body": True})
        block = b"a" * MIB
        self.sent[kind] = 0
        for _ in range(CHUNKS):
            await send({"type": "http.response.body", "body": block, "more_body": True})
            self.sent[kind] += 1
        await send({"type": "http.response.body", "body": b'"}]}\n\n'})


@pytest.fixture
async def flooded(nursery: trio.Nursery) -> tuple[FloodingUpstream, Server]:
    app = FloodingUpstream()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    base = (await nursery.start(partial(hypercorn_serve, app, config, mode="asgi")))[0]  # type: ignore[arg-type]

    def proxy(kind: str) -> ModelSettings:
        extra = {
            "base_url": f"{base}/{kind}/v1",
            "model": "text",
            "api_type": "completions",
            "max_response_bytes": MIB,
        }
        return ModelSettings(name=kind, implementation=OpenAIProxyModel, parameters={"extra": extra})

    settings = Settings(
        http_port=0,
        grpc_port=None,
        host="127.0.0.1",
        no_auth=True,
        models=(proxy("body"), proxy("error"), proxy("line")),
    )
    server: Server = await nursery.start(partial(serve, settings))
    return app, server


@pytest.mark.parametrize(
    ("kind", "op"), [("body", "generate"), ("error", "generate"), ("line", "generate_stream")]
)
async def test_an_endless_upstream_answer_is_cut_at_max_response_bytes(
    flooded: tuple[FloodingUpstream, Server], kind: str, op: str
) -> None:
    app, server = flooded
    assert server.http_url is not None
    with trio.fail_after(TIMEOUT):
        async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
            body = {"text_input": "x", "parameters": {"max_tokens": 4}}
            reply = await client.post(f"/v2/models/{kind}/{op}", json=body)
    assert "larger than 1048576 bytes (parameters.extra.max_response_bytes)" in reply.text, reply.text[:500]
    assert reply.status_code in (200, 500)  # a stream that started ends in an error event
    assert app.sent[kind] < CHUNKS  # the proxy stopped reading: the upstream never finished


def test_max_response_bytes_is_checked_at_load() -> None:
    from actorserve.models.openai_proxy import UpstreamConfig
    from actorserve.settings import SettingsError

    extra = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_response_bytes": 0}
    with pytest.raises(SettingsError, match="max_response_bytes: expected a number of bytes >= 1"):
        UpstreamConfig.from_parameters("gpt", {"extra": extra})
