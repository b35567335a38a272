"""The lean unary path (``actorserve/transport/grpchost/unary.py``): which calls take it,
and, on a real server on 127.0.0.1 port 0 with raw HTTP/2 and grpcio clients, that a call
it serves answers as grpclib's ``request_handler`` did: exact replies, headers and
trailers, error statuses (trailers-only, with the server's metadata), the server's own
deadline, compression, size limits, tokens, and a client that resets the stream."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import grpc
import h2.connection
import h2.events
import numpy as np
import trio
from e2e.grpc_fixtures import in_asyncio, running_grpc_server
from grpclib.const import Cardinality, Handler
from h2.errors import ErrorCodes
from support.grpcframes import frame, unframe
from support.rel_badinput import TIMEOUT, grpc_headers, h2_client, h2_exchange, launch

from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.replica import REPLICA_HEADER
from actorserve.transport.auth import FORBIDDEN, UNAUTHORIZED
from actorserve.transport.grpchost.unary import lean, lean_call

INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
#: grpc-status codes
OK, UNKNOWN, DEADLINE_EXCEEDED, NOT_FOUND = "0", "2", "4", "5"
PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNIMPLEMENTED, UNAUTHENTICATED = "7", "8", "12", "16"
TOKEN = "s3cret-token-for-tests"  # management (and everything else)
READER = "inference-only-token-for-tests"


def message(
    model: str = "identity", rid: str = "r", values: tuple[int, ...] = (3, -4), **params: Any
) -> bytes:
    request = InferenceRequest(
        inputs=[tensor_from_numpy("INPUT0", np.array(values, dtype=np.int64))], id=rid, parameters=params
    )
    return bytes(request_to_pb(request, model_name=model, raw=True))


async def exchange(port: int, body: bytes, *extra: tuple[str, str], path: str = INFER) -> Any:
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(port, path, extra=extra))
    conn.send_data(sid, body, end_stream=True)
    return await h2_exchange(port, conn)


def output(data: bytes) -> list[int]:
    ((compressed, payload),) = unframe(data)
    assert not compressed
    reply = response_from_pb(pb.ModelInferResponse.FromString(payload))
    return [int(v) for v in reply.output("OUTPUT0").data.reshape(-1)]


# -- which calls take the lean path -----------------------------------------------------------


async def _lean(stream: Any) -> None: ...


async def _plain(stream: Any) -> None: ...


def test_lean_call_takes_only_plain_unary_calls_of_lean_methods() -> None:
    unary, stream = Cardinality.UNARY_UNARY, Cardinality.STREAM_STREAM
    mapping = {
        "/s/Lean": Handler(lean(_lean), unary, None, None),
        "/s/Plain": Handler(_plain, unary, None, None),
        "/s/Stream": Handler(_lean, stream, None, None),
    }
    base = [
        (":method", "POST"),
        (":path", "/s/Lean"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    call = lean_call(mapping, [*base, ("x-key", "v"), ("k-bin", "AAE")])
    assert call is not None
    func, metadata, deadline = call
    assert func is mapping["/s/Lean"].func and deadline is None
    assert list(metadata.items()) == [("x-key", "v"), ("k-bin", b"\x00\x01")]
    _, _, deadline = lean_call(mapping, [*base, ("grpc-timeout", "5S")]) or (None, None, None)
    assert deadline is not None and 4 < deadline.time_remaining() <= 5
    assert lean_call(mapping, [*base[:3], ("content-type", "application/grpc+proto"), ("te", "trailers")])

    def changed(key: str, value: str) -> list[tuple[str, str]]:
        return [(k, value if k == key else v) for k, v in base]

    # anything else is grpclib's request_handler's, with its own answers
    assert lean_call(mapping, changed(":path", "/s/Plain")) is None
    assert lean_call(mapping, changed(":path", "/s/Stream")) is None
    assert lean_call(mapping, changed(":path", "/s/Missing")) is None
    assert lean_call(mapping, changed(":method", "GET")) is None
    assert lean_call(mapping, changed("content-type", "application/grpc+json")) is None
    assert lean_call(mapping, changed("te", "gzip")) is None
    assert lean_call(mapping, [*base, ("grpc-timeout", "soon")]) is None


# -- what a call gets ---------------------------------------------------------------------------


async def test_reply_headers_and_trailers_are_grpclibs() -> None:
    async with running_grpc_server() as server:
        out = await exchange(server.port, frame(message(values=(7, -8, 9))), ("grpc-timeout", "10S"))
        assert output(out.data) == [7, -8, 9]
        assert out.headers == {
            ":status": "200",
            "content-type": "application/grpc+proto",
            REPLICA_HEADER: out.headers[REPLICA_HEADER],
        }
        assert out.headers[REPLICA_HEADER]
        assert out.trailers == {"grpc-status": OK}
        live = await exchange(server.port, frame(b""), path=LIVE)
        assert (live.grpc_status, unframe(live.data)) == (OK, [(False, b"\x08\x01")])  # live: true


async def test_a_request_in_many_data_frames_is_read_whole() -> None:
    async with running_grpc_server() as server:
        body = frame(message(values=(11, 12, 13)))
        conn = h2_client()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, grpc_headers(server.port))
        for start in range(0, len(body), 7):  # the prefix itself split across frames
            conn.send_data(sid, body[start : start + 7])
        conn.send_data(sid, b"", end_stream=True)
        out = await h2_exchange(server.port, conn)
        assert (out.grpc_status, output(out.data)) == (OK, [11, 12, 13])
        # a message cut short at the end of the stream: INTERNAL, as grpclib's framing error
        short = await exchange(server.port, body[:-3])
        assert (short.grpc_status, short.grpc_message) == (
            "13",
            f"the request ended inside a message of {len(body) - 5} bytes",
        )
        half_prefix = await exchange(server.port, body[:3])
        assert (half_prefix.grpc_status, half_prefix.grpc_message) == (
            "13",
            "the request ended inside a message prefix",
        )


async def test_errors_are_trailers_only_with_the_servers_metadata() -> None:
    async with running_grpc_server() as server:
        out = await exchange(server.port, frame(message(model="nope")))
        assert out.data == b"" and out.trailers == {}
        assert out.headers[":status"] == "200" and out.headers[REPLICA_HEADER]
        assert out.grpc_status == NOT_FOUND
        assert "nope" in out.grpc_message
        # no message at all: INVALID_ARGUMENT, as before
        empty = await exchange(server.port, b"")
        assert (empty.grpc_status, empty.grpc_message) == ("3", "the call carried no request message")
        # grpclib's own checks still answer what the lean path does not take
        bad = await exchange(server.port, frame(message()), ("grpc-timeout", "soon"))
        assert (bad.grpc_status, bad.grpc_message) == (UNKNOWN, "Invalid grpc-timeout header")
        assert output((await exchange(server.port, frame(message()))).data) == [3, -4]


async def test_the_servers_deadline_ends_the_call_and_its_request() -> None:
    async with running_grpc_server() as server:
        model = server.model("gate")
        # a raw client: it keeps no deadline of its own, so the server's timer ends the call
        out = await exchange(
            server.port, frame(message("gate", "late", gate="never")), ("grpc-timeout", "50m")
        )
        assert (out.grpc_status, out.data) == (DEADLINE_EXCEEDED, b"")
        with trio.fail_after(TIMEOUT):
            await model.left["late"].wait()
        assert model.outcome["late"] == "cancelled"
        await server.assert_quiet()


async def test_compressed_calls_and_unknown_encodings() -> None:
    async with running_grpc_server(gzip_min_bytes=0) as server:
        body = frame(gzip.compress(message(values=(5, 6))), compressed=True)
        out = await exchange(
            server.port, body, ("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity,gzip")
        )
        assert out.grpc_status == OK and out.headers["grpc-encoding"] == "gzip"
        ((compressed, payload),) = unframe(out.data)
        assert compressed
        assert output(frame(gzip.decompress(payload))) == [5, 6]
        unknown = await exchange(server.port, frame(message()), ("grpc-encoding", "br"))
        assert unknown.grpc_status == UNIMPLEMENTED
        assert unknown.grpc_message.startswith("message encoding 'br' is not supported")


async def test_a_message_over_the_limit_is_refused_before_it_is_read() -> None:
    async with running_grpc_server(max_body_bytes=4096) as server:
        prefix_only = frame(b"")[:1] + (10**6).to_bytes(4, "big")
        out = await exchange(server.port, prefix_only)
        assert (out.grpc_status, out.grpc_message) == (
            RESOURCE_EXHAUSTED,
            "message of 1000000 bytes is larger than 4096",
        )
        assert output((await exchange(server.port, frame(message()))).data) == [3, -4]


async def test_tokens_are_checked_by_the_methods_scope(nursery: trio.Nursery) -> None:
    server = await launch(nursery, no_auth=False, token=TOKEN, inference_token=READER, auth_inference=True)
    assert server.grpc_address is not None
    port = server.grpc_address[1]
    missing = await exchange(port, frame(message()))
    assert (missing.grpc_status, missing.grpc_message, missing.data) == (UNAUTHENTICATED, UNAUTHORIZED, b"")
    wrong = await exchange(port, frame(message()), ("authorization", "Bearer nope"))
    assert wrong.grpc_status == UNAUTHENTICATED
    for token in (TOKEN, READER):
        right = await exchange(port, frame(message()), ("authorization", f"Bearer {token}"))
        assert output(right.data) == [3, -4]
    # a management method with the inference token: PERMISSION_DENIED (REST's 403)
    load = bytes(pb.RepositoryModelLoadRequest(model_name="identity"))
    denied = await exchange(port, frame(load), ("authorization", f"Bearer {READER}"), path=LOAD)
    assert (denied.grpc_status, denied.grpc_message) == (PERMISSION_DENIED, FORBIDDEN)
    # ServerLive is open: no token needed
    assert (await exchange(port, frame(b""), path=LIVE)).grpc_status == OK


async def test_a_reset_stream_cancels_the_call_and_the_connection_serves_on() -> None:
    async with running_grpc_server() as server:
        model = server.model("gate")
        conn = h2_client()
        first = conn.get_next_available_stream_id()
        conn.send_headers(first, grpc_headers(server.port))
        conn.send_data(first, frame(message("gate", "held", gate="never")), end_stream=True)
        with trio.fail_after(TIMEOUT):
            sock = await trio.open_tcp_stream("127.0.0.1", server.port)
            async with sock:
                await sock.send_all(conn.data_to_send())
                await model.started["held"].wait()
                conn.reset_stream(first, ErrorCodes.CANCEL)
                second = conn.get_next_available_stream_id()
                conn.send_headers(second, grpc_headers(server.port))
                conn.send_data(second, frame(message(values=(1,))), end_stream=True)
                await sock.send_all(conn.data_to_send())
                await model.left["held"].wait()
                data, trailers = b"", {}
                while "grpc-status" not in trailers:
                    for event in conn.receive_data(await sock.receive_some()):
                        if isinstance(event, h2.events.DataReceived) and event.stream_id == second:
                            data += event.data
                        elif isinstance(event, h2.events.TrailersReceived):
                            trailers = dict(event.headers)
                    await sock.send_all(conn.data_to_send())
        assert model.outcome["held"] == "cancelled"
        assert (trailers["grpc-status"], output(data)) == (OK, [1])
        await server.assert_quiet()


async def test_grpcio_client_cancelling_mid_call() -> None:
    async with running_grpc_server() as server:
        model = server.model("gate")
        target, body = server.target, message("gate", "aio", gate="never")

        async def client() -> tuple[bool, bytes]:
            async with grpc.aio.insecure_channel(target) as channel:
                method = channel.unary_unary(INFER)
                call = method(body, timeout=TIMEOUT)
                for _ in range(int(TIMEOUT / 0.005)):  # set on the trio side; read only here
                    if model.started["aio"].is_set():
                        break
                    await asyncio.sleep(0.005)
                cancelled = call.cancel()
                identity = await method(message(values=(2,)), timeout=TIMEOUT)
                return cancelled, identity

        cancelled, identity = await in_asyncio(client)
        assert cancelled
        assert output(frame(identity)) == [2]
        with trio.fail_after(TIMEOUT):
            await model.left["aio"].wait()
        assert model.outcome["aio"] == "cancelled"
