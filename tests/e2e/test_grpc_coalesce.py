"""ModelStreamInfer's coalesced writes, seen on the wire by a bare HTTP/2 client: every
message already waiting goes out in one DATA frame, a lone message goes out at once,
gzip framing holds on that path, and a client's cancel still reaches the engine within
one step.

The ``ticker`` model steps only when the test releases a permit, and a step answers
every request in the batch at once: that is how several messages come to be waiting
for the writer together.
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import trio
import trio.testing
from e2e.grpc_fixtures import GatedBatchModel, GrpcServer, running_grpc_server
from support.grpcframes import frame, unframe

from actorserve import InferenceRequest
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb

TIMEOUT = 20.0
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def ticker_request(rid: str, n_tokens: int = 1) -> bytes:
    return bytes(
        request_to_pb(InferenceRequest([], id=rid, parameters={"n_tokens": n_tokens}), model_name="ticker")
    )


class RawCall:
    """One streaming gRPC call on a bare HTTP/2 connection: the test sees each DATA
    frame the server sends, as sent."""

    def __init__(self, sock: trio.SocketStream, conn: h2.connection.H2Connection, sid: int) -> None:
        self.sock, self.conn, self.sid = sock, conn, sid
        #: the payload of every DATA frame received so far
        self.data_frames: list[bytes] = []
        self.ended = False

    @classmethod
    @asynccontextmanager
    async def open(cls, server: GrpcServer, headers: list[tuple[str, str]] = []) -> AsyncIterator[RawCall]:  # noqa: B006
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", STREAM_INFER),
                (":authority", server.target),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        sock = await trio.open_tcp_stream(server.host, server.port)
        async with sock:
            call = cls(sock, conn, sid)
            await call._flush()
            yield call

    async def _flush(self) -> None:
        await self.sock.send_all(self.conn.data_to_send())

    async def send(self, message: bytes, *, end: bool = False) -> None:
        self.conn.send_data(self.sid, message, end_stream=end)
        await self._flush()

    async def reset(self) -> None:
        """Cancel the call, as a client that goes away does."""
        self.conn.reset_stream(self.sid, h2.errors.ErrorCodes.CANCEL)
        await self._flush()

    async def messages(self, count: int) -> list[tuple[bool, bytes]]:
        """Read until the DATA frames received hold ``count`` messages in all (more
        than that fails the test); return them."""
        with trio.fail_after(TIMEOUT):
            while True:
                got = unframe(b"".join(self.data_frames))
                if len(got) >= count:
                    assert len(got) == count, got
                    return got
                assert not self.ended, f"the call ended after {len(got)} of {count} messages"
                chunk = await self.sock.receive_some()
                assert chunk, "connection closed early"
                for event in self.conn.receive_data(chunk):
                    if isinstance(event, h2.events.DataReceived):
                        self.data_frames.append(event.data)
                        self.conn.acknowledge_received_data(event.flow_controlled_length, self.sid)
                    elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                        self.ended = True
                await self._flush()


async def statistics(server: GrpcServer) -> Any:
    return await server.engine.statistics("ticker")


async def step_begun(model: GatedBatchModel, count: int) -> None:
    """Until the model's worker thread has begun ``count`` steps (it waits in the last)."""
    with trio.fail_after(TIMEOUT):
        while model.begun < count:  # noqa: ASYNC110 (a worker thread sets it, not a trio task)
            await trio.sleep(0.001)  # the thread is not a trio task: poll briefly


async def in_the_batcher(server: GrpcServer, count: int) -> None:
    """Until ``count`` ticker requests are in its batcher (waiting or in a step: the step
    loop reports admissions with the step's outputs, so the split is not known yet)."""
    with trio.fail_after(TIMEOUT):
        while True:
            stats = await statistics(server)
            if stats.waiting + stats.running == count:
                return
            await trio.testing.wait_all_tasks_blocked()


