"""Stopping ``python -m actorserve`` with signals, in both process shapes: the first
SIGINT (Ctrl-C) drains within the grace period, a second one stops the server at once,
even while a long stream is open and the grace period is long."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.servers import identity_folder, start_server

#: the grace period the first Ctrl-C starts (a stream is running, so it is waited for)
GRACE = 60
#: a second Ctrl-C stops every process "at once": long before the grace period would end
#: (a bound on behaviour, not speed: process exits take seconds on a loaded machine)
AT_ONCE = GRACE / 4


@pytest.mark.parametrize("api_workers", ["0", "2"])
def test_a_second_ctrl_c_stops_at_once(api_workers: str) -> None:
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--api-workers",
        api_workers,
        "--no-auth",
        "--grace-period",
        str(GRACE),
        "--log-level",
        "DEBUG",  # the fronts say their drain has begun at DEBUG (the parent speaks for them)
    )
    try:
        server.wait_for("serving with" if api_workers != "0" else "REST listening", 60)
        url = server.wait_for(r"REST listening on (http://\S+)")[1]
        streaming = threading.Event()

        def stream() -> None:  # 10,000 tokens, 0.1 s apart: far longer than the test
            body = {"text_input": "x", "parameters": {"n_tokens": 10_000, "delay": 0.1}}
            try:
                with (
                    httpx.Client(base_url=url, timeout=30) as client,
                    client.stream("POST", "/v2/models/streamer/generate_stream", json=body) as reply,
                ):
                    for _ in reply.iter_lines():
                        streaming.set()
            except httpx.HTTPError:
                pass  # cut off by the stop: what this test is about

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert streaming.wait(30), server.text()
        server.process.send_signal(signal.SIGINT)
        server.wait_for(r"SIGINT: shutting down gracefully", 10)
        # the graceful stop is under way: the process serving the stream is draining it
        server.wait_for(r"shutting down: in-flight requests have 60\.0 s to finish", 10)
        assert server.process.poll() is None  # still draining: the grace period is 60 s
        second = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        server.process.wait(timeout=30)
        took = time.monotonic() - second
        assert took < AT_ONCE, f"{took:.1f} s after the second SIGINT:\n{server.text()}"
        reader.join(timeout=10)
        assert "second SIGINT" in server.text()
    finally:
        server.stop()


@pytest.mark.parametrize("api_workers", ["0", "2"])
def test_the_log_says_each_address_once_and_ends_with_stopped(api_workers: str, tmp_path: Path) -> None:
    # one small model, not the built-in ones (the text model's torch load is seconds of
    # each start): the log's addresses and last line are the server's, whatever it serves
    models = str(identity_folder(tmp_path))
    server = start_server(
        "--http-port", "0", "--grpc-port", "0", "--api-workers", api_workers, "--no-auth", models
    )
    try:
        server.wait_for("serving with" if api_workers != "0" else "REST listening", 60)
        server.wait_for("gRPC listening")
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()
    lines = server.text().splitlines()
    for what in ("REST listening on", "gRPC listening on", "SIGINT: shutting down gracefully"):
        assert len([line for line in lines if what in line]) == 1, (what, server.text())
    assert len([line for line in lines if "shutting down: in-flight" in line]) <= 1, server.text()
    logger = "actorserve.server.processes" if api_workers != "0" else "actorserve.server"
    assert lines[-1].endswith(f"INFO {logger}: actorserve stopped"), server.text()
