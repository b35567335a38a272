"""Bad input (issue 14): slow-loris clients on the gRPC port. A connection with no open
stream for ``grpc_idle_timeout`` gets GOAWAY (NO_ERROR, saying why) and is closed,
whether it sent nothing, the preface only, or finished its calls; a frame (or the
preface) started and not finished within ``read_timeout`` closes it the same way, even
when it trickles in byte by byte. A stream left open and quiet for longer than either
keeps its connection; tritonclient's and grpclib's kept-alive channels that sat idle
past the timeout reconnect by themselves on their next call.

Real sockets need real time: the timeouts are 0.3 s and 0.6 s here, every wait bounded."""

from __future__ import annotations

import asyncio
import logging
import time

import attrs
import h2.connection
import h2.events
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from grpclib.client import Channel
from support.grpcframes import frame, unframe
from support.rel_badinput import good_grpc_call, grpc_headers, h2_client, infer_message, launch

from actorserve.proto import inference as pb
from actorserve.proto.convert import response_from_pb

READ = 0.3
IDLE = 0.6
#: how long a quiet stream stays open before it is used: well past both timeouts
QUIET = 3 * IDLE
BOUND = 5.0
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
LOGGER = "actorserve.transport.grpc"


@attrs.define
class Ending:
    """How the server ended a raw connection."""

    goaway: int | None
    reason: bytes
    #: seconds from connecting to the server's close
    closed_at: float


async def hold(port: int, data: bytes = b"", trickle: bytes = b"", every: float = 0.05) -> Ending:
    """Connect, send ``data`` at once and then ``trickle`` one byte every ``every`` s;
    read (parsing the server's frames) until the server closes the connection."""
    client = h2_client()  # only parses what the server sends
    goaway, reason = None, b""
    start = trio.current_time()
    sock = await trio.open_tcp_stream("127.0.0.1", port)

    async def send() -> None:
        try:
            await sock.send_all(data)
            for k in range(len(trickle)):
                await trio.sleep(every)
                await sock.send_all(trickle[k : k + 1])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # closed by the server: the reader sees it

    async with sock:
        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                while True:
                    try:
                        chunk = await sock.receive_some()
                    except trio.BrokenResourceError:
                        chunk = b""
                    if not chunk:
                        break
                    for event in client.receive_data(chunk):
                        if isinstance(event, h2.events.ConnectionTerminated):
                            goaway, reason = int(event.error_code), bytes(event.additional_data or b"")
                nursery.cancel_scope.cancel()
    return Ending(goaway, reason, trio.current_time() - start)


async def pump(
    sock: trio.SocketStream, conn: h2.connection.H2Connection, events: list[h2.events.Event]
) -> bool:
    """Read one chunk into ``events`` (answering settings and pings); False at EOF."""
    chunk = await sock.receive_some()
    if not chunk:
        return False
    for event in conn.receive_data(chunk):
        events.append(event)
        if isinstance(event, h2.events.DataReceived):
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
    if pending := conn.data_to_send():
        await sock.send_all(pending)
    return True


async def quiet_stream(port: int) -> tuple[list[int], str]:
    """Open a ModelStreamInfer call, send nothing on it for :data:`QUIET` s, then one
    request: the identity model's output and the call's grpc-status."""
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(port, STREAM_INFER))
    events: list[h2.events.Event] = []
    sock = await trio.open_tcp_stream("127.0.0.1", port)
    async with sock:
        await sock.send_all(conn.data_to_send())
        with trio.move_on_after(QUIET):
            while True:
                assert await pump(sock, conn, events), "the connection of an open stream was closed"
        assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
        conn.send_data(sid, frame(infer_message("late", 5)), end_stream=True)
        await sock.send_all(conn.data_to_send())
        with trio.fail_after(BOUND):
            while not any(isinstance(e, h2.events.StreamEnded) for e in events):
                assert await pump(sock, conn, events)
    data = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    ((_, payload),) = unframe(data)
    reply = response_from_pb(pb.ModelStreamInferResponse.FromString(payload).infer_response)
    (trailers,) = [dict(e.headers) for e in events if isinstance(e, h2.events.TrailersReceived)]
    return [int(v) for v in reply.output("OUTPUT0").data.reshape(-1)], trailers["grpc-status"]


def preface() -> bytes:
    """A client's connection preface and SETTINGS."""
    return h2_client().data_to_send()


