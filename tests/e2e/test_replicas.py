"""A server behind a proxy: it names itself on every answer (``actorserve-replica``),
makes sequence ids that say where they were made, reads and echoes the ``sequence-id``
routing key over gRPC, and never serves a sequence it does not hold as a fresh one
(docs/deploy.md). One process here; the proof with three replicas behind HAProxy is
tests/e2e/test_deploy_haproxy.py's."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import grpc
import httpx
import numpy as np
import trio
from e2e.conftest import TIMEOUT, rest_settings
from e2e.grpc_fixtures import wait_until
from support.replicas import not_held_message, routing_hint

from actorserve import InferenceRequest
from actorserve.actors.reports import model_statistics
from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.replica import made_by
from actorserve.server.composition import Server, serve

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


async def start(nursery: trio.Nursery, replica: str = "r1") -> Server:
    server: Server = await nursery.start(partial(serve, rest_settings(grpc_port=0, replica_id=replica)))
    return server


def add(value: int, **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]}
    if parameters:
        body["parameters"] = parameters
    return body


def pb_add(value: int, **parameters: Any) -> pb.ModelInferRequest:
    tensor = tensor_from_numpy("INPUT", np.array([value], dtype=np.int64))
    return request_to_pb(InferenceRequest(inputs=[tensor], parameters=parameters), model_name="accumulator")


def total_of(message: pb.ModelInferResponse) -> int:
    return int(response_from_pb(message).outputs[0].data[0])


async def test_rest_answers_name_the_replica_and_server_made_ids_say_where(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        live = await client.get("/v2/health/live")
        missing = await client.get("/v2/nowhere")
        opened = await client.post(
            "/v2/models/accumulator/infer", json=add(2), headers={"sequence-start": "true"}
        )
        sid = opened.headers["sequence-id"]
        more = await client.post("/v2/models/accumulator/infer", json=add(3), headers={"sequence-id": sid})
        stray = await client.post(
            "/v2/models/accumulator/infer", json=add(1), headers={"sequence-id": "r2_" + "0" * 32}
        )
        unknown = await client.post(
            "/v2/models/accumulator/infer", json=add(1), headers={"sequence-id": "chat-7"}
        )
    answers = (live, missing, opened, more, stray, unknown)
    assert [r.headers["actorserve-replica"] for r in answers] == ["r1"] * 6
    assert (missing.status_code, made_by(sid), len(sid)) == (404, "r1", 35)
    assert more.json()["outputs"][0]["data"] == [5] and more.headers["sequence-id"] == sid
    # never silently fresh: the distinct error, naming this replica, the id, and where it was made
    assert (stray.status_code, stray.json()) == (
        404,
        {"error": not_held_message("r2_" + "0" * 32, "r1"), "reason": "sequence_not_held"},
    )
    assert "replica 'r1'" in stray.json()["error"] and "made by replica 'r2'" in stray.json()["error"]
    assert (unknown.status_code, unknown.json()["reason"]) == (404, "sequence_not_held")


def _all_metadata(error: Any) -> dict[str, str]:
    """An error's metadata: a trailers-only answer's headers are its trailing metadata."""
    return {**dict(error.initial_metadata() or ()), **dict(error.trailing_metadata() or ())}


def _grpc_calls(target: str) -> dict[str, Any]:
    """ModelInfer and ModelStreamInfer over grpcio, keeping each answer's initial metadata."""
    with grpc.insecure_channel(target) as channel:
        infer = channel.unary_unary(
            INFER, request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
        )
        stream = channel.stream_stream(
            STREAM, request_serializer=bytes, response_deserializer=pb.ModelStreamInferResponse.parse
        )
        got: dict[str, Any] = {}
        first, call = infer.with_call(pb_add(4, sequence_start=True))
        sid = response_from_pb(first).parameters["sequence_id"]
        got["start"] = (total_of(first), dict(call.initial_metadata()))
        # the routing key alone: the message takes the metadata's id
        second, call = infer.with_call(pb_add(6), metadata=[("sequence-id", sid)])
        got["by_metadata"] = (total_of(second), dict(call.initial_metadata()))
        try:
            infer.with_call(pb_add(1, sequence_id=sid), metadata=[("sequence-id", "other")])
        except grpc.RpcError as exc:
            got["disagree"] = (exc.code(), exc.details(), _all_metadata(exc))
        try:
            infer.with_call(pb_add(1, sequence_id="r9_" + "a" * 32))
        except grpc.RpcError as exc:
            got["not_held"] = (exc.code(), exc.details(), _all_metadata(exc))

        def requests() -> Iterator[pb.ModelInferRequest]:
            yield pb_add(10)
            yield pb_add(20, sequence_end=True)

        responses = stream(requests(), metadata=[("sequence-id", sid)])
        totals = [total_of(r.infer_response) for r in responses]
        got["stream"] = (totals, dict(responses.initial_metadata()))
        return got


