"""gRPC end to end with the generated betterproto2/grpclib client (under its own
``asyncio.run`` in a worker thread): full duplex ModelStreamInfer, several requests in
flight, backpressure, cancellation, stream-in models, both dialects, parameters and
raw/typed contents, and gzip on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import numpy as np
import pytest
import trio
import trio.testing
from e2e.grpc_fixtures import (
    GatedBatchModel,
    GateModel,
    GrpcServer,
    grpc_server,
    in_asyncio,
    running_grpc_server,
    wait_until,
)
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from support.grpcframes import frame, unframe
from support.replicas import not_held_message

from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb

__all__ = ["grpc_server"]

TIMEOUT = 20.0
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def req(model: str, rid: str, *inputs: Any, raw: bool = True, **parameters: Any) -> pb.ModelInferRequest:
    request = InferenceRequest(inputs=list(inputs), id=rid, parameters=parameters)
    return request_to_pb(request, model_name=model, raw=raw)


def int64(value: int, name: str = "INPUT") -> Any:
    return tensor_from_numpy(name, np.array([value], dtype=np.int64))


def index_of(message: Any) -> tuple[str, int]:
    """(id, index) of a gate/ticker/streamer response."""
    response = response_from_pb(message.infer_response)
    return str(response.id), int(response.output("index").data[0])


class DuplexStream:
    """The stub's ModelStreamInfer driven by hand: ``send`` a request, ``recv`` the next
    response, ``rest`` half-closes and collects the rest, ``cancel`` cancels the call.
    The call starts at once and requests and responses flow independently."""

    def __init__(self, channel: Channel, **kw: Any) -> None:
        self._requests: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()
        self._responses: asyncio.Queue[Any] = asyncio.Queue()
        stub = pb.GrpcInferenceServiceStub(channel)
        self._pump = asyncio.get_running_loop().create_task(self._receive(stub, kw))

    async def _source(self) -> AsyncIterator[pb.ModelInferRequest]:
        while (message := await self._requests.get()) is not None:
            yield message

    async def _receive(self, stub: pb.GrpcInferenceServiceStub, kw: dict[str, Any]) -> None:
        try:
            async for message in stub.model_stream_infer(self._source(), **kw):
                self._responses.put_nowait(message)
        except Exception as exc:
            self._responses.put_nowait(exc)
        else:
            self._responses.put_nowait(StopAsyncIteration())

    def send(self, message: pb.ModelInferRequest) -> None:
        self._requests.put_nowait(message)

    async def recv(self) -> Any:
        item = await asyncio.wait_for(self._responses.get(), TIMEOUT)
        if isinstance(item, Exception):
            raise item
        return item

    async def rest(self) -> list[Any]:
        """Half-close, then every remaining response until the server ends the call."""
        self._requests.put_nowait(None)
        out = []
        while True:
            try:
                out.append(await self.recv())
            except StopAsyncIteration:
                return out

    async def cancel(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump


def channel(server: GrpcServer) -> Channel:
    return Channel(server.host, server.port)


# --------------------------------------------------------------------------- full duplex


async def test_full_duplex_a_response_arrives_before_the_client_sends_more(grpc_server: GrpcServer) -> None:
    async def scenario() -> list[Any]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("streamer", "r1", n_tokens=2))
            first = index_of(await stream.recv())  # before request 2 exists
            stream.send(req("streamer", "r2", n_tokens=1))
            rest = sorted(index_of(m) for m in await stream.rest())
            return [first, rest]

    assert await in_asyncio(scenario) == [("r1", 0), [("r1", 1), ("r2", 0)]]


async def test_several_requests_in_flight_on_one_stream(grpc_server: GrpcServer) -> None:
    """A and C wait on gates, B does not: B is answered while A and C are in flight,
    then C and A as their gates open; every response carries its request's id."""

    async def scenario() -> list[tuple[str, int]]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("gate", "A", n_tokens=2, gate="a"))
            stream.send(req("gate", "B", n_tokens=2))
            stream.send(req("gate", "C", n_tokens=1, gate="c"))
            got = [index_of(await stream.recv()), index_of(await stream.recv())]
            grpc_server.open_gate_from_thread("gate", "c")
            got.append(index_of(await stream.recv()))
            grpc_server.open_gate_from_thread("gate", "a")
            got += [index_of(m) for m in await stream.rest()]
            return got

    assert await in_asyncio(scenario) == [("B", 0), ("B", 1), ("C", 0), ("A", 0), ("A", 1)]
    await grpc_server.assert_quiet()


