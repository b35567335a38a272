"""actorserve.proto.upb: the upb codec of the hot inference messages gives what the
betterproto2 path gives: the same bytes out, the same requests (or the same errors) in."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import tritonclient.grpc as triton_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc._utils import _get_inference_request

from actorserve.codecs import tensor_from_numpy
from actorserve.errors import BadInput
from actorserve.ipc.deltas import DeltaDecoder, DeltaEncoder
from actorserve.ipc.values import plain_default
from actorserve.proto import inference as bp
from actorserve.proto.convert import request_to_pb, response_to_pb
from actorserve.proto.upb import (
    DecodedRequest,
    InferRequestDecoder,
    request_of,
    response_message,
    stream_raw_message,
    stream_response_message,
)
from actorserve.rawevents import RawEvent
from actorserve.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tests.strategies import arrays

names = st.text(max_size=6)
values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=6),
)
#: up to three entries: one takes the upb path, more fall back (map order)
params = st.dictionaries(names, values, max_size=3)


@st.composite
def tensors(draw: st.DrawFn) -> Tensor:
    datatype, array = draw(arrays())
    tensor = tensor_from_numpy(draw(names), array, datatype)
    return Tensor(tensor.name, tensor.shape, tensor.datatype, tensor.data, draw(params))


@st.composite
def responses(draw: st.DrawFn) -> InferenceResponse:
    return InferenceResponse(
        model_name=draw(names),
        outputs=draw(st.lists(tensors(), max_size=3)),
        model_version=draw(st.none() | names),
        id=draw(st.none() | names),
        parameters=draw(params),
    )


@settings(max_examples=300, deadline=None)
@given(responses())
def test_responses_are_byte_identical(response: InferenceResponse) -> None:
    slow = bytes(response_to_pb(response))
    assert response_message(response).SerializeToString() == slow
    stream = bytes(bp.ModelStreamInferResponse(infer_response=response_to_pb(response)))
    assert stream_response_message(response).SerializeToString() == stream


def _outcome(decode: Any, data: bytes) -> Any:
    """The request ``data`` decodes to, in order, or the error it fails with (as a repr,
    so that a NaN parameter equals itself)."""
    try:
        request = request_of(decode(data))
    except Exception as exc:
        return type(exc), str(exc)
    ordered = [
        (
            t.name,
            t.shape,
            t.datatype,
            t.data.tolist() if t.data.dtype == object else t.data.tobytes(),
            list(t.parameters.items()),
        )
        for t in request.inputs
    ]
    return repr(
        (
            ordered,
            [(o.name, list(o.parameters.items())) for o in request.outputs],
            list(request.parameters.items()),
            request.id,
            request.model_name,
            request.model_version,
        )
    )


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(a serialized request, whether upb decodes it)."""
    inputs = draw(st.lists(tensors(), max_size=3))
    outputs = [RequestedOutput(n, p) for n, p in draw(st.lists(st.tuples(names, params), max_size=2))]
    request = InferenceRequest(
        inputs=inputs, id=draw(st.none() | names), parameters=draw(params), outputs=outputs
    )
    raw = draw(st.booleans())
    message = request_to_pb(request, raw=raw, model_name=draw(names), model_version=draw(names))
    maps = [request.parameters, *(t.parameters for t in inputs), *(o.parameters for o in outputs)]
    raw_contents = bool(message.raw_input_contents) or not inputs
    return bytes(message), raw_contents and all(len(m) <= 1 for m in maps)


@settings(max_examples=300, deadline=None)
@given(requests())
def test_requests_decode_as_betterproto2_does(case: tuple[bytes, bool]) -> None:
    data, fast = case
    decoded = InferRequestDecoder.FromString(data)
    assert isinstance(decoded, DecodedRequest) == fast
    assert _outcome(InferRequestDecoder.FromString, data) == _outcome(bp.ModelInferRequest.FromString, data)


@settings(max_examples=300, deadline=None)
@given(requests(), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), min_size=1, max_size=4))
def test_damaged_requests_fail_or_pass_alike(case: tuple[bytes, bool], damage: list[tuple[int, int]]) -> None:
    data = bytearray(case[0] or b"\x00")
    for at, byte in damage:
        data[at % len(data)] = byte
    assert _outcome(InferRequestDecoder.FromString, bytes(data)) == _outcome(
        bp.ModelInferRequest.FromString, bytes(data)
    )


def test_tritonclient_requests_take_the_upb_path() -> None:
    # tritonclient's own inference.* classes live in protobuf's default pool; ours in a
    # private one, so both load in one process.
    infer_input = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    message = _get_inference_request(
        model_name="identity",
        inputs=[infer_input],
        model_version="",
        request_id="abc",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    decoded = InferRequestDecoder.FromString(message.SerializeToString())
    assert isinstance(decoded, DecodedRequest)
    assert (decoded.model_name, decoded.id) == ("identity", "abc")
    (tensor,) = decoded.request.inputs
    np.testing.assert_array_equal(tensor.data, np.arange(4, dtype=np.float32).reshape(1, 4))


@settings(max_examples=300, deadline=None)
@given(responses())
def test_a_fronts_raw_event_is_the_stream_message_of_its_response(response: InferenceResponse) -> None:
    """A front reads a remote stream as raw events where it can (ipc/deltas.py); their
    stream messages are byte for byte those of the responses they stand for."""
    try:
        packed = msgpack.packb([DeltaEncoder().event(response)], use_bin_type=True, default=plain_default)
    except (BadInput, TypeError, OverflowError):  # what cannot cross never reaches a front
        return
    wire = msgpack.unpackb(packed, raw=False)
    [decoded] = DeltaDecoder().responses(wire)
    [raw] = DeltaDecoder().raw_events(wire)
    expected = stream_response_message(decoded).SerializeToString()
    if isinstance(raw, RawEvent):
        assert stream_raw_message(raw).SerializeToString() == expected
    else:
        assert stream_response_message(raw).SerializeToString() == expected
