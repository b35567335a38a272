"""Triton's ``priority`` over the wire (issue 34): a real server on 127.0.0.1 port 0, a
BatchModel with one batch slot held by a step that waits for the test, and requests of
mixed priorities waiting behind it, sent over REST: when the slot frees they start 1
first, then 2, then the default (none or 0), first come first served within each."""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing
from e2e.conftest import TIMEOUT, Launch
from e2e.grpc_fixtures import GatedBatchModel

from actorserve import ModelSettings
from actorserve.engine import Engine


async def test_waiting_requests_start_in_priority_order(launch: Launch) -> None:
    settings = ModelSettings(name="ticker", implementation=GatedBatchModel, max_batch_size=1)
    server = await launch(models=(settings,))
    engine = server.engine
    assert isinstance(engine, Engine) and server.http_url is not None
    model = engine.model("ticker")
    assert isinstance(model, GatedBatchModel)

    async def submitted() -> int:
        """Requests handed to the batcher: its ``waiting`` (the held one counts there
        until its step reports)."""
        return (await engine.statistics("ticker")).waiting

    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as http:

        async def send(rid: str, priority: int | None) -> None:
            parameters: dict[str, Any] = {"n_tokens": 1}
            if priority is not None:
                parameters["priority"] = priority
            body = {"id": rid, "inputs": [], "parameters": parameters}
            assert (await http.post("/v2/models/ticker/infer", json=body)).status_code == 200

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, "hold", None)
                while model.begun < 1:  # its step runs, waiting for a permit: the slot is held
                    await trio.testing.wait_all_tasks_blocked(0.01)
                for count, (rid, priority) in enumerate(
                    [("d1", None), ("p2a", 2), ("d0", 0), ("p1", 1), ("p2b", 2)], start=1
                ):
                    nursery.start_soon(send, rid, priority)
                    while await submitted() < count + 1:  # queued before the next is sent
                        await trio.testing.wait_all_tasks_blocked(0.01)
                model.release_all()
    assert model.steps == [["hold"], ["p1"], ["p2a"], ["p2b"], ["d1"], ["d0"]]