async def test_stream_stops_reading_past_max_inflight() -> None:
    async with running_grpc_server(grpc_stream_max_inflight=2) as server:
        model: GateModel = server.model("gate")

        async def only_two_started() -> list[str]:
            await wait_until(lambda: model.started["A"].is_set() and model.started["B"].is_set())
            await trio.testing.wait_all_tasks_blocked()
            return sorted(rid for rid, event in model.started.items() if event.is_set())

        async def scenario() -> tuple[list[str], list[tuple[str, int]]]:
            async with channel(server) as ch:
                stream = DuplexStream(ch)
                for rid in "ABC":
                    stream.send(req("gate", rid, n_tokens=1, gate=rid.lower()))
                started = await asyncio.to_thread(
                    lambda: trio.from_thread.run(only_two_started, trio_token=server.token)
                )
                server.open_gate_from_thread("gate", "c")  # C is not read yet: nothing happens
                server.open_gate_from_thread("gate", "a")  # A ends, a slot frees, C is read and runs
                got = [index_of(await stream.recv()), index_of(await stream.recv())]
                server.open_gate_from_thread("gate", "b")
                got += [index_of(m) for m in await stream.rest()]
                return started, got

        assert await in_asyncio(scenario) == (["A", "B"], [("A", 0), ("C", 0), ("B", 0)])


# --------------------------------------------------------------------------- cancellation


async def test_cancel_mid_stream_leaves_the_engine_without_work(grpc_server: GrpcServer) -> None:
    model: GateModel = grpc_server.model("gate")

    async def scenario() -> tuple[str, int]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("gate", "A", n_tokens=5, gate="never", free=1))
            stream.send(req("gate", "B", n_tokens=5, gate="never"))
            first = index_of(await stream.recv())
            await asyncio.to_thread(
                lambda: trio.from_thread.run(model.started["B"].wait, trio_token=grpc_server.token)
            )
            await stream.cancel()
            return first

    assert await in_asyncio(scenario) == ("A", 0)
    with trio.fail_after(TIMEOUT):
        await model.left["A"].wait()
        await model.left["B"].wait()
    assert model.outcome == {"A": "cancelled", "B": "cancelled"}
    await grpc_server.assert_quiet()


async def test_cancel_reaches_a_batched_model_within_one_step(grpc_server: GrpcServer) -> None:
    """Every step of ``ticker`` waits for a permit: after the client cancels, at most
    the step already running includes the request; then the model is told."""
    model: GatedBatchModel = grpc_server.model("ticker")

    async def scenario() -> tuple[str, int]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("ticker", "T", n_tokens=100))
            model.permits.release()
            first = index_of(await stream.recv())
            await stream.cancel()
            return first

    assert await in_asyncio(scenario) == ("T", 0)
    await grpc_server.statistics_when("ticker", lambda s: s.inflight == 0)  # the server has left the request
    steps_before = len(model.steps)
    model.permits.release()  # let a step that was already waiting for a permit finish
    with trio.fail_after(TIMEOUT):
        await model.cancelled_event.wait()
    assert model.cancelled == ["T"]
    assert len(model.steps) - steps_before <= 1
    assert all(step == ["T"] for step in model.steps)
    await grpc_server.assert_quiet()


async def test_cancelled_sequence_request_leaves_the_sequence_open(grpc_server: GrpcServer) -> None:
    model: GateModel = grpc_server.model("gateseq")

    async def first_call() -> tuple[str, int]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(
                req("gateseq", "s1", n_tokens=3, gate="never", free=1, sequence_id="S", sequence_start=True)
            )
            first = index_of(await stream.recv())
            await stream.cancel()
            return first

    assert await in_asyncio(first_call) == ("s1", 0)
    with trio.fail_after(TIMEOUT):
        await model.left["s1"].wait()
    await grpc_server.statistics_when(
        "gateseq", lambda s: s.inflight == s.queued == 0 and s.open_sequences == 1
    )

    async def second_call() -> list[tuple[str, int]]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("gateseq", "s2", n_tokens=2, sequence_id="S", sequence_end=True))
            return [index_of(m) for m in await stream.rest()]

    assert await in_asyncio(second_call) == [("s2", 0), ("s2", 1)]
    assert model.outcome == {"s1": "cancelled", "s2": "done"}
    assert (await grpc_server.engine.statistics("gateseq")).open_sequences == 0


