"""Bad input (issue 14), property-based: the JSON and binary tensor codecs, the SSE
encoder, the msgpack frames between processes and the protobuf converters.

Round trips where a format has two directions; everywhere, garbage in gives the one clear
error of that layer (``BadInput`` for what a client sends, ``WireError`` for what the
other process sends) and never another exception. Inputs are mostly *nearly* right
(a valid value with a few nodes replaced, :func:`strategies.mutated`), which reaches much
deeper into a decoder than random bytes. Fixed seeds (``derandomize``) keep CI stable;
``benchmarks/reliability/fuzz.py`` runs the same properties with many more examples."""

from __future__ import annotations

import math
import os
import re
import struct
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest
from httpx_sse._decoders import SSEDecoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import arrays, json_values, msgpack_values, mutated, oip_request_like

from actorserve.codecs import request_from_json, request_to_json, tensor_from_numpy
from actorserve.errors import BadInput
from actorserve.ipc import frames as ipc
from actorserve.ipc.deltas import DeltaEncoder
from actorserve.ipc.unary_values import result_codec
from actorserve.ipc.values import WireError
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_from_pb, request_to_pb, response_from_pb, response_to_pb
from actorserve.raw import tensor_to_raw
from actorserve.transport.rest import sse
from actorserve.transport.rest.wire import RequestHeaders, decode_infer_request
from actorserve.types import InferenceRequest, InferenceResponse, Tensor
from actorserve.unary import BY_NAME

#: CI: a bounded number of examples, the same ones on every run. The fuzz soak
#: (``benchmarks/reliability/fuzz.py``) sets ACTORSERVE_FUZZ_EXAMPLES and random seeds.
EXAMPLES = int(os.environ.get("ACTORSERVE_FUZZ_EXAMPLES", "150"))
CI = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="ACTORSERVE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

LIMIT = 1 << 20


def valid_request(*pairs: tuple[str, np.ndarray[Any, Any]]) -> InferenceRequest:
    inputs = [tensor_from_numpy(f"in{k}", array, datatype=dt) for k, (dt, array) in enumerate(pairs)]
    return InferenceRequest(inputs=inputs, id="r1", parameters={"p": 1, "q": "x"})


def same_tensors(a: list[Tensor], b: list[Tensor]) -> bool:
    def key(t: Tensor) -> tuple[Any, ...]:
        values = t.data.reshape(-1).tolist()
        values = [v.hex() if isinstance(v, float) and math.isnan(v) else v for v in values]
        return (t.name, t.datatype, tuple(t.shape), values)

    return [key(t) for t in a] == [key(t) for t in b]


# -- JSON and Triton's binary tensor extension (REST) ----------------------------------


@CI
@given(oip_request_like())
def test_any_json_body_is_a_request_or_a_bad_input(obj: Any) -> None:
    try:
        body = orjson.dumps(obj)
    except TypeError:  # an integer orjson cannot write: the decoder's own path, directly
        try:
            request_from_json(obj)
        except BadInput:
            pass
        return
    try:
        request, _ = decode_infer_request(body, RequestHeaders())
    except BadInput:
        return
    assert isinstance(request, InferenceRequest)


@CI
@given(st.data(), st.lists(arrays(), min_size=1, max_size=3))
def test_nearly_valid_json_bodies(data: st.DataObject, pairs: list[tuple[str, np.ndarray[Any, Any]]]) -> None:
    valid = orjson.loads(
        orjson.dumps(request_to_json(valid_request(*pairs)), option=orjson.OPT_SERIALIZE_NUMPY)
    )
    if json_safe(pairs):  # the round trip
        request, _ = decode_infer_request(orjson.dumps(valid), RequestHeaders())
        assert same_tensors(request.inputs, valid_request(*pairs).inputs)
    obj = data.draw(mutated(valid, json_values))
    try:
        decode_infer_request(orjson.dumps(obj), RequestHeaders())
    except TypeError:  # an integer past 64 bits, which orjson cannot write: decode it directly
        try:
            request_from_json(obj)
        except BadInput:
            pass
    except BadInput:
        pass


