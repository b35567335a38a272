"""Server-sent event streams (``infer_stream``, ``generate_stream``) with httpx-sse over
HTTP/1.1: incremental delivery, exact event counts, errors before and after the stream
starts, client disconnects, gzip-accepting clients, BatchModels with two replicas,
MLServer's documented client flow; and, on a raw socket, coalesced writes for a slow
reader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import httpx_sse
import pytest
import trio
from httpx_sse import ServerSentEvent, aconnect_sse
from hypercorn.events import Event, RawData
from hypercorn.trio.tcp_server import TCPServer

from actorserve.codecs import response_from_json
from actorserve.server.composition import Server

if TYPE_CHECKING:
    from conftest import GateModel, Settle

TIMEOUT = 20.0


def prompt(text: str, **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [text]}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def token(event: ServerSentEvent) -> tuple[str, int]:
    """(text_output, index) of a streamer response event."""
    doc = json.loads(event.data)
    outputs = {o["name"]: o["data"][0] for o in doc["outputs"]}
    return outputs["text_output"], outputs["index"]


async def collect(events: AsyncIterator[ServerSentEvent]) -> list[ServerSentEvent]:
    return [event async for event in events]


async def test_events_arrive_as_produced(client: httpx.AsyncClient, server: Server) -> None:
    """The first event is read while the model still sleeps before its next token."""
    engine = server.engine
    body = prompt("p", n_tokens=5, delay=0.2)
    async with aconnect_sse(client, "POST", "/v2/models/streamer/infer_stream", json=body) as source:
        events = source.aiter_sse()
        first = await events.__anext__()
        assert token(first) == ("p:0", 0)
        assert (await engine.statistics("streamer")).inflight == 1  # four tokens (0.8 s) still to come
        rest = await collect(events)
    assert [token(e) for e in rest] == [(f"p:{k}", k) for k in range(1, 5)]
    assert (await engine.statistics("streamer")).inflight == 0


async def test_each_event_is_sent_before_the_model_produces_the_next(
    client: httpx.AsyncClient, gate: GateModel
) -> None:
    body = {"id": "g1", "inputs": [], "parameters": {"n_tokens": 3, "gate": "g1", "free": 1}}
    async with aconnect_sse(client, "POST", "/v2/models/gate/infer_stream", json=body) as source:
        events = source.aiter_sse()
        first = await events.__anext__()
        assert json.loads(first.data)["outputs"][0]["data"] == [0]
        assert not gate.left["g1"].is_set()  # the model waits for the gate: nothing more exists yet
        gate.gates["g1"].set()
        rest = await collect(events)
    assert [json.loads(e.data)["outputs"][0]["data"] for e in rest] == [[1], [2]]
    assert gate.outcome["g1"] == "done"


@pytest.mark.parametrize("n_tokens", [0, 1, 7, 300])
async def test_exactly_n_events(client: httpx.AsyncClient, n_tokens: int) -> None:
    body = prompt("n", n_tokens=n_tokens)
    async with aconnect_sse(client, "POST", "/v2/models/streamer/infer_stream", json=body) as source:
        assert source.response.status_code == 200
        events = await collect(source.aiter_sse())
    assert [e.event for e in events] == ["message"] * n_tokens
    assert [token(e) for e in events] == [(f"n:{k}", k) for k in range(n_tokens)]


async def test_a_reading_clients_events_skip_send_all(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte of the stream went straight into the socket (transport/httphost/writes.py):
    none waited in hypercorn's send_all, which only takes what a full socket refused."""
    through_send_all: list[bytes] = []
    original = TCPServer.protocol_send

    async def counting(self: TCPServer, event: Event) -> None:
        if isinstance(event, RawData):
            through_send_all.append(event.data)
        await original(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", counting)  # before the connection opens
    body = prompt("w", n_tokens=300)
    async with aconnect_sse(client, "POST", "/v2/models/streamer/infer_stream", json=body) as source:
        events = await collect(source.aiter_sse())
    assert [token(e) for e in events] == [(f"w:{k}", k) for k in range(300)]
    assert through_send_all == []


async def test_stream_headers(client: httpx.AsyncClient) -> None:
    body = prompt("h", n_tokens=1)
    async with client.stream("POST", "/v2/models/streamer/infer_stream", json=body) as reply:
        raw = b"".join([chunk async for chunk in reply.aiter_raw()])
    assert reply.headers["content-type"] == "text/event-stream"
    assert reply.headers["cache-control"] == "no-cache"
    assert reply.headers["x-accel-buffering"] == "no"
    assert reply.headers["transfer-encoding"] == "chunked"
    assert raw == (
        b'data: {"model_name":"streamer","model_version":"1","outputs":[{"name":"text_output","shape":[1],'
        b'"datatype":"BYTES","data":["h:0"]},{"name":"index","shape":[1],"datatype":"INT64","data":[0]}]}\n\n'
    )


async def test_gzip_accepting_client_still_gets_events_one_by_one(
    client: httpx.AsyncClient, gate: GateModel
) -> None:
    body = {"id": "z1", "inputs": [], "parameters": {"n_tokens": 2, "gate": "z1", "free": 1}}
    headers = {"Accept-Encoding": "gzip"}
    async with aconnect_sse(
        client, "POST", "/v2/models/gate/infer_stream", json=body, headers=headers
    ) as source:
        assert "content-encoding" not in source.response.headers
        events = source.aiter_sse()
        assert json.loads((await events.__anext__()).data)["outputs"][0]["data"] == [0]
        assert not gate.left["z1"].is_set()
        gate.gates["z1"].set()
        assert [json.loads(e.data)["outputs"][0]["data"] for e in await collect(events)] == [[1]]


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        (
            "/v2/models/streamer/infer_stream",
            prompt("x", n_tokens=-1),
            400,
            "parameter 'n_tokens': expected an integer in [0, 10000], got -1",
        ),
        ("/v2/models/nope/infer_stream", prompt("x"), 404, "model 'nope' is not loaded"),
        (
            "/v2/models/failing/infer_stream",
            {"inputs": []},
            500,
            "model 'failing' failed: RuntimeError: the model broke",
        ),
        (
            "/v2/models/streamer/infer_stream",
            {"inputs": 3},
            400,
            "'inputs' must be a list, got a JSON number",
        ),
        (
            "/v2/models/streamer/generate_stream",
            {"text_input": {"a": 1}},
            400,
            "input 'text_input': expected a string, a number, a boolean or a list of them",
        ),
    ],
)
async def test_errors_before_the_first_event_use_the_status(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], status: int, error: str
) -> None:
    reply = await client.post(path, json=body)
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"error": error}