async def test_idle_and_half_sent_grpc_connections_are_closed_and_quiet_streams_kept(
    nursery: trio.Nursery,
) -> None:
    server = await launch(nursery, grpc_idle_timeout=IDLE, read_timeout=READ)
    assert server.grpc_address is not None
    port = server.grpc_address[1]
    headers_start = (
        (100).to_bytes(3, "big") + b"\x01\x04" + (1).to_bytes(4, "big")
    )  # HEADERS, 100 bytes announced
    cases = {
        "silent": (b"", b""),
        "the preface, no stream": (preface(), b""),
        "half the preface": (b"PRI * HTTP/2.0\r\n", b""),
        "a frame header, no body": (preface() + headers_start, b""),
        "a frame trickled": (preface(), headers_start + b"\x00" * 100),
        "the preface trickled": (b"", preface()),
    }
    endings: dict[str, Ending] = {}
    quiet: list[tuple[list[int], str]] = []

    async def run(name: str, data: bytes, trickle: bytes) -> None:
        endings[name] = await hold(port, data, trickle)

    async def run_quiet() -> None:
        quiet.append(await quiet_stream(port))

    async with trio.open_nursery() as clients:
        for name, (data, trickle) in cases.items():
            clients.start_soon(run, name, data, trickle)
        clients.start_soon(run_quiet)

    idle = b"idle: no open stream for 0.6 s (grpc_idle_timeout)"
    read = b"a frame did not arrive within 0.3 s (read_timeout)"
    assert {name: (e.goaway, e.reason) for name, e in endings.items()} == {
        "silent": (0, idle),
        "the preface, no stream": (0, idle),
        "half the preface": (0, read),
        "a frame header, no body": (0, read),
        "a frame trickled": (0, read),
        "the preface trickled": (0, read),
    }
    for name, ending in endings.items():
        timeout = IDLE if ending.reason == idle else READ
        # not before the timeout, and not after the seconds of trickle left
        assert timeout - 0.05 < ending.closed_at < timeout + 1.0, (name, ending)
    # the quiet stream was kept, and answered once used
    assert quiet == [([5], "0")]
    # the server still serves, and nothing of the slow clients reached a model
    assert await good_grpc_call(port, value=3) == [3]
    stats = await server.engine.statistics("identity", "")
    assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0)


def idle_closes(caplog: pytest.LogCaptureFixture) -> int:
    return sum("closed: idle: no open stream" in r.getMessage() for r in caplog.records if r.name == LOGGER)


async def test_idle_tritonclient_and_grpclib_channels_reconnect_after_the_goaway(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Each client makes a call, sits idle past the timeout (the server closes its
    connection with GOAWAY), then calls again on the same client object: answered."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    timeout = 0.3
    server = await launch(nursery, grpc_idle_timeout=timeout)
    assert server.grpc_address is not None
    port = server.grpc_address[1]

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

    def triton_call(value: int) -> int:
        tensor = grpcclient.InferInput("INPUT0", [1], "INT64")
        tensor.set_data_from_numpy(np.array([value], dtype=np.int64))
        return int(client.infer("identity", [tensor]).as_numpy("OUTPUT0")[0])

    try:
        first = await trio.to_thread.run_sync(triton_call, 1)
        closes = idle_closes(caplog)
        with trio.fail_after(BOUND):
            while idle_closes(caplog) == closes:  # noqa: ASYNC110 (a log line to wait for: the server closed it)
                await trio.sleep(0.05)
        second = await trio.to_thread.run_sync(triton_call, 2)
    finally:
        await trio.to_thread.run_sync(client.close)
    assert (first, second) == (1, 2)

    def grpclib_calls() -> list[int]:
        async def calls() -> list[int]:
            out = []
            async with Channel("127.0.0.1", port) as channel:
                stub = pb.GrpcInferenceServiceStub(channel)
                for value in (3, 4):
                    reply = await stub.model_infer(
                        pb.ModelInferRequest.FromString(infer_message(str(value), value))
                    )
                    out.append(int(response_from_pb(reply).output("OUTPUT0").data[0]))
                    await asyncio.sleep(3 * timeout)  # idle past the timeout: GOAWAY
            return out

        # a plain asyncio loop (trio_asyncio's policy would give one of its own)
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            return runner.run(calls())

    closes = idle_closes(caplog)
    started = time.monotonic()
    assert await trio.to_thread.run_sync(grpclib_calls) == [3, 4]
    assert time.monotonic() - started < BOUND
    assert idle_closes(caplog) - closes == 2  # after each call
