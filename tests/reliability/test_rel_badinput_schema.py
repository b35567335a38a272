"""Bad input (issue 14): schemathesis against the served OpenAPI document, every
operation (OIP, management, OpenAI, TorchServe inference and management, on the main
port and on TorchServe's management port), valid and invalid requests generated from
the schema, on a real server: no 5xx, no connection lost, every 4xx a JSON error body in
the route family's format. Fixed seed and few examples in CI; ``python
benchmarks/soak.py fuzz`` runs many more."""

from __future__ import annotations

import httpx
import trio
from support.rel_badinput import launch
from support.rel_schema import run_schema

from actorserve.transport.httphost.openapi import DOCUMENT_PATH

EXAMPLES = 2


async def test_generated_requests_get_no_5xx_and_json_errors(nursery: trio.Nursery) -> None:
    server = await launch(nursery, grpc_port=None)
    assert server.http_url is not None
    management = server.extra_addresses["ts_management_http"]
    async with httpx.AsyncClient(base_url=server.http_url) as client:
        document = (await client.get(DOCUMENT_PATH)).json()  # the served document, as a client gets it
    tally = await trio.to_thread.run_sync(
        lambda: run_schema(
            document,
            server.http_url or "",
            examples=EXAMPLES,
            management_url=f"http://127.0.0.1:{management[1]}",
        )
    )
    assert tally.operations >= len(document["paths"])
    assert tally.sent >= tally.operations
    assert (tally.server_errors, tally.crashes, tally.problems) == (0, [], [])
    # the models the server started with are all still there and idle
    names = sorted(m.name for m in await server.engine.models())
    assert names == ["identity", "streamer"]
