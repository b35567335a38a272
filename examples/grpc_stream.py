"""Full-duplex ModelStreamInfer with the generated betterproto2/grpclib client.

    python examples/grpc_stream.py [--grpc 127.0.0.1:8081]

One bidirectional stream carries several requests at once: three ``streamer`` prompts
and a stateful ``accumulator`` sequence. Requests are sent while responses are already
arriving; each response carries the ``id`` of its request. Exits 0 when every request
got exactly its own answers, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from collections.abc import AsyncIterator

import numpy as np
from example_token import METADATA, refused
from grpclib import Status
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.types import InferenceRequest

N_TOKENS = 4


def streamer(prompt: str) -> pb.ModelInferRequest:
    text = tensor_from_numpy("text_input", np.array([prompt.encode()], dtype=object), "BYTES")
    request = InferenceRequest(inputs=[text], id=prompt, parameters={"n_tokens": N_TOKENS})
    return request_to_pb(request, model_name="streamer")


def accumulate(rid: str, value: int, **sequence: bool) -> pb.ModelInferRequest:
    tensor = tensor_from_numpy("INPUT", np.array([value], dtype=np.int64))
    parameters: dict[str, object] = {"sequence_id": "example-seq"}
    parameters.update({f"sequence_{k}": v for k, v in sequence.items()})
    return request_to_pb(
        InferenceRequest(inputs=[tensor], id=rid, parameters=parameters), model_name="accumulator"
    )


async def main(host: str, port: int) -> int:
    outbox: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        while (message := await outbox.get()) is not None:
            yield message

    got: dict[str, list[str]] = defaultdict(list)
    async with Channel(host, port) as channel:
        stub = pb.GrpcInferenceServiceStub(channel, timeout=60, metadata=METADATA)
        responses = stub.model_stream_infer(requests())

        # Three prompts in flight at once; the sequence starts beside them.
        for prompt in ("alpha", "beta", "gamma"):
            outbox.put_nowait(streamer(prompt))
        outbox.put_nowait(accumulate("add-1", 1, start=True))
        sent_rest = False
        async for message in responses:
            reply = message.infer_response
            if message.error_message or reply is None:
                print(f"error for {reply.id if reply else '?'}: {message.error_message}")
                return 1
            response = response_from_pb(reply)
            if response.model_name == "accumulator":
                value = str(int(response.output("OUTPUT").data[0]))
            else:
                value = response.output("text_output").data[0].decode()
            got[str(response.id)].append(value)
            print(f"{response.id}: {value}")
            if not sent_rest:
                # Full duplex: the rest is sent after responses started to arrive.
                sent_rest = True
                outbox.put_nowait(accumulate("add-2", 2))
                outbox.put_nowait(accumulate("add-3", 3, end=True))
                outbox.put_nowait(None)  # half-close: no more requests

    want = {p: [f"{p}:{k}" for k in range(N_TOKENS)] for p in ("alpha", "beta", "gamma")}
    want.update({"add-1": ["1"], "add-2": ["3"], "add-3": ["6"]})
    return 0 if dict(got) == want else 1


def parse_args() -> tuple[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", help="REST URL (unused here)")
    parser.add_argument("--grpc", default="127.0.0.1:8081", help="gRPC host:port")
    args = parser.parse_args()
    host, _, port = args.grpc.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(*parse_args())))
    except GRPCError as error:
        if error.status is not Status.UNAUTHENTICATED:
            raise
        refused(f"a gRPC call ({error.status.name})")
