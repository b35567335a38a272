"""HTTP/1.1 on the wire, byte by byte, for both parsers (``--http-parser httptools``, the
default, and hypercorn's ``h11``): keep-alive, pipelining, chunked bodies both ways,
``Expect: 100-continue``, HEAD, ``Connection: close`` and HTTP/1.0, malformed and oversize
requests, HTTP/2 with prior knowledge on the same port. The two must answer alike."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from e2e.conftest import TIMEOUT, Launch
from hypercorn.events import Event, RawData
from hypercorn.trio.tcp_server import TCPServer

from actorserve.server.composition import Server

PARSERS = ["httptools", "h11"]
INFER_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]}]}
).encode()


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, chunks: list[bytes]) -> None:
        self.status, self.headers, self.body, self.chunks = status, headers, body, chunks

    def json(self) -> Any:
        return json.loads(self.body)


class Wire:
    """A raw TCP connection that sends bytes as given and parses responses itself."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buffer += data
        return bool(data)

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not await self._fill():
                raise EOFError(f"connection closed before {marker!r}; have {self.buffer!r}")
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    async def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not await self._fill():
                raise EOFError("connection closed inside a body")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    async def reply(self, *, head_only: bool = False) -> Reply:
        with trio.fail_after(TIMEOUT):
            lines = (await self._until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            chunks: list[bytes] = []
            if head_only or status < 200 or status in (204, 304):
                return Reply(status, headers, b"", chunks)
            if "content-length" in headers:
                body = await self._exactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                while size := int(await self._until(b"\r\n"), 16):
                    chunks.append(await self._exactly(size))
                    assert await self._exactly(2) == b"\r\n"
                assert await self._exactly(2) == b"\r\n"
                body = b"".join(chunks)
            else:  # ends with the connection
                while await self._fill():
                    pass
                body, self.buffer = self.buffer, b""
            return Reply(status, headers, body, chunks)

    async def closed(self) -> bool:
        """True once the server has closed the connection (and sent nothing more)."""
        with trio.fail_after(TIMEOUT):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:  # reset instead of FIN
                    return not self.buffer
                if not data:
                    return not self.buffer
                self.buffer += data


@pytest.fixture(params=PARSERS)
async def server(request: pytest.FixtureRequest, launch: Launch) -> Server:
    return await launch(http_parser=request.param)


async def connect(server: Server) -> Wire:
    host, port = server.http_address or ("", 0)
    return Wire(await trio.open_tcp_stream(host, port))


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: t", "Content-Type: application/json", *extra]
    if not any(h.lower().startswith("transfer-encoding") for h in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str, *extra: str, version: str = "1.1") -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/{version}", "Host: t", *extra]) + "\r\n\r\n").encode()


async def test_keep_alive_serves_requests_on_one_connection(server: Server) -> None:
    wire = await connect(server)
    for _ in range(3):
        await wire.send(post("/v2/models/identity/infer", INFER_BODY))
        reply = await wire.reply()
        assert reply.status == 200
        assert reply.json()["outputs"][0]["data"] == [1, 2, 3]
        assert "connection" not in reply.headers
    await wire.send(get("/v2/health/ready"))
    assert (await wire.reply()).status == 200


async def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    wire = await connect(server)
    await wire.send(
        get("/v2/models/identity")
        + post("/v2/models/identity/infer", INFER_BODY)
        + get("/v2/models/streamer")
    )
    first, second, third = [await wire.reply() for _ in range(3)]
    assert first.json()["name"] == "identity"
    assert second.json()["outputs"][0]["data"] == [1, 2, 3]
    assert third.json()["name"] == "streamer"


async def test_chunked_request_body(server: Server) -> None:
    wire = await connect(server)
    half = len(INFER_BODY) // 2
    body = b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (
        half,
        INFER_BODY[:half],
        len(INFER_BODY) - half,
        INFER_BODY[half:],
    )
    await wire.send(post("/v2/models/identity/infer", body, "Transfer-Encoding: chunked"))
    reply = await wire.reply()
    assert reply.status == 200
    assert reply.json()["outputs"][0]["data"] == [1, 2, 3]


async def test_streamed_response_is_chunked_one_event_per_chunk_or_more(server: Server) -> None:
    wire = await connect(server)
    body = json.dumps({"text_input": "ab", "parameters": {"n_tokens": 4}}).encode()
    await wire.send(post("/v2/models/streamer/generate_stream", body))
    reply = await wire.reply()
    assert reply.status == 200
    assert reply.headers["transfer-encoding"] == "chunked"
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [line for line in reply.body.split(b"\n") if line.startswith(b"data:")]
    assert len(events) == 4
    await wire.send(get("/v2/health/live"))  # the connection is reusable after the stream
    assert (await wire.reply()).status == 200


async def test_expect_100_continue(server: Server) -> None:
    wire = await connect(server)
    head, _, body = post("/v2/models/identity/infer", INFER_BODY, "Expect: 100-continue").partition(
        b"\r\n\r\n"
    )
    await wire.send(head + b"\r\n\r\n")
    interim = await wire.reply()
    assert interim.status == 100
    await wire.send(body)
    reply = await wire.reply()
    assert reply.status == 200
    assert reply.json()["outputs"][0]["data"] == [1, 2, 3]


async def test_head_has_no_body_and_keeps_the_connection(server: Server) -> None:
    wire = await connect(server)
    await wire.send(b"HEAD /v2/models/identity HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await wire.reply(head_only=True)
    assert head.status == 200
    await wire.send(get("/v2/health/ready"))
    assert (await wire.reply()).status == 200


@pytest.mark.parametrize("parser", PARSERS)
async def test_idle_keep_alive_connection_is_closed_after_the_timeout(launch: Launch, parser: str) -> None:
    """The keep-alive timer is armed after a response (hypercorn's own arming ran in the
    app's task, which is cancelled as the response ends, so it never was)."""
    wire = await connect(await launch(http_parser=parser, keep_alive_timeout=0.2))
    for path in ("/v2/health/ready", "/v2/models/identity"):  # Quart, then the raw path
        await wire.send(get(path))
        assert (await wire.reply()).status == 200
    assert await wire.closed()


async def test_an_answer_before_the_body_says_it_closes(launch: Launch) -> None:
    """A request answered before its body arrived (here: 401 on a management route)
    cannot keep its connection; the response says so (h11 closes without saying)."""
    wire = await connect(await launch(http_parser="httptools", no_auth=False, token="secret-token"))
    head = post("/v2/repository/models/identity/unload", b"{}").partition(b"\r\n\r\n")[0]
    await wire.send(head + b"\r\n\r\n")  # and never the body
    reply = await wire.reply()
    assert (reply.status, reply.headers["connection"]) == (401, "close")
    assert await wire.closed()


async def test_connection_close_is_honoured(server: Server) -> None:
    wire = await connect(server)
    await wire.send(get("/v2/health/ready", "Connection: close"))
    reply = await wire.reply()
    assert reply.status == 200
    assert reply.headers["connection"] == "close"
    assert await wire.closed()


async def test_http_1_0_closes_after_the_response(server: Server) -> None:
    wire = await connect(server)
    await wire.send(get("/v2/models/identity", version="1.0"))
    reply = await wire.reply()
    assert reply.status == 200
    assert reply.json()["name"] == "identity"
    assert await wire.closed()


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: many\r\n\r\n",
    ],
    ids=["request-line", "header-name", "content-length"],
)
async def test_malformed_request_gets_400_and_close(server: Server, garbage: bytes) -> None:
    wire = await connect(server)
    await wire.send(garbage)
    reply = await wire.reply()
    assert reply.status == 400
    assert await wire.closed()


