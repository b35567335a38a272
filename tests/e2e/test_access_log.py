"""The access log: one structured line per request, over REST and gRPC, written off the
request path (flushed in batches; the last ones when the server stops); and the JSON log
format of the command line."""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
import time
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, rest_settings
from support.servers import start_server

from actorserve.server.composition import Server, serve
from actorserve.server.logformat import JsonFormatter
from actorserve.transport.access import ACCESS_LOGGER, FIELDS, AccessHandler, AccessLog

IDENTITY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.access for r in caplog.records if r.name == ACCESS_LOGGER and hasattr(r, "access")]


async def test_one_line_per_request_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    settings = rest_settings(access_log=True, grpc_port=0)
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(partial(serve, settings))
        assert server.grpc_address is not None
        async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
            first = await client.post("/v2/models/identity/infer", json=IDENTITY)
            assert first.status_code == 200
            add = {
                "inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [1]}],
                "parameters": {"sequence_id": "s1", "sequence_start": True},
            }
            assert (await client.post("/v2/models/accumulator/versions/1/infer", json=add)).status_code == 200
            stream = await client.post(
                "/v2/models/streamer/infer_stream", json={"inputs": [], "parameters": {"n_tokens": 3}}
            )
            assert stream.status_code == 200
            assert (await client.post("/v2/models/nope/infer", json=IDENTITY)).status_code == 404
            assert (await client.get("/v2/health/ready")).status_code == 200

        def over_grpc() -> None:
            with grpcclient.InferenceServerClient("{}:{}".format(*server.grpc_address)) as c:
                one = grpcclient.InferInput("INPUT0", [1], "FP32")
                one.set_data_from_numpy(np.array([1.0], dtype=np.float32))
                c.infer("identity", [one])

        await trio.to_thread.run_sync(over_grpc)
        server.shutdown()  # the last lines are flushed as the server stops
    lines = access_lines(caplog)
    assert all(list(line) == list(FIELDS) for line in lines)
    assert all(isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0 for line in lines)
    brief = [
        {k: line[k] for k in ("transport", "method", "route", "status", "model", "version", "sequence")}
        for line in lines
    ]
    assert brief == [
        {
            "transport": "rest",
            "method": "POST",
            "route": "/v2/models/identity/infer",
            "status": 200,
            "model": "identity",
            "version": "1",
            "sequence": None,
        },
        {
            "transport": "rest",
            "method": "POST",
            "route": "/v2/models/accumulator/versions/1/infer",
            "status": 200,
            "model": "accumulator",
            "version": "1",
            "sequence": lines[1]["sequence"],  # a hash, checked below
        },
        {
            "transport": "rest",
            "method": "POST",
            "route": "/v2/models/streamer/infer_stream",
            "status": 200,
            "model": "streamer",
            "version": "1",
            "sequence": None,
        },
        {
            "transport": "rest",
            "method": "POST",
            "route": "/v2/models/nope/infer",
            "status": 404,
            "model": "nope",
            "version": None,
            "sequence": None,
        },
        {
            "transport": "rest",
            "method": "GET",
            "route": "/v2/health/ready",
            "status": 200,
            "model": None,
            "version": None,
            "sequence": None,
        },
        {
            "transport": "grpc",
            "method": "POST",
            "route": "/inference.GRPCInferenceService/ModelInfer",
            "status": "OK",
            "model": "identity",
            "version": "1",
            "sequence": None,
        },
    ]
    # issue 30, finding 11: the id is a bearer secret; the line has a keyed hash of it
    assert re.fullmatch(r"[0-9a-f]{16}", lines[1]["sequence"]) and "s1" not in caplog.text
    assert (lines[0]["bytes"], lines[2]["bytes"]) == (len(first.content), len(stream.content))
    assert lines[-1]["bytes"] is None  # gRPC: not counted


async def test_no_access_lines_by_default(caplog: pytest.LogCaptureFixture, launch: Any) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    server = await launch()
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        assert (await client.post("/v2/models/identity/infer", json=IDENTITY)).status_code == 200
    assert access_lines(caplog) == []


