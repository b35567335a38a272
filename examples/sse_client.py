"""Stream tokens from ``generate_stream`` with httpx + httpx-sse.

    python examples/sse_client.py [--http http://127.0.0.1:8080]

Sends Triton's generate shape (``{"text_input": ..., "parameters": {...}}``) to the
built-in ``streamer`` model and prints each event as it arrives; then does the same with
an OIP tensor request on ``infer_stream``. Exits 0 when every token is right.
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx
from example_token import AUTH, HOOKS
from httpx_sse import connect_sse


def main(base_url: str) -> int:
    tokens: list[str] = []
    with httpx.Client(base_url=base_url, timeout=30, headers=AUTH, event_hooks=HOOKS) as client:
        # 1. Triton's generate extension: one JSON object per event.
        body = {"id": "sse-1", "text_input": "hello", "parameters": {"n_tokens": 5, "delay": 0.05}}
        with connect_sse(client, "POST", "/v2/models/streamer/generate_stream", json=body) as events:
            for event in events.iter_sse():
                if event.event == "error":  # an error after the stream started
                    print(f"error: {event.data}")
                    return 1
                doc = json.loads(event.data)
                print(f"event {doc['index']}: {doc['text_output']}", flush=True)
                tokens.append(doc["text_output"])

        # 2. The same model through infer_stream: each event is an OIP InferenceResponse.
        request = {
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["oip"]}],
            "parameters": {"n_tokens": 3},
        }
        oip: list[str] = []
        with connect_sse(client, "POST", "/v2/models/streamer/infer_stream", json=request) as events:
            for event in events.iter_sse():
                response = json.loads(event.data)
                oip.append(response["outputs"][0]["data"][0])
        print(f"infer_stream: {oip}")

    ok = tokens == [f"hello:{k}" for k in range(5)] and oip == ["oip:0", "oip:1", "oip:2"]
    print("ok" if ok else "unexpected tokens")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--http", default="http://127.0.0.1:8080", help="REST base URL of a running actorserve"
    )
    parser.add_argument("--grpc", help="ignored (this example uses REST)")
    args = parser.parse_args()
    sys.exit(main(args.http))
