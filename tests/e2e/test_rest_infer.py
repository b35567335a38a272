"""``POST .../infer`` with OIP JSON and Triton's binary tensor extension, raw over httpx,
against both front doors (the raw-ASGI fast path and Quart)."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
import trio

from actorserve.server.composition import Server

if TYPE_CHECKING:
    from conftest import GateModel, Settle

pytestmark = pytest.mark.parametrize("server", ["fast", "quart"], indirect=True)


def tensor(name: str, datatype: str, shape: list[int], data: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data, **extra}


async def test_json_infer_echoes_id_parameters_and_nested_data(client: httpx.AsyncClient) -> None:
    body = {
        "id": "req-1",
        "parameters": {"temperature": 0.5, "tag": "x"},
        "inputs": [tensor("INPUT0", "FP32", [2, 3], [[1, 2, 3], [4, 5, 6.5]])],
    }
    reply = await client.post("/v2/models/identity/infer", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "model_name": "identity",
        "model_version": "1",
        "id": "req-1",
        "parameters": {"temperature": 0.5, "tag": "x"},
        "outputs": [tensor("OUTPUT0", "FP32", [2, 3], [1.0, 2.0, 3.0, 4.0, 5.0, 6.5])],
    }


async def test_versioned_route(client: httpx.AsyncClient) -> None:
    body = {"inputs": [tensor("INPUT0", "INT32", [1], [7])]}
    reply = await client.post("/v2/models/identity/versions/1/infer", json=body)
    assert reply.json()["outputs"] == [tensor("OUTPUT0", "INT32", [1], [7])]
    missing = await client.post("/v2/models/identity/versions/2/infer", json=body)
    assert (missing.status_code, missing.json()) == (404, {"error": "model 'identity' has no version '2'"})


async def test_requested_outputs_are_honoured(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": [tensor("INPUT0", "INT8", [2], [1, 2]), tensor("INPUT1", "BYTES", [1], ["b"])],
        "outputs": [{"name": "OUTPUT1"}],
    }
    reply = await client.post("/v2/models/identity/infer", json=body)
    assert reply.json()["outputs"] == [tensor("OUTPUT1", "BYTES", [1], ["b"])]


async def test_binary_inputs_and_outputs(client: httpx.AsyncClient) -> None:
    ints = np.arange(6, dtype=np.int16).reshape(2, 3)
    words = [b"h\x00i", b"", "é".encode()]
    raw_words = b"".join(struct.pack("<I", len(w)) + w for w in words)
    head = json.dumps(
        {
            "id": "bin",
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT16",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": 12},
                },
                {
                    "name": "INPUT1",
                    "datatype": "BYTES",
                    "shape": [3],
                    "parameters": {"binary_data_size": len(raw_words)},
                },
            ],
            "parameters": {"binary_data_output": True, "keep": 1},
        }
    ).encode()
    reply = await client.post(
        "/v2/models/identity/infer",
        content=head + ints.tobytes() + raw_words,
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        },
    )
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/octet-stream"
    length = int(reply.headers["inference-header-content-length"])
    doc = json.loads(reply.content[:length])
    assert doc == {
        "model_name": "identity",
        "model_version": "1",
        "id": "bin",
        "parameters": {"keep": 1},  # transport parameters never reach the model
        "outputs": [
            {"name": "OUTPUT0", "shape": [2, 3], "datatype": "INT16", "parameters": {"binary_data_size": 12}},
            {
                "name": "OUTPUT1",
                "shape": [3],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(raw_words)},
            },
        ],
    }
    assert reply.content[length:] == ints.tobytes() + raw_words


async def test_binary_data_per_requested_output_wins(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": [tensor("INPUT0", "UINT8", [2], [1, 2]), tensor("INPUT1", "BOOL", [2], [True, False])],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
            {"name": "OUTPUT1", "parameters": {"binary_data": False}},
        ],
        "parameters": {"binary_data_output": True},
    }
    reply = await client.post("/v2/models/identity/infer", json=body)
    length = int(reply.headers["inference-header-content-length"])
    doc = json.loads(reply.content[:length])
    assert doc["outputs"] == [
        {"name": "OUTPUT0", "shape": [2], "datatype": "UINT8", "parameters": {"binary_data_size": 2}},
        tensor("OUTPUT1", "BOOL", [2], [True, False]),
    ]
    assert "parameters" not in doc
    assert reply.content[length:] == b"\x01\x02"


async def test_binary_input_with_json_output(client: httpx.AsyncClient) -> None:
    head = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP64", "shape": [2], "parameters": {"binary_data_size": 16}}
            ]
        }
    ).encode()
    reply = await client.post(
        "/v2/models/identity/infer",
        content=head + np.array([0.5, -2.0]).tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["outputs"] == [tensor("OUTPUT0", "FP64", [2], [0.5, -2.0])]


async def test_gzip_large_response_and_not_small_ones(client: httpx.AsyncClient) -> None:
    values = list(range(5000))
    body = {"inputs": [tensor("INPUT0", "INT64", [5000], values)]}
    big = await client.post("/v2/models/identity/infer", json=body, headers={"Accept-Encoding": "gzip"})
    assert big.headers["content-encoding"] == "gzip"
    assert int(big.headers["content-length"]) < len(json.dumps(values)) // 2
    assert big.json()["outputs"][0]["data"] == values  # httpx inflates it
    small_body = {"inputs": [tensor("INPUT0", "INT64", [1], [1])]}
    small = await client.post(
        "/v2/models/identity/infer", json=small_body, headers={"Accept-Encoding": "gzip"}
    )
    assert "content-encoding" not in small.headers
    plain = await client.post("/v2/models/identity/infer", json=body, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    refused = await client.post(
        "/v2/models/identity/infer", json=body, headers={"Accept-Encoding": "gzip;q=0"}
    )
    assert "content-encoding" not in refused.headers


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_compressed_request_bodies(client: httpx.AsyncClient, encoding: str) -> None:
    raw = json.dumps({"inputs": [tensor("INPUT0", "INT32", [3], [1, 2, 3])]}).encode()
    packed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    reply = await client.post(
        "/v2/models/identity/infer", content=packed, headers={"Content-Encoding": encoding}
    )
    assert reply.json()["outputs"] == [tensor("OUTPUT0", "INT32", [3], [1, 2, 3])]


async def test_sequence_id_header_on_unary_infer(client: httpx.AsyncClient, server: Server) -> None:
    body = {"inputs": [tensor("INPUT", "INT64", [1], [4])]}
    first = await client.post("/v2/models/accumulator/infer", json=body, headers={"sequence-start": "true"})
    sequence_id = first.headers["sequence-id"]
    assert first.json()["parameters"] == {"sequence_id": sequence_id}
    second = await client.post(
        "/v2/models/accumulator/infer", json=body, headers={"sequence-id": sequence_id, "sequence-end": "1"}
    )
    assert second.json()["outputs"][0]["data"] == [8]
    assert second.headers["sequence-id"] == sequence_id
    with trio.fail_after(10):  # the actor unregisters right after the last response
        while (await server.engine.statistics("accumulator")).open_sequences:  # noqa: ASYNC110
            await trio.sleep(0.01)


async def test_client_going_away_cancels_a_unary_request(
    client: httpx.AsyncClient, server: Server, gate: GateModel, settle: Settle
) -> None:
    body = {"id": "away", "inputs": [], "parameters": {"n_tokens": 2, "free": 0, "gate": "never"}}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.post, "/v2/models/gate/infer", json=body))
        with trio.fail_after(20):
            await gate.started["away"].wait()
        nursery.cancel_scope.cancel()  # the client gives up: httpx closes the connection
    with trio.fail_after(20):
        await gate.left["away"].wait()
    assert gate.outcome["away"] == "cancelled"
    await settle()
    assert (await client.get("/v2/health/ready")).status_code == 200
