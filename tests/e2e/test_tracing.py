"""OpenTelemetry traces (``--otel``), in one process: REST and gRPC requests make a span
each, child of the ``traceparent`` the client sent, with the engine's span and a batched
request's queue and batch spans below it. The SDK's in-memory exporter collects them
(no network). The multi-process shape is in ``test_tracing_multiprocess.py``.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, Launch
from e2e.grpc_fixtures import in_thread
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from actorserve.otel import sequence_hash

#: the client's own span: trace 0af7651916cd43dd8448eb211c80319c, span b7ad6b7169203331
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CLIENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{CLIENT_SPAN:016x}-01"


@pytest.fixture(scope="session")
def exporter() -> InMemorySpanExporter:
    """This process's spans (its global tracer provider is set once; the server finds
    it and installs none of its own)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


async def wait_for_spans(exporter: InMemorySpanExporter, *names: str) -> list[ReadableSpan]:
    """Every span finished so far, once each of ``names`` is among them (a name given
    twice: two such spans; the host ends its span just after the client has the last byte)."""
    with trio.fail_after(TIMEOUT):
        while True:
            finished = list(exporter.get_finished_spans())
            if all(sum(s.name == name for s in finished) >= names.count(name) for name in names):
                return finished
            await trio.sleep(0.01)


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


async def test_a_rest_stream_is_one_trace_from_the_client_through_the_batch(
    launch: Launch, spans: InMemorySpanExporter
) -> None:
    server = await launch(otel=True)
    body = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [0]}], "parameters": {"n": 3}}
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        reply = await client.post(
            "/v2/models/counter/infer_stream",
            json=body,
            headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
        )
    assert reply.status_code == 200
    assert reply.text.count("data: ") == 3
    name = "POST /v2/models/{model}/infer_stream"
    found = await wait_for_spans(spans, name, "actorserve.engine", "queue", "batch")
    front, engine = one(found, name), one(found, "actorserve.engine")
    queue, batch = one(found, "queue"), one(found, "batch")
    assert {trace_id(s) for s in (front, engine, queue, batch)} == {TRACE_ID}
    assert parent_id(front) == CLIENT_SPAN
    assert front.kind is SpanKind.SERVER
    assert front.context is not None and front.context.trace_state.get("vendor") == "1"
    assert parent_id(engine) == span_id(front)
    assert parent_id(queue) == parent_id(batch) == span_id(engine)
    assert dict(front.attributes or {}) == {
        "actorserve.transport": "rest",
        "http.request.method": "POST",
        "url.path": "/v2/models/counter/infer_stream",
        "actorserve.model": "counter",
        "actorserve.version": "1",
        "http.response.status_code": 200,
    }
    assert [e.name for e in front.events] == ["first_response"]
    assert (engine.attributes or {})["actorserve.model"] == "counter"
    assert (batch.attributes or {})["actorserve.batch.responses"] == 3
    assert (batch.attributes or {})["actorserve.batch.steps"] >= 3
    assert queue.end_time is not None and batch.start_time is not None
    assert queue.end_time <= batch.start_time


async def test_a_request_without_traceparent_starts_a_trace_and_the_sequence_id_is_only_hashed(
    launch: Launch, spans: InMemorySpanExporter
) -> None:
    server = await launch(otel=True)
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [5]}],
        "parameters": {"sequence_id": "secret-7", "sequence_start": True},
    }
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        reply = await client.post("/v2/models/accumulator/infer", json=body)
    assert reply.status_code == 200, reply.text
    found = await wait_for_spans(spans, "POST /v2/models/{model}/infer", "actorserve.engine")
    front = one(found, "POST /v2/models/{model}/infer")
    assert front.parent is None
    assert (front.attributes or {})["actorserve.sequence.hash"] == sequence_hash("secret-7")
    for span in found:
        assert "secret-7" not in repr(dict(span.attributes or {})), span.name
    assert parent_id(one(found, "actorserve.engine")) == span_id(front)


