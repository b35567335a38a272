"""Bad input (issue 14): a body announced over ``max_body_bytes`` is refused with 413
before a byte of it is read, on every REST route family and with both HTTP/1.1 parsers;
on gRPC a message over the limit gets RESOURCE_EXHAUSTED without being buffered.

The client sends only the request head (Content-Length: 1 GiB, no body): the 413 arriving,
and the connection closing, show the server did not wait for the body."""

from __future__ import annotations

import json

import pytest
import trio
from support.grpcframes import frame
from support.rel_badinput import (
    TIMEOUT,
    good_grpc_call,
    grpc_headers,
    h2_client,
    h2_exchange,
    head_of,
    launch,
    send_head,
)

GIB = 1 << 30

#: (method, path, error format) on the main REST port: the OIP raw paths, Quart's
#: routes (and its 404), the OpenAI API, TorchServe's inference and management paths.
MAIN_PORT = (
    ("POST", "/v2/models/identity/infer", "oip"),
    ("POST", "/v2/models/identity/versions/1/infer", "oip"),
    ("POST", "/v2/models/streamer/generate", "oip"),
    ("POST", "/v2/models/streamer/generate_stream", "oip"),
    ("POST", "/v2/models/streamer/infer_stream", "oip"),
    ("POST", "/v2/repository/index", "oip"),
    ("POST", "/v2/repository/models/identity/load", "oip"),
    ("POST", "/v2/repository/models/identity/unload", "oip"),
    ("GET", "/v2/health/ready", "oip"),
    ("GET", "/v2/models/identity", "oip"),
    ("POST", "/no/such/route", "oip"),
    ("GET", "/metrics", "oip"),
    ("POST", "/v1/completions", "openai"),
    ("POST", "/v1/chat/completions", "openai"),
    ("GET", "/v1/models", "openai"),
    ("POST", "/predictions/identity", "torchserve"),
    ("PUT", "/predictions/identity/1", "torchserve"),
    ("GET", "/ping", "torchserve"),
    ("POST", "/models", "torchserve"),
    ("PUT", "/models/identity", "torchserve"),
    ("DELETE", "/models/identity", "torchserve"),
)
#: the same on TorchServe's management port
MANAGEMENT_PORT = (
    ("POST", "/models", "torchserve"),
    ("PUT", "/models/identity", "torchserve"),
    ("GET", "/models", "torchserve"),
    ("GET", "/ping", "torchserve"),
)


def error_message(body: bytes, style: str) -> str:
    """The message of a JSON error body in the family's format."""
    document = json.loads(body)
    if style == "oip":
        return str(document["error"])
    if style == "openai":
        return str(document["error"]["message"])
    assert document["code"] == 413 and document["type"] == "RequestTooLargeException"
    return str(document["message"])


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_gibibyte_announced_is_refused_unread_on_every_route(
    nursery: trio.Nursery, parser: str
) -> None:
    server = await launch(nursery, http_parser=parser)
    assert server.http_address is not None
    ports = [
        (server.http_address[1], MAIN_PORT),
        (server.extra_addresses["ts_management_http"][1], MANAGEMENT_PORT),
    ]
    seen = []
    for port, cases in ports:
        for method, path, style in cases:
            answer = await send_head(port, head_of(method, path, GIB))
            message = error_message(answer.body, style) if answer.status == 413 else answer.body.decode()
            seen.append((method, path, answer.status, answer.closed, "max_body_bytes" in message))
    assert seen == [(m, p, 413, True, True) for _, cases in ports for m, p, _ in cases]
    # nothing ran: no request reached a model
    for name in ("identity", "streamer"):
        stats = await server.engine.statistics(name, "")
        assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0)
    # and the server still serves
    answer = await send_head(
        server.http_address[1], b"GET /v2/health/ready HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
    )
    assert (answer.status, json.loads(answer.body)) == (200, {"ready": True})


async def test_a_small_limit_holds_on_the_torchserve_prediction_path(nursery: trio.Nursery) -> None:
    """Regression: ``/predictions`` read the body up to the limit instead of looking at
    Content-Length first, so a client announcing a big body and sending nothing waited
    for ever (no 413)."""
    server = await launch(nursery, max_body_bytes=1000)
    assert server.http_address is not None
    answer = await send_head(server.http_address[1], head_of("POST", "/predictions/identity", 1001))
    assert (answer.status, answer.closed) == (413, True)
    assert json.loads(answer.body)["message"] == "request body is over 1000 bytes (max_body_bytes)"


@pytest.mark.parametrize("encoding", [None, "gzip"])
async def test_grpc_message_over_the_limit_is_resource_exhausted(
    nursery: trio.Nursery, encoding: str | None
) -> None:
    """A message whose prefix announces more than ``max_body_bytes`` is refused from the
    prefix alone (the client sends 5 bytes and keeps its stream open). Regression: without
    ``grpc-encoding`` grpclib read and buffered the whole announced message first (up
    to 4 GiB, acknowledging flow control as it went)."""
    server = await launch(nursery, max_body_bytes=1000)
    assert server.grpc_address is not None
    port = server.grpc_address[1]
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    extra = (("grpc-encoding", encoding),) if encoding else ()
    conn.send_headers(sid, grpc_headers(port, extra=extra))
    conn.send_data(sid, b"\x00" + (GIB).to_bytes(4, "big"))  # the prefix of a 1 GiB message, no end
    with trio.fail_after(TIMEOUT):
        out = await h2_exchange(port, conn)
    assert (out.grpc_status, out.grpc_message) == ("8", f"message of {GIB} bytes is larger than 1000")
    # one byte over, sent whole
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(port))
    conn.send_data(sid, frame(b"\x00" * 1001), end_stream=True)
    out = await h2_exchange(port, conn)
    assert (out.grpc_status, out.grpc_message) == ("8", "message of 1001 bytes is larger than 1000")
    assert await good_grpc_call(port) == [7]
