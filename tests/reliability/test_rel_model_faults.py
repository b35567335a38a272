"""Model faults through a real server in this process (``--api-workers 0``'s shape):
REST unary and SSE against models that raise for chosen items, hang past their
``step_timeout``, or answer with malformed output. Only the affected requests fail (500
naming the model), a hung replica is replaced, sequences on it end ``failed`` exactly
once, the rest keep serving, and nothing is left in flight."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from httpx_sse import aconnect_sse
from support import rel_faults
from support.rel_faults import fault_models

from actorserve import InferenceRequest
from actorserve.errors import ModelFailed
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings

TIMEOUT = 20.0
#: the step deadline of the models here (real seconds: a hung step is a real thread)
STEP_TIMEOUT = 0.5


@pytest.fixture
async def server(nursery: trio.Nursery) -> Server:
    settings = Settings(
        http_port=0, grpc_port=None, host="127.0.0.1", no_auth=True, models=fault_models(STEP_TIMEOUT)
    )
    started: Server = await nursery.start(partial(serve, settings))
    return started


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as c:
        yield c


def body(request_id: str, **parameters: Any) -> dict[str, Any]:
    return {"id": request_id, "inputs": [], "parameters": parameters}


async def infer(client: httpx.AsyncClient, model: str, request_id: str, **parameters: Any) -> httpx.Response:
    return await client.post(f"/v2/models/{model}/infer", json=body(request_id, **parameters))


def outputs(reply: httpx.Response) -> dict[str, list[int]]:
    assert reply.status_code == 200, reply.text
    return {o["name"]: o["data"] for o in reply.json()["outputs"]}


async def settled(server: Server) -> dict[str, Any]:
    """What is still in flight per model once the engine is idle (must be nothing)."""
    with trio.fail_after(TIMEOUT):
        await server.engine.wait_idle()
    busy = {}
    for info in await server.engine.models():
        stats = await server.engine.statistics(info.name, info.version)
        work = {"inflight": stats.inflight, "waiting": stats.waiting, "running": stats.running}
        if any(work.values()):
            busy[info.name] = work
    return busy


FAULTS = {
    "raise": "model '{m}' failed: RuntimeError: step broke on {id}",
    "notstep": "model '{m}' returned a malformed answer: step output 0 is a str, expected a StepOutput",
    "notresponse": "model '{m}' returned a malformed answer: returned a dict, expected an InferenceResponse",
    "dtype": "model '{m}' returned a malformed answer: output 'y': FP32 data has numpy dtype object (expected float32)",
    "shape": "model '{m}' returned a malformed answer: output 'y': shape [3] but its data has shape [2]",
    "bytes": "model '{m}' returned a malformed answer: output 'y': a BYTES element is a NoneType, expected bytes",
    "params": "model '{m}' returned a malformed answer: response parameter 'bad': a set is not a parameter value "
    "(bool, int, float, str, lists and dicts of them)",
}


@pytest.mark.parametrize("model", ["faulty", "faulty_inline"])
async def test_only_the_faulty_requests_fail_among_concurrent_good_ones(
    client: httpx.AsyncClient, server: Server, model: str
) -> None:
    replies: dict[str, httpx.Response] = {}

    async def one(request_id: str, **parameters: Any) -> None:
        replies[request_id] = await infer(client, model, request_id, **parameters)

    async with trio.open_nursery() as nursery:
        for round_ in range(3):  # concurrent, so faults share steps with good items
            for k in range(4):
                nursery.start_soon(partial(one, f"good-{round_}-{k}", n=3))
            for fault in FAULTS:
                nursery.start_soon(partial(one, f"{fault}-{round_}", fault=fault))
    for request_id, reply in replies.items():
        fault = request_id.rsplit("-", 1)[0]
        if request_id.startswith("good"):
            assert outputs(reply)["k"] == [1, 2, 3], request_id
        else:
            assert reply.status_code == 500, reply.text
            expected = FAULTS[fault].format(m=model, id=request_id)
            if fault == "notstep":  # its index in the step that made it varies
                assert reply.json()["error"].startswith(expected.rsplit(" 0 ", 1)[0]), reply.text
            else:
                assert reply.json() == {"error": expected}
    assert await settled(server) == {}


async def test_a_step_raising_mid_stream_ends_the_sse_stream_with_an_error_event(
    client: httpx.AsyncClient, server: Server
) -> None:
    for model in ("faulty", "faulty_plain"):
        fault_after = {
            "faulty": {"fault": "notresponse", "at": 3, "n": 5},
            "faulty_plain": {"fault": "raise", "n": 2},
        }[model]
        async with aconnect_sse(
            client, "POST", f"/v2/models/{model}/infer_stream", json=body("s1", **fault_after)
        ) as source:
            assert source.response.status_code == 200
            events = [event async for event in source.aiter_sse()]
        names = [e.event for e in events]
        assert names == ["message", "message", "error"], names
        error = json.loads(events[-1].data)
        assert error["status"] == 500 and f"model {model!r}" in error["error"], error
    assert (
        json.loads(events[-1].data)["error"]
        == "model 'faulty_plain' failed: RuntimeError: predict broke on s1"
    )
    assert await settled(server) == {}


async def start_sequence(client: httpx.AsyncClient, model: str, request_id: str) -> str:
    reply = await infer(client, model, request_id, sequence_start=True, n=1)
    assert reply.status_code == 200, reply.text
    return str(reply.headers["sequence-id"])


@pytest.mark.parametrize("model", ["faulty", "faulty_inline", "faulty_plain"])
async def test_a_model_failure_in_a_sequence_ends_it_failed_exactly_once(
    client: httpx.AsyncClient, server: Server, model: str
) -> None:
    rel_faults.ENDED.clear()
    broken = await start_sequence(client, model, "a0")
    healthy = await start_sequence(client, model, "b0")
    reply = await infer(client, model, "a1", sequence_id=broken, fault="raise")
    assert reply.status_code == 500 and f"model {model!r} failed: RuntimeError" in reply.text
    again = await infer(client, model, "a2", sequence_id=broken)
    assert again.status_code == 404
    assert again.json() == {"error": f"sequence {broken!r} failed"}
    assert outputs(await infer(client, model, "b1", sequence_id=healthy, sequence_end=True, n=2))["k"] == [
        1,
        2,
    ]
    bad_begin = await start_sequence(client, model, "c0")
    reply = await infer(client, model, "c1", sequence_id=bad_begin, fault="begin")
    if model != "faulty_plain":  # a plain model has no begin
        assert reply.status_code == 500 and "begin broke on c1" in reply.text
        assert (await infer(client, model, "c2", sequence_id=bad_begin)).status_code == 404
    assert await settled(server) == {}
    stats = await server.engine.statistics(model, "1")
    ended = {"failed": 2, "ended": 1} if model != "faulty_plain" else {"failed": 1, "ended": 1}
    assert stats.sequences_ended == ended
    if model != "faulty_plain":
        assert sorted(rel_faults.ENDED) == sorted(
            [(broken, "failed"), (healthy, "ended"), (bad_begin, "failed")]
        )


async def test_a_hung_replica_is_replaced_and_the_rest_keep_serving(
    client: httpx.AsyncClient, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    rel_faults.ENDED.clear()
    # two sequences: the replicas take one each (a sequence goes to the least pinned)
    first, second = await start_sequence(client, "faulty", "a0"), await start_sequence(client, "faulty", "b0")
    replica_of = {}
    for sequence_id in (first, second):
        reply = await infer(client, "faulty", f"{sequence_id}-where", sequence_id=sequence_id, n=1)
        replica_of[sequence_id] = outputs(reply)["replica"][0]
    assert len(set(replica_of.values())) == 2
    served_meanwhile: list[int] = []

    async def other_sequence_keeps_going() -> None:
        for k in range(5):
            reply = await infer(client, "faulty", f"b-{k}", sequence_id=second, n=1)
            served_meanwhile.append(outputs(reply)["replica"][0])
            await trio.sleep(0.1)

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_sequence_keeps_going)
        reply = await infer(client, "faulty", "hang", sequence_id=first, fault="hang", hang=3)
    took = trio.current_time() - started
    assert reply.status_code == 500
    assert reply.json() == {
        "error": f"model 'faulty': a step ran past its step_timeout of {STEP_TIMEOUT:g} s; "
        "the replica was declared hung and is being replaced"
    }
    assert took < 2.5, took  # failed at the deadline, not when the step returned (3 s)
    assert served_meanwhile == [replica_of[second]] * 5
    gone = await infer(client, "faulty", "a-after", sequence_id=first)
    assert gone.json() == {"error": f"sequence {first!r} failed"}
    assert (first, "failed") in rel_faults.ENDED and rel_faults.ENDED.count((first, "failed")) == 1
    # the new replica serves: new requests go to both, one of them not the hung one
    seen = set()

    async def after(k: int) -> None:
        seen.update(outputs(await infer(client, "faulty", f"after-{k}", n=4))["replica"])

    async with trio.open_nursery() as nursery:  # concurrent: least-loaded routing spreads them
        for k in range(8):
            nursery.start_soon(after, k)
    seen.add(
        outputs(await infer(client, "faulty", "b-last", sequence_id=second, sequence_end=True))["replica"][0]
    )
    assert replica_of[first] not in seen and len(seen) == 2, (seen, replica_of)
    assert "declared hung" in caplog.text and "loading a replica in place of the hung one" in caplog.text
    assert await settled(server) == {}


@pytest.mark.parametrize(("fault", "hang"), [("hang", 30.0), ("thread", 30.0)])
async def test_a_plain_model_past_its_deadline_fails_that_request_only(
    client: httpx.AsyncClient, server: Server, fault: str, hang: float
) -> None:
    async with trio.open_nursery() as nursery:
        results: dict[str, httpx.Response] = {}

        async def one(request_id: str, **parameters: Any) -> None:
            results[request_id] = await infer(client, "faulty_plain", request_id, **parameters)

        nursery.start_soon(partial(one, "stuck", fault=fault, hang=hang, n=1))
        for k in range(3):
            nursery.start_soon(partial(one, f"ok-{k}", n=1))
    assert results["stuck"].json() == {
        "error": f"model 'faulty_plain': no response within its step_timeout of {STEP_TIMEOUT:g} s"
    }
    assert all(outputs(results[f"ok-{k}"])["k"] == [1] for k in range(3))
    assert await settled(server) == {}


async def test_work_computed_inline_past_the_deadline_is_logged(
    client: httpx.AsyncClient, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        reply = await infer(client, "faulty_plain", "inline", fault="inline", hang=STEP_TIMEOUT + 0.2, n=1)
    assert outputs(reply)["k"] == [1]  # nothing could stop it; it answered late
    assert "past its step_timeout of 0.5 s" in caplog.text and "cannot be preempted" in caplog.text


async def test_a_leaking_replica_is_recycled_without_losing_a_request_or_a_sequence(
    client: httpx.AsyncClient, server: Server
) -> None:
    rel_faults.UNLOADED.clear()
    rel_faults.ENDED.clear()
    sequence = await start_sequence(client, "leaky", "s0")  # request 1 of the first replica
    first = outputs(await infer(client, "leaky", "s1", sequence_id=sequence, n=1))["replica"][0]
    replicas: list[int] = []
    results: dict[str, httpx.Response] = {}

    async def one(request_id: str) -> None:
        results[request_id] = await infer(client, "leaky", request_id, fault="leak", n=2)

    for wave in range(4):  # 32 requests, 8 at a time: several recyclings, some mid-wave
        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(one, f"leak-{wave}-{k}")
    for reply in results.values():
        replicas.extend(outputs(reply)["replica"])
    assert len(results) == 32 and all(r.status_code == 200 for r in results.values())
    assert len(set(replicas)) >= 4, replicas  # recycled every 5 admitted requests
    # the sequence stays on its (worn) replica until it ends; then that replica goes
    assert first not in rel_faults.UNLOADED
    reply = await infer(client, "leaky", "s2", sequence_id=sequence, sequence_end=True, n=2)
    assert outputs(reply) == {"k": [1, 2], "replica": [first, first]}
    with trio.fail_after(TIMEOUT):
        while first not in rel_faults.UNLOADED:  # noqa: ASYNC110 (its task unloads it soon)
            await trio.sleep(0.01)
    assert rel_faults.ENDED == [(sequence, "ended")]
    # a new sequence is made and begun by a live replica, not the first (unloaded) one
    later = await start_sequence(client, "leaky", "t0")
    reply = await infer(client, "leaky", "t1", sequence_id=later, sequence_end=True, n=1)
    assert outputs(reply)["replica"] != [first]
    assert await settled(server) == {}
    described = await server.engine.describe("leaky", "1")
    assert len(described.replicas) == 1


async def test_a_stream_in_model_is_checked_but_not_timed(server: Server) -> None:
    async def requests() -> AsyncIterator[InferenceRequest]:
        yield InferenceRequest(inputs=[], id="r1")
        await trio.sleep(STEP_TIMEOUT * 2)  # the client is slow: no deadline for that
        yield InferenceRequest(inputs=[], id="r2", parameters={"fault": "shape"})

    got = []
    with pytest.raises(ModelFailed) as failed:
        async with server.engine.stream(requests(), model="faulty_streamin") as responses:
            async for response in responses:
                got.append(int(response.output("k").data[0]))
    assert got == [1, 2]
    assert str(failed.value) == (
        "model 'faulty_streamin' returned a malformed answer: output 'y': shape [3] but its data has shape [2]"
    )
    assert await settled(server) == {}
