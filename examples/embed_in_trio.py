"""Embed actorserve in a trio program: serve it in your own nursery, call it over HTTP.

    python examples/embed_in_trio.py

Starts the built-in models on 127.0.0.1 with a free port (port 0), calls ``identity``
over REST with httpx, then shuts the server down gracefully. Exits 0 when the answer is
right. (``--http``/``--grpc`` are accepted for the examples' common command line and
ignored: this example runs its own server.)
"""

from __future__ import annotations

import argparse
import sys

import httpx
import trio

import actorserve
from actorserve.models import builtin_settings


async def main() -> int:
    settings = actorserve.Settings(
        models=tuple(builtin_settings()), host="127.0.0.1", http_port=0, grpc_port=None, grace_period=5.0
    )
    async with trio.open_nursery() as nursery:
        # nursery.start returns once every model is loaded and the port is bound.
        server = await nursery.start(actorserve.serve, settings)
        print(f"actorserve is listening on {server.http_url}")

        body = {
            "id": "embedded-1",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4.5]]}],
        }
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as client:
            reply = await client.post("/v2/models/identity/infer", json=body)
        reply.raise_for_status()
        output = reply.json()["outputs"][0]
        print(f"identity answered {output['data']} with shape {output['shape']}")

        # The engine is also right here, in-process, for trio code that needs no HTTP.
        print(f"models: {[model.name for model in await server.engine.models()]}")

        server.shutdown()  # graceful: in-flight requests finish, then everything stops
    ok = output["data"] == [1.0, 2.0, 3.0, 4.5] and output["shape"] == [2, 2]
    print("ok" if ok else "unexpected answer")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--http", help="ignored (this example starts its own server)")
    parser.add_argument("--grpc", help="ignored (this example starts its own server)")
    parser.parse_args()
    sys.exit(trio.run(main))
