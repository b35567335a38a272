"""The REST wire format (``transport/rest/wire.py``): pure decode/encode functions, on
plain bytes, without a server."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

from actorserve.errors import BadInput, Overloaded
from actorserve.transport.rest.wire import (
    BodyTooLarge,
    OutputEncoding,
    RequestHeaders,
    decode_infer_request,
    decompress_body,
    encode_infer_response,
    error_reply,
    should_gzip,
    too_large_reply,
)
from actorserve.types import InferenceResponse, Tensor


def test_transport_parameters_never_reach_the_engine() -> None:
    """binary_data_size / binary_data / binary_data_output are stripped from the request,
    its inputs and its requested outputs."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "UINT8",
                    "shape": [2],
                    "parameters": {"binary_data_size": 2, "k": 1},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True, "class_count": 0}}],
            "parameters": {"binary_data_output": False, "binary_data_size": 3, "keep": True},
        }
    ).encode()
    headers = RequestHeaders(inference_header_length=str(len(head)))
    request, encoding = decode_infer_request(head + b"\x01\x02", headers)
    assert request.parameters == {"keep": True}
    assert request.inputs[0].parameters == {"k": 1}
    assert request.inputs[0].data.tolist() == [1, 2]
    assert request.outputs[0].parameters == {"class_count": 0}
    assert (encoding.binary("OUTPUT0"), encoding.binary("OUTPUT1")) == (True, False)


def test_binary_and_json_inputs_keep_their_order() -> None:
    head = json.dumps(
        {
            "inputs": [
                {"name": "a", "datatype": "INT8", "shape": [1], "data": [5]},
                {"name": "b", "datatype": "INT8", "shape": [1], "parameters": {"binary_data_size": 1}},
                {"name": "c", "datatype": "INT8", "shape": [1], "data": [7]},
                {"name": "d", "datatype": "INT8", "shape": [1], "parameters": {"binary_data_size": 1}},
            ]
        }
    ).encode()
    request, _ = decode_infer_request(
        head + b"\x06\x08", RequestHeaders(inference_header_length=str(len(head)))
    )
    assert [(t.name, t.data.tolist()) for t in request.inputs] == [
        ("a", [5]),
        ("b", [6]),
        ("c", [7]),
        ("d", [8]),
    ]


def test_sequence_headers_become_parameters() -> None:
    headers = RequestHeaders(sequence=(("sequence_id", "42"), ("sequence_start", "true")))
    request, _ = decode_infer_request(b'{"inputs": []}', headers)
    assert request.parameters == {"sequence_id": "42", "sequence_start": "true"}
    none, _ = decode_infer_request(b'{"inputs": []}', RequestHeaders(sequence=(("sequence_id", "0"),)))
    assert none.parameters == {}
    same, _ = decode_infer_request(
        b'{"inputs": [], "parameters": {"sequence_end": true}}',
        RequestHeaders(sequence=(("sequence_end", "1"),)),
    )
    assert same.parameters == {"sequence_end": True}
    with pytest.raises(BadInput, match="disagrees"):
        decode_infer_request(
            b'{"inputs": [], "parameters": {"sequence_end": true}}',
            RequestHeaders(sequence=(("sequence_end", "false"),)),
        )


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("br, gzip", True),
        ("deflate", False),
        ("gzip;q=0", False),
        ("gzip;q=0.5", True),
        ("*", True),
        ("GZIP", True),
        ("identity", False),
    ],
)
def test_gzip_needs_the_client_to_accept_it(header: str | None, accepted: bool) -> None:
    assert should_gzip(2000, False, header, 1024) is accepted


def test_gzip_only_large_unencoded_bodies() -> None:
    assert should_gzip(1025, False, "gzip", 1024)
    assert not should_gzip(1024, False, "gzip", 1024)
    assert not should_gzip(5000, True, "gzip", 1024)  # already has a Content-Encoding


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate", "GZIP "])
def test_decompress_body(encoding: str) -> None:
    raw = b'{"inputs": []}'
    packed = zlib.compress(raw) if encoding == "deflate" else gzip.compress(raw)
    assert decompress_body(packed, encoding, 100) == raw
    assert decompress_body(raw, None, 100) == decompress_body(raw, "identity", 100) == raw


def test_decompress_body_errors() -> None:
    with pytest.raises(BadInput, match=r"^unsupported Content-Encoding 'br' \(use gzip or deflate\)$"):
        decompress_body(b"{}", "br", 100)
    with pytest.raises(BadInput, match=r"^the request body is not valid gzip data: "):
        decompress_body(b"plain", "gzip", 100)
    with pytest.raises(BadInput, match=r"^the gzip request body is truncated$"):
        decompress_body(gzip.compress(b"x" * 50)[:-12], "gzip", 100)
    with pytest.raises(BodyTooLarge):  # a zip bomb stops at the limit
        decompress_body(gzip.compress(b"x" * 101), "gzip", 100)
    assert decompress_body(gzip.compress(b"x" * 100), "gzip", 100) == b"x" * 100


def test_error_replies() -> None:
    reply = error_reply(Overloaded("full"))
    assert (reply.status, reply.body) == (429, b'{"error":"full"}')
    assert reply.headers == [("Content-Type", "application/json"), ("Retry-After", "1")]
    bug = error_reply(KeyError("secret"))
    assert (bug.status, bug.body) == (500, b'{"error":"internal error: KeyError"}')
    assert (
        too_large_reply(10).body == b'{"error":"the request body is larger than 10 bytes (max_body_bytes)"}'
    )


def test_encode_infer_response_json_and_binary() -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="1",
        parameters={"sequence_id": 7},
        outputs=[
            Tensor("a", (2,), "INT8", np.array([1, 2], dtype=np.int8)),
            Tensor("b", (1,), "INT8", np.array([3], dtype=np.int8)),
        ],
    )
    plain = encode_infer_response(response)
    assert plain.headers == [("sequence-id", "7"), ("Content-Type", "application/json")]
    assert json.loads(plain.body)["outputs"][0]["data"] == [1, 2]
    mixed = encode_infer_response(response, OutputEncoding(per_output={"a": True}))
    length = int(dict(mixed.headers)["Inference-Header-Content-Length"])
    doc = json.loads(mixed.body[:length])
    assert doc["outputs"] == [
        {"name": "a", "shape": [2], "datatype": "INT8", "parameters": {"binary_data_size": 2}},
        {"name": "b", "shape": [1], "datatype": "INT8", "data": [3]},
    ]
    assert mixed.body[length:] == b"\x01\x02"
    assert dict(mixed.headers)["Content-Type"] == "application/octet-stream"
