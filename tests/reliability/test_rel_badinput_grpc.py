"""Bad input (issue 14): malformed gRPC messages and HTTP/2 frames written raw to the gRPC
port. Each gets a gRPC status (or an RST_STREAM / GOAWAY), never a hang, and the server
keeps serving: a well-formed call on a new connection succeeds after each one, and a
connection opened before them is still usable after all of them."""

from __future__ import annotations

import h2.connection
import h2.events
import pytest
import trio
from h2.errors import ErrorCodes
from support.grpcframes import frame
from support.rel_badinput import (
    H2Outcome,
    good_grpc_call,
    grpc_headers,
    h2_client,
    h2_exchange,
    infer_message,
    launch,
)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: grpc-status codes
OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = "0", "3", "8", "12", "13"


def call(
    port: int, body: bytes, *, headers: list[tuple[str, str]] | None = None
) -> h2.connection.H2Connection:
    """A client connection with one call queued: ``headers`` (default: ModelInfer's) and
    ``body`` as its DATA, ending the stream."""
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, headers or grpc_headers(port))
    conn.send_data(sid, body, end_stream=True)
    return conn


def status_of(out: H2Outcome) -> tuple[str | None, str]:
    return out.grpc_status, out.grpc_message


async def test_malformed_messages_get_a_clear_grpc_status(nursery: trio.Nursery) -> None:
    server = await launch(nursery, max_body_bytes=1 << 20)
    assert server.grpc_address is not None
    port = server.grpc_address[1]
    good = infer_message()
    cases = {
        "valid": frame(good),
        "short prefix": b"\x00\x00\x00",
        "truncated message": frame(good)[:-3],
        "length over the data": b"\x00" + (len(good) + 50).to_bytes(4, "big") + good,
        "compressed flag, no grpc-encoding": frame(good, compressed=True),
        "invalid protobuf": frame(b"\xff" * 16),
        "invalid UTF-8 in a string": frame(b"\x0a\x02\xff\xfe"),  # model_name
        "no message": b"",
        "huge declared length": b"\x00\xff\xff\xff\xff",
    }
    seen = {}
    for name, body in cases.items():
        seen[name] = status_of(await h2_exchange(port, call(port, body)))
        assert await good_grpc_call(port, value=len(seen)) == [len(seen)]  # the server keeps serving
    name = "ModelInferRequest"
    assert seen == {
        "valid": (OK, ""),
        "short prefix": (INTERNAL, "the request ended inside a message prefix"),
        "truncated message": (INTERNAL, f"the request ended inside a message of {len(good)} bytes"),
        "length over the data": (INTERNAL, f"the request ended inside a message of {len(good) + 50} bytes"),
        "compressed flag, no grpc-encoding": (
            INTERNAL,
            "a compressed message on a call without grpc-encoding",
        ),
        "invalid protobuf": (INVALID_ARGUMENT, seen["invalid protobuf"][1]),
        "invalid UTF-8 in a string": (INVALID_ARGUMENT, seen["invalid UTF-8 in a string"][1]),
        "no message": (INVALID_ARGUMENT, "the call carried no request message"),
        "huge declared length": (
            RESOURCE_EXHAUSTED,
            f"message of {0xFFFFFFFF} bytes is larger than {1 << 20}",
        ),
    }
    for case in ("invalid protobuf", "invalid UTF-8 in a string"):
        assert seen[case][1].startswith(f"the request is not a valid {name} message ("), seen[case]


