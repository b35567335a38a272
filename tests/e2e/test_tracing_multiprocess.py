"""OpenTelemetry traces across processes: ``python -m actorserve --otel --api-workers 2``
exports with the OTLP exporter (HTTP/protobuf, configured by the standard ``OTEL_*``
variables) to a collector this test runs on 127.0.0.1; one request's trace holds the
front's span, its ``engine link`` span (the hop) and the engine process's spans below it.

And with tracing off, no process imports ``opentelemetry`` at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from support.servers import ROOT, start_server

STARTUP_TIMEOUT = 60.0
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span it was sent, as
    ``(service name, span)`` (the span a protobuf message)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.lock = threading.Lock()
        self.spans: list[tuple[str, Any]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def received(self) -> list[tuple[str, Any]]:
        with self.lock:
            return list(self.spans)


class _Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        message = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource_spans in message.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.server.spans.append((attributes.get("service.name", ""), span))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:  # the base class' name
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_one_trace_crosses_the_front_and_the_engine_process(tmp_path: Path, collector: Collector) -> None:
    (tmp_path / "accumulator").mkdir()
    (tmp_path / "accumulator" / "model-settings.json").write_text(
        json.dumps(
            {"name": "accumulator", "implementation": "actorserve.models.accumulator.AccumulatorModel"}
        )
    )
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "actorserve-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: export soon after each span ends
    }
    args = ("--http-port", "0", "--grpc-port", "off", "--api-workers", "2", "--otel", str(tmp_path))
    server = start_server(*args, env=env)
    try:
        server.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        engine_pid = int(server.wait_for(r"engine process started \(pid (\d+)\)")[1])
        body = {
            "inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT64", "data": [3]}],
            "parameters": {"sequence_id": "s-1", "sequence_start": True, "sequence_end": True},
        }
        reply = httpx.post(
            f"{url}/v2/models/accumulator/infer",
            json=body,
            headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
            timeout=20,
        )
        assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            names = {span.name for _, span in collector.received()}
            if {"POST /v2/models/{model}/infer", "engine link", "actorserve.engine", "batch"} <= names:
                break
            time.sleep(0.05)
    finally:
        server.stop()
    spans = {span.name: (service, span) for service, span in collector.received()}
    (service, front), (_, engine) = spans["POST /v2/models/{model}/infer"], spans["actorserve.engine"]
    assert service == "actorserve-under-test"
    assert front.trace_id.hex() == engine.trace_id.hex() == TRACE_ID
    assert front.parent_span_id.hex() == CLIENT_SPAN
    link = spans["engine link"][1]  # the front's hop: from sending the request to its reply
    assert link.parent_span_id == front.span_id
    assert engine.parent_span_id == link.span_id
    assert spans["batch"][1].parent_span_id == engine.span_id
    engine_attributes = {a.key: a.value for a in engine.attributes}
    assert engine_attributes["process.pid"].int_value == engine_pid  # made in the engine process
    assert engine_attributes["actorserve.model"].string_value == "accumulator"
    front_attributes = {a.key for a in front.attributes}
    assert "actorserve.sequence.hash" in front_attributes


OFF = """
import sys, trio, httpx
TRACEPARENT = sys.argv[1]
from actorserve.server.composition import serve
from actorserve.settings import Settings
from actorserve.models import builtin_settings

async def main():
    settings = Settings(host="127.0.0.1", http_port=0, grpc_port=0, no_auth=True,
                        models=tuple(m for m in builtin_settings() if m.name == "identity"))
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve, settings)
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
        async with httpx.AsyncClient(base_url=server.http_url) as client:
            reply = await client.post("/v2/models/identity/infer", json=body,
                                      headers={"traceparent": TRACEPARENT})
            assert reply.status_code == 200, reply.text
        nursery.cancel_scope.cancel()
    print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))

trio.run(main)
"""


def test_tracing_off_imports_no_opentelemetry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", OFF, f"00-{TRACE_ID}-{CLIENT_SPAN}-01"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