async def test_sequence_cancel_on_a_stream_stops_the_running_request(grpc_server: GrpcServer) -> None:
    """``sequence_cancel`` does not wait behind the running request of its sequence: it
    is answered at once, and the running request ends with the reason in-band."""
    model: GatedBatchModel = grpc_server.model("ticker")

    async def scenario() -> tuple[Any, ...]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("ticker", "T1", n_tokens=100, sequence_id="S", sequence_start=True))
            model.permits.release()
            first = index_of(await stream.recv())
            stream.send(req("ticker", "cancel", sequence_id="S", sequence_cancel=True))
            answers = [await stream.recv()]
            if answers[0].infer_response.id == "cancel":
                # T1 leaves the batch when the step already waiting for a permit is done
                model.permits.release()
                answers.append(await stream.recv())
            model.permits.release()
            rest = await stream.rest()
            by_id = {m.infer_response.id: m for m in answers}
            cancel, running = by_id["cancel"], by_id["T1"]
            return (
                first,
                (cancel.error_message, response_from_pb(cancel.infer_response).parameters),
                (running.infer_response.id, running.error_message),
                rest,
            )

    assert await in_asyncio(scenario) == (
        ("T1", 0),
        ("", {"sequence_id": "S", "sequence_cancelled": True}),
        ("T1", "sequence 'S' was cancelled"),
        [],
    )
    with trio.fail_after(TIMEOUT):
        await model.cancelled_event.wait()
    assert (await grpc_server.engine.statistics("ticker")).open_sequences == 0
    await grpc_server.assert_quiet()


async def test_cancelled_unary_call_cancels_its_request(grpc_server: GrpcServer) -> None:
    model: GateModel = grpc_server.model("gate")

    async def scenario() -> bool:
        async with channel(grpc_server) as ch:
            stub = pb.GrpcInferenceServiceStub(ch)
            call = asyncio.create_task(stub.model_infer(req("gate", "U", n_tokens=1, gate="never")))
            await asyncio.to_thread(
                lambda: trio.from_thread.run(model.started["U"].wait, trio_token=grpc_server.token)
            )
            call.cancel()
            try:
                await call
            except asyncio.CancelledError:
                return True
            return False

    assert await in_asyncio(scenario) is True
    with trio.fail_after(TIMEOUT):
        await model.left["U"].wait()
    assert model.outcome == {"U": "cancelled"}
    await grpc_server.assert_quiet()


# --------------------------------------------------------------------------- errors


async def test_in_band_error_keeps_the_stream_open(grpc_server: GrpcServer) -> None:
    async def scenario() -> list[Any]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            stream.send(req("identity", "bad", int64(1, "BOGUS")))
            bad = await stream.recv()
            stream.send(req("identity", "good", int64(5, "INPUT0")))
            good = await stream.recv()
            rest = await stream.rest()
            out = response_from_pb(good.infer_response)
            return [
                (bad.error_message, bad.infer_response.id, bad.infer_response.model_name),
                (good.error_message, out.id, out.output("OUTPUT0").data.tolist()),
                rest,
            ]

    assert await in_asyncio(scenario) == [
        ("model 'identity' has no input 'BOGUS' (expected INPUT0, INPUT1)", "bad", "identity"),
        ("", "good", [5]),
        [],
    ]


async def test_triton_grpc_error_header_ends_the_call_with_a_status(grpc_server: GrpcServer) -> None:
    """With ``triton_grpc_error: true`` the first error ends the call with its status,
    after the responses before it.

    The client half-closes right after the bad request: if it kept its side open, the
    server's RST_STREAM after the trailers (which HTTP/2 allows and grpcio handles) can
    reach grpclib's client first, and it then reports ProtocolError instead of the
    status."""

    async def scenario() -> tuple[list[tuple[str, int]], Status, str | None]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch, metadata={"triton_grpc_error": "true"})
            stream.send(req("streamer", "ok", n_tokens=2))
            got = [index_of(await stream.recv()), index_of(await stream.recv())]
            stream.send(req("accumulator", "bad", int64(1), sequence_id=77))
            with pytest.raises(GRPCError) as info:
                await stream.rest()
            return got, info.value.status, info.value.message

    assert await in_asyncio(scenario) == (
        [("ok", 0), ("ok", 1)],
        Status.NOT_FOUND,
        not_held_message("77"),
    )