async def test_grpc_routing_key_is_checked_and_echoed_with_the_replica(nursery: trio.Nursery) -> None:
    server = await start(nursery, replica="pod-a")
    assert server.grpc_address is not None
    got = await trio.to_thread.run_sync(_grpc_calls, "{}:{}".format(*server.grpc_address))
    total, meta = got["start"]
    sid = meta["sequence-id"]
    assert (total, meta["actorserve-replica"], made_by(sid)) == (4, "pod-a", "pod-a")
    assert got["by_metadata"] == (10, {"actorserve-replica": "pod-a", "sequence-id": sid})
    code, details, meta = got["disagree"]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and meta["actorserve-replica"] == "pod-a"
    assert details == (
        f"gRPC metadata 'sequence-id' ('other') and parameter 'sequence_id' ({sid!r}) name different "
        "sequences; send one id, or the same in both"
    )
    code, details, meta = got["not_held"]
    assert (code, details) == (
        grpc.StatusCode.NOT_FOUND,
        not_held_message("r9_" + "a" * 32, "pod-a") + routing_hint("r9_" + "a" * 32),
    )
    assert meta["actorserve-replica"] == "pod-a"
    assert got["stream"] == ([20, 40], {"actorserve-replica": "pod-a", "sequence-id": sid})


def _tritonclient_not_held(target: str) -> list[str]:
    """Stock tritonclient calls naming a sequence this replica never saw (a proxy sent
    them here): unary and streamed, without and with the routing metadata."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    one = grpcclient.InferInput("INPUT", [1], "INT64")
    one.set_data_from_numpy(np.array([1], dtype=np.int64))
    answers = []
    with grpcclient.InferenceServerClient(target) as c:
        for headers in (None, {"sequence-id": "chat-42"}):
            try:
                c.infer("accumulator", [one], sequence_id="chat-42", headers=headers)
            except InferenceServerException as exc:
                answers.append(f"{exc.status()} {exc.message()}")
            errors: list[Any] = []
            c.start_stream(callback=lambda result, error, seen=errors: seen.append(error), headers=headers)
            c.async_stream_infer("accumulator", [one], sequence_id="chat-42")
            c.stop_stream()
            answers.append(errors[0].message())
    return answers


async def test_a_tritonclient_call_without_the_routing_metadata_is_told_what_to_add(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, replica="r1")
    assert server.grpc_address is not None
    answers = await trio.to_thread.run_sync(_tritonclient_not_held, "{}:{}".format(*server.grpc_address))
    plain = not_held_message("chat-42", "r1")
    assert answers == [
        f"StatusCode.NOT_FOUND {plain}{routing_hint('chat-42')}",
        plain + routing_hint("chat-42"),
        f"StatusCode.NOT_FOUND {plain}",  # it carried the metadata: the proxy had what it needs
        plain,
    ]


async def test_metrics_carry_the_replica_label(nursery: trio.Nursery) -> None:
    server = await start(nursery, replica="pod-m")
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        text = (await client.get("/metrics")).text
    assert 'actorserve_replica_info{replica="pod-m"} 1.0' in text.splitlines()


async def test_sigterm_drain_serves_open_sequences_and_refuses_new_starts(nursery: trio.Nursery) -> None:
    """Scale-in (``drain_timeout``): after shutdown() the replica is not ready, refuses
    starts with 503 + Retry-After naming itself, serves the open sequence to its end,
    then stops at once (long before ``drain_timeout``)."""
    settings = rest_settings(grpc_port=0, replica_id="r-old", drain_timeout=30.0, grace_period=1.0)
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(settings, task_status=task_status)
        stopped.set()

    server: Server = await nursery.start(run)
    url = "/v2/models/accumulator/infer"
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        opened = await client.post(url, json=add(1), headers={"sequence-start": "true"})
        sid = opened.headers["sequence-id"]
        scrape = (await client.get("/metrics")).text.splitlines()
        assert "actorserve_draining 0.0" in scrape
        server.shutdown()
        await wait_until(lambda: bool(getattr(server.engine, "draining", False)))
        assert (await client.get("/v2/health/ready")).status_code == 503
        refused = await client.post(url, json=add(1), headers={"sequence-start": "true"})
        plain = await client.post("/v2/models/identity/infer", json=identity_body())
        step = await client.post(url, json=add(2), headers={"sequence-id": sid})
        scrape = (await client.get("/metrics")).text.splitlines()
        last = await client.post(url, json=add(3), headers={"sequence-id": sid, "sequence-end": "true"})
        with trio.fail_after(10):  # drain_timeout is 30 s: the last sequence's end let it stop
            await stopped.wait()
    assert (refused.status_code, refused.headers["retry-after"], refused.json()) == (
        503,
        "1",
        {"error": "replica 'r-old' is draining: start the sequence on another replica"},
    )
    assert plain.status_code == 200
    assert [r.json()["outputs"][0]["data"] for r in (step, last)] == [[3], [6]]
    assert "actorserve_draining 1.0" in scrape


def identity_body() -> dict[str, Any]:
    tensors = [{"name": n, "datatype": "INT32", "shape": [1], "data": [1]} for n in ("INPUT0", "INPUT1")]
    return {"inputs": tensors}


async def test_autoscaling_totals_count_what_waits_and_runs(nursery: trio.Nursery) -> None:
    """The Inference Extension's totals: a request held in the gate model runs, the next
    one of its sequence waits behind it; both go back to 0."""
    server = await start(nursery, replica="pod-s")
    engine: Any = server.engine
    gate = engine.model("gate")
    url = "/v2/models/gate/infer"

    def totals(text: str) -> tuple[str, str]:
        """The server's totals, checked against the gate model's own series (the only
        model with work)."""
        lines = text.splitlines()
        waiting = next(line for line in lines if line.startswith("actorserve_num_requests_waiting "))
        running = next(line for line in lines if line.startswith("actorserve_num_requests_running "))
        labels = '{model="gate",version="1"}'
        model_waiting = f"actorserve_model_num_requests_waiting{labels} {waiting.split()[1]}"
        model_running = f"actorserve_model_num_requests_running{labels} {running.split()[1]}"
        assert model_waiting in lines and model_running in lines
        return waiting.split()[1], running.split()[1]

    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:

        async def send(rid: str, parameters: dict[str, Any]) -> None:
            body = {
                "id": rid,
                "inputs": [],
                "parameters": {"n_tokens": 1, "free": 0, "gate": "t", **parameters},
            }
            assert (await client.post(url, json=body)).status_code == 200

        assert totals((await client.get("/metrics")).text) == ("0.0", "0.0")
        async with trio.open_nursery() as requests:
            requests.start_soon(send, "first", {"sequence_id": "t", "sequence_start": True})
            with trio.fail_after(TIMEOUT):
                await gate.started["first"].wait()
            requests.start_soon(send, "second", {"sequence_id": "t"})
            await wait_until(lambda: model_statistics_queued(engine) == 1)
            held = totals((await client.get("/metrics")).text)
            gate.gates["t"].set()
        assert held == ("1.0", "1.0")
        assert totals((await client.get("/metrics")).text) == ("0.0", "0.0")


def model_statistics_queued(engine: Any) -> int:
    """Requests queued behind a running one in the gate model's sequences, now."""
    return model_statistics(engine.host("gate")).queued