def json_safe(pairs: list[tuple[str, np.ndarray[Any, Any]]]) -> bool:
    """JSON carries text and finite numbers only (BYTES that are not UTF-8 and infinities
    have no JSON form: the binary extension is for those)."""
    for datatype, array in pairs:
        if datatype == "BYTES":
            try:
                for value in array.reshape(-1):
                    value.decode("utf-8")
            except UnicodeDecodeError:
                return False
        elif array.dtype.kind == "f" and not np.isfinite(array).all():
            return False
    return True


def binary_body(request: InferenceRequest) -> tuple[bytes, int]:
    """The request in Triton's binary extension: JSON head, then each input's raw bytes."""
    head = request_to_json(request)
    blobs = []
    for tensor_obj, tensor in zip(head["inputs"], request.inputs, strict=True):
        raw = tensor_to_raw(tensor)
        tensor_obj.pop("data")
        tensor_obj["parameters"] = {"binary_data_size": len(raw)}
        blobs.append(raw)
    json_part = orjson.dumps(head)
    return json_part + b"".join(blobs), len(json_part)


@CI
@given(st.lists(arrays(), min_size=1, max_size=3))
def test_binary_extension_round_trip(pairs: list[tuple[str, np.ndarray[Any, Any]]]) -> None:
    original = valid_request(*pairs)
    body, head_length = binary_body(original)
    request, _ = decode_infer_request(body, RequestHeaders(inference_header_length=str(head_length)))
    assert same_tensors(request.inputs, original.inputs)


@CI
@given(st.data(), st.lists(arrays(), min_size=1, max_size=2))
def test_garbage_in_the_binary_extension(
    data: st.DataObject, pairs: list[tuple[str, np.ndarray[Any, Any]]]
) -> None:
    body, head_length = binary_body(valid_request(*pairs))
    head = orjson.loads(body[:head_length])
    kind = data.draw(st.sampled_from(["head", "length", "cut", "bytes"]))
    if kind == "head":  # the JSON part changed (sizes, shapes, datatypes...)
        try:
            new_head = orjson.dumps(data.draw(mutated(head, json_values)))
        except TypeError:  # an integer past 64 bits: not JSON anyone can send
            return
        body, head_length = new_head + body[head_length:], len(new_head)
    elif kind == "cut":  # the binary part cut short or grown
        body = body[: data.draw(st.integers(0, len(body)))] + data.draw(st.binary(max_size=9))
    elif kind == "bytes":
        body = data.draw(st.binary(max_size=64))
    length = data.draw(
        st.one_of(st.just(str(head_length)), st.integers(-5, len(body) + 5).map(str), st.text(max_size=4))
    )
    try:
        decode_infer_request(body, RequestHeaders(inference_header_length=length))
    except BadInput:
        pass


# -- SSE ---------------------------------------------------------------------------------


def sse_events(stream: bytes) -> list[tuple[str, str]]:
    """(event, data) of each event, as a browser's EventSource reads them."""
    decoder = SSEDecoder()
    events = []
    for line in re.split(r"\r\n|\r|\n", stream.decode()):  # SSE's line breaks, no others
        event = decoder.decode(line)
        if event is not None:
            events.append((event.event, event.data))
    return events


@CI
@given(st.lists(st.text(max_size=20), min_size=1, max_size=4), st.sampled_from([None, "error", "end"]))
def test_sse_frames_read_back_as_sent(texts: list[str], event: str | None) -> None:
    """Whatever the data (line breaks of every kind, empty lines, unicode), each frame is
    one event whose data reads back with its line breaks as ``\\n``."""
    stream = b"".join(sse.frame(t.encode(), event=event) for t in texts)
    stream += sse.data_frames(texts, str.encode)
    expected = [
        (event or "message", "\n".join(t.replace("\r\n", "\n").replace("\r", "\n").split("\n")))
        for t in texts
    ]
    assert sse_events(stream) == [*expected, *(("message", e[1]) for e in expected)]