async def test_unary_bad_raw_contents_are_invalid_argument(grpc_server: GrpcServer) -> None:
    async def scenario() -> list[tuple[Status, str | None]]:
        out = []
        async with channel(grpc_server) as ch:
            stub = pb.GrpcInferenceServiceStub(ch)
            short = req("identity", "x", tensor_from_numpy("INPUT0", np.array([1, 2], np.int32)))
            short.raw_input_contents = [b"\x01\x00\x00"]
            missing = req("identity", "y", tensor_from_numpy("INPUT0", np.array([1, 2], np.int32)))
            missing.raw_input_contents = []
            for message in (short, missing):
                with pytest.raises(GRPCError) as info:
                    await stub.model_infer(message)
                out.append((info.value.status, info.value.message))
        return out

    assert await in_asyncio(scenario) == [
        (Status.INVALID_ARGUMENT, "input 'INPUT0': INT32 shape [2] needs 8 bytes, got 3"),
        (Status.INVALID_ARGUMENT, "input 'INPUT0': shape [2] needs 2 elements, contents.int_contents has 0"),
    ]


# --------------------------------------------------------------------------- parameters, contents


async def test_unary_parameters_of_all_five_kinds_and_typed_contents(grpc_server: GrpcServer) -> None:
    async def scenario() -> tuple[dict[str, Any], list[str], Any]:
        async with channel(grpc_server) as ch:
            stub = pb.GrpcInferenceServiceStub(ch)
            message = req(
                "identity",
                "p",
                tensor_from_numpy("INPUT0", np.array([[1.5, -2.0]], np.float32)),
                tensor_from_numpy("INPUT1", np.array([b"a", b"bc"], dtype=object), "BYTES"),
                raw=False,
                flag=True,
                count=-7,
                name="n",
                ratio=0.5,
                big=2**64 - 1,
            )
            assert message.raw_input_contents == []
            reply = await stub.model_infer(message)
            kinds = {k: betterproto_kind(v) for k, v in reply.parameters.items()}
            response = response_from_pb(reply)
            return (
                kinds,
                [reply.model_name, reply.model_version, reply.id],
                [t.data.tolist() for t in response.outputs],
            )

    kinds, meta, data = await in_asyncio(scenario)
    assert kinds == {
        "flag": ("bool_param", True),
        "count": ("int64_param", -7),
        "name": ("string_param", "n"),
        "ratio": ("double_param", 0.5),
        "big": ("uint64_param", 2**64 - 1),
    }
    assert meta == ["identity", "1", "p"]
    assert data == [[[1.5, -2.0]], [b"a", b"bc"]]


def betterproto_kind(param: Any) -> tuple[str, Any]:
    import betterproto2

    field, value = betterproto2.which_one_of(param, "parameter_choice")
    return field, value


# --------------------------------------------------------------------------- stream-in models


async def test_stream_in_models_and_per_request_models_share_a_stream(grpc_server: GrpcServer) -> None:
    """``sum`` (stream in, one response out) answers when the client half-closes;
    ``running_sum`` (stream in, stream out) answers each request as it arrives, while a
    streamer request runs beside them."""

    async def scenario() -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[Any]]:
        async with channel(grpc_server) as ch:
            stream = DuplexStream(ch)
            for rid, value in (("s1", 1), ("s2", 2), ("s3", 3)):
                stream.send(req("sum", rid, int64(value)))
            running = []
            for rid, value in (("r1", 1), ("r2", 2), ("r3", 4)):
                stream.send(req("running_sum", rid, int64(value)))
                out = response_from_pb((await stream.recv()).infer_response)
                running.append((str(out.id), int(out.output("SUM").data[0])))
            stream.send(req("streamer", "t", n_tokens=1))
            rest = [response_from_pb(m.infer_response) for m in await stream.rest()]
            sums = [(str(r.id), int(r.output("SUM").data[0])) for r in rest if r.model_name == "sum"]
            others = [(r.model_name, r.id) for r in rest if r.model_name != "sum"]
            return running, sums, others

    assert await in_asyncio(scenario) == (
        [("r1", 1), ("r2", 3), ("r3", 7)],
        [("s3", 6)],
        [("streamer", "t")],
    )


# --------------------------------------------------------------------------- MLServer dialect


