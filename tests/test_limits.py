"""Issue 30, findings 3, 4 and 12: counts that were missing. Short BYTES strings, JSON
values, parameter keys (REST and gRPC) and nested parameters are counted on the wire,
before an object is made for each, and refused with a 400 naming their limit; an error
never repeats more of the client's input than a few KiB."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actorserve import limits
from actorserve.codecs import request_from_json
from actorserve.errors import MAX_MESSAGE_CHARS, BadInput
from actorserve.limits import (
    MAX_JSON_KEYS,
    MAX_JSON_STRINGS,
    MAX_JSON_VALUES,
    MAX_PARAMETER_DEPTH,
    MAX_PARAMETERS,
    check_json_containers,
    check_parameters,
)
from actorserve.model import Model
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_from_pb
from actorserve.proto.counts import check_request_counts
from actorserve.proto.upb import decode_request
from actorserve.raw import tensor_from_raw
from actorserve.settings import ModelSettings
from actorserve.transport.rest.generate import generate_request_from_json
from actorserve.transport.rest.wire import RequestHeaders, decode_infer_request
from actorserve.types import InferenceRequest
from actorserve.validation import RequestContract


@pytest.fixture
def few_bytes_elements(monkeypatch: pytest.MonkeyPatch) -> int:
    """The per-request BYTES element limit lowered to 10, so a test need not send 1 M."""
    monkeypatch.setattr(limits, "MAX_BYTES_ELEMENTS", 10)
    return 10


def _bytes_input(name: str, count: int) -> dict[str, Any]:
    return {"name": name, "shape": [count], "datatype": "BYTES", "data": ["a"] * count}


def test_json_strings_and_values_are_counted_before_parsing() -> None:
    check_json_containers(b'"",' * MAX_JSON_STRINGS)  # an empty string is two quotes
    with pytest.raises(BadInput, match="MAX_JSON_STRINGS"):
        check_json_containers(b'"",' * (MAX_JSON_STRINGS + 1))
    check_json_containers(b'{"k":0},' * MAX_JSON_KEYS)
    with pytest.raises(BadInput, match="MAX_JSON_KEYS"):
        check_json_containers(b'{"k":0},' * (MAX_JSON_KEYS + 1))
    check_json_containers(b"0," * MAX_JSON_VALUES)
    with pytest.raises(BadInput, match="MAX_JSON_VALUES"):
        check_json_containers(b"0," * (MAX_JSON_VALUES + 1))


def test_bytes_elements_are_counted_across_a_requests_json_inputs(few_bytes_elements: int) -> None:
    request_from_json({"inputs": [_bytes_input("a", 5), _bytes_input("b", 5)]})
    with pytest.raises(BadInput, match="input 'b': the request holds more than 10 BYTES elements"):
        request_from_json({"inputs": [_bytes_input("a", 5), _bytes_input("b", 6)]})


def test_bytes_elements_are_counted_in_binary_and_json_inputs_together(few_bytes_elements: int) -> None:
    raw = b"\x01\x00\x00\x00a" * 6
    head = {
        "inputs": [
            {"name": "r", "shape": [6], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}},
            _bytes_input("j", 5),
        ]
    }
    text = json.dumps(head).encode()
    headers = RequestHeaders(inference_header_length=str(len(text)))
    with pytest.raises(BadInput, match="MAX_BYTES_ELEMENTS"):
        decode_infer_request(text + raw, headers)


def test_raw_bytes_elements_are_counted_before_decoding(few_bytes_elements: int) -> None:
    tensor_from_raw("x", "BYTES", [10], b"\0\0\0\0" * 10)
    with pytest.raises(BadInput, match="MAX_BYTES_ELEMENTS"):
        tensor_from_raw("x", "BYTES", [11], b"\0\0\0\0" * 11)
    # gRPC raw_input_contents, both decoders: the request's inputs together
    inputs = [pb.ModelInferRequestInferInputTensor(name=n, datatype="BYTES", shape=[6]) for n in "ab"]
    message = pb.ModelInferRequest(model_name="m", inputs=inputs, raw_input_contents=[b"\0\0\0\0" * 6] * 2)
    with pytest.raises(BadInput, match="MAX_BYTES_ELEMENTS"):
        request_from_pb(message)
    assert decode_request(bytes(message)) is None  # left to betterproto2's path, which refuses


def test_parameters_are_counted_per_request_tensor_and_output() -> None:
    many = {f"k{i}": 0 for i in range(MAX_PARAMETERS + 1)}
    tensor = {"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}
    for body in (
        {"inputs": [tensor], "parameters": many},
        {"inputs": [{**tensor, "parameters": many}]},
        {"inputs": [tensor], "outputs": [{"name": "y", "parameters": many}]},
    ):
        with pytest.raises(BadInput, match="MAX_PARAMETERS"):
            request_from_json(body)
    check_parameters(dict(list(many.items())[:MAX_PARAMETERS]), "request")


def test_grpc_parameters_are_counted_on_the_wire() -> None:
    value = pb.InferParameter(int64_param=1)
    many = {f"k{i}": value for i in range(MAX_PARAMETERS + 1)}
    check_request_counts(
        bytes(pb.ModelInferRequest(model_name="m", parameters=dict(list(many.items())[:-1])))
    )
    for message in (
        pb.ModelInferRequest(model_name="m", parameters=many),
        pb.ModelInferRequest(
            model_name="m", inputs=[pb.ModelInferRequestInferInputTensor(name="x", parameters=many)]
        ),
        pb.ModelInferRequest(
            model_name="m",
            outputs=[pb.ModelInferRequestInferRequestedOutputTensor(name="y", parameters=many)],
        ),
    ):
        with pytest.raises(BadInput, match="MAX_PARAMETERS"):
            check_request_counts(bytes(message))


def _nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_parameters_nested_past_the_depth_are_refused_when_parsed() -> None:
    tensor = {"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}
    request_from_json({"inputs": [tensor], "parameters": {"p": _nested(MAX_PARAMETER_DEPTH)}})
    with pytest.raises(BadInput, match="MAX_PARAMETER_DEPTH"):
        request_from_json({"inputs": [tensor], "parameters": {"p": _nested(MAX_PARAMETER_DEPTH + 1)}})
    with pytest.raises(BadInput, match="MAX_PARAMETER_DEPTH"):  # a tensor's, too
        request_from_json({"inputs": [{**tensor, "parameters": {"p": _nested(1000)}}]})


def test_error_text_that_repeats_input_is_cut() -> None:
    assert len(BadInput("x" * 10_000_000).message) <= MAX_MESSAGE_CHARS
    assert BadInput("short").message == "short"

    class Reads(Model):
        request_parameters = frozenset({"n"})

    rule = RequestContract.of(ModelSettings(name="m", implementation=Reads), Reads)
    assert rule is not None
    parameters = {f"{i:0>1000}": 0 for i in range(MAX_PARAMETERS)}
    with pytest.raises(BadInput) as caught:
        rule.check(InferenceRequest([], parameters=parameters))
    assert len(str(caught.value)) < 2048
    assert f"and {MAX_PARAMETERS - 20} more" in str(caught.value)


def test_a_generate_request_is_counted_as_infer_is(few_bytes_elements: int) -> None:
    generate_request_from_json({"a": ["x"] * 5, "b": ["x"] * 5}, {})
    with pytest.raises(BadInput, match="MAX_BYTES_ELEMENTS"):
        generate_request_from_json({"a": ["x"] * 5, "b": ["x"] * 6}, {})
    with pytest.raises(BadInput, match="MAX_PARAMETER_DEPTH"):
        generate_request_from_json({"text_input": "hi", "parameters": {"p": _nested(9)}}, {})
