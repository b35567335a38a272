"""Malformed requests and limits: exact status and ``{"error": ...}`` body, on both front
doors, and the server keeps serving afterwards."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import pytest
import trio

from actorserve.server.composition import Server

pytestmark = pytest.mark.parametrize("server", ["fast", "quart"], indirect=True)

DATATYPES = "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES"


def body(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def t(datatype: str = "INT32", shape: Any = (1,), data: Any = (1,), name: str = "INPUT0") -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": name, "datatype": datatype}
    if shape is not None:
        tensor["shape"] = list(shape) if isinstance(shape, tuple) else shape
    if data is not None:
        tensor["data"] = list(data) if isinstance(data, tuple) else data
    return tensor


BAD_BODIES = [
    (
        b"hello",
        "the request body is not valid JSON: unexpected character, expected a JSON value: line 1 column 1 (char 0)",
    ),
    (
        b'{"inputs": [{"name"',
        "the request body is not valid JSON: unexpected end of data: line 1 column 20 (char 19)",
    ),
    (b"", "the request body is empty; expected a JSON object"),
    (b"[]", "the request body must be a JSON object, got a JSON array"),
    (b'"inputs"', "the request body must be a JSON object, got a JSON string"),
    (b"{}", "the request has no 'inputs'"),
    (b'{"inputs": {}}', "'inputs' must be a list, got a JSON object"),
    (b'{"inputs": [5]}', "each input must be a JSON object, got int"),
    (body(t(shape=None)), "input 'INPUT0': missing 'shape'"),
    (body(t(data=None)), "input 'INPUT0': missing 'data'"),
    (body(t(shape="1")), "input 'INPUT0': shape must be a list of integers, got '1'"),
    (body(t(shape=(3,), data=(1, 2))), "input 'INPUT0': shape [3] needs 3 elements, data has 2"),
    (body(t(shape=(1,), data=(1, 2))), "input 'INPUT0': shape [1] needs 1 elements, data has 2"),
    (
        body(t(shape=(2, 2), data=[[1, 2], [3, 4], [5, 6]])),
        "input 'INPUT0': shape [2, 2] needs 4 elements, data has 6",
    ),
    (body(t(shape=(2,), data=[[1], [2, 3]])), "input 'INPUT0': data is a ragged nested list"),
    (body(t(data=1)), "input 'INPUT0': data must be a list, got int"),
    (body(t("INT128")), f"unknown datatype 'INT128'; expected one of {DATATYPES}"),
    (
        body(t("fp32")),
        f"unknown datatype 'fp32' (datatypes are case-sensitive: did you mean 'FP32'?); expected one of {DATATYPES}",
    ),
    (body(t(data=("a",))), "input 'INPUT0': INT32 data must hold integers, got strings"),
    (body(t(data=(1.5,))), "input 'INPUT0': INT32 data must hold integers, got floating-point numbers"),
    (
        body(t("BOOL", data=(1.5,))),
        "input 'INPUT0': BOOL data must hold booleans, got floating-point numbers",
    ),
    (body(t("BYTES", data=(1,))), "input 'INPUT0': BYTES elements must be strings, got int 1"),
    (body(t("INT8", data=(300,))), "input 'INPUT0': a value is out of range for INT8"),
    (body(t(shape=(-1,))), "input 'INPUT0': negative dimension -1 in shape [-1]"),
    (
        body(t(), outputs=[{"name": "NOPE"}]),
        "unknown requested output 'NOPE' (model 'identity' has OUTPUT0, OUTPUT1)",
    ),
    (body(t(name="INPUT1")), "missing required input 'INPUT0'"),
    (body(t(), id=5), "'id' must be a string"),
    (body(t(), parameters=[1]), "request: 'parameters' must be a JSON object"),
    (
        body(t(), parameters={"binary_data_output": "maybe"}),
        "parameter 'binary_data_output': expected a boolean, got 'maybe'",
    ),
]


@pytest.mark.parametrize(("content", "error"), BAD_BODIES)
async def test_bad_body_is_400(client: httpx.AsyncClient, content: bytes, error: str) -> None:
    reply = await client.post("/v2/models/identity/infer", content=content)
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"error": error}


def binary_head(size: Any, **extra: Any) -> bytes:
    tensor = {
        "name": "INPUT0",
        "datatype": "INT32",
        "shape": [2],
        "parameters": {"binary_data_size": size},
        **extra,
    }
    return json.dumps({"inputs": [tensor]}).encode()


BAD_BINARY = [
    ("abc", binary_head(8), b"", "Inference-Header-Content-Length must be an integer, got 'abc'"),
    ("9999", binary_head(8), b"", None),  # filled in below: depends on the body length
    (
        None,
        binary_head(8),
        b"",
        "input 'INPUT0' has a binary_data_size, but the request has no "
        "Inference-Header-Content-Length header giving the length of its JSON part",
    ),
    (
        None,
        binary_head(8),
        b"\x00" * 8,
        "the request body is not valid JSON: unexpected content after document: line 1 column 107 (char 106)",
    ),
    (
        "H",
        binary_head(8),
        b"",
        "input 'INPUT0': binary_data_size 8 runs past the end of the binary data (0 bytes left)",
    ),
    (
        "H",
        binary_head(8),
        b"\x00" * 4,
        "input 'INPUT0': binary_data_size 8 runs past the end of the binary data (4 bytes left)",
    ),
    (
        "H",
        binary_head(8),
        b"\x00" * 10,
        "2 bytes of binary data after the JSON header are not claimed by any input's binary_data_size",
    ),
    ("H", binary_head(4), b"\x00" * 4, "input 'INPUT0': INT32 shape [2] needs 8 bytes, got 4"),
    ("H", binary_head(-1), b"", "input 'INPUT0': binary_data_size must be a non-negative integer, got -1"),
    ("H", binary_head(8, data=[1, 2]), b"\x00" * 8, "input 'INPUT0': has both 'data' and binary_data_size"),
]


@pytest.mark.parametrize(("length", "head", "raw", "error"), BAD_BINARY)
async def test_bad_binary_body_is_400(
    client: httpx.AsyncClient, length: str | None, head: bytes, raw: bytes, error: str | None
) -> None:
    headers = {"Content-Type": "application/octet-stream"}
    if length is not None:
        headers["Inference-Header-Content-Length"] = str(len(head)) if length == "H" else length
    if error is None:
        error = f"Inference-Header-Content-Length 9999 does not fit a body of {len(head) + len(raw)} bytes"
    reply = await client.post("/v2/models/identity/infer", content=head + raw, headers=headers)
    assert (reply.status_code, reply.json()) == (400, {"error": error})


async def test_bad_compressed_bodies(client: httpx.AsyncClient) -> None:
    not_gzip = await client.post(
        "/v2/models/identity/infer", content=b"plain", headers={"Content-Encoding": "gzip"}
    )
    assert not_gzip.status_code == 400
    assert not_gzip.json()["error"].startswith("the request body is not valid gzip data: ")
    brotli = await client.post("/v2/models/identity/infer", content=b"{}", headers={"Content-Encoding": "br"})
    assert (brotli.status_code, brotli.json()) == (
        400,
        {"error": "unsupported Content-Encoding 'br' (use gzip or deflate)"},
    )
    truncated = gzip.compress(body(t()))[:-12]
    cut = await client.post(
        "/v2/models/identity/infer", content=truncated, headers={"Content-Encoding": "gzip"}
    )
    assert (cut.status_code, cut.json()) == (400, {"error": "the gzip request body is truncated"})


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v2/models/nope/infer", content=body(t()))
    assert (reply.status_code, reply.json()) == (404, {"error": "model 'nope' is not loaded"})


async def test_model_failure_is_500(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v2/models/failing/infer", content=body())
    assert (reply.status_code, reply.json()) == (
        500,
        {"error": "model 'failing' failed: RuntimeError: the model broke"},
    )


async def test_conflicting_sequence_header_is_400(client: httpx.AsyncClient) -> None:
    content = body(t("INT64", name="INPUT"), parameters={"sequence_id": 5, "sequence_start": True})
    reply = await client.post("/v2/models/accumulator/infer", content=content, headers={"sequence-id": "6"})
    assert (reply.status_code, reply.json()) == (
        400,
        {"error": "header 'sequence-id' ('6') disagrees with parameter 'sequence_id' (5)"},
    )


async def test_shutting_down_is_503_with_retry_after(client: httpx.AsyncClient, server: Server) -> None:
    await server.engine.aclose(grace=0)
    reply = await client.post("/v2/models/identity/infer", content=body(t()))
    assert (reply.status_code, reply.json()) == (503, {"error": "the engine is shutting down"})
    assert reply.headers["retry-after"] == "1"
    ready = await client.get("/v2/health/ready")
    assert (ready.status_code, ready.json()) == (503, {"error": "the server is shutting down"})


async def test_server_keeps_serving_after_a_burst_of_bad_requests(client: httpx.AsyncClient) -> None:
    statuses: list[int] = []

    async def bad(content: bytes) -> None:
        reply = await client.post("/v2/models/identity/infer", content=content)
        statuses.append(reply.status_code)
        assert "error" in reply.json()

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(bad, BAD_BODIES[i % len(BAD_BODIES)][0])
    assert statuses == [400] * 40
    good = await client.post("/v2/models/identity/infer", content=body(t(data=(42,))))
    assert good.json()["outputs"][0]["data"] == [42]
    assert (await client.get("/v2/health/ready")).status_code == 200
