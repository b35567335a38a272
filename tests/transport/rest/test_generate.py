"""Triton's generate extension (``transport/rest/generate.py``): bodies, query strings
and response shapes, on plain values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actorserve.errors import BadInput
from actorserve.transport.rest.generate import (
    encode_event_source,
    encode_generate,
    generate_request_from_json,
    generate_request_from_query,
    generate_response_to_json,
    parse_generate_body,
    query_value,
)
from actorserve.transport.rest.wire import RequestHeaders, encode_oip
from actorserve.types import InferenceResponse, Tensor


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ("-3", -3),
        ("2.5", 2.5),
        ("true", True),
        ("False", False),
        ("abc", "abc"),
        ("nan", "nan"),
        ("inf", "inf"),
        ("1e3", 1000.0),
        ("", ""),
    ],
)
def test_query_values(text: str, value: object) -> None:
    assert query_value(text) == value
    assert type(query_value(text)) is type(value)


def test_generate_response_shapes() -> None:
    text = np.empty(1, dtype=object)
    text[:] = [b"hi"]
    words = np.empty((2, 1), dtype=object)
    words[:] = [[b"a"], [b"b"]]
    response = InferenceResponse(
        model_name="m",
        model_version="2",
        id="x",
        outputs=[
            Tensor("text_output", (1,), "BYTES", text),
            Tensor("score", (1,), "FP32", np.array([0.5], dtype=np.float32)),
            Tensor("ids", (2, 2), "INT64", np.array([[1, 2], [3, 4]])),
            Tensor("words", (2, 1), "BYTES", words),
        ],
    )
    assert generate_response_to_json(response) == {
        "id": "x",
        "model_name": "m",
        "model_version": "2",
        "text_output": "hi",
        "score": 0.5,
        "ids": [[1, 2], [3, 4]],
        "words": [["a"], ["b"]],
    }
    assert json.loads(encode_generate(response)) == generate_response_to_json(response)


def test_event_source_events_name_their_sequence() -> None:
    response = InferenceResponse(
        model_name="m", model_version="1", parameters={"sequence_id": "s"}, outputs=[]
    )
    assert json.loads(encode_event_source(response)) == {
        "model_name": "m",
        "model_version": "1",
        "sequence_id": "s",
    }
    assert "sequence_id" not in json.loads(encode_generate(response))


def test_parse_generate_body_tells_the_shapes_apart() -> None:
    oip = parse_generate_body(b'{"inputs": [], "parameters": {"k": 1}}', RequestHeaders())
    assert isinstance(oip, tuple)
    assert oip[0].parameters == {"k": 1} and oip[1] is encode_oip
    triton = parse_generate_body(b'{"text_input": "hi"}', RequestHeaders())
    assert triton == {"text_input": "hi"}
    with pytest.raises(BadInput, match="not valid JSON"):
        parse_generate_body(b"{", RequestHeaders())


def test_generate_request_datatypes_from_metadata_or_values() -> None:
    request = generate_request_from_json(
        {"id": "a", "text_input": "hi", "n": 5, "x": [[1.5], [2.0]], "parameters": {"p": 1}}, {"n": "INT32"}
    )
    assert request.id == "a" and request.parameters == {"p": 1}
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [
        ("text_input", "BYTES", (1,)),
        ("n", "INT32", (1,)),
        ("x", "FP64", (2, 1)),
    ]


def test_generate_request_from_query() -> None:
    request = generate_request_from_query(
        [
            ("text_input", ["7"]),
            ("n_tokens", ["2"]),
            ("INPUT", ["4", "5"]),
            ("id", ["web"]),
            ("tag", ["a", "b"]),
        ],
        {"INPUT": "INT64"},
    )
    assert request.id == "web"
    assert request.parameters == {"n_tokens": 2, "tag": ["a", "b"]}
    assert [(t.name, t.datatype, t.data.tolist()) for t in request.inputs] == [
        ("text_input", "BYTES", [b"7"]),
        ("INPUT", "INT64", [4, 5]),
    ]
