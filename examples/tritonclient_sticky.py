"""Stateful sequences with ``tritonclient.grpc`` behind a sticky proxy: every call of a
sequence carries the ``sequence-id`` metadata the proxy routes on.

    python examples/tritonclient_sticky.py [--grpc 127.0.0.1:8081]

Stock tritonclient puts the sequence id in the message body only, which a proxy
(HAProxy, nginx, Envoy) cannot see: the second request of a sequence then reaches a
random replica, which answers ``sequence ... is not open on replica ...``.
:class:`StickyClient` adds the metadata from ``sequence_id``; a stream carries one
sequence (its metadata is the stream's). Runs one ``accumulator`` sequence by unary
calls and one on a stream; exits 0 when every sum is right (docs/deploy.md#clients).
"""

from __future__ import annotations

import argparse
import queue
import secrets
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from example_token import METADATA, refused
from tritonclient.utils import InferenceServerException

TIMEOUT = 30.0


class StickyClient(grpcclient.InferenceServerClient):
    """tritonclient's gRPC client, sending a request's ``sequence_id`` also as the
    ``sequence-id`` metadata (the routing key, docs/deploy.md#stickiness)."""

    def infer(self, model_name: str, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return super().infer(model_name, inputs, *args, **_routed(kwargs))

    def async_infer(self, model_name: str, inputs: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
        return super().async_infer(model_name, inputs, callback, *args, **_routed(kwargs))

    def start_sequence_stream(self, sequence_id: str | int, callback: Callable[[Any, Any], None]) -> None:
        """A stream for the requests of one sequence (the metadata is the stream's)."""
        headers = {**METADATA, "sequence-id": str(sequence_id)}
        self.start_stream(callback=callback, headers=headers)


def _routed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the token and, for a sequence, its id as ``sequence-id`` metadata."""
    headers = {**METADATA, **(kwargs.get("headers") or {})}
    sequence_id = kwargs.get("sequence_id")
    if sequence_id:  # 0 and "": no sequence
        headers["sequence-id"] = str(sequence_id)
    return {**kwargs, "headers": headers}


def int_input(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT", [1], "INT64")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int64))
    return tensor


def main(url: str) -> int:
    client = StickyClient(url)
    try:
        return run(client)
    except InferenceServerException as exc:
        if exc.status() == "StatusCode.UNAUTHENTICATED":
            refused(f"infer ({exc.message()})")
        print(f"error: {exc}")
        return 1
    finally:
        client.close()


def run(client: StickyClient) -> int:
    # 1. Unary calls: each carries the id in its parameters and in its metadata.
    unary_id = f"sticky-{secrets.token_hex(8)}"
    sums = []
    for value, flags in ((1, {"sequence_start": True}), (2, {}), (3, {"sequence_end": True})):
        result = client.infer("accumulator", [int_input(value)], sequence_id=unary_id, **flags)
        sums.append(int(result.as_numpy("OUTPUT")[0]))
    print("unary:", sums)

    # 2. One sequence on one stream.
    stream_id = f"sticky-{secrets.token_hex(8)}"
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_sequence_stream(stream_id, lambda result, error: results.put((result, error)))
    streamed = []
    try:
        for value, flags in ((10, {"sequence_start": True}), (20, {}), (30, {"sequence_end": True})):
            client.async_stream_infer("accumulator", [int_input(value)], sequence_id=stream_id, **flags)
        for _ in range(3):
            result, error = results.get(timeout=TIMEOUT)
            if error is not None:
                if error.status() == "StatusCode.UNAUTHENTICATED":
                    refused(f"the stream ({error.message()})")
                print(f"error: {error}")
                return 1
            streamed.append(int(result.as_numpy("OUTPUT")[0]))
    finally:
        client.stop_stream()
    print("stream:", streamed)
    return 0 if sums == [1, 3, 6] and streamed == [10, 30, 60] else 1


def parse_args() -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", help="REST URL (unused here)")
    parser.add_argument("--grpc", default="127.0.0.1:8081", help="gRPC host:port")
    return str(parser.parse_args().grpc)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