async def test_error_after_the_stream_started_is_an_error_event(
    client: httpx.AsyncClient, settle: Settle
) -> None:
    body = {"inputs": [], "parameters": {"ok": 2}}
    async with aconnect_sse(client, "POST", "/v2/models/failing/infer_stream", json=body) as source:
        assert source.response.status_code == 200
        events = await collect(source.aiter_sse())
    assert [e.event for e in events] == ["message", "message", "error"]
    assert json.loads(events[2].data) == {
        "error": "model 'failing' failed: RuntimeError: the model broke",
        "status": 500,
    }
    await settle()


async def test_disconnect_cancels_the_request(
    client: httpx.AsyncClient, server: Server, gate: GateModel, settle: Settle
) -> None:
    body = {"id": "d1", "inputs": [], "parameters": {"n_tokens": 10, "gate": "d1", "free": 2}}
    async with aconnect_sse(client, "POST", "/v2/models/gate/infer_stream", json=body) as source:
        events = source.aiter_sse()
        assert [json.loads((await events.__anext__()).data)["outputs"][0]["data"] for _ in range(2)] == [
            [0],
            [1],
        ]
    with trio.fail_after(TIMEOUT):
        await gate.left["d1"].wait()
    assert gate.outcome["d1"] == "cancelled"
    await settle()
    assert (await client.get("/v2/health/ready")).status_code == 200


