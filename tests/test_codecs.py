"""OIP tensor codecs: every datatype, every validation message."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from strategies import arrays

from actorserve.codecs import (
    request_from_json,
    request_to_json,
    response_from_json,
    response_to_json,
    tensor_from_json,
    tensor_from_list,
    tensor_from_numpy,
    tensor_from_torch,
    tensor_to_json,
    tensor_to_torch,
)
from actorserve.errors import BadInput
from actorserve.raw import tensor_from_raw, tensor_to_raw
from actorserve.types import DATATYPES, InferenceResponse


@given(arrays())
def test_raw_round_trip_every_datatype(pair: tuple[str, np.ndarray[Any, Any]]) -> None:
    datatype, array = pair
    tensor = tensor_from_numpy("x", array, datatype)
    back = tensor_from_raw("x", datatype, list(tensor.shape), tensor_to_raw(tensor))
    assert back == tensor


@given(arrays())
def test_json_round_trip_every_datatype(pair: tuple[str, np.ndarray[Any, Any]]) -> None:
    import orjson

    datatype, array = pair
    if array.dtype.kind == "f":  # JSON has no inf
        array = np.nan_to_num(array, posinf=1.0, neginf=-1.0)
    if datatype == "BYTES":  # JSON carries text; keep to valid UTF-8
        array = np.vectorize(lambda b: b.hex().encode(), otypes=[object])(array) if array.size else array
    tensor = tensor_from_numpy("x", array, datatype)
    wire = orjson.loads(orjson.dumps(tensor_to_json(tensor), option=orjson.OPT_SERIALIZE_NUMPY))
    assert tensor_from_json(wire) == tensor


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@pytest.mark.parametrize("shape", [[1], [2, 3]])
def test_list_decoding_shapes(datatype: str, shape: list[int]) -> None:
    n = int(np.prod(shape))
    data: list[Any] = {
        "BOOL": [True, False] * n,
        "BYTES": ["a", "b"] * n,
    }.get(datatype, list(range(2 * n)))[:n]
    tensor = tensor_from_list("x", datatype, shape, data)
    assert tensor.shape == tuple(shape)
    assert tensor.data.shape == tuple(shape)
    nested = tensor_from_list("x", datatype, shape, np.array(data, dtype=object).reshape(shape).tolist())
    assert nested == tensor


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]},
            r"shape \[2\] needs 2 elements, data has 1",
        ),
        ({"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0, 2.0]}, "needs 1 elements, data has 2"),
        (
            {"name": "x", "shape": [1], "datatype": "fp32", "data": [1.0]},
            "case-sensitive: did you mean 'FP32'",
        ),
        ({"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1.0]}, "unknown datatype 'FLOAT'"),
        (
            {"name": "x", "shape": [1], "datatype": "INT32", "data": ["a"]},
            "INT32 data must hold integers, got strings",
        ),
        ({"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}, "got floating-point numbers"),
        ({"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}, "must hold booleans"),
        ({"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}, "BYTES elements must be strings"),
        ({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}, r"negative dimension -1"),
        ({"name": "x", "shape": [1], "datatype": "UINT8", "data": [300]}, "out of range for UINT8"),
        ({"name": "x", "datatype": "FP32", "data": [1.0]}, "missing 'shape'"),
        ({"name": "x", "shape": [2], "datatype": "FP32", "data": [[1.0], [2.0, 3.0]]}, "ragged"),
        ({"shape": [1], "datatype": "FP32", "data": [1.0]}, "without a string 'name'"),
    ],
)
def test_validation_messages(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        tensor_from_json(obj)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1, 2], "must be a JSON object, got a JSON array"),
        ({}, "has no 'inputs'"),
        ({"inputs": {}}, "'inputs' must be a list"),
        ({"inputs": [], "outputs": [{"nom": 1}]}, "string 'name'"),
        ({"inputs": [], "id": 5}, "'id' must be a string"),
    ],
)
def test_request_validation(body: Any, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        request_from_json(body)


def test_request_and_response_json_round_trip() -> None:
    body = {
        "id": "r1",
        "parameters": {"a": 1},
        "inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT64", "data": [[1, 2], [3, 4]]}],
        "outputs": [{"name": "y"}],
    }
    req = request_from_json(body)
    assert req.inputs[0].data.tolist() == [[1, 2], [3, 4]]
    again = request_to_json(req)
    assert again["inputs"][0]["data"].tolist() == [1, 2, 3, 4]
    response = InferenceResponse("m", [tensor_from_numpy("y", np.ones((2,), np.float32))], "1", "r1")
    import orjson

    wire = orjson.loads(orjson.dumps(response_to_json(response), option=orjson.OPT_SERIALIZE_NUMPY))
    assert response_from_json(wire) == response


def test_raw_errors() -> None:
    with pytest.raises(BadInput, match="needs 8 bytes, got 4"):
        tensor_from_raw("x", "FP32", [2], b"\0" * 4)
    with pytest.raises(BadInput, match="needs 1 BYTES elements"):  # checked before allocating
        tensor_from_raw("x", "BYTES", [1], b"\1")
    with pytest.raises(BadInput, match="ends after 1 of 2"):
        tensor_from_raw("x", "BYTES", [2], b"\4\0\0\0abcd")
    with pytest.raises(BadInput, match="left over"):
        tensor_from_raw("x", "BYTES", [1], b"\1\0\0\0ab")


def test_torch_conversion() -> None:
    tensor = tensor_from_torch("t", torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert tensor.datatype == "FP32" and tensor.shape == (2, 3)
    assert torch.equal(tensor_to_torch(tensor), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(BadInput, match="no torch equivalent"):
        tensor_to_torch(tensor_from_numpy("b", np.array([b"x"], dtype=object), "BYTES"))
