"""Stateful sequences over REST: ids, start, end and cancel as headers or as parameters,
server-made ids, and the sequence errors (404, 409, 429)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import trio
from httpx_sse import aconnect_sse
from support.replicas import not_held_message

from actorserve.server.composition import Server

if TYPE_CHECKING:
    from conftest import GateModel, Settle

TIMEOUT = 20.0


def add(value: int, **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]}
    if parameters:
        body["parameters"] = parameters
    return body


def total(reply: httpx.Response) -> int:
    assert reply.status_code == 200, reply.text
    value: int = reply.json()["outputs"][0]["data"][0]
    return value


async def test_interleaved_sequences_over_headers(client: httpx.AsyncClient) -> None:
    url = "/v2/models/accumulator/infer"
    a = await client.post(url, json=add(1), headers={"sequence-start": "true"})
    b = await client.post(url, json=add(10), headers={"sequence-start": "1"})
    a_id, b_id = a.headers["sequence-id"], b.headers["sequence-id"]
    assert a_id != b_id
    assert a.json()["parameters"] == {"sequence_id": a_id}
    assert b.json()["parameters"] == {"sequence_id": b_id}
    assert (total(a), total(b)) == (1, 10)
    assert total(await client.post(url, json=add(2), headers={"sequence-id": a_id})) == 3
    assert total(await client.post(url, json=add(20), headers={"sequence-id": b_id})) == 30
    last = await client.post(url, json=add(3), headers={"sequence-id": a_id, "sequence-end": "true"})
    assert (total(last), last.headers["sequence-id"]) == (6, a_id)
    ended = await client.post(url, json=add(4), headers={"sequence-id": a_id})
    assert (ended.status_code, ended.json()) == (404, {"error": f"sequence {a_id!r} has ended"})
    assert (
        total(await client.post(url, json=add(30), headers={"sequence-id": b_id, "sequence-end": "true"}))
        == 60
    )


async def test_interleaved_sequences_over_parameters(client: httpx.AsyncClient) -> None:
    url = "/v2/models/accumulator/infer"
    replies = [
        await client.post(url, json=add(1, sequence_id=1001, sequence_start=True)),
        await client.post(url, json=add(5, sequence_id="chat-b", sequence_start="true")),
        await client.post(url, json=add(2, sequence_id=1001)),
        await client.post(url, json=add(5, sequence_id="chat-b")),
        await client.post(url, json=add(3, sequence_id=1001, sequence_end=True)),
        await client.post(url, json=add(5, sequence_id="chat-b", sequence_end=1)),
    ]
    assert [total(r) for r in replies] == [1, 5, 3, 10, 6, 15]
    assert [r.headers["sequence-id"] for r in replies] == ["1001", "chat-b"] * 3
    assert [r.json()["parameters"]["sequence_id"] for r in replies] == ["1001", "chat-b"] * 3


async def test_unknown_sequence_is_404(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v2/models/accumulator/infer", json=add(1, sequence_id=777))
    assert (reply.status_code, reply.json()) == (
        404,
        {"error": not_held_message("777")},  # a lone server: "unknown sequence", no proxy blamed
    )
    no_id = await client.post("/v2/models/accumulator/infer", json=add(1))
    assert (no_id.status_code, no_id.json()) == (
        400,
        {"error": "model 'accumulator' is stateful: send a sequence_id (and sequence_start)"},
    )


async def test_second_start_is_409(client: httpx.AsyncClient) -> None:
    url = "/v2/models/accumulator/infer"
    assert (
        total(await client.post(url, json=add(1), headers={"sequence-id": "s5", "sequence-start": "true"}))
        == 1
    )
    again = await client.post(url, json=add(1), headers={"sequence-id": "s5", "sequence-start": "true"})
    assert (again.status_code, again.json()) == (409, {"error": "sequence 's5' is already open"})
    assert (
        total(await client.post(url, json=add(1), headers={"sequence-id": "s5", "sequence-end": "true"})) == 2
    )


async def test_cancel_over_a_header(client: httpx.AsyncClient) -> None:
    url = "/v2/models/accumulator/infer"
    await client.post(url, json=add(1, sequence_id=31, sequence_start=True))
    cancelled = await client.post(url, json=add(0), headers={"sequence-id": "31", "sequence-cancel": "true"})
    assert cancelled.status_code == 200
    assert cancelled.json()["parameters"] == {"sequence_id": "31", "sequence_cancelled": True}
    late = await client.post(url, json=add(1, sequence_id=31))
    assert (late.status_code, late.json()) == (404, {"error": "sequence '31' was cancelled"})


async def test_full_mailbox_is_429(client: httpx.AsyncClient, server: Server, gate: GateModel) -> None:
    """gate has max_queue=1: one request runs (held by its gate), one waits in the
    mailbox, the third is refused."""
    url = "/v2/models/gate/infer"
    replies: dict[str, httpx.Response] = {}

    async def send(rid: str, parameters: dict[str, Any]) -> None:
        body = {"id": rid, "inputs": [], "parameters": {"n_tokens": 1, "free": 0, "gate": "q", **parameters}}
        replies[rid] = await client.post(url, json=body)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send, "first", {"sequence_id": "q", "sequence_start": True})
        with trio.fail_after(TIMEOUT):
            await gate.started["first"].wait()
        nursery.start_soon(send, "second", {"sequence_id": "q"})
        with trio.fail_after(TIMEOUT):
            while (await server.engine.statistics("gate")).queued < 1:  # noqa: ASYNC110 - the second request is on its way
                await trio.sleep(0.01)
        await send("third", {"sequence_id": "q"})
        assert replies["third"].status_code == 429
        assert replies["third"].json() == {"error": "sequence 'q' already has 1 requests queued (max_queue)"}
        assert replies["third"].headers["retry-after"] == "1"
        gate.gates["q"].set()
    assert [replies[r].status_code for r in ("first", "second")] == [200, 200]
    ended = await client.post(
        url, json={"inputs": [], "parameters": {"sequence_id": "q", "sequence_end": True}}
    )
    assert ended.status_code == 200


async def test_stream_in_a_sequence_and_disconnect_keeps_it_open(
    client: httpx.AsyncClient, server: Server, gate: GateModel, settle: Settle
) -> None:
    body = {"id": "k1", "inputs": [], "parameters": {"n_tokens": 5, "gate": "k", "free": 1}}
    headers = {"sequence-start": "true"}
    async with aconnect_sse(
        client, "POST", "/v2/models/gate/infer_stream", json=body, headers=headers
    ) as source:
        sequence_id = source.response.headers["sequence-id"]
        first = json.loads((await source.aiter_sse().__anext__()).data)
        assert first["parameters"] == {"sequence_id": sequence_id}
    with trio.fail_after(TIMEOUT):
        await gate.left["k1"].wait()
    assert gate.outcome["k1"] == "cancelled"
    await settle()
    assert (await server.engine.statistics("gate")).open_sequences == 1  # still open
    again = {"id": "k2", "inputs": [], "parameters": {"n_tokens": 2}}
    headers = {"sequence-id": sequence_id, "sequence-end": "true"}
    async with aconnect_sse(
        client, "POST", "/v2/models/gate/infer_stream", json=again, headers=headers
    ) as source:
        events = [json.loads(e.data) async for e in source.aiter_sse()]
    assert [e["outputs"][0]["data"] for e in events] == [[0], [1]]
    assert {e["parameters"]["sequence_id"] for e in events} == {sequence_id}
