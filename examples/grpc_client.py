"""Unary gRPC calls with the generated betterproto2/grpclib client.

    python examples/grpc_client.py [--grpc 127.0.0.1:8081]

Checks that the server is live and ready, reads the metadata of the ``identity`` model,
and runs one ModelInfer with a raw FP32 tensor. Exits 0 when every answer is right.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np
from example_token import METADATA, refused
from grpclib import Status
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.types import InferenceRequest


async def main(host: str, port: int) -> int:
    async with Channel(host, port) as channel:
        stub = pb.GrpcInferenceServiceStub(channel, timeout=30, metadata=METADATA)
        live = (await stub.server_live(pb.ServerLiveRequest())).live
        ready = (await stub.server_ready(pb.ServerReadyRequest())).ready
        meta = await stub.model_metadata(pb.ModelMetadataRequest(name="identity"))
        print(f"live={live} ready={ready} identity inputs={[t.name for t in meta.inputs]}")

        data = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
        request = InferenceRequest(
            inputs=[tensor_from_numpy("INPUT0", data)], id="example-1", parameters={"note": "hello"}
        )
        # Tensors travel as raw little-endian bytes (raw_input_contents): the fast path.
        reply = await stub.model_infer(request_to_pb(request, model_name="identity"))
        response = response_from_pb(reply)
        output = response.output("OUTPUT0").data
        print(
            f"id={response.id} model={response.model_name}/{response.model_version} OUTPUT0={output.tolist()}"
        )

        try:
            await stub.model_metadata(pb.ModelMetadataRequest(name="no-such-model"))
        except GRPCError as error:
            print(f"unknown model -> {error.status.name}: {error.message}")
            not_found = error.status.name == "NOT_FOUND"
        else:
            not_found = False

    ok = live and ready and np.array_equal(output, data) and response.id == "example-1" and not_found
    return 0 if ok else 1


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