@CI
@given(st.text(max_size=40))
def test_sse_error_frames_carry_any_message(message: str) -> None:
    ((event, data),) = sse_events(sse.error_frame(BadInput(message)))
    assert (event, orjson.loads(data)) == ("error", {"error": message, "status": 400})


# -- the msgpack link between processes ---------------------------------------------------


def valid_messages(pairs: list[tuple[str, np.ndarray[Any, Any]]]) -> list[Any]:
    request = valid_request(*pairs)
    response = InferenceResponse(model_name="m", outputs=request.inputs, id="r1", parameters={"a": True})
    return [
        ipc.Call(1, "statistics", {"name": "m", "version": None}),
        ipc.Infer(2, request, "m", None),
        ipc.OpenStream(3, request, "m", "1", 4),
        ipc.OpenStreamIn(4, "m", None, 2),
        ipc.StreamRequest(4, request),
        ipc.StreamInputEnd(4),
        ipc.Ack(3, 1),
        ipc.Cancel(3),
        ipc.Reply(1, [1, 2]),
        ipc.Opened(3),
        ipc.StreamOutputs(0, ((3, [DeltaEncoder().event(response)]),)),
        ipc.End(3),
        ipc.Failed(2, "BadInput", "no"),
        ipc.Credit(4, 1),
    ]


def frame_of(plain: Any) -> bytes:
    body = msgpack.packb(plain, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


@CI
@given(st.data(), st.lists(arrays(), min_size=1, max_size=2))
def test_link_messages_round_trip_and_nearly_valid_ones_are_wire_errors(
    data: st.DataObject, pairs: list[tuple[str, np.ndarray[Any, Any]]]
) -> None:
    messages = valid_messages(pairs)
    encoded = [ipc.encode_message(m) for m in messages]
    decoder = ipc.FrameDecoder(LIMIT)
    decoder.feed(ipc.encode_frame(encoded))
    decoded = decoder.next_frame()
    assert decoded is not None and [type(m) for m in decoded] == [type(m) for m in messages]
    # one message changed in a few places
    plain = msgpack.unpackb(data.draw(st.sampled_from(encoded)), raw=False)
    bad = data.draw(mutated(plain, msgpack_values))
    decoder.feed(frame_of([bad]))
    try:
        decoder.next_frame()
    except WireError:
        return


@CI
@given(st.binary(max_size=64), st.integers(1, 8))
def test_random_bytes_on_the_link_are_wire_errors_or_wait(raw: bytes, pieces: int) -> None:
    """Bytes fed in any split either make frames, raise WireError, or wait for more (a
    frame not complete yet); never another exception."""
    decoder = ipc.FrameDecoder(LIMIT)
    step = max(1, len(raw) // pieces)
    for start in range(0, len(raw), step):
        decoder.feed(raw[start : start + step])
        try:
            while decoder.next_frame() is not None:
                pass
        except WireError:
            return


@CI
@given(st.data())
def test_garbage_unary_results_are_wire_errors(data: st.DataObject) -> None:
    """What a Reply carries for each unary method, decoded by the front: garbage in, a
    WireError (or BadInput for a value a client sent) out."""
    method = data.draw(st.sampled_from(sorted(BY_NAME)))
    _, from_plain = result_codec(BY_NAME[method].record)
    try:
        from_plain(data.draw(msgpack_values))
    except (WireError, BadInput):
        pass


# -- protobuf (gRPC) -----------------------------------------------------------------------


@CI
@given(st.lists(arrays(), min_size=1, max_size=3), st.booleans())
def test_protobuf_round_trip(pairs: list[tuple[str, np.ndarray[Any, Any]]], raw: bool) -> None:
    original = valid_request(*pairs)
    message = pb.ModelInferRequest.FromString(bytes(request_to_pb(original, model_name="m", raw=raw)))
    assert same_tensors(request_from_pb(message).inputs, original.inputs)
    response = InferenceResponse(model_name="m", outputs=original.inputs, id="r1")
    back = response_from_pb(pb.ModelInferResponse.FromString(bytes(response_to_pb(response, raw=raw))))
    assert same_tensors(back.outputs, original.inputs)


_FIELDS = st.sampled_from(
    [
        "bool_contents",
        "int_contents",
        "int64_contents",
        "uint_contents",
        "uint64_contents",
        "fp32_contents",
        "fp64_contents",
        "bytes_contents",
    ]
)


@st.composite
def nearly_valid_pb(draw: st.DrawFn) -> pb.ModelInferRequest:
    pairs = draw(st.lists(arrays(), min_size=1, max_size=2))
    message = request_to_pb(valid_request(*pairs), model_name="m", raw=draw(st.booleans()))
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(message.inputs))
        change = draw(st.sampled_from(["datatype", "shape", "contents", "raw", "params", "drop raw"]))
        if change == "datatype":
            target.datatype = draw(
                st.one_of(st.text(max_size=5), st.sampled_from(["INT8", "FP16", "BYTES", "BOOL"]))
            )
        elif change == "shape":
            target.shape = draw(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-2, 5), max_size=3))
        elif change == "contents":
            field = draw(_FIELDS)
            values: Any = draw(
                st.lists(st.binary(max_size=4), max_size=5)
                if field == "bytes_contents"
                else st.lists(st.booleans(), max_size=5)
                if field == "bool_contents"
                else st.lists(st.floats(width=32), max_size=5)
                if field.startswith("fp")
                else st.lists(st.integers(0, 2**32 - 1), max_size=5)
            )
            target.contents = pb.InferTensorContents(**{field: values})
        elif change == "raw":
            message.raw_input_contents = draw(st.lists(st.binary(max_size=24), max_size=3))
        elif change == "params":
            target.parameters = {"binary_data_size": pb.InferParameter(int64_param=draw(st.integers(-5, 99)))}
        else:
            message.raw_input_contents = message.raw_input_contents[:-1]
    return message