async def test_lines_beyond_the_bound_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    access = AccessLog(max_waiting=2)
    line = (1.0, "rest", "GET", "/v2", 200, 10, 0.5, None, None, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(access.run)
        for _ in range(5):
            access.add(line)
        nursery.cancel_scope.cancel()
    assert len(access_lines(caplog)) == 2
    assert "access log: 3 line(s) dropped" in caplog.text


def test_json_format_puts_the_fields_in_the_object() -> None:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "%s", ("text",), None)
    record.access = {"transport": "rest", "status": 200}
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in ("level", "logger", "message", "transport", "status")} == {
        "level": "INFO",
        "logger": ACCESS_LOGGER,
        "message": "text",
        "transport": "rest",
        "status": 200,
    }
    assert line["time"].endswith("+00:00")


def test_the_command_line_handler_writes_a_batch_like_the_other_lines() -> None:
    stream = io.StringIO()
    when = 1_795_000_000.25
    line = (when, "rest", "GET", "/v2", 200, 10, 0.5, None, None, None)
    AccessHandler(stream, "json").write_batch([line, line])
    first, second = (json.loads(text) for text in stream.getvalue().splitlines())
    assert first == second
    assert first == {
        "time": datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat(timespec="milliseconds"),
        "level": "INFO",
        "logger": ACCESS_LOGGER,
        "message": "rest GET /v2 status=200 bytes=10 duration_ms=0.500 model=- version=- sequence=-",
        "transport": "rest",
        "method": "GET",
        "route": "/v2",
        "status": 200,
        "bytes": 10,
        "duration_ms": 0.5,
        "model": None,
        "version": None,
        "sequence": None,
    }
    text = io.StringIO()
    AccessHandler(text, "text").write_batch([line])
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
    assert text.getvalue() == f"{stamp},250 INFO {ACCESS_LOGGER}: " + first["message"] + "\n"


def test_the_command_line_logs_json() -> None:
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--api-workers",
        "0",
        "--no-auth",
        "--log-format",
        "json",
        "--access-log",
    )
    try:
        url = server.wait_for(r"REST listening on (http://[\d.:]+)")[1]
        assert (
            httpx.post(f"{url}/v2/models/identity/infer", json=IDENTITY, timeout=TIMEOUT).status_code == 200
        )
    finally:
        server.stop()
    lines = [json.loads(text) for text in server.log if text.startswith("{")]
    assert lines and len(lines) == len([t for t in server.log if t.strip()])  # every line is JSON
    (access,) = [line for line in lines if line["logger"] == ACCESS_LOGGER]
    assert (access["route"], access["status"], access["model"]) == (
        "/v2/models/identity/infer",
        200,
        "identity",
    )


async def test_a_sequence_keeps_one_hash_and_no_line_holds_its_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 30, finding 11: lines of one sequence share its hash (they can be correlated),
    two sequences differ, another log (process) hashes under another key, and no id is
    written, whatever characters it holds."""
    secret = "client-chosen secret id"
    stream = io.StringIO()
    handler = AccessHandler(stream, "json")
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    saved = logger.propagate, logger.level
    logger.propagate, logger.level = False, logging.INFO
    hashes: list[list[str | None]] = []
    try:
        for _ in range(2):  # two processes
            log = AccessLog()
            async with trio.open_nursery() as nursery:
                await nursery.start(log.run)
                for sequence in (secret, secret, "other", None):
                    log.add((1.0, "rest", "POST", "/v2/models/m/infer", 200, 1, 0.1, "m", "1", sequence))
                await trio.sleep(1)
                nursery.cancel_scope.cancel()
            lines = [json.loads(text) for text in stream.getvalue().splitlines()]
            hashes.append([line["sequence"] for line in lines[-4:]])
    finally:
        logger.removeHandler(handler)
        logger.propagate, logger.level = saved
    for first, again, other, none in hashes:
        assert first == again and first != other and none is None
        assert first is not None and re.fullmatch(r"[0-9a-f]{16}", first)
    assert hashes[0][0] != hashes[1][0]
    assert secret not in stream.getvalue() and "other" not in stream.getvalue()