async def test_length_and_chunked_together_are_refused(launch: Launch) -> None:
    """Both framings in one request (a request-smuggling vector): llhttp refuses it, as
    RFC 9112 allows; h11 would take the chunked framing."""
    wire = await connect(await launch(http_parser="httptools"))
    await wire.send(
        post(
            "/v2/models/identity/infer",
            b"3\r\nabc\r\n0\r\n\r\n",
            "Content-Length: 3",
            "Transfer-Encoding: chunked",
        )
    )
    reply = await wire.reply()
    assert reply.status == 400
    assert await wire.closed()


async def test_malformed_request_after_a_good_one(server: Server) -> None:
    wire = await connect(server)
    await wire.send(get("/v2/health/ready") + b"\x00\x01garbage\r\n\r\n")
    assert (await wire.reply()).status == 200
    assert (await wire.reply()).status == 400
    assert await wire.closed()


async def test_oversize_request_head_gets_431(server: Server) -> None:
    wire = await connect(server)
    await wire.send(get("/v2/health/ready", "X-Big: " + "a" * 70_000))
    reply = await wire.reply()
    assert reply.status == 431
    assert await wire.closed()


async def test_http2_prior_knowledge_on_the_same_port(server: Server) -> None:
    async with httpx.AsyncClient(
        http1=False, http2=True, base_url=server.http_url or "", timeout=TIMEOUT
    ) as client:
        reply = await client.post("/v2/models/identity/infer", content=INFER_BODY)
        assert reply.http_version == "HTTP/2"
        assert reply.json()["outputs"][0]["data"] == [1, 2, 3]


@pytest.mark.parametrize("http2", [False, True])
async def test_every_protocol_writes_straight_into_the_socket(
    server: Server, monkeypatch: pytest.MonkeyPatch, http2: bool
) -> None:
    """httptools, h11 and HTTP/2 (prior knowledge) alike: a reading client's replies
    never wait in hypercorn's send_all (transport/httphost/writes.py)."""
    through_send_all: list[bytes] = []
    original = TCPServer.protocol_send

    async def counting(self: TCPServer, event: Event) -> None:
        if isinstance(event, RawData):
            through_send_all.append(event.data)
        await original(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", counting)  # before the connection opens
    async with httpx.AsyncClient(
        http1=not http2, http2=http2, base_url=server.http_url or "", timeout=TIMEOUT
    ) as client:
        for _ in range(3):
            reply = await client.post("/v2/models/identity/infer", content=INFER_BODY)
            assert reply.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            assert reply.json()["outputs"][0]["data"] == [1, 2, 3]
    assert through_send_all == []


async def test_upgrade_requests_are_served_as_http_1_1(launch: Launch) -> None:
    """h11 would switch to h2c; httptools answers in HTTP/1.1 (allowed: Upgrade is a
    request the server may ignore), also for an Upgrade request with a body."""
    server = await launch(http_parser="httptools")
    wire = await connect(server)
    upgrade = ("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQAAP__")
    await wire.send(get("/v2/health/ready", *upgrade))
    assert (await wire.reply()).status == 200
    await wire.send(post("/v2/models/identity/infer", INFER_BODY, *upgrade) + get("/v2/health/live"))
    reply = await wire.reply()
    assert reply.status == 200
    assert reply.json()["outputs"][0]["data"] == [1, 2, 3]
    assert (await wire.reply()).status == 200