@CI
@given(nearly_valid_pb())
def test_nearly_valid_protobuf_requests_are_bad_input(message: pb.ModelInferRequest) -> None:
    try:
        request_from_pb(pb.ModelInferRequest.FromString(bytes(message)))
    except BadInput:
        pass


@CI
@given(st.binary(max_size=80))
def test_protobuf_garbage_that_parses_is_a_request_or_bad_input(raw: bytes) -> None:
    try:
        message = pb.ModelInferRequest.FromString(raw)
    except Exception:  # the gRPC transport answers INVALID_ARGUMENT (test_rel_badinput_grpc)
        return
    try:
        request_from_pb(message)
    except BadInput:
        pass


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"+", "input 0 is malformed (not a tensor message)"),  # a group where an input belongs
        (b"0\x00", "requested output 0 is malformed (not a tensor message)"),  # a varint there
        (b'"\x00', "request: parameter '' has no value"),  # a map entry without its value
        (
            b'"\x05\n\x01k\x10\x05',
            "request: parameter 'k' has no value",
        ),  # a varint as its value (found by the fuzz soak)
        (b"*\x02\x08\x01", "input 0: name is not a string"),  # a varint where a string belongs
        (b"\x08\x01", "model_name is not a string"),
        (b"*\x02(\x00", "input 0: contents is malformed (not an InferTensorContents message)"),
        # input x, BYTES [1], contents.bytes_contents = [a varint 7]
        (
            b"*\x11\n\x01x\x12\x05BYTES\x1a\x01\x01*\x02@\x07",
            "input 'x': an element of contents.bytes_contents is not bytes",
        ),
    ],
)
def test_protobuf_wire_type_confusions_are_bad_input(raw: bytes, message: str) -> None:
    """Regression: betterproto2 does not check wire types, and request_from_pb raised
    AttributeError (gRPC: UNKNOWN) on what it let through."""
    with pytest.raises(BadInput) as info:
        request_from_pb(pb.ModelInferRequest.FromString(raw))
    assert info.value.message == message
