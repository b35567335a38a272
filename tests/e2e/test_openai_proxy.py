"""The OpenAI-proxy runtime, with every hop real: an actorserve (the proxy) whose model
forwards to a second actorserve's OpenAI routes (the upstream), both on port 0; and an
upstream that fails in each way (a tiny ASGI app on hypercorn in the test)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import openai
import orjson
import pytest
import trio
from conftest import TIMEOUT, Launch
from e2e.openai_fixtures import in_thread, openai_models
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from actorserve.models.openai_proxy import OpenAIProxyModel, UpstreamConfig
from actorserve.server.composition import Server
from actorserve.settings import ModelSettings, SettingsError

KEY = "sk-test-not-a-real-key-4711"


def proxy_model(name: str, base_url: str, api_type: str = "completions", **extra: Any) -> ModelSettings:
    settings = {
        "base_url": base_url,
        "model": "text",
        "api_type": api_type,
        "api_key_env": "AS_PROXY_TEST_KEY",
        **extra,
    }
    return ModelSettings(name=name, implementation=OpenAIProxyModel, parameters={"extra": settings})


@pytest.fixture
async def chain(launch: Launch, monkeypatch: pytest.MonkeyPatch) -> tuple[Server, Server]:
    """(upstream actorserve serving ``text``, proxy actorserve serving ``gpt`` and ``chat``)."""
    monkeypatch.setenv("AS_PROXY_TEST_KEY", KEY)
    upstream = await launch(models=openai_models())
    base = f"{upstream.http_url}/v1"
    proxy = await launch(models=(proxy_model("gpt", base), proxy_model("chat", base, "chat")))
    return upstream, proxy


async def generate(url: str, model: str, prompt: str, **parameters: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        return await client.post(
            f"/v2/models/{model}/generate", json={"text_input": prompt, "parameters": parameters}
        )


async def infer_stream(url: str, model: str, prompt: str, **parameters: Any) -> list[dict[str, Any]]:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": parameters,
    }
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        reply = await client.post(f"/v2/models/{model}/infer_stream", json=body)
    assert reply.status_code == 200, reply.text
    return [orjson.loads(line[6:]) for line in reply.text.split("\n\n") if line.startswith("data: ")]


async def test_generate_and_streams_go_through_to_the_upstream(
    chain: tuple[Server, Server], caplog: Any
) -> None:
    upstream, proxy = chain
    assert upstream.http_url is not None and proxy.http_url is not None
    caplog.set_level(logging.DEBUG)
    direct = (await generate(upstream.http_url, "text", "ROMEO:", max_tokens=20, seed=3)).json()[
        "text_output"
    ]
    through = await generate(proxy.http_url, "gpt", "ROMEO:", max_tokens=20, seed=3)
    assert through.status_code == 200, through.text
    assert through.json()["text_output"] == direct and len(direct) == 20
    events = await infer_stream(proxy.http_url, "gpt", "ROMEO:", max_tokens=20, seed=3, usage=True)
    texts = [e["outputs"][0]["data"][0] for e in events]
    assert "".join(texts) == direct and len(texts) > 2  # piece by piece, as the upstream sent them
    assert events[-1]["parameters"] == {
        "finish_reason": "length",
        "prompt_tokens": 6,
        "completion_tokens": 20,
    }
    stop = direct[8:11]
    stopped = await generate(proxy.http_url, "gpt", "ROMEO:", max_tokens=20, seed=3, stop=[stop])
    assert stopped.json()["text_output"] == direct[: direct.find(stop)]
    # chat: the prompt is the user message, through the upstream's chat template
    client = openai.AsyncOpenAI(base_url=f"{upstream.http_url}/v1", api_key="x", max_retries=0)
    chat = await client.chat.completions.create(
        model="text", messages=[{"role": "user", "content": "Hail"}], max_tokens=30, seed=9
    )
    via = await generate(proxy.http_url, "chat", "Hail", max_tokens=30, seed=9)
    assert via.json()["text_output"] == chat.choices[0].message.content
    assert KEY not in caplog.text


async def test_the_proxy_serves_the_openai_api_too(chain: tuple[Server, Server]) -> None:
    upstream, proxy = chain
    clients = [
        openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="x", timeout=TIMEOUT, max_retries=0)
        for server in (upstream, proxy)
    ]
    direct, through = [
        await in_thread(
            lambda c=c, m=m: c.completions.create(model=m, prompt="KING:", max_tokens=12, seed=1, n=2)
        )
        for c, m in zip(clients, ("text", "gpt"), strict=True)
    ]
    assert [c.text for c in through.choices] == [c.text for c in direct.choices]
    assert through.usage is not None and direct.usage is not None
    assert through.usage.model_dump() == direct.usage.model_dump()
    streamed = await in_thread(
        lambda: "".join(
            c.choices[0].text
            for c in clients[1].completions.create(
                model="gpt", prompt="KING:", max_tokens=12, seed=1, stream=True
            )
        )
    )
    assert streamed == direct.choices[0].text


# -- an upstream that fails --------------------------------------------------------------


class FailingUpstream:
    """An OpenAI-ish upstream: the first path segment picks how it fails."""

    def __init__(self) -> None:
        self.seen_keys: list[str] = []
        self.disconnected = trio.Event()

    async def __call__(
        self, scope: Any, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        kind = scope["path"].split("/")[1]
        headers = dict(scope["headers"])
        self.seen_keys.append(headers.get(b"authorization", b"").decode())
        statuses = {
            "unauthorized": 401,
            "missing": 404,
            "limited": 429,
            "broken": 500,
            "unavailable": 503,
            "bad": 400,
        }
        if kind in statuses:
            extra = [(b"retry-after", b"7")] if kind == "limited" else []
            body = orjson.dumps(
                {"error": {"message": f"upstream says {kind}", "type": "x", "param": None, "code": None}}
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": statuses[kind],
                    "headers": [(b"content-type", b"application/json"), *extra],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if kind == "slow":
            await trio.sleep(TIMEOUT)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        chunk = b'data: {"choices": [{"index": 0, "text": "ab", "finish_reason": null}]}\n\n'
        if kind == "cut":
            await send({"type": "http.response.body", "body": chunk * 2, "more_body": True})
            await send({"type": "http.response.body", "body": b""})  # ends without [DONE]
            return
        # "drip": a piece every 10 ms until the client goes away
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.disconnected.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            while True:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await trio.sleep(0.01)


@pytest.fixture
async def failing(
    nursery: trio.Nursery, launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> tuple[FailingUpstream, Server]:
    monkeypatch.setenv("AS_PROXY_TEST_KEY", KEY)
    app = FailingUpstream()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    binds = await nursery.start(partial(hypercorn_serve, app, config, mode="asgi"))  # type: ignore[arg-type]
    base = binds[0]
    with trio.socket.socket() as closed:  # a port nobody listens on
        await closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    kinds = ("unauthorized", "missing", "limited", "broken", "unavailable", "bad", "slow", "cut", "drip")
    models = [proxy_model(kind, f"{base}/{kind}/v1", timeout=0.3) for kind in kinds]
    server = await launch(models=(*models, proxy_model("dead", dead)))
    return app, server


@pytest.mark.parametrize(
    ("model", "status", "words"),
    [
        (
            "unauthorized",
            500,
            "answered 401: the upstream refused our credentials (check api_key_env): upstream says unauthorized",
        ),
        ("missing", 500, "answered 404: no such upstream model or path ('text'): upstream says missing"),
        ("limited", 429, "answered 429 (rate limited): upstream says limited"),
        ("broken", 500, "answered 500: upstream says broken"),
        ("unavailable", 500, "answered 503: upstream says unavailable"),
        ("bad", 400, "answered 400: upstream says bad"),
        ("slow", 500, "timed out (no answer within 0.3 s)"),
        ("cut", 500, "the stream was cut before [DONE]"),
        ("dead", 503, "is unreachable"),
    ],
)
async def test_upstream_failures_become_clear_errors(
    failing: tuple[FailingUpstream, Server], model: str, status: int, words: str, caplog: Any
) -> None:
    app, server = failing
    assert server.http_url is not None
    caplog.set_level(logging.DEBUG)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        body = {"text_input": "x", "parameters": {"max_tokens": 4}}
        reply = await client.post(f"/v2/models/{model}/generate_stream", json=body)
    if model == "cut":  # the stream had started: the error is its last event
        assert reply.status_code == 200
        assert reply.text.count("data: ") == 3 and "event: error" in reply.text and words in reply.text
    else:
        assert reply.status_code == status, reply.text
        assert words in reply.json()["error"]
    if status == 429:
        assert reply.headers["retry-after"] == "7"
    assert set(app.seen_keys) <= {f"Bearer {KEY}"}
    assert KEY not in caplog.text


async def test_a_disconnect_closes_the_upstream_request(failing: tuple[FailingUpstream, Server]) -> None:
    app, server = failing
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        body = {"text_input": "x", "parameters": {}}
        async with client.stream("POST", "/v2/models/drip/generate_stream", json=body) as reply:
            lines = reply.aiter_lines()
            assert (await lines.__anext__()).startswith("data: ")
    with trio.fail_after(TIMEOUT):
        await app.disconnected.wait()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "AS_PROXY_TEST_KEY"},
            "api_key_env: the environment variable AS_PROXY_TEST_KEY is not set",
        ),
        (
            {"base_url": "http://x/v1", "model": "m", "api_type": "edits"},
            "api_type: expected one of ['chat', 'completions'], got 'edits'",
        ),
        ({"base_url": "x", "model": "m"}, "base_url: expected an http(s) URL"),
        ({"base_url": "http://x/v1"}, "model: expected the upstream model's name"),
        ({"base_url": "http://x/v1", "model": "m", "key": "sk-inline"}, "unknown key(s) key"),
    ],
)
def test_settings_are_checked_at_load(
    extra: dict[str, Any], words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AS_PROXY_TEST_KEY", raising=False)
    with pytest.raises(SettingsError) as caught:
        UpstreamConfig.from_parameters("gpt", {"extra": extra})
    assert words in str(caught.value)


def test_the_api_key_stays_out_of_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AS_PROXY_TEST_KEY", KEY)
    config = UpstreamConfig.from_parameters(
        "gpt", {"extra": {"base_url": "http://x/v1", "model": "m", "api_key_env": "AS_PROXY_TEST_KEY"}}
    )
    assert config.request_headers()["Authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(config)