async def test_disconnect_mid_stream_leaves_no_work(
    client: httpx.AsyncClient, server: Server, settle: Settle
) -> None:
    body = prompt("d", n_tokens=10_000, delay=0.01)
    async with aconnect_sse(client, "POST", "/v2/models/streamer/infer_stream", json=body) as source:
        events = source.aiter_sse()
        assert [token(await events.__anext__()) for _ in range(2)] == [("d:0", 0), ("d:1", 1)]
        assert (await server.engine.statistics("streamer")).inflight == 1
    await settle()
    async with aconnect_sse(
        client, "POST", "/v2/models/streamer/infer_stream", json=prompt("e", n_tokens=2)
    ) as source:
        assert [token(e) for e in await collect(source.aiter_sse())] == [("e:0", 0), ("e:1", 1)]


def counts(events: list[ServerSentEvent]) -> tuple[list[int], set[int]]:
    docs = [{o["name"]: o["data"][0] for o in json.loads(e.data)["outputs"]} for e in events]
    return [d["k"] for d in docs], {d["replica"] for d in docs}


async def test_batch_model_with_two_replicas_streams(
    client: httpx.AsyncClient, server: Server, settle: Settle
) -> None:
    """Two streams on a BatchModel with workers=2: one per replica, every event exact."""
    assert (await server.engine.model_info("counter")).workers == 2
    url = "/v2/models/counter/infer_stream"
    # a is long enough to be still running (or paused on its full reply buffer) when b comes
    async with aconnect_sse(client, "POST", url, json={"inputs": [], "parameters": {"n": 100_000}}) as a:
        a_events = a.aiter_sse()
        a_head = [await a_events.__anext__()]
        async with aconnect_sse(client, "POST", url, json={"inputs": [], "parameters": {"n": 200}}) as b:
            stats = await server.engine.statistics("counter")
            assert stats.waiting + stats.running == 2  # one on each replica (checked below)
            b_events = await collect(b.aiter_sse())
        a_head += [await a_events.__anext__() for _ in range(99)]
    a_ks, a_replicas = counts(a_head)
    b_ks, b_replicas = counts(b_events)
    assert (a_ks, b_ks) == (list(range(100)), list(range(200)))
    assert len(a_replicas) == len(b_replicas) == 1
    assert a_replicas != b_replicas
    await settle()


async def test_disconnect_from_a_batch_model_stream(
    client: httpx.AsyncClient, server: Server, settle: Settle
) -> None:
    url = "/v2/models/counter/infer_stream"
    async with aconnect_sse(client, "POST", url, json={"inputs": [], "parameters": {"n": 100_000}}) as source:
        events = source.aiter_sse()
        assert counts([await events.__anext__(), await events.__anext__()])[0] == [0, 1]
    await settle()
    stats = await server.engine.statistics("counter")
    assert (stats.waiting, stats.running) == (0, 0)


async def test_many_concurrent_streams(client: httpx.AsyncClient, settle: Settle) -> None:
    results: dict[int, list[tuple[str, int]]] = {}

    async def one(i: int) -> None:
        body = prompt(f"c{i}", n_tokens=20)
        async with aconnect_sse(client, "POST", "/v2/models/streamer/infer_stream", json=body) as source:
            results[i] = [token(e) for e in await collect(source.aiter_sse())]

    async with trio.open_nursery() as nursery:
        for i in range(16):
            nursery.start_soon(one, i)
    assert results == {i: [(f"c{i}:{k}", k) for k in range(20)] for i in range(16)}
    await settle()


