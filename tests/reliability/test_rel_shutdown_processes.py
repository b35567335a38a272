"""SIGTERM to ``python -m actorserve``, one process (``--api-workers 0``) and two fronts
(``--api-workers 2``): streams running when the grace period ends get their last message
(SSE ``event: error``, gRPC UNAVAILABLE) and the server exits 0 right after the grace
period; an idle server exits at once (measured from SIGTERM to exit)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.rel_shutdown import SHUTTING_DOWN, GrpcStream
from support.servers import ServerProcess, start_server

from actorserve.server.composition import END_MARGIN

GRACE = 1.0
#: SIGTERM to exit of an idle server, with room for a busy machine (it takes ~0.05 s
#: with one process and ~0.15 s with two fronts; it took 2-3 s before)
IDLE_EXIT_BOUND = 2.0


@pytest.fixture(params=[0, 2], ids=["api-workers-0", "api-workers-2"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    (tmp_path / "streamer").mkdir()
    (tmp_path / "streamer" / "model-settings.json").write_text(
        json.dumps({"name": "streamer", "implementation": "actorserve.models.streamer.StreamerModel"})
    )
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        str(request.param),
        "--grace-period",
        str(GRACE),
        "--no-auth",
        str(tmp_path),
    )
    try:
        server.wait_for(r"serving with 2 front process" if request.param else r"REST listening on", 60)
        http = server.wait_for(r"REST listening on (http://\S+)")[1]
        grpc = server.wait_for(r"gRPC listening on (\S+)")[1]
        yield server, http, grpc
    finally:
        server.stop()


def _sse(url: str, box: list[str], started: threading.Event) -> None:
    body = {"text_input": "p", "parameters": {"n_tokens": 10_000, "delay": 0.02}}
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream("POST", "/v2/models/streamer/generate_stream", json=body) as response,
    ):
        for line in response.iter_lines():
            box.append(line)
            started.set()


@pytest.mark.parametrize("served", [2], indirect=True, ids=["api-workers-2"])  # 0: test_rel_shutdown.py
def test_sigterm_ends_running_streams_with_a_last_message_then_exits_0(
    served: tuple[ServerProcess, str, str],
) -> None:
    server, http, grpc_url = served
    lines: list[str] = []
    started = threading.Event()
    reader = threading.Thread(target=_sse, args=(http, lines, started))
    reader.start()
    grpc = GrpcStream(grpc_url, model="streamer", delay=0.02)
    grpc.open()
    assert started.wait(10)
    deadline = time.monotonic() + 10
    while not grpc.results and time.monotonic() < deadline:
        time.sleep(0.01)
    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert server.process.wait(timeout=30) == 0
    took = time.monotonic() - signalled
    reader.join(10)
    assert grpc.ended.wait(10)
    grpc.close()
    assert [line for line in lines if line][-2:] == [
        "event: error",
        f'data: {{"error":"{SHUTTING_DOWN}","status":503}}',
    ]
    assert (grpc.error.status(), SHUTTING_DOWN in grpc.error.message()) == ("StatusCode.UNAVAILABLE", True)
    assert GRACE <= took < GRACE + END_MARGIN + IDLE_EXIT_BOUND, took


def test_an_idle_server_exits_at_once_after_sigterm(served: tuple[ServerProcess, str, str]) -> None:
    server, http, _ = served
    with httpx.Client(base_url=http, timeout=10) as client:  # a kept-alive connection stays open
        assert client.get("/v2/health/ready").status_code == 200
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert server.process.wait(timeout=30) == 0
    took = time.monotonic() - signalled
    assert took < IDLE_EXIT_BOUND, took
    server.wait_for(r"actorserve stopped|engine: stopping")
