"""ModelStreamInfer names a server-made sequence id in its initial metadata: a call
without ``sequence-id`` metadata whose first message starts a sequence without an id
gets the id the server makes in its answer's headers (``sequence-id``, beside
``actorserve-replica``), as ModelInfer does; with grpclib and with tritonclient."""

from __future__ import annotations

import asyncio
import queue
from functools import partial
from typing import Any

import numpy as np
import trio
import tritonclient.grpc as triton
from conftest import rest_settings
from grpclib.client import Channel
from grpclib.const import Cardinality
from tritonclient.grpc import service_pb2

from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.replica import made_by
from actorserve.server.composition import Server, serve

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
TIMEOUT = 20.0


async def start(nursery: trio.Nursery, replica: str) -> tuple[str, int]:
    server: Server = await nursery.start(partial(serve, rest_settings(grpc_port=0, replica_id=replica)))
    assert server.grpc_address is not None
    host, port = server.grpc_address[:2]
    return str(host), int(port)


def pb_add(value: int, model: str = "accumulator", **parameters: Any) -> pb.ModelInferRequest:
    name = "INPUT" if model == "accumulator" else "INPUT0"
    tensor = tensor_from_numpy(name, np.array([value], dtype=np.int64))
    return request_to_pb(InferenceRequest(inputs=[tensor], parameters=parameters), model_name=model)


def total_of(message: pb.ModelStreamInferResponse) -> int:
    assert not message.error_message, message.error_message
    return int(response_from_pb(message.infer_response).outputs[0].data[0])


async def grpclib_stream(host: str, port: int, first: pb.ModelInferRequest) -> dict[str, Any]:
    """One ModelStreamInfer call: ``first``, then (when it opened a sequence) one more
    request of that sequence by its id, ending it."""
    channel = Channel(host, port)
    try:
        async with channel.request(
            STREAM, Cardinality.STREAM_STREAM, pb.ModelInferRequest, pb.ModelStreamInferResponse
        ) as call:
            await call.send_message(first)
            await call.recv_initial_metadata()
            metadata = dict(call.initial_metadata or {})
            answer = await call.recv_message()
            assert answer is not None
            sid = response_from_pb(answer.infer_response).parameters.get("sequence_id")
            totals = [total_of(answer)]
            if sid is not None:
                await call.send_message(pb_add(5, sequence_id=sid, sequence_end=True))
                later = await call.recv_message()
                assert later is not None
                totals.append(total_of(later))
            await call.end()
            return {"metadata": metadata, "sid": sid, "totals": totals}
    finally:
        channel.close()


async def test_grpclib_learns_a_server_made_id_from_the_stream_headers(nursery: trio.Nursery) -> None:
    host, port = await start(nursery, "pod-s")

    def run(first: pb.ModelInferRequest) -> dict[str, Any]:
        return asyncio.run(asyncio.wait_for(grpclib_stream(host, port, first), TIMEOUT))

    made = await trio.to_thread.run_sync(run, pb_add(2, sequence_start=True))
    sid = made["sid"]
    assert made_by(sid) == "pod-s" and made["totals"] == [2, 7]
    assert made["metadata"]["sequence-id"] == sid and made["metadata"]["actorserve-replica"] == "pod-s"
    # a client's own id is the client's: nothing to learn, nothing echoed from the first message
    chosen = await trio.to_thread.run_sync(run, pb_add(3, sequence_start=True, sequence_id="chat-3"))
    assert chosen["sid"] == "chat-3" and "sequence-id" not in chosen["metadata"]
    assert chosen["totals"] == [3, 8]


def triton_stream(target: str) -> tuple[str, dict[str, str], list[int]]:
    """tritonclient: a stream whose first request starts a sequence with no id.
    tritonclient's ``async_stream_infer`` sends ``sequence_start`` only beside an id (and
    refuses it as a custom parameter), so that request is tritonclient's own protobuf,
    given ``sequence_start`` and queued on its stream."""
    answers: queue.Queue[Any] = queue.Queue(maxsize=8)
    client = triton.InferenceServerClient(target)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error), timeout=TIMEOUT))
        request = service_pb2.ModelInferRequest(model_name="accumulator")
        tensor = request.inputs.add(name="INPUT", datatype="INT64", shape=[1])
        tensor.contents.int64_contents.append(4)
        request.parameters["sequence_start"].bool_param = True
        client._stream._enqueue_request(request)
        result, error = answers.get(timeout=TIMEOUT)
        assert error is None, error.message()
        sid = result.get_response().parameters["sequence_id"].string_param
        # tritonclient keeps grpcio's call; its initial metadata is the stream's headers
        metadata = dict(client._stream._response_iterator.initial_metadata())
        data = triton.InferInput("INPUT", [1], "INT64")
        data.set_data_from_numpy(np.array([6], dtype=np.int64))
        client.async_stream_infer("accumulator", [data], sequence_id=sid, sequence_end=True)
        later, error = answers.get(timeout=TIMEOUT)
        assert error is None, error
        totals = [int(result.as_numpy("OUTPUT")[0]), int(later.as_numpy("OUTPUT")[0])]
        client.stop_stream()
        return sid, metadata, totals
    finally:
        client.close()


async def test_tritonclient_stream_headers_name_the_server_made_id(nursery: trio.Nursery) -> None:
    host, port = await start(nursery, "pod-t")
    sid, metadata, totals = await trio.to_thread.run_sync(triton_stream, f"{host}:{port}")
    assert made_by(sid) == "pod-t" and totals == [4, 10]
    assert (metadata["sequence-id"], metadata["actorserve-replica"]) == (sid, "pod-t")
