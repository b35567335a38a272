"""Per-stream wire templates (``transport/rest/templates.py``, and the OpenAI text chunk
of ``transport/openai/encode.py``): every event they write is byte-for-byte what the
plain encoder writes, for random names, ids, datatypes, shapes, values and parameters,
over streams whose events change (shapes, parameters, ids, outputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from actorserve.errors import BadInput
from actorserve.ipc.deltas import DeltaDecoder, DeltaEncoder
from actorserve.ipc.values import plain_default
from actorserve.rawevents import RawEvent
from actorserve.transport.openai.encode import ChunkShape
from actorserve.transport.rest.generate import encode_event_source, encode_generate
from actorserve.transport.rest.templates import GenerateEvents, OipEvents, for_stream
from actorserve.transport.rest.wire import encode_oip
from actorserve.types import InferenceResponse, Tensor
from tests.strategies import arrays, datatypes, json_values

names = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["text_output", "index", "id", "model_name", "model_version", "sequence_id"]),
)
parameters = st.dictionaries(st.text(max_size=5), json_values, max_size=3)


@st.composite
def tensors(draw: st.DrawFn, name: str | None = None, datatype: str | None = None) -> Tensor:
    datatype, array = draw(arrays(datatype))
    return Tensor(
        draw(names) if name is None else name,
        tuple(int(d) for d in array.shape),
        datatype,
        array,
        draw(parameters),
    )


@st.composite
def streams(draw: st.DrawFn) -> list[InferenceResponse]:
    """A stream's responses: mostly the same constants with new data, sometimes not."""
    model = draw(st.text(max_size=6))
    version = draw(st.none() | st.text(max_size=3))
    request_id = draw(st.none() | st.text(max_size=6))
    layout = [(t.name, t.datatype) for t in draw(st.lists(tensors(), max_size=3))]
    out: list[InferenceResponse] = []
    for _ in range(draw(st.integers(1, 5))):
        change = draw(st.integers(0, 7))
        if change == 0:  # a response unlike the ones before
            request_id = draw(st.none() | st.text(max_size=6))
            layout = [(t.name, t.datatype) for t in draw(st.lists(tensors(), max_size=3))]
        elif change == 1 and layout:  # as many outputs, one of them renamed or retyped
            i = draw(st.integers(0, len(layout) - 1))
            name, datatype = layout[i]
            if draw(st.booleans()):
                name = draw(names.filter(lambda new, old=name: new != old))
            else:
                datatype = draw(datatypes.filter(lambda new, old=datatype: new != old))
            layout[i] = (name, datatype)
        outputs = [draw(tensors(name, datatype)) for name, datatype in layout]
        params = draw(parameters) if draw(st.booleans()) else {}
        if draw(st.booleans()):
            params["sequence_id"] = draw(st.text(max_size=4) | st.integers(0, 9))
        out.append(InferenceResponse(model, outputs, version, request_id, params))
    return out


def outcome(encode: Callable[[InferenceResponse], bytes], response: InferenceResponse) -> Any:
    """The bytes, or the type of the error (a value orjson refuses, in both paths)."""
    try:
        return encode(response)
    except Exception as exc:
        return type(exc)


# 150, not 300: with the renamed / retyped output in streams() (the template's rebuild
# at an unchanged output count), 150 examples reached every line-to-line arc of the
# encoders that 300 reached before it, on 5 of 6 seeds (300 before: 2 of 4); the
# generate and raw-event tests below keep 300 (fewer missed rare arcs there)
@settings(max_examples=150, deadline=None)
@given(streams())
def test_oip_template_writes_what_encode_oip_writes(stream: list[InferenceResponse]) -> None:
    template = OipEvents()
    for response in stream:
        assert outcome(template, response) == outcome(encode_oip, response)


@settings(max_examples=300, deadline=None)
@given(streams(), st.booleans())
def test_generate_template_writes_what_the_generate_encoders_write(
    stream: list[InferenceResponse], event_source: bool
) -> None:
    template = GenerateEvents(event_source=event_source)
    slow = encode_event_source if event_source else encode_generate
    for response in stream:
        assert outcome(template, response) == outcome(slow, response)


def test_a_stream_of_one_shape_splices_only_the_data() -> None:
    template = OipEvents()
    events = []
    for i in range(3):
        text = np.array([f"t{i}".encode()], dtype=object)
        outputs = [Tensor("text_output", (1,), "BYTES", text), Tensor("index", (1,), "INT64", np.array([i]))]
        response = InferenceResponse("streamer", outputs, "1", "r", {"n": i} if i else {})
        events.append(template(response))
        assert events[-1] == encode_oip(response)
    assert events[2] == (
        b'{"model_name":"streamer","model_version":"1","id":"r","parameters":{"n":2},"outputs":['
        b'{"name":"text_output","shape":[1],"datatype":"BYTES","data":["t2"]},'
        b'{"name":"index","shape":[1],"datatype":"INT64","data":[2]}]}'
    )


def test_for_stream_gives_each_stream_its_own_template() -> None:
    first, second = for_stream(encode_oip), for_stream(encode_oip)
    assert isinstance(first, OipEvents) and first is not second
    assert isinstance(for_stream(encode_generate), GenerateEvents)
    assert isinstance(for_stream(encode_event_source), GenerateEvents)
    assert for_stream(bytes) is bytes  # an encoder without a template is used as it is


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=8),
    st.text(max_size=8),
    st.integers(0, 2**40),
    st.booleans(),
    st.booleans(),
    st.none() | st.text(max_size=6),
    st.lists(st.tuples(st.integers(0, 300), st.text(max_size=8)), min_size=1, max_size=4),
)
def test_openai_text_chunks_are_the_documents_bytes(
    call_id: str,
    model: str,
    created: int,
    chat: bool,
    include_usage: bool,
    sequence_id: str | None,
    pieces: list[tuple[int, str]],
) -> None:
    shape = ChunkShape(call_id, model, created, chat, include_usage, sequence_id)
    for index, text in pieces:
        try:
            expected: Any = shape.text_slow(index, text)
        except Exception as exc:  # a lone surrogate: orjson refuses it either way
            expected = type(exc)
        try:
            got: Any = shape.text(index, text)
        except Exception as exc:
            got = type(exc)
        assert got == expected


@settings(max_examples=300, deadline=None)
@given(streams(), st.booleans())
def test_raw_events_are_written_as_the_responses_they_stand_for(
    stream: list[InferenceResponse], event_source: bool
) -> None:
    """A front reads a remote stream's responses as raw events where it can
    (ipc/deltas.py); each template writes them byte for byte as it writes the decoded
    responses."""
    encoder, objects, raws = DeltaEncoder(), DeltaDecoder(), DeltaDecoder()
    pairs: list[tuple[Any, Any]] = [
        (OipEvents(), OipEvents()),
        (GenerateEvents(event_source=event_source), GenerateEvents(event_source=event_source)),
    ]
    for response in stream:
        try:
            event = encoder.event(response)
            packed = msgpack.packb([event], use_bin_type=True, default=plain_default)
        except (BadInput, TypeError, OverflowError):  # what cannot cross never reaches a front
            return
        wire = msgpack.unpackb(packed, raw=False)
        [decoded] = objects.responses(wire)
        [raw] = raws.raw_events(wire)
        for plain, fast in pairs:

            def render(item: RawEvent | InferenceResponse, fast: Any = fast) -> bytes:
                return fast.raw(item) if isinstance(item, RawEvent) else fast(item)

            assert outcome(render, raw) == outcome(plain, decoded)  # type: ignore[arg-type]