async def test_messages_waiting_together_go_out_in_one_data_frame() -> None:
    async with running_grpc_server() as server:
        model: GatedBatchModel = server.engine.model("ticker")  # type: ignore[assignment]
        async with RawCall.open(server) as call:
            await call.send(frame(ticker_request("first")))
            await step_begun(model, 1)  # "first" is alone in a step, waiting for a permit
            for rid in ("a", "b", "c", "d"):
                await call.send(frame(ticker_request(rid)))
            await in_the_batcher(server, 5)

            model.permits.release()  # step 1 answers "first" alone: it goes out at once
            first = await call.messages(1)
            assert len(call.data_frames) == 1
            model.permits.release()  # step 2 answers a, b, c and d together
            together = await call.messages(5)

        assert model.steps == [["first"], ["a", "b", "c", "d"]]
        assert len(call.data_frames) == 2, "the four responses of one step share one DATA frame"
        ids = [pb.ModelStreamInferResponse.FromString(payload).infer_response.id for _, payload in together]
        assert ids[0] == "first" and sorted(ids[1:]) == ["a", "b", "c", "d"]
        assert [compressed for compressed, _ in first + together[1:]] == [False] * 5
        await server.assert_quiet()


async def test_a_lone_message_is_not_held_back() -> None:
    """One response, the stream still open and nothing else coming: it is sent."""
    async with running_grpc_server() as server:
        model: GatedBatchModel = server.engine.model("ticker")  # type: ignore[assignment]
        async with RawCall.open(server) as call:
            await call.send(frame(ticker_request("solo", n_tokens=3)))
            for k in range(3):
                model.permits.release()
                ((_, payload),) = (await call.messages(k + 1))[k:]
                reply = response_from_pb(pb.ModelStreamInferResponse.FromString(payload).infer_response)
                assert (reply.id, int(reply.output("index").data[0])) == ("solo", k)
            assert len(call.data_frames) == 3
            await call.send(b"", end=True)


async def test_gzip_framing_holds_on_the_coalesced_path() -> None:
    """Every message of one write compressed on its own, each with its flag and length."""
    async with running_grpc_server(gzip_min_bytes=0) as server:
        model: GatedBatchModel = server.engine.model("ticker")  # type: ignore[assignment]
        gzip_headers = [("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")]
        async with RawCall.open(server, gzip_headers) as call:
            await call.send(frame(gzip.compress(ticker_request("first")), True))
            await step_begun(model, 1)
            for rid in ("a", "b", "c"):
                await call.send(frame(gzip.compress(ticker_request(rid)), True))
            await in_the_batcher(server, 4)
            model.permits.release()
            model.permits.release()
            got = await call.messages(4)

        # the step loop may run both steps before the writer wakes: one or two writes
        assert len(call.data_frames) in (1, 2)
        assert all(compressed for compressed, _ in got)
        ids = [
            pb.ModelStreamInferResponse.FromString(gzip.decompress(payload)).infer_response.id
            for _, payload in got
        ]
        assert sorted(ids) == ["a", "b", "c", "first"]  # requests of one stream are not ordered


async def test_a_client_cancel_reaches_the_engine_within_one_step() -> None:
    async with running_grpc_server() as server:
        model: GatedBatchModel = server.engine.model("ticker")  # type: ignore[assignment]
        async with RawCall.open(server) as call:
            await call.send(frame(ticker_request("T", n_tokens=100)))
            model.permits.release()
            await call.messages(1)
            await call.reset()
            with trio.fail_after(TIMEOUT):
                while (await statistics(server)).inflight:  # the server has left the request
                    await trio.testing.wait_all_tasks_blocked()
        steps_before = len(model.steps)
        model.permits.release()  # a step already waiting for a permit may still include it
        with trio.fail_after(TIMEOUT):
            await model.cancelled_event.wait()
        assert model.cancelled == ["T"]
        assert len(model.steps) - steps_before <= 1
        stats = await statistics(server)
        assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0)
