"""Sequence races end to end (issue 14): a real server on 127.0.0.1 port 0, real clients.

REST (headers and parameters, SSE streams) and gRPC (tritonclient's bidirectional
stream) against a model stepped in its worker thread: idle expiry vs a new request,
cancel vs end sent at once, eviction under ``max_sequences``, and unload during SSE
streams. Every client gets a final answer (a result, or an error naming the sequence
and why), every hook runs once, nothing is left in a batch, the server keeps serving.
The ``--api-workers 2`` case is in ``test_rel_sequence_multiprocess.py``.
"""

from __future__ import annotations

import json
import queue
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import tritonclient.grpc as grpcclient
from httpx_sse import aconnect_sse
from support.rel_sequences import HookModel, check_invariants, hook_settings

from actorserve.server.composition import Server, serve
from actorserve.settings import Settings

TIMEOUT = 20.0


def models() -> tuple[Any, ...]:
    return (
        hook_settings("rec", threaded=True, idle_timeout_ms=300, reply_buffer=1),
        hook_settings("evict", threaded=True, max_sequences=2, evict_idle=True),
    )


@pytest.fixture
async def server(nursery: trio.Nursery) -> Server:
    settings = Settings(
        http_port=0, grpc_port=0, host="127.0.0.1", models=models(), no_auth=True, grace_period=0.2
    )
    running: Server = await nursery.start(partial(serve, settings))
    return running


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as c:
        yield c


def body(rid: str, n_tokens: int = 1, **parameters: Any) -> dict[str, Any]:
    return {"id": rid, "inputs": [], "parameters": {"n_tokens": n_tokens, **parameters}}


def hooks(server: Server, name: str = "rec") -> HookModel:
    model = server.engine.model(name)  # type: ignore[attr-defined]
    assert isinstance(model, HookModel)
    return model


async def sse(client: httpx.AsyncClient, url: str, payload: dict[str, Any], **headers: str) -> list[str]:
    """Every event of a POST stream: ``data:<total>`` per response, ``error:<message>``."""
    events: list[str] = []
    async with aconnect_sse(client, "POST", url, json=payload, headers=headers) as source:
        if source.response.status_code != 200:
            await source.response.aread()
            return [f"status {source.response.status_code}: {source.response.json()['error']}"]
        async for event in source.aiter_sse():
            doc = json.loads(event.data)
            if event.event == "error":
                events.append(f"error:{doc['error']}")
            else:
                events.append(f"data:{doc['outputs'][1]['data'][0]}")
    return events


async def test_rest_idle_expiry_vs_new_request(client: httpx.AsyncClient, server: Server) -> None:
    url = "/v2/models/rec/infer"
    first = await client.post(url, json=body("r1"), headers={"sequence-id": "e", "sequence-start": "true"})
    assert first.status_code == 200, first.text
    await trio.sleep(0.6)  # idle_timeout_ms=300 (real clock: a real server)
    late = await client.post(url, json=body("r2"), headers={"sequence-id": "e"})
    assert (late.status_code, late.json()) == (404, {"error": "sequence 'e' expired"})
    again = await client.post(url, json=body("r3", sequence_id="e", sequence_start=True, sequence_end=True))
    assert again.status_code == 200 and again.json()["outputs"][1]["data"] == [1]
    await check_invariants(server.engine)  # type: ignore[arg-type]
    assert hooks(server).ended == [("e", "expired"), ("e", "ended")]


async def end_and_cancel(client: httpx.AsyncClient, sid: str, n: int) -> dict[str, Any]:
    """Send a 3-token request ending ``sid`` (SSE) and a cancel of ``sid`` together."""
    answers: dict[str, Any] = {}

    async def end() -> None:
        headers = {"sequence-id": sid, "sequence-end": "true"}
        answers["end"] = await sse(client, "/v2/models/rec/infer_stream", body(f"end{n}", 3), **headers)

    async def cancel() -> None:
        await trio.sleep(0.001 * (n % 4))
        payload = body(f"c{n}", 0, sequence_id=sid, sequence_cancel=True)
        reply = await client.post("/v2/models/rec/infer", json=payload)
        answers["cancel"] = (reply.status_code, reply.json())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(end)
        nursery.start_soon(cancel)
    return answers


async def test_rest_cancel_vs_end_sent_at_once(client: httpx.AsyncClient, server: Server) -> None:
    """Twelve rounds of: a request ending the sequence (an SSE stream) and a cancel sent
    together. Whichever wins, both answer, and the hook's reason matches the answers."""
    model = hooks(server)
    for n in range(12):
        sid = f"ce{n}"
        headers = {"sequence-id": sid, "sequence-start": "1"}
        opened = await client.post("/v2/models/rec/infer", json=body(f"o{n}", 0), headers=headers)
        assert opened.status_code == 200, opened.text
        answers = await end_and_cancel(client, sid, n)
        await check_invariants(server.engine)  # type: ignore[arg-type]
        reason = dict(model.ended)[sid]
        if answers["cancel"][0] == 200:
            assert answers["cancel"][1]["parameters"] == {"sequence_id": sid, "sequence_cancelled": True}
            assert reason == "cancelled"
            assert answers["end"][-1] in (
                f"error:sequence '{sid}' was cancelled",
                f"status 404: sequence '{sid}' was cancelled",
            ), answers
        else:
            assert answers["cancel"] == (404, {"error": f"sequence '{sid}' has ended"}), answers
            assert reason == "ended"
            assert answers["end"] == ["data:1", "data:2", "data:3"]
    assert len(model.ended) == 12


