"""Helpers of the bad-input reliability tests (``tests/reliability/test_rel_badinput_*``):
an in-process server with every front door on (REST, gRPC, TorchServe's management
port), a raw HTTP/1.1 client that sends only a request head, and a raw HTTP/2 client
that writes whatever bytes a test gives it to the gRPC port."""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.events
import numpy as np
import trio

from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.models import builtin_settings
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings
from support.grpcframes import frame, unframe

#: Bound on every wait: a hang fails the test instead of freezing the run.
TIMEOUT = 10.0

INFER = "/inference.GRPCInferenceService/ModelInfer"


async def launch(nursery: trio.Nursery, **changes: Any) -> Server:
    """A server in ``nursery`` (in-process, ``--api-workers 0``) on 127.0.0.1 port 0:
    REST, gRPC and TorchServe's management REST port, the identity and streamer models."""
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "http_port": 0,
        "grpc_port": 0,
        "ts_management_http_port": 0,
        "models": tuple(m for m in builtin_settings() if m.name in ("identity", "streamer")),
        "no_auth": True,
        "api_workers": 0,
    }
    values.update(changes)
    server: Server = await nursery.start(partial(serve, Settings(**values)))
    return server


@attrs.define
class Answer:
    """What the server sent back on one HTTP/1.1 connection."""

    status: int
    headers: dict[str, str]
    body: bytes
    #: the server closed the connection (EOF) within the wait
    closed: bool


def parse_answer(data: bytes, closed: bool) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(status, headers, body, closed)


async def send_head(port: int, head: bytes, *, wait: float = TIMEOUT, whole_answer: bool = False) -> Answer:
    """Send ``head`` (and nothing more) on a new connection; read until the server closes
    it or ``wait`` s pass (``whole_answer``: or until one whole answer with a
    ``Content-Length`` has arrived, for a connection the server may keep alive)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data, closed = b"", False
    async with stream:
        await stream.send_all(head)
        with trio.move_on_after(wait):
            while not (whole_answer and _complete(data)):
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:  # a reset after the answer
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                data += chunk
    return parse_answer(data, closed)


def _complete(data: bytes) -> bool:
    """``data`` holds an answer's head and as much body as its Content-Length says."""
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def head_of(method: str, path: str, length: int, content_type: str = "application/json") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: {content_type}\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


def infer_message(rid: str = "ok", value: int = 7) -> bytes:
    """A valid ModelInferRequest for ``identity``, serialized."""
    request = InferenceRequest(
        inputs=[tensor_from_numpy("INPUT0", np.array([value], dtype=np.int64))], id=rid
    )
    return bytes(request_to_pb(request, model_name="identity", raw=True))


@attrs.define
class H2Outcome:
    """How the server ended one raw HTTP/2 exchange."""

    headers: dict[str, str] = attrs.field(factory=dict)
    trailers: dict[str, str] = attrs.field(factory=dict)
    data: bytes = b""
    reset: int | None = None  # RST_STREAM error code
    goaway: int | None = None  # GOAWAY error code
    closed: bool = False  # the TCP connection was closed

    @property
    def grpc_status(self) -> str | None:
        """grpc-status from the trailers (or from a trailers-only answer)."""
        return self.trailers.get("grpc-status") or self.headers.get("grpc-status")

    @property
    def grpc_message(self) -> str:
        return self.trailers.get("grpc-message") or self.headers.get("grpc-message") or ""


def h2_client() -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    return conn


def grpc_headers(
    port: int,
    path: str = INFER,
    content_type: str = "application/grpc",
    extra: tuple[tuple[str, str], ...] = (),
) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", content_type),
        ("te", "trailers"),
        *extra,
    ]


async def h2_exchange(
    port: int, conn: h2.connection.H2Connection, raw: bytes = b"", *, end: bool = True
) -> H2Outcome:
    """Send what ``conn`` has queued, then ``raw`` bytes as they are; read until the
    stream ends (``end``) or the connection does, bounded by :data:`TIMEOUT`."""
    out = H2Outcome()
    with trio.fail_after(TIMEOUT):
        sock = await trio.open_tcp_stream("127.0.0.1", port)
        async with sock:
            await sock.send_all(conn.data_to_send() + raw)
            while True:
                try:
                    chunk = await sock.receive_some()
                except trio.BrokenResourceError:
                    chunk = b""
                if not chunk:
                    out.closed = True
                    return out
                try:
                    events = conn.receive_data(chunk)
                except h2.exceptions.ProtocolError:
                    out.closed = True
                    return out
                for event in events:
                    if isinstance(event, h2.events.ResponseReceived):
                        out.headers = dict(event.headers)
                    elif isinstance(event, h2.events.DataReceived):
                        out.data += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.TrailersReceived):
                        out.trailers = dict(event.headers)
                    elif isinstance(event, h2.events.StreamReset):
                        out.reset = int(event.error_code)
                        if end:
                            return out
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        out.goaway = int(event.error_code)
                        return out
                    elif isinstance(event, h2.events.StreamEnded) and end:
                        return out
                pending = conn.data_to_send()
                if pending:
                    await sock.send_all(pending)


async def good_grpc_call(port: int, rid: str = "ok", value: int = 7) -> list[int]:
    """One well-formed ModelInfer on a new connection: the identity model's output."""
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(port))
    conn.send_data(sid, frame(infer_message(rid, value)), end_stream=True)
    out = await h2_exchange(port, conn)
    assert out.grpc_status == "0", out
    ((_, payload),) = unframe(out.data)
    reply = response_from_pb(pb.ModelInferResponse.FromString(payload))
    return [int(v) for v in reply.output("OUTPUT0").data.reshape(-1)]
