"""A stream's responses as deltas (actorserve.ipc.deltas), with plain values: any sequence
of responses survives the round trip exactly, what is constant crosses once, a malformed
event is a WireError, and the outbox joins the entries of several streams into one
message without reordering anything."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import arrays, msgpack_values, mutated

from actorserve.errors import BadInput
from actorserve.ipc.deltas import DeltaDecoder, DeltaEncoder
from actorserve.ipc.frames import (
    FrameDecoder,
    StreamOutputs,
    encode_frame,
    encode_stream_entry,
    encode_stream_outputs,
)
from actorserve.ipc.outbox import Outbox
from actorserve.ipc.values import WireError, plain_default
from actorserve.rawevents import RawEvent
from actorserve.types import InferenceResponse, Tensor


def text(value: bytes) -> Tensor:
    one = np.empty(1, dtype=object)
    one[0] = value
    return Tensor("text_output", (1,), "BYTES", one)


def token(k: int, **parameters: Any) -> InferenceResponse:
    return InferenceResponse(
        "streamer",
        [text(f"tok:{k}".encode()), Tensor("index", (1,), "INT64", np.array([k], dtype=np.int64))],
        model_version="1",
        id="r1",
        parameters=parameters,
    )


def over_the_wire(events: list[Any]) -> list[Any]:
    """``events`` through msgpack, as the link carries them."""
    decoded = msgpack.unpackb(msgpack.packb(events, use_bin_type=True, default=plain_default), raw=False)
    assert isinstance(decoded, list)
    return decoded


def test_constants_cross_once_and_each_event_carries_only_what_changed() -> None:
    encoder = DeltaEncoder()
    first, second, last = (encoder.event(r) for r in (token(0), token(1), token(2, finish_reason="length")))
    assert first[3] == ["streamer", "1", "r1", ["text_output", "index"], ["BYTES", "INT64"], [{}, {}]]
    assert first[2] == [[1], [1]]
    assert second == [{}, [b"\x05\x00\x00\x00tok:1", np.int64(1).tobytes()]]
    assert last[0] == {"finish_reason": "length"} and len(last) == 2
    decoder = DeltaDecoder()
    assert decoder.responses(over_the_wire([first, second, last])) == [
        token(0),
        token(1),
        token(2, finish_reason="length"),
    ]


def test_a_changed_shape_or_constant_is_sent_again() -> None:
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    grown = InferenceResponse("m", [Tensor("x", (2,), "FP32", np.array([1, 2], dtype=np.float32))])
    renamed = InferenceResponse("m", [Tensor("y", (2,), "FP32", np.array([3, 4], dtype=np.float32))])
    tagged = InferenceResponse("m", [Tensor("y", (2,), "FP32", np.array([5, 6], dtype=np.float32), {"k": 1})])
    small = InferenceResponse("m", [Tensor("x", (1,), "FP32", np.array([0], dtype=np.float32))])
    small_again = InferenceResponse("m", [Tensor("x", (3,), "FP32", np.array([7, 8, 9], dtype=np.float32))])
    sequence = [small, grown, renamed, tagged, tagged, small, small_again]
    events = [encoder.event(r) for r in sequence]
    assert [len(e) for e in events] == [4, 3, 4, 4, 2, 4, 3]
    assert decoder.responses(over_the_wire(events)) == sequence


def test_a_model_that_changes_a_dict_it_returns_again_is_seen() -> None:
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    shared: dict[str, Any] = {"k": 1}
    tensor = Tensor("x", (1,), "INT32", np.array([1], dtype=np.int32), shared)
    first = encoder.event(InferenceResponse("m", [tensor]))
    shared["k"] = 2
    second = encoder.event(InferenceResponse("m", [tensor]))
    got = decoder.responses(over_the_wire([first, second]))
    assert [r.outputs[0].parameters for r in got] == [{"k": 1}, {"k": 2}]


def test_data_that_does_not_fit_its_shape_is_bad_input() -> None:
    with pytest.raises(BadInput, match="needs 2 elements"):
        DeltaEncoder().event(
            InferenceResponse("m", [Tensor("x", (2,), "INT32", np.array([1], dtype=np.int32))])
        )


@given(
    st.lists(st.tuples(st.lists(arrays(), min_size=0, max_size=2), st.sampled_from(["a", "b"])), max_size=6)
)
def test_any_sequence_of_responses_round_trips(steps: list[tuple[list[tuple[str, Any]], str]]) -> None:
    responses = [
        InferenceResponse(
            "m",
            [Tensor(f"o{i}", tuple(a.shape), dt, a) for i, (dt, a) in enumerate(pairs)],
            id=rid,
            parameters={"step": n},
        )
        for n, (pairs, rid) in enumerate(steps)
    ]
    encoder = DeltaEncoder()
    got = DeltaDecoder().responses(over_the_wire([encoder.event(r) for r in responses]))
    assert got == responses
    for mine, theirs in zip(got, responses, strict=True):
        assert [t.data.dtype for t in mine.outputs] == [t.data.dtype for t in theirs.outputs]


def test_entries_of_several_streams_leave_as_one_message() -> None:
    encoders = {3: DeltaEncoder(), 9: DeltaEncoder()}
    entries = [encode_stream_entry(i, [encoders[i].event(token(i))]) for i in (3, 9)]
    frame = encode_frame([encode_stream_outputs(entries)])
    decoder = FrameDecoder(1 << 20)
    decoder.feed(frame)
    (message,) = decoder.next_frame() or []
    assert isinstance(message, StreamOutputs) and [call_id for call_id, _ in message.entries] == [3, 9]
    assert DeltaDecoder().responses(message.entries[1][1]) == [token(9)]


@given(st.data())
def test_a_nearly_valid_event_is_a_wire_error_or_decodes(data: st.DataObject) -> None:
    encoder = DeltaEncoder()
    events = over_the_wire([encoder.event(token(0)), encoder.event(token(1))])
    bad = data.draw(mutated(events, msgpack_values))
    decoder = DeltaDecoder()
    try:
        decoder.responses(bad)
    except WireError:
        pass


@pytest.mark.parametrize(
    "events",
    [
        [[{}, [b"x"]]],  # no constants first
        [[{}, [], [], ["m", None, None, [], [], []]], "x"],
        [[[], [], [], ["m", None, None, [], [], []]]],  # parameters not a map
        [[{}, [b"\x01\x00\x00\x00a"], [[1]], ["m", None, None, ["t"], ["BYTES"], []]]],  # lengths differ
        [[{}, [b"\x01\x00"], [[1]], ["m", None, None, ["t"], ["INT32"], [{}]]]],  # 2 bytes for an INT32
        [[{}, [b"\x09\x00\x00\x00a"], [[1]], ["m", None, None, ["t"], ["BYTES"], [{}]]]],  # short string
        [[{}, [b""], [[-1]], ["m", None, None, ["t"], ["BYTES"], [{}]]]],  # negative size
    ],
)
def test_malformed_events_are_wire_errors(events: list[Any]) -> None:
    with pytest.raises(WireError):
        DeltaDecoder().responses(events)


async def test_entries_join_only_the_message_queued_last() -> None:
    """Entries queued one after the other share one message; anything queued between
    them (a stream's Opened, another's End) starts a new one, so order is kept; a
    message never grows past the given size."""
    outbox = Outbox(max_messages=16, max_bytes=1 << 20)
    entries = [encode_stream_entry(i, [[{}, [b"x" * 10]]]) for i in range(5)]
    outbox.put_urgent(b"A")
    await outbox.put_entry(entries[0], 1000)
    await outbox.put_entry(entries[1], 1000)
    outbox.put_urgent(b"B")
    await outbox.put_entry(entries[2], 1000)
    await outbox.put_entry(entries[3], len(entries[2]) + 1)  # would pass the size: a new message
    await outbox.put_entry(entries[4], 1000)
    taken = await outbox.take(1 << 20)
    assert taken == [
        b"A",
        encode_stream_outputs(entries[:2]),
        b"B",
        encode_stream_outputs(entries[2:3]),
        encode_stream_outputs(entries[3:]),
    ]
    assert len(outbox) == 0
    await outbox.put_entry(entries[0], 1000)  # the taken message is closed: a new one
    assert await outbox.take(1 << 20) == [encode_stream_outputs(entries[:1])]


def test_numbers_and_one_string_decode_as_raw_events_sharing_their_constants() -> None:
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    events = over_the_wire([encoder.event(token(k)) for k in range(3)])
    raw = decoder.raw_events(events)
    assert all(isinstance(e, RawEvent) for e in raw)
    first = raw[0]
    assert isinstance(first, RawEvent)
    assert (first.head.model_name, first.head.model_version, first.head.id) == ("streamer", "1", "r1")
    assert first.head.names == ("text_output", "index") and first.shapes == ((1,), (1,))
    # one head and one shapes object for the whole stream: templates compare by identity
    assert all(isinstance(e, RawEvent) and e.head is first.head and e.shapes is first.shapes for e in raw)
    assert [e.raws for e in raw if isinstance(e, RawEvent)][2] == [
        b"\x05\x00\x00\x00tok:2",
        np.int64(2).tobytes(),
    ]


def test_outputs_that_are_not_numbers_or_one_string_decode_as_responses() -> None:
    two = np.empty(2, dtype=object)
    two[:] = [b"a", b"b"]
    response = InferenceResponse("m", [Tensor("t", (2,), "BYTES", two)], id="r")
    [decoded] = DeltaDecoder().raw_events(over_the_wire([DeltaEncoder().event(response)]))
    assert isinstance(decoded, InferenceResponse) and decoded.outputs[0].data.tolist() == [b"a", b"b"]


@pytest.mark.parametrize(
    "raws",
    [[b"\x05\x00\x00\x00tok", b"\x00" * 8], [b"\x03\x00\x00\x00tok", b"\x00" * 7], ["tok", b"\x00" * 8]],
)
def test_a_raw_event_of_the_wrong_size_is_a_wire_error(raws: list[Any]) -> None:
    decoder = DeltaDecoder()
    decoder.raw_events(over_the_wire([DeltaEncoder().event(token(0))]))
    with pytest.raises(WireError, match="malformed tensor"):
        decoder.raw_events([[{}, raws]])