async def test_an_error_marks_the_span(launch: Launch, spans: InMemorySpanExporter) -> None:
    server = await launch(otel=True)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        missing = await client.post("/v2/models/nope/infer", json={"inputs": []})
        failed = await client.post(
            "/v2/models/failing/infer",
            json={"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [0]}]},
        )
    assert (missing.status_code, failed.status_code) == (404, 500)
    found = await wait_for_spans(spans, "POST /v2/models/{model}/infer", "POST /v2/models/{model}/infer")
    statuses = sorted(
        (s.attributes or {})["http.response.status_code"] for s in found if s.kind is SpanKind.SERVER
    )
    assert statuses == [404, 500]
    [error] = [s for s in found if s.kind is SpanKind.SERVER and not s.status.is_ok]
    assert (error.attributes or {})["actorserve.model"] == "failing"


async def test_tracing_off_makes_no_span(launch: Launch, spans: InMemorySpanExporter) -> None:
    server = await launch()
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        reply = await client.post(
            "/v2/models/counter/infer_stream",
            json={
                "inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [0]}],
                "parameters": {"n": 2},
            },
            headers={"traceparent": TRACEPARENT},
        )
    assert reply.status_code == 200
    await trio.sleep(0.05)
    assert list(spans.get_finished_spans()) == []


async def test_probes_and_scrapes_make_no_span(launch: Launch, spans: InMemorySpanExporter) -> None:
    server = await launch(otel=True)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/v2/models/identity"):
            assert (await client.get(path, headers={"traceparent": TRACEPARENT})).status_code == 200, path
    found = await wait_for_spans(spans, "GET")
    assert [s.name for s in found] == ["GET"]  # model metadata: not a probe (no model route: the method)
    assert (found[0].attributes or {})["url.path"] == "/v2/models/identity"


async def test_a_grpc_call_takes_its_parent_from_the_metadata(
    launch: Launch, spans: InMemorySpanExporter
) -> None:
    server = await launch(otel=True, grpc_port=0)
    assert server.grpc_address is not None
    host, port = server.grpc_address[:2]

    def scenario() -> list[int]:
        with grpcclient.InferenceServerClient(f"{host}:{port}") as client:
            tensor = grpcclient.InferInput("INPUT0", [2], "INT32")
            tensor.set_data_from_numpy(np.array([1, 2], np.int32))
            result = client.infer("identity", [tensor], headers={"traceparent": TRACEPARENT})
            return result.as_numpy("OUTPUT0").tolist()  # type: ignore[no-any-return]

    assert await in_thread(scenario) == [1, 2]
    name = "inference.GRPCInferenceService/ModelInfer"
    found = await wait_for_spans(spans, name, "actorserve.engine")
    front, engine = one(found, name), one(found, "actorserve.engine")
    assert trace_id(front) == trace_id(engine) == TRACE_ID
    assert parent_id(front) == CLIENT_SPAN
    assert parent_id(engine) == span_id(front)
    assert dict(front.attributes or {}) == {
        "actorserve.transport": "grpc",
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "actorserve.model": "identity",
        "actorserve.version": "1",
        "rpc.grpc.status": "OK",
    }


async def test_a_grpc_stream_has_its_first_response_event_and_batch_spans(
    launch: Launch, spans: InMemorySpanExporter
) -> None:
    server = await launch(otel=True, grpc_port=0)
    assert server.grpc_address is not None
    host, port = server.grpc_address[:2]

    def scenario() -> list[Any]:
        results: queue.Queue[Any] = queue.Queue()
        with grpcclient.InferenceServerClient(f"{host}:{port}") as client:
            client.start_stream(
                callback=lambda result, error: results.put(error or result),
                headers={"traceparent": TRACEPARENT},
            )
            tensor = grpcclient.InferInput("x", [1], "INT64")
            tensor.set_data_from_numpy(np.array([0], np.int64))
            client.async_stream_infer("counter", [tensor], parameters={"n": 3})
            got = [results.get(timeout=TIMEOUT) for _ in range(3)]
            client.stop_stream()
        return got

    got = await in_thread(scenario)
    assert all(not isinstance(r, Exception) for r in got), got
    name = "inference.GRPCInferenceService/ModelStreamInfer"
    found = await wait_for_spans(spans, name, "ModelStreamInfer request", "actorserve.engine", "batch")
    call, request = one(found, name), one(found, "ModelStreamInfer request")
    engine, batch = one(found, "actorserve.engine"), one(found, "batch")
    assert parent_id(call) == CLIENT_SPAN and trace_id(batch) == TRACE_ID
    assert parent_id(request) == span_id(call)  # one span per request of the call
    assert parent_id(engine) == span_id(request) and parent_id(batch) == span_id(engine)
    assert [e.name for e in request.events] == ["first_response"]
    assert (request.attributes or {})["actorserve.model"] == "counter"
    assert (batch.attributes or {})["actorserve.batch.responses"] == 3