async def mlserver_call(server: GrpcServer, messages: list[pb.ModelInferRequest]) -> list[Any]:
    async with (
        channel(server) as ch,
        ch.request(
            STREAM_INFER, Cardinality.STREAM_STREAM, pb.ModelInferRequest, pb.ModelInferResponse
        ) as stream,
    ):
        for message in messages:
            await stream.send_message(message)
        await stream.end()
        return [response_from_pb(m) async for m in stream]


async def test_mlserver_dialect_streams_bare_responses_and_errors_as_status() -> None:
    async with running_grpc_server(grpc_stream_dialect="mlserver") as server:

        async def scenario() -> list[Any]:
            tokens = await mlserver_call(
                server, [req("streamer", "a", n_tokens=2), req("streamer", "b", n_tokens=1)]
            )
            sums = await mlserver_call(server, [req("sum", "x", int64(4)), req("sum", "y", int64(5))])
            with pytest.raises(GRPCError) as info:
                await mlserver_call(server, [req("nope", "z")])
            return [
                [(r.id, int(r.output("index").data[0])) for r in tokens],
                [(r.id, int(r.output("SUM").data[0])) for r in sums],
                (info.value.status, info.value.message),
            ]

        assert await in_asyncio(scenario) == [
            [("a", 0), ("a", 1), ("b", 0)],
            [("y", 9)],
            (Status.NOT_FOUND, "model 'nope' is not loaded"),
        ]


# --------------------------------------------------------------------------- gzip on the wire


async def raw_h2_call(
    server: GrpcServer, path: str, body: bytes, headers: list[tuple[str, str]]
) -> dict[str, Any]:
    """One gRPC call over a bare HTTP/2 connection: what the server really sends."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", server.target),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *headers,
        ],
    )
    conn.send_data(sid, body, end_stream=True)
    out: dict[str, Any] = {"data": b""}
    with trio.fail_after(TIMEOUT):
        sock = await trio.open_tcp_stream(server.host, server.port)
        async with sock:
            await sock.send_all(conn.data_to_send())
            ended = False
            while not ended:
                chunk = await sock.receive_some()
                assert chunk, "connection closed early"
                for event in conn.receive_data(chunk):
                    if isinstance(event, h2.events.ResponseReceived):
                        out["headers"] = dict(event.headers)
                    elif isinstance(event, h2.events.DataReceived):
                        out["data"] += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    elif isinstance(event, h2.events.TrailersReceived):
                        out["trailers"] = dict(event.headers)
                    elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                        ended = True
                await sock.send_all(conn.data_to_send())
    return out


async def test_gzip_request_gets_a_gzip_response(grpc_server: GrpcServer) -> None:
    data = np.arange(4096, dtype=np.int64)
    message = req("identity", "gz", tensor_from_numpy("INPUT0", data))
    body = frame(gzip.compress(bytes(message)), True)
    result = await raw_h2_call(
        grpc_server,
        "/inference.GRPCInferenceService/ModelInfer",
        body,
        [("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity,gzip")],
    )
    assert result["headers"]["grpc-encoding"] == "gzip"
    assert result["trailers"]["grpc-status"] == "0"
    ((compressed, payload),) = unframe(result["data"])
    assert compressed is True
    assert len(payload) < data.nbytes // 4
    reply = response_from_pb(pb.ModelInferResponse.FromString(gzip.decompress(payload)))
    assert (reply.id, reply.output("OUTPUT0").data.tolist()) == ("gz", data.tolist())


async def test_small_messages_and_clients_that_do_not_compress_stay_plain(grpc_server: GrpcServer) -> None:
    path = "/inference.GRPCInferenceService/ModelInfer"
    small = bytes(req("identity", "s", int64(1, "INPUT0")))
    compressed_small = await raw_h2_call(
        grpc_server,
        path,
        frame(gzip.compress(small), True),
        [("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")],
    )
    plain = await raw_h2_call(
        grpc_server, path, frame(small, False), [("grpc-accept-encoding", "identity,deflate,gzip")]
    )
    unsupported = await raw_h2_call(grpc_server, path, frame(small, True), [("grpc-encoding", "snappy")])
    assert compressed_small["headers"]["grpc-encoding"] == "gzip"
    assert [c for c, _ in unframe(compressed_small["data"])] == [False]  # under gzip_min_bytes
    assert "grpc-encoding" not in plain["headers"]
    assert [c for c, _ in unframe(plain["data"])] == [False]
    status = unsupported.get("trailers") or unsupported["headers"]
    assert status["grpc-status"] == str(Status.UNIMPLEMENTED.value)
