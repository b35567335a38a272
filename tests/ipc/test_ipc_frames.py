"""The engine link's wire format, with plain bytes: messages, tensors of every OIP
datatype, parameters, records and errors survive a round trip; malformed input is a
WireError; sizes are bounded."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import arrays

from actorserve import errors
from actorserve.api import (
    BatchStatistics,
    Duration,
    InferenceStatistics,
    ModelDescription,
    ModelInfo,
    ModelMetadata,
    ModelState,
    ModelStatistics,
    ReplicaDescription,
    RepositoryEntry,
    TensorMetadata,
)
from actorserve.codecs import tensor_from_numpy
from actorserve.ipc.deltas import DeltaDecoder, DeltaEncoder
from actorserve.ipc.frames import (
    Ack,
    Call,
    Cancel,
    Credit,
    End,
    Failed,
    FrameDecoder,
    FrameTooLarge,
    Infer,
    Message,
    Opened,
    OpenStream,
    OpenStreamIn,
    Reply,
    StreamInputEnd,
    StreamOutputs,
    StreamRequest,
    encode_frame,
    encode_message,
)
from actorserve.ipc.unary_values import result_codec
from actorserve.ipc.values import (
    EngineInternalError,
    WireError,
    error_from_plain,
    error_to_plain,
    tensor_from_plain,
)
from actorserve.settings import SettingsError
from actorserve.textgen import TextGeneration
from actorserve.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from actorserve.unary import BY_NAME
from actorserve.unary_records import GetModelInfo

LIMIT = 1 << 20


def round_trip(*messages: Message) -> list[Message]:
    decoder = FrameDecoder(LIMIT)
    decoder.feed(encode_frame([encode_message(m) for m in messages]))
    frame = decoder.next_frame()
    assert frame is not None and decoder.next_frame() is None and decoder.buffered == 0
    return frame


def bytes_tensor(name: str, *values: bytes) -> Tensor:
    data = np.empty(len(values), dtype=object)
    data[:] = list(values)
    return tensor_from_numpy(name, data, "BYTES")


# JSON-ish parameter values: what REST, gRPC and models put in parameters
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
parameter_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
parameters = st.dictionaries(st.text(max_size=10), parameter_values, max_size=4)


@given(arrays(), parameters)
def test_every_datatype_and_parameters_survive(
    pair: tuple[str, np.ndarray[Any, Any]], params: dict[str, Any]
) -> None:
    datatype, array = pair
    tensor = Tensor("x", tuple(array.shape), datatype, array, params)
    request = InferenceRequest(
        [tensor],
        id="r1",
        parameters=params,
        outputs=[RequestedOutput("y", {"binary_data": True})],
        model_name="m",
        model_version="2",
    )
    response = InferenceResponse("m", [tensor], model_version="2", id="r1", parameters=params)
    deltas = DeltaEncoder()
    events = [deltas.event(response), deltas.event(response)]
    (got_infer, got_outputs) = round_trip(Infer(7, request, "m", None), StreamOutputs(0, ((7, events),)))
    assert isinstance(got_infer, Infer) and isinstance(got_outputs, StreamOutputs)
    assert (got_infer.id, got_infer.model, got_infer.version) == (7, "m", None)
    assert got_infer.request == request
    ((call_id, got_events),) = got_outputs.entries
    got_responses = DeltaDecoder().responses(got_events)
    assert call_id == 7 and got_responses == [response, response]
    out = got_responses[0].outputs[0].data
    assert out.dtype == array.dtype and out.shape == array.shape


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x03\x00\x00", b"\x05\x00\x00\x00abc", b"\x02\x00\x00\x00abc", b"\xff\xff\xff\xffabc"],
    ids=["empty", "short-length", "truncated", "left-over", "huge-length"],
)
def test_a_malformed_single_string_tensor_is_a_wire_error(raw: bytes) -> None:
    """One BYTES element (a streamed text piece) has a fast path; it checks as much."""
    with pytest.raises(WireError):
        tensor_from_plain(["t", "BYTES", [1], raw, {}])
    got = tensor_from_plain(["t", "BYTES", [1], b"\x02\x00\x00\x00ab", {"k": 1}])
    assert got == Tensor("t", (1,), "BYTES", np.array([b"ab"], dtype=object), {"k": 1})


def test_every_message_kind_round_trips() -> None:
    request = InferenceRequest([bytes_tensor("text_input", b"hi")], id="a", parameters={"n_tokens": 3})
    messages: list[Message] = [
        Call(1, "statistics", {"name": "m", "version": None}),
        Infer(2, request, None, "1"),
        OpenStream(3, request, "streamer", None, 64),
        OpenStreamIn(4, "streamer", "1", 8),
        StreamRequest(4, request),
        StreamInputEnd(4),
        Ack(3, 32),
        Cancel(3),
        Reply(1, [1, "x", None]),
        Opened(3),
        StreamOutputs(0, ((3, []), (5, [[{}, []]]))),
        End(3),
        Failed(2, "ModelNotFound", "model 'x' is not loaded"),
        Credit(4, 1),
    ]
    assert round_trip(*messages) == messages


def test_frames_split_anywhere_and_many_messages() -> None:
    messages = [Ack(i, i) for i in range(70_000)]  # array32 header
    data = encode_frame([encode_message(m) for m in messages]) + encode_frame([encode_message(End(5))])
    decoder = FrameDecoder(LIMIT)
    frames = []
    for start in range(0, len(data), 4097):
        decoder.feed(data[start : start + 4097])
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert frames == [messages, [End(5)]]
    for count in (15, 16, 65_535, 65_536):  # header size boundaries
        assert len(round_trip(*[Cancel(1)] * count)) == count


def test_records_and_results_round_trip() -> None:
    values: dict[str, Any] = {
        "ready": True,
        "models": [
            ModelInfo("m", "1", ModelState.READY, True, False, 2, 64),
            ModelInfo("n", "3", ModelState.LOADING, False, True, 1, reason="x"),
            ModelInfo(
                "t",
                "1",
                ModelState.READY,
                True,
                False,
                1,
                8,
                text_generation=TextGeneration(
                    sampling=("seed",), stop=True, chat_template="{{ x }}", chat_stop=("\n",)
                ),
            ),
        ],
        "model_info": ModelInfo("m", "1", ModelState.UNAVAILABLE, False, False, 1),
        "metadata": ModelMetadata(
            "m",
            ("1", "2"),
            "p",
            (TensorMetadata("a", "FP32", (-1, 3)),),
            (TensorMetadata("b", "BYTES", (1,)),),
            {"request_parameters": "n", "text_generation.chat": True},
        ),
        "repository_index": [
            RepositoryEntry("m", "1", ModelState.READY),
            RepositoryEntry("n", "2", ModelState.UNAVAILABLE, "broken"),
        ],
        "statistics": ModelStatistics("m", "1", 3, 1, 2, 10, 40, 5, 9, {"ended": 3, "expired": 1}),
        "load_from_repository": None,
        "unload": None,
        "load_archive": ModelInfo("ts", "1.0", ModelState.READY, True, False, 1, 4),
        "set_default_version": None,
        "wait_idle": None,
        "set_workers": None,
        "describe": ModelDescription(
            "m",
            "2",
            "READY",
            "",
            "2",
            ("1", "2"),
            "pkg.M",
            "p",
            True,
            3,
            8,
            0.5,
            16,
            100,
            0,
            4,
            9,
            True,
            2,
            5,
            1,
            (ReplicaDescription(0, 1, 2, 1), ReplicaDescription(1, 0, 3, 1)),
        ),
        "inference_statistics": [
            InferenceStatistics(
                "m",
                "1",
                1700000000000,
                12,
                5,
                Duration(4, 400),
                Duration(1, 10),
                Duration(4, 40),
                Duration(5, 500),
                (BatchStatistics(1, Duration(2, 100)), BatchStatistics(3, Duration(3, 400))),
            ),
            InferenceStatistics("n", "1"),
        ],
    }
    assert set(values) == set(BY_NAME)
    for method, value in values.items():
        to_plain, from_plain = result_codec(BY_NAME[method].record)
        (reply,) = round_trip(Reply(9, to_plain(value)))
        assert isinstance(reply, Reply)
        assert from_plain(reply.value) == value
    with pytest.raises(WireError):
        result_codec(GetModelInfo)[1](["m", "1", "BROKEN", True, False, 1, 0, "", None])


@pytest.mark.parametrize(
    "error",
    [
        errors.BadInput("input 'x': bad"),
        errors.ModelNotFound("model 'q' is not loaded"),
        errors.ModelNotReady("later"),
        errors.ShuttingDown("bye"),
        errors.SequenceNotFound("sequence '3' expired"),
        errors.SequenceConflict("open"),
        errors.Overloaded("full"),
        errors.ModelFailed("model 'm' failed: ValueError: no"),
        SettingsError("model-settings.json: bad"),
    ],
)
def test_domain_errors_keep_their_class(error: Exception) -> None:
    (failed,) = round_trip(Failed(1, *error_to_plain(error)))
    assert isinstance(failed, Failed)
    rebuilt = error_from_plain(failed.kind, failed.message)
    assert type(rebuilt) is type(error) and str(rebuilt) == str(error)


def test_other_errors() -> None:
    class TooLong(errors.BadInput):
        pass

    assert error_to_plain(TooLong("prompt too long")) == ("BadInput", "prompt too long")
    rebuilt = error_from_plain(*error_to_plain(KeyError("k")))
    assert type(rebuilt) is EngineInternalError and str(rebuilt) == "KeyError: 'k'"
    assert not isinstance(rebuilt, errors.ActorServeError)  # a bug stays a 500 with a generic message


def test_values_that_cannot_cross() -> None:
    odd = Tensor("x", (3,), "FP32", np.zeros(2, np.float32))
    with pytest.raises(errors.BadInput, match=r"tensor 'x': shape \[3\] needs 3 elements, data has 2"):
        encode_message(Infer(1, InferenceRequest([odd]), "m", None))
    with pytest.raises(errors.BadInput, match="cannot be sent"):
        encode_message(Infer(1, InferenceRequest([], parameters={"x": object()}), "m", None))
    with pytest.raises(FrameTooLarge, match="exceeds the engine link's limit of 100 bytes"):
        encode_message(Infer(1, InferenceRequest([bytes_tensor("t", b"x" * 200)]), "m", None), 100)
    # numpy scalars and a wider array than declared are converted, not refused
    wide = Tensor("y", (2,), "INT32", np.array([1, 2], np.int64), {"scale": np.float32(0.5)})
    (got,) = round_trip(Infer(1, InferenceRequest([wide], parameters={"n": np.int64(3)}), None, None))
    assert isinstance(got, Infer)
    assert got.request.parameters == {"n": 3}
    assert got.request.inputs[0].data.dtype == np.int32 and got.request.inputs[0].parameters == {"scale": 0.5}


def frame_of(plain: Any) -> bytes:
    body = msgpack.packb(plain)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "data",
    [
        frame_of({"not": "a list"}),
        frame_of([[99, 1]]),  # unknown tag
        frame_of([[8, 1, "extra"]]),  # Cancel has no fields
        frame_of([[8, "one"]]),  # the id is not an integer
        frame_of([[7, 1, -1]]),  # a negative count
        frame_of(
            [[22, 1, [["m", None, None, {}, [["t", "FP32", [2], b"\x00" * 4, {}]]]]]]
        ),  # 4 bytes for 2 floats
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",  # not msgpack
        struct.pack(">I", LIMIT + 1),  # too large, refused before its body arrives
    ],
)
def test_malformed_frames(data: bytes) -> None:
    decoder = FrameDecoder(LIMIT)
    decoder.feed(data)
    with pytest.raises(WireError):
        decoder.next_frame()


def test_an_overloaded_error_keeps_its_retry_after() -> None:
    kind, message = error_to_plain(errors.Overloaded("upstream rate limited", retry_after=7))
    back = error_from_plain(kind, message)
    assert isinstance(back, errors.Overloaded)
    assert (back.message, back.retry_after) == ("upstream rate limited", 7)
    plain = error_from_plain(*error_to_plain(errors.Overloaded("mailbox full")))
    assert isinstance(plain, errors.Overloaded) and plain.retry_after is None
