"""A stateful sequence over REST: a running sum kept by the ``accumulator`` model.

    python examples/stateful_chat.py [--http http://127.0.0.1:8080]

The first request says ``sequence-start: true`` without an id; the server makes one and
returns it in the ``sequence-id`` header (and in the response parameters). Later
requests send that header; the last one adds ``sequence-end: true``. A request after the
end gets 404. Exits 0 when every total is right.
"""

from __future__ import annotations

import argparse
import sys

import httpx
from example_token import AUTH, HOOKS


def add(value: int) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]}


def main(base_url: str) -> int:
    url = "/v2/models/accumulator/infer"
    values = [3, 4, 5, 6]
    totals: list[int] = []
    with httpx.Client(base_url=base_url, timeout=30, headers=AUTH, event_hooks=HOOKS) as client:
        first = client.post(url, json=add(values[0]), headers={"sequence-start": "true"})
        first.raise_for_status()
        sequence_id = first.headers["sequence-id"]
        totals.append(first.json()["outputs"][0]["data"][0])
        print(f"started sequence {sequence_id}: total {totals[-1]}")

        for i, value in enumerate(values[1:], start=1):
            headers = {"sequence-id": sequence_id}
            if i == len(values) - 1:
                headers["sequence-end"] = "true"
            reply = client.post(url, json=add(value), headers=headers)
            reply.raise_for_status()
            totals.append(reply.json()["outputs"][0]["data"][0])
            print(f"+{value} -> total {totals[-1]}")

        late = client.post(url, json=add(1), headers={"sequence-id": sequence_id})
        print(f"after the end: {late.status_code} {late.json()['error']}")

    ok = totals == [3, 7, 12, 18] and late.status_code == 404
    print("ok" if ok else "unexpected totals")
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
