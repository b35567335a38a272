"""``generate`` and ``generate_stream`` in both shapes (OIP tensors, as MLServer does,
and Triton's generate extension), and the ``GET`` stream for a browser's EventSource."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse


async def events_of(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> list[ServerSentEvent]:
    async with aconnect_sse(client, method, url, **kwargs) as source:
        assert source.response.status_code == 200
        return [event async for event in source.aiter_sse()]


async def test_generate_triton_shape(client: httpx.AsyncClient) -> None:
    body = {"id": "g1", "text_input": "hello", "parameters": {"n_tokens": 3}}
    reply = await client.post("/v2/models/streamer/generate", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "id": "g1",
        "model_name": "streamer",
        "model_version": "1",
        "text_output": ["hello:0", "hello:1", "hello:2"],
        "index": [0, 1, 2],
    }
    one = await client.post(
        "/v2/models/streamer/versions/1/generate", json={"text_input": "x", "parameters": {"n_tokens": 1}}
    )
    assert one.json() == {"model_name": "streamer", "model_version": "1", "text_output": "x:0", "index": 0}


async def test_generate_oip_shape_is_infer(client: httpx.AsyncClient) -> None:
    body = {"id": "o1", "inputs": [{"name": "INPUT0", "datatype": "INT16", "shape": [2], "data": [1, 2]}]}
    generate = await client.post("/v2/models/identity/generate", json=body)
    infer = await client.post("/v2/models/identity/infer", json=body)
    assert generate.status_code == 200
    assert generate.json() == infer.json()


@pytest.mark.parametrize(
    ("value", "output"),
    [
        ("text", "text"),
        (2.5, 2.5),
        (7, 7),
        (True, True),
        ([[1, 2], [3, 4]], [[1, 2], [3, 4]]),
        (["a", "b"], ["a", "b"]),
    ],
)
async def test_generate_top_level_keys_become_tensors(
    client: httpx.AsyncClient, value: Any, output: Any
) -> None:
    reply = await client.post("/v2/models/identity/generate", json={"INPUT0": value})
    assert reply.json() == {"model_name": "identity", "model_version": "1", "OUTPUT0": output}


async def test_generate_uses_the_datatypes_of_the_model_metadata(client: httpx.AsyncClient) -> None:
    """accumulator declares INPUT as INT64: a JSON number becomes an INT64 [1] tensor."""
    first = await client.post(
        "/v2/models/accumulator/generate", json={"INPUT": 5, "parameters": {"sequence_start": True}}
    )
    sequence_id = first.headers["sequence-id"]
    assert first.json() == {"model_name": "accumulator", "model_version": "1", "OUTPUT": 5}
    second = await client.post(
        "/v2/models/accumulator/generate",
        json={"INPUT": 6},
        headers={"sequence-id": sequence_id, "sequence-end": "1"},
    )
    assert second.json()["OUTPUT"] == 11


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ([1], 400, "the request body must be a JSON object, got a JSON array"),
        (
            {"text_input": None},
            400,
            "input 'text_input': expected a string, a number, a boolean or a list of them",
        ),
        ({"text_input": [1, "a"]}, 400, "input 'text_input': BYTES elements must be strings, got int 1"),
        ({"INPUT0": [1, "a"]}, 400, "input 'INPUT0': expected strings, booleans or numbers, got [1, 'a']"),
        ({"INPUT0": [[1], [2, 3]]}, 400, "input 'INPUT0': data is a ragged nested list"),
        ({"text_input": "x", "parameters": 3}, 400, "'parameters' must be a JSON object"),
        ({"text_input": "x", "id": 3}, 400, "'id' must be a string"),
        ({"INPUT": "five"}, 400, "input 'INPUT': INT64 data must hold integers, got strings"),
    ],
)
async def test_generate_bad_bodies(client: httpx.AsyncClient, body: Any, status: int, error: str) -> None:
    keys = set(body) if isinstance(body, dict) else set()
    model = "accumulator" if "INPUT" in keys else "identity" if "INPUT0" in keys else "streamer"
    reply = await client.post(f"/v2/models/{model}/generate", json=body)
    assert (reply.status_code, reply.json()) == (status, {"error": error})


async def test_generate_unknown_model_and_model_failure(client: httpx.AsyncClient) -> None:
    missing = await client.post("/v2/models/nope/generate", json={"text_input": "x"})
    assert (missing.status_code, missing.json()) == (404, {"error": "model 'nope' is not loaded"})
    failing = await client.post("/v2/models/failing/generate", json={"text_input": "x"})
    assert (failing.status_code, failing.json()) == (
        500,
        {"error": "model 'failing' failed: RuntimeError: the model broke"},
    )


async def test_generate_stream_triton_shape(client: httpx.AsyncClient) -> None:
    body = {"id": "s1", "text_input": "hi", "parameters": {"n_tokens": 3}}
    events = await events_of(client, "POST", "/v2/models/streamer/generate_stream", json=body)
    assert [e.event for e in events] == ["message"] * 3
    assert [json.loads(e.data) for e in events] == [
        {"id": "s1", "model_name": "streamer", "model_version": "1", "text_output": f"hi:{k}", "index": k}
        for k in range(3)
    ]


async def test_generate_stream_oip_shape(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["t"]}],
        "parameters": {"n_tokens": 2},
    }
    events = await events_of(client, "POST", "/v2/models/streamer/generate_stream", json=body)
    assert [json.loads(e.data)["outputs"][0]["data"] for e in events] == [["t:0"], ["t:1"]]


async def test_get_generate_stream_for_event_source(client: httpx.AsyncClient) -> None:
    params = {"text_input": "7", "n_tokens": "2", "delay": "0", "id": "web"}
    events = await events_of(client, "GET", "/v2/models/streamer/generate_stream", params=params)
    assert [e.event for e in events] == ["message", "message", "end"]
    assert [json.loads(e.data) for e in events[:2]] == [
        {"id": "web", "model_name": "streamer", "model_version": "1", "text_output": f"7:{k}", "index": k}
        for k in range(2)
    ]
    assert events[2].data == "{}"


async def test_get_generate_stream_ends_with_end_after_an_error(client: httpx.AsyncClient) -> None:
    events = await events_of(client, "GET", "/v2/models/failing/generate_stream", params={"ok": "1"})
    assert [e.event for e in events] == ["message", "error", "end"]
    assert json.loads(events[1].data) == {
        "error": "model 'failing' failed: RuntimeError: the model broke",
        "status": 500,
    }


@pytest.mark.parametrize(
    ("path", "params", "status", "error"),
    [
        (
            "/v2/models/streamer/generate_stream",
            {"n_tokens": "many"},
            400,
            "parameter 'n_tokens': expected an integer, got 'many'",
        ),
        (
            "/v2/models/streamer/generate_stream",
            {"n_tokens": "true"},
            400,
            "parameter 'n_tokens': expected an integer, got True",
        ),
        ("/v2/models/nope/generate_stream", {"text_input": "x"}, 404, "model 'nope' is not loaded"),
    ],
)
async def test_get_generate_stream_errors_use_the_status(
    client: httpx.AsyncClient, path: str, params: dict[str, str], status: int, error: str
) -> None:
    reply = await client.get(path, params=params)
    assert (reply.status_code, reply.json()) == (status, {"error": error})


async def test_get_generate_stream_in_a_sequence(client: httpx.AsyncClient) -> None:
    params = {"INPUT": "4", "sequence_start": "true"}
    async with aconnect_sse(client, "GET", "/v2/models/accumulator/generate_stream", params=params) as source:
        sequence_id = source.response.headers["sequence-id"]
        events = [e async for e in source.aiter_sse()]
    assert [json.loads(e.data)["OUTPUT"] for e in events[:-1]] == [4]
    params = {"INPUT": "5", "sequence_id": sequence_id, "sequence_end": "1"}
    events = await events_of(client, "GET", "/v2/models/accumulator/generate_stream", params=params)
    assert [json.loads(e.data)["OUTPUT"] for e in events[:-1]] == [9]


async def test_get_generate_stream_declared_inputs_without_a_datatype(client: httpx.AsyncClient) -> None:
    """identity declares INPUT0 with any datatype: the query value is typed like JSON."""
    events = await events_of(client, "GET", "/v2/models/identity/generate_stream", params={"INPUT0": "12"})
    assert [json.loads(e.data) for e in events[:-1]] == [
        {"model_name": "identity", "model_version": "1", "OUTPUT0": 12}
    ]
    events = await events_of(
        client, "GET", "/v2/models/identity/generate_stream", params=[("INPUT0", "a"), ("INPUT0", "b")]
    )
    assert [json.loads(e.data)["OUTPUT0"] for e in events[:-1]] == [["a", "b"]]