async def test_bad_calls_and_bad_http2_frames_leave_other_clients_served(nursery: trio.Nursery) -> None:
    server = await launch(nursery)
    assert server.grpc_address is not None
    port = server.grpc_address[1]
    good = frame(infer_message())
    # a connection opened before the bad ones, kept open through them
    keeper = await trio.open_tcp_stream("127.0.0.1", port)
    keeper_conn = h2_client()
    await keeper.send_all(keeper_conn.data_to_send())

    outcomes: dict[str, H2Outcome] = {}
    # wrong content-type, unknown method, unknown encoding: answered with a status
    outcomes["text/plain"] = await h2_exchange(
        port, call(port, good, headers=grpc_headers(port, content_type="text/plain"))
    )
    outcomes["no such method"] = await h2_exchange(
        port, call(port, good, headers=grpc_headers(port, "/inference.GRPCInferenceService/Nope"))
    )
    outcomes["snappy"] = await h2_exchange(
        port, call(port, good, headers=grpc_headers(port, extra=(("grpc-encoding", "snappy"),)))
    )
    # frames that break HTTP/2 itself: the connection is ended with a GOAWAY saying why
    # (an invalid preface is simply closed, which RFC 9113 section 3.4 allows)
    settings_bad = (
        (5).to_bytes(3, "big") + b"\x04\x00" + (0).to_bytes(4, "big") + b"\x01" * 5
    )  # not n*6 bytes
    outcomes["SETTINGS of a bad length"] = await h2_exchange(port, h2_client(), settings_bad)
    outcomes["garbage instead of the preface"] = await h2_exchange(
        port, h2.connection.H2Connection(), b"GET / HTTP/1.1\r\n\r\n" + b"\xff" * 64
    )
    data_idle = (5).to_bytes(3, "big") + b"\x00\x01" + (1).to_bytes(4, "big") + b"\x00\x00\x00\x00\x05"
    outcomes["DATA on an idle stream"] = await h2_exchange(port, h2_client(), data_idle)
    # a frame announcing 16 MiB, of which 100 bytes come: refused from its header
    huge_frame = (0xFFFFFF).to_bytes(3, "big") + b"\x00\x00" + (1).to_bytes(4, "big") + b"\x00" * 100
    outcomes["frame over the max frame size"] = await h2_exchange(port, h2_client(), huge_frame)
    headers_garbage = (
        (16).to_bytes(3, "big") + b"\x01\x05" + (1).to_bytes(4, "big") + b"\xff" * 16
    )  # HPACK garbage
    outcomes["HPACK garbage"] = await h2_exchange(port, h2_client(), headers_garbage)

    text = outcomes["text/plain"]
    assert (text.headers[":status"], *status_of(text)) == ("415", "2", "Unacceptable content-type header")
    assert status_of(outcomes["no such method"]) == (UNIMPLEMENTED, "Method not found")
    assert status_of(outcomes["snappy"]) == (
        UNIMPLEMENTED,
        "message encoding 'snappy' is not supported (supported: identity, gzip, deflate)",
    )
    calls = ("text/plain", "no such method", "snappy")
    ends = {
        name: (out.goaway, out.closed, out.grpc_status) for name, out in outcomes.items() if name not in calls
    }
    assert ends == {
        "SETTINGS of a bad length": (ErrorCodes.FRAME_SIZE_ERROR, False, None),
        "garbage instead of the preface": (None, True, None),
        "DATA on an idle stream": (ErrorCodes.PROTOCOL_ERROR, False, None),
        "frame over the max frame size": (ErrorCodes.FRAME_SIZE_ERROR, False, None),
        "HPACK garbage": (ErrorCodes.PROTOCOL_ERROR, False, None),
    }
    # the server still serves: new connections, and the one opened before
    assert await good_grpc_call(port, value=3) == [3]
    sid = keeper_conn.get_next_available_stream_id()
    keeper_conn.send_headers(sid, grpc_headers(port))
    keeper_conn.send_data(sid, good, end_stream=True)
    await keeper.send_all(keeper_conn.data_to_send())
    with trio.fail_after(10):
        while True:
            chunk = await keeper.receive_some()
            assert chunk, "the connection opened first was closed"
            events = keeper_conn.receive_data(chunk)
            if any(isinstance(e, h2.events.TrailersReceived) for e in events):
                trailers = next(dict(e.headers) for e in events if isinstance(e, h2.events.TrailersReceived))
                break
    assert trailers["grpc-status"] == OK
    await keeper.aclose()
    stats = await server.engine.statistics("identity", "")
    assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0)


@pytest.mark.parametrize("count", [20])
async def test_many_bad_calls_on_one_connection_keep_it_serving(nursery: trio.Nursery, count: int) -> None:
    """Bad messages are per-call errors: the HTTP/2 connection that carried them still
    serves a good call afterwards."""
    server = await launch(nursery)
    assert server.grpc_address is not None
    port = server.grpc_address[1]
    conn = h2_client()
    for k in range(count):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, grpc_headers(port))
        body = frame(b"\xff" * (11 + k)) if k % 2 else b"\x01\x00"  # a varint too long; a short prefix
        conn.send_data(sid, body, end_stream=True)
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(port))
    conn.send_data(sid, frame(infer_message("last", 5)), end_stream=True)
    statuses: dict[int, str] = {}
    with trio.fail_after(10):
        sock = await trio.open_tcp_stream("127.0.0.1", port)
        async with sock:
            await sock.send_all(conn.data_to_send())
            while len(statuses) < count + 1:
                chunk = await sock.receive_some()
                assert chunk, "connection closed"
                for event in conn.receive_data(chunk):
                    if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                        status = dict(event.headers).get("grpc-status")
                        if status is not None:
                            statuses[event.stream_id] = status
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                await sock.send_all(conn.data_to_send())
    ordered = [statuses[s] for s in sorted(statuses)]
    assert ordered[-1] == OK
    assert sorted(set(ordered[:-1])) == sorted({INTERNAL, INVALID_ARGUMENT})