async def test_rest_eviction_names_the_evicted_sequence(client: httpx.AsyncClient, server: Server) -> None:
    url = "/v2/models/evict/infer"
    for sid in ("a", "b", "c"):  # the third start evicts "a", the least recently used
        reply = await client.post(url, json=body(sid, sequence_id=sid, sequence_start=True))
        assert reply.status_code == 200, reply.text
    gone = await client.post(url, json=body("a2", sequence_id="a"))
    assert (gone.status_code, gone.json()) == (
        404,
        {"error": "sequence 'a' was evicted (max_sequences reached)"},
    )
    assert (await client.post(url, json=body("b2", sequence_id="b", sequence_end=True))).status_code == 200
    await check_invariants(server.engine, "evict")  # type: ignore[arg-type]
    assert hooks(server, "evict").ended == [("a", "evicted"), ("b", "ended")]


async def test_rest_unload_during_sse_streams(client: httpx.AsyncClient, server: Server) -> None:
    """Three sequences stream (slow readers) while the model is unloaded: each stream
    ends with an ``event: error`` naming its sequence; the hooks say 'shutdown' once
    each; the model, loaded again, serves."""
    model = hooks(server)
    streams: dict[str, list[str]] = {}
    started = trio.Semaphore(0)

    async def stream(sid: str) -> None:
        headers = {"sequence-id": sid, "sequence-start": "true"}
        async with aconnect_sse(
            client, "POST", "/v2/models/rec/infer_stream", json=body(sid, 10_000_000), headers=headers
        ) as source:
            events = streams[sid] = []
            async for event in source.aiter_sse():
                events.append(event.event)
                if len(events) == 1:
                    started.release()
                if event.event == "error":
                    events.append(json.loads(event.data)["error"])

    async with trio.open_nursery() as nursery:
        for sid in ("u1", "u2", "u3"):
            nursery.start_soon(stream, sid)
        for _ in range(3):
            await started.acquire()
        unloaded = await client.post("/v2/repository/models/rec/unload", json={})
        assert unloaded.status_code == 200, unloaded.text
    for sid, events in streams.items():
        assert events[-2:] == ["error", f"sequence {sid!r} was shut down"], events[-3:]
    assert sorted(model.ended) == [("u1", "shutdown"), ("u2", "shutdown"), ("u3", "shutdown")]
    assert model.doubles == []
    await server.engine.load(models()[0])  # type: ignore[attr-defined]
    events = await sse(
        client,
        "/v2/models/rec/infer_stream",
        body("n", 2, sequence_id="u1", sequence_start=True, sequence_end=True),
    )
    assert events == ["data:1", "data:2"]
    await check_invariants(server.engine)  # type: ignore[arg-type]


async def test_grpc_stream_races(server: Server) -> None:
    """On one tritonclient stream: expiry vs a new request, a restart of the expired id,
    and cancel vs end sent back to back. Errors come in band and name the sequence."""
    assert server.grpc_address is not None
    host, port = server.grpc_address
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"{host}:{port}")
    await trio.to_thread.run_sync(
        lambda: client.start_stream(callback=lambda result, error: results.put((result, error)))
    )

    def send(rid: str, sid: str, n_tokens: int = 1, **flags: Any) -> None:
        client.async_stream_infer(
            "rec", [], request_id=rid, sequence_id=sid, parameters={"n_tokens": n_tokens}, **flags
        )

    def answer() -> str:
        result, error = results.get(timeout=TIMEOUT)
        if error is not None:
            return f"error:{error.message()}"
        response = result.get_response()
        if (
            response.parameters["sequence_cancelled"].bool_param
            if "sequence_cancelled" in response.parameters
            else False
        ):
            return f"{response.id}:cancelled"
        return f"{response.id}:{int(result.as_numpy('total')[0])}"

    outcome: list[str] = []

    def scenario(part: int) -> None:
        if part == 0:
            send("a", "g", sequence_start=True)
            assert answer() == "a:1"
            return
        send("b", "g")
        assert answer() == "error:sequence 'g' expired"
        send("c", "g", sequence_start=True)
        assert answer() == "c:1"
        send("d", "g", 2, sequence_end=True)
        client.async_stream_infer(
            "rec", [], request_id="x", sequence_id="g", parameters={"sequence_cancel": True}
        )
        # Whichever wins, each of the two gets its final answer, and they agree.
        finals = {"d:3", "error:sequence 'g' was cancelled", "x:cancelled", "error:sequence 'g' has ended"}
        got = [answer()]
        while len(finals.intersection(got)) < 2:
            got.append(answer())
        ends = [a for a in got if a.startswith("d:") or "was cancelled" in a]
        if "x:cancelled" in got:
            outcome.append("cancelled")
            assert ends[-1] == "error:sequence 'g' was cancelled", got
        else:
            outcome.append("ended")
            assert ends == ["d:2", "d:3"] and "error:sequence 'g' has ended" in got, got

    try:
        await trio.to_thread.run_sync(scenario, 0)
        await trio.sleep(0.6)  # past idle_timeout_ms=300
        await trio.to_thread.run_sync(scenario, 1)
    finally:

        def close() -> None:
            client.stop_stream()
            client.close()

        await trio.to_thread.run_sync(close)
    model = hooks(server)
    assert model.ended == [("g", "expired"), ("g", outcome[0])]
    assert model.doubles == []
