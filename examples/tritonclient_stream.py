"""Streaming with Triton's own client, unchanged: ``tritonclient.grpc`` ``start_stream``
and ``async_stream_infer``.

    python examples/tritonclient_stream.py [--grpc 127.0.0.1:8081]

Streams tokens from ``streamer``, then runs two interleaved ``accumulator`` sequences
(``sequence_id=``, ``sequence_start=``, ``sequence_end=``) on the same stream. Exits 0
when every answer is right.
"""

from __future__ import annotations

import argparse
import queue
import sys
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from example_token import METADATA, refused
from tritonclient.utils import InferenceServerException

TIMEOUT = 30.0


def text_input(prompt: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    return tensor


def int_input(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT", [1], "INT64")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int64))
    return tensor


def failed(error: Any) -> int:
    """Exit with :data:`example_token.REFUSED` if the server wants a token, else say the error."""
    if error.status() == "StatusCode.UNAUTHENTICATED":
        refused(f"the stream ({error.message()})")
    print(f"error: {error}")
    return 1


def main(url: str) -> int:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        return exchange(url, results)
    except InferenceServerException:
        # The server ended the stream (as it does at once for a missing token) before a
        # request went out; the callback holds the reason.
        _, error = results.get(timeout=TIMEOUT)
        return failed(error)


def exchange(url: str, results: queue.Queue[tuple[Any, Any]]) -> int:
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)), headers=METADATA)
    try:
        # 1. Tokens from the streamer, each response carrying the request id.
        client.async_stream_infer(
            "streamer", [text_input("hello")], request_id="tokens", parameters={"n_tokens": 5}
        )
        tokens = []
        for _ in range(5):
            result, error = results.get(timeout=TIMEOUT)
            if error is not None:
                return failed(error)
            tokens.append(result.as_numpy("text_output")[0].decode())
        print("streamer:", tokens)

        # 2. Two sequences interleaved on the same stream; each keeps its own sum.
        plan = [
            (101, 1, {"sequence_start": True}),
            (202, 10, {"sequence_start": True}),
            (101, 2, {}),
            (202, 20, {}),
            (101, 3, {"sequence_end": True}),
            (202, 30, {"sequence_end": True}),
        ]
        for i, (sequence_id, value, flags) in enumerate(plan):
            client.async_stream_infer(
                "accumulator", [int_input(value)], request_id=f"r{i}", sequence_id=sequence_id, **flags
            )
        sums: dict[str, list[int]] = {"101": [], "202": []}
        for _ in plan:
            result, error = results.get(timeout=TIMEOUT)
            if error is not None:
                return failed(error)
            sequence_id = result.get_response().parameters["sequence_id"].string_param
            sums[sequence_id].append(int(result.as_numpy("OUTPUT")[0]))
        print("accumulator:", sums)
    finally:
        client.stop_stream()
        client.close()

    ok = tokens == [f"hello:{k}" for k in range(5)] and sums == {"101": [1, 3, 6], "202": [10, 30, 60]}
    return 0 if ok else 1


def parse_args() -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", help="REST URL (unused here)")
    parser.add_argument("--grpc", default="127.0.0.1:8081", help="gRPC host:port")
    return str(parser.parse_args().grpc)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