async def test_mlserver_client_flow(server: Server) -> None:
    """MLServer's streaming docs: httpx + httpx_sse.connect_sse POST to infer_stream with
    an InferenceRequest, each ``sse.data`` parsed into an InferenceResponse."""
    url = f"{server.http_url}/v2/models/streamer/infer_stream"
    inference_request = {
        "inputs": [
            {
                "name": "text_input",
                "shape": [1],
                "datatype": "BYTES",
                "data": ["What is the capital of France?"],
            }
        ],
        "parameters": {"n_tokens": 4},
    }

    def mlserver_style() -> list[str]:
        tokens = []
        with (
            httpx.Client() as http_client,
            httpx_sse.connect_sse(http_client, "POST", url, json=inference_request) as event_source,
        ):
            for sse in event_source.iter_sse():
                response = response_from_json(json.loads(sse.data))
                tokens.append(response.outputs[0].data[0].decode())
        return tokens

    with trio.fail_after(TIMEOUT):
        tokens = await trio.to_thread.run_sync(mlserver_style)
    assert tokens == [f"What is the capital of France?:{k}" for k in range(4)]


# -- coalesced writes, seen on a raw socket ----------------------------------------------


async def open_raw_stream(server: Server, path: str, body: dict[str, Any]) -> trio.SocketStream:
    """POST ``body`` over a plain socket whose receive buffer is small, so the server's
    writes block soon when the test does not read."""
    assert server.http_address is not None
    host, port = server.http_address
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((host, port))
    stream = trio.SocketStream(sock)
    content = json.dumps(body).encode()
    await stream.send_all(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n".encode()
        + content
    )
    return stream


async def read_chunks(stream: trio.SocketStream) -> tuple[bytes, list[bytes]]:
    """The response head and the chunks of its chunked body (as the server wrote them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some()
    head, rest = data.split(b"\r\n\r\n", 1)
    chunks: list[bytes] = []
    while True:
        while b"\r\n" not in rest:
            rest += await stream.receive_some()
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        while len(rest) < size + 2:
            rest += await stream.receive_some()
        if size == 0:
            return head, chunks
        chunks.append(rest[:size])
        rest = rest[size + 2 :]


async def steps_settle(server: Server, model: str) -> None:
    """Return once the model stopped stepping (its only stream sits out: the reader is
    not reading and every buffer on the way is full)."""
    last = -1
    while (stepped := (await server.engine.statistics(model)).items_stepped) != last:
        last = stepped
        await trio.sleep(0.05)


async def test_a_slow_reader_gets_the_events_that_waited_in_one_chunk(server: Server, settle: Settle) -> None:
    n = 2_000
    with trio.fail_after(TIMEOUT):
        stream = await open_raw_stream(
            server, "/v2/models/counter/infer_stream", {"inputs": [], "parameters": {"n": n}}
        )
        async with stream:
            await steps_settle(server, "counter")
            assert (await server.engine.statistics("counter")).items_stepped < n  # the writes blocked
            head, chunks = await read_chunks(stream)
    assert head.startswith(b"HTTP/1.1 200 ")
    per_chunk = [chunk.count(b"data: ") for chunk in chunks]
    assert max(per_chunk) > 1, per_chunk[:50]
    ks = [
        json.loads(part.removeprefix(b"data: "))["outputs"][0]["data"][0]
        for chunk in chunks
        for part in chunk.split(b"\n\n")
        if part
    ]
    assert ks == list(range(n))
    await settle()


async def test_disconnect_on_a_raw_socket_frees_the_engine(server: Server) -> None:
    with trio.fail_after(TIMEOUT):
        stream = await open_raw_stream(
            server, "/v2/models/counter/infer_stream", {"inputs": [], "parameters": {"n": 100_000}}
        )
        async with stream:
            data = b""
            while b"data: " not in data:
                data += await stream.receive_some()
            assert (await server.engine.statistics("counter")).inflight == 1
        await server.engine.wait_idle()
    assert (await server.engine.statistics("counter")).inflight == 0
