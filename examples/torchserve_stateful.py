"""TorchServe's stateful example, served by actorserve's built-in ``ts_stateful`` model,
driven the way TorchServe's users drive it: REST with the ``ts_request_sequence_*``
headers (curl-style), then gRPC ``StreamPredictions2`` with TorchServe's own protos.

    python examples/torchserve_stateful.py [--http http://127.0.0.1:8080] [--grpc 127.0.0.1:8081]

A running sum per sequence: even inputs answer once, an odd input streams the sum until a
later request of its sequence ends it (0). Exits 0 when every answer is right.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading

import httpx
from example_token import AUTH, HOOKS, METADATA, refused
from grpclib import Status
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from actorserve.proto.torchserve.org.pytorch.serve.grpc import inference as ts

SEQ_ID, SEQ_END = "ts_request_sequence_id", "ts_request_sequence_end"


def rest(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=30, headers=AUTH, event_hooks=HOOKS) as client:
        first = client.post("/predictions/ts_stateful", content=b"1")  # no id: a new sequence
        sequence = first.headers[SEQ_ID]
        print(f"started {sequence}: {first.text}")
        chunks: list[str] = []

        def stream() -> None:  # an odd input streams until the sequence ends
            with client.stream(
                "POST", "/predictions/ts_stateful", content=b"3", headers={SEQ_ID: sequence}
            ) as reply:
                for chunk in reply.iter_raw():
                    chunks.append(chunk.decode())
                    if len(chunks) == 2:
                        started.set()

        started = threading.Event()
        streamer = threading.Thread(target=stream)
        streamer.start()
        started.wait(30)
        last = client.post("/predictions/ts_stateful", content=b"0", headers={SEQ_ID: sequence})
        streamer.join(30)
        print(f"streamed {chunks}, then 0 ended it: {last.text} ({SEQ_END}: {last.headers.get(SEQ_END)})")
        return (
            first.text == "1"
            and set(chunks) == {"4"}
            and last.text == "4"
            and last.headers.get(SEQ_END) == sequence
        )


async def grpc(host: str, port: int) -> bool:
    async with Channel(host, port) as channel:
        stub = ts.InferenceApIsServiceStub(channel, timeout=30, metadata=METADATA)
        requests = [
            ts.PredictionsRequest(
                model_name="ts_stateful", sequence_id="grpc-1", input={"data": value, **flags}
            )
            for value, flags in ((b"2", {"ts_request_sequence_start": b"true"}), (b"4", {}), (b"0", {}))
        ]
        answers = [(r.sequence_id, r.prediction) async for r in stub.stream_predictions_2(requests)]
        print(f"StreamPredictions2: {answers}")
        return answers == [("grpc-1", b"2"), ("grpc-1", b"6"), ("grpc-1", b"6")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", default="http://127.0.0.1:8080", help="REST URL")
    parser.add_argument("--grpc", default="127.0.0.1:8081", help="gRPC host:port")
    args = parser.parse_args()
    host, _, port = args.grpc.rpartition(":")
    try:
        ok = rest(args.http) and asyncio.run(grpc(host, int(port)))
    except GRPCError as error:
        if error.status is not Status.UNAUTHENTICATED:
            raise
        refused(f"StreamPredictions2 ({error.status.name})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
