"""The REST transport's pure decode/encode functions, without a server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actorserve.errors import BadInput
from actorserve.transport.rest import (
    RequestHeaders,
    accepts_gzip,
    decode_infer_request,
    generate_response_to_json,
    query_value,
)
from actorserve.types import InferenceResponse, Tensor


def test_transport_parameters_never_reach_the_engine() -> None:
    """binary_data_size / binary_data / binary_data_output are stripped from the request,
    its inputs and its requested outputs."""
    head = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2, "k": 1}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True, "class_count": 0}}],
        "parameters": {"binary_data_output": False, "binary_data_size": 3, "keep": True},
    }).encode()  # fmt: skip
    headers = RequestHeaders(inference_header_length=str(len(head)))
    request, encoding = decode_infer_request(head + b"\x01\x02", headers)
    assert request.parameters == {"keep": True}
    assert request.inputs[0].parameters == {"k": 1}
    assert request.inputs[0].data.tolist() == [1, 2]
    assert request.outputs[0].parameters == {"class_count": 0}
    assert (encoding.binary("OUTPUT0"), encoding.binary("OUTPUT1")) == (True, False)


def test_binary_and_json_inputs_keep_their_order() -> None:
    head = json.dumps({"inputs": [
        {"name": "a", "datatype": "INT8", "shape": [1], "data": [5]},
        {"name": "b", "datatype": "INT8", "shape": [1], "parameters": {"binary_data_size": 1}},
        {"name": "c", "datatype": "INT8", "shape": [1], "data": [7]},
        {"name": "d", "datatype": "INT8", "shape": [1], "parameters": {"binary_data_size": 1}},
    ]}).encode()  # fmt: skip
    request, _ = decode_infer_request(head + b"\x06\x08", RequestHeaders(inference_header_length=str(len(head))))
    assert [(t.name, t.data.tolist()) for t in request.inputs] == [("a", [5]), ("b", [6]), ("c", [7]), ("d", [8])]


def test_sequence_headers_become_parameters() -> None:
    headers = RequestHeaders(sequence=(("sequence_id", "42"), ("sequence_start", "true")))
    request, _ = decode_infer_request(b'{"inputs": []}', headers)
    assert request.parameters == {"sequence_id": "42", "sequence_start": "true"}
    none, _ = decode_infer_request(b'{"inputs": []}', RequestHeaders(sequence=(("sequence_id", "0"),)))
    assert none.parameters == {}
    same, _ = decode_infer_request(b'{"inputs": [], "parameters": {"sequence_end": true}}',
                                   RequestHeaders(sequence=(("sequence_end", "1"),)))  # fmt: skip
    assert same.parameters == {"sequence_end": True}
    with pytest.raises(BadInput, match="disagrees"):
        decode_infer_request(b'{"inputs": [], "parameters": {"sequence_end": true}}',
                             RequestHeaders(sequence=(("sequence_end", "false"),)))  # fmt: skip


@pytest.mark.parametrize(
    ("header", "accepted"),
    [(None, False), ("", False), ("gzip", True), ("br, gzip", True), ("deflate", False), ("gzip;q=0", False),
     ("gzip;q=0.5", True), ("*", True), ("GZIP", True), ("identity", False)],
)  # fmt: skip
def test_accepts_gzip(header: str | None, accepted: bool) -> None:
    assert accepts_gzip(header) is accepted


@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), ("-3", -3), ("2.5", 2.5), ("true", True), ("False", False), ("abc", "abc"), ("nan", "nan"),
     ("inf", "inf"), ("1e3", 1000.0), ("", "")],
)  # fmt: skip
def test_query_values(text: str, value: object) -> None:
    assert query_value(text) == value
    assert type(query_value(text)) is type(value)


def test_generate_response_shapes() -> None:
    text = np.empty(1, dtype=object)
    text[:] = [b"hi"]
    words = np.empty((2, 1), dtype=object)
    words[:] = [[b"a"], [b"b"]]
    response = InferenceResponse(
        model_name="m", model_version="2", id="x",
        outputs=[
            Tensor("text_output", (1,), "BYTES", text),
            Tensor("score", (1,), "FP32", np.array([0.5], dtype=np.float32)),
            Tensor("ids", (2, 2), "INT64", np.array([[1, 2], [3, 4]])),
            Tensor("words", (2, 1), "BYTES", words),
        ],
    )  # fmt: skip
    assert generate_response_to_json(response) == {
        "id": "x", "model_name": "m", "model_version": "2", "text_output": "hi", "score": 0.5,
        "ids": [[1, 2], [3, 4]], "words": [["a"], ["b"]],
    }  # fmt: skip
