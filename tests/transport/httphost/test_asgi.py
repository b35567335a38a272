"""The raw-ASGI paths (``transport/rest/asgi.py``) driven directly with ASGI messages
over a real engine: stream headers, the first response pulled before the response
starts, coalesced writes, and a disconnect that cancels the request in the engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from support.models import GateModel, RecordingModel

from actorserve import open_engine
from actorserve.engine import Engine
from actorserve.models import builtin_settings as builtin_models
from actorserve.server.doors import create_app
from actorserve.settings import ModelSettings, Settings
from actorserve.transport.httphost import HttpHost

TIMEOUT = 20.0


class Client:
    """One ASGI request: ``receive`` gives the body, then ``http.disconnect`` once
    :meth:`disconnect` is called; every message the app sends lands in :attr:`sent`.
    With ``hold_body``, the first body chunk's ``send`` blocks until :meth:`release`
    (a reader that does not read)."""

    def __init__(self, body: bytes, *, hold_body: bool = False) -> None:
        self._body = body
        self._gone = trio.Event()
        self._released = trio.Event()
        self._hold = hold_body
        self.sent: list[dict[str, Any]] = []
        self.started = trio.Event()
        self.first_body = trio.Event()
        self.done = trio.Event()
        if not hold_body:
            self._released.set()

    async def receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None  # type: ignore[assignment]
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not self.first_body.is_set():
            self.sent.append(message)
            self.first_body.set()
            await self._released.wait()
            return
        self.sent.append(message)
        if message["type"] == "http.response.start":
            self.started.set()

    def disconnect(self) -> None:
        self._gone.set()

    def release(self) -> None:
        self._released.set()

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


def scope(path: str, method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "query_string": b"", "headers": []}


async def run(app: HttpHost, client: Client, path: str, nursery: trio.Nursery) -> None:
    async def go() -> None:
        try:
            await app(scope(path), client.receive, client.send)
        finally:
            client.done.set()

    nursery.start_soon(go)


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    models = (
        *(m for m in builtin_models() if m.name == "streamer"),
        ModelSettings(name="gate", implementation=GateModel),
        ModelSettings(name="rec", implementation=RecordingModel, reply_buffer=64),
    )
    async with open_engine(Settings(models=models, http_port=0, grpc_port=None)) as engine:
        yield engine


def events(chunk: bytes) -> list[dict[str, Any]]:
    return [json.loads(part.removeprefix(b"data: ")) for part in chunk.split(b"\n\n") if part]


async def test_stream_headers_first_response_first_and_disconnect_cancels(
    engine: Engine, nursery: trio.Nursery
) -> None:
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None))
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["q"]}],
        "parameters": {"n_tokens": 10_000, "delay": 0.001},
    }
    client = Client(json.dumps(body).encode())
    await run(app, client, "/v2/models/streamer/infer_stream", nursery)
    with trio.fail_after(TIMEOUT):
        await client.started.wait()
    start = client.sent[0]
    assert (start["status"], start["headers"]) == (
        200,
        [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ],
    )
    assert (await engine.statistics("streamer")).inflight == 1  # the first response came before the headers
    with trio.fail_after(TIMEOUT):
        while len(client.bodies) < 3:  # noqa: ASYNC110 (the fake client has no event per chunk)
            await trio.sleep(0.001)
    tokens = [e["outputs"][0]["data"][0] for chunk in client.bodies for e in events(chunk)]
    assert tokens[:3] == ["q:0", "q:1", "q:2"]
    client.disconnect()
    with trio.fail_after(TIMEOUT):
        await client.done.wait()
    assert (await engine.statistics("streamer")).inflight == 0  # leaving the stream cancelled it
    assert client.sent[-1]["more_body"] is True  # a client that left is sent no end


async def test_a_lone_event_is_written_at_once(engine: Engine, nursery: trio.Nursery) -> None:
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None))
    gate = engine.model("gate")
    assert isinstance(gate, GateModel)
    body = {"id": "lone", "inputs": [], "parameters": {"n_tokens": 2, "gate": "g", "free": 1}}
    client = Client(json.dumps(body).encode())
    await run(app, client, "/v2/models/gate/infer_stream", nursery)
    with trio.fail_after(TIMEOUT):
        await client.first_body.wait()
    assert [e["outputs"][0]["data"] for e in events(client.bodies[0])] == [[0]]
    assert not gate.left["lone"].is_set()  # written while the model waits: nothing was held back
    gate.gates["g"].set()
    with trio.fail_after(TIMEOUT):
        await client.done.wait()
    assert client.bodies[1:] == [
        b'data: {"model_name":"gate","model_version":"1","id":"lone","outputs":'
        b'[{"name":"index","shape":[1],"datatype":"INT64","data":[1]}]}\n\n',
        b"",
    ]


async def test_a_stream_that_fell_behind_catches_up_in_one_write(
    engine: Engine, nursery: trio.Nursery
) -> None:
    """The reader blocks on the first chunk while the batch model steps on; once it
    reads again, everything that waited goes out as one chunk."""
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None))
    body = {"id": "slow", "inputs": [], "parameters": {"n_tokens": 40}}
    client = Client(json.dumps(body).encode(), hold_body=True)
    await run(app, client, "/v2/models/rec/infer_stream", nursery)
    with trio.fail_after(TIMEOUT):
        await client.first_body.wait()
        await trio.testing.wait_all_tasks_blocked()  # the model made all 40 tokens meanwhile
    model = engine.model("rec")
    assert isinstance(model, RecordingModel)
    assert len(model.steps) == 40
    client.release()
    with trio.fail_after(TIMEOUT):
        await client.done.wait()
    per_chunk = [len(events(chunk)) for chunk in client.bodies]
    assert per_chunk[1] == 40 - per_chunk[0]  # every waiting response in one write
    assert per_chunk[2:] == [0]  # then the end of the body
    tokens = [e["outputs"][0]["data"][0] for chunk in client.bodies for e in events(chunk)]
    assert tokens == list(range(40))
