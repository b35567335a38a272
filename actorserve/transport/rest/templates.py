"""Per-stream wire templates for SSE events: the bytes a stream's events share (model
name and version, request id, each output's name and datatype, its shape while it does
not change) are rendered once, when the stream's first event is encoded, and each later
event splices in only what changed: the JSON of the data, a new shape, the parameters.

Each template is a drop-in for one encoder of :mod:`.wire` / :mod:`.generate` and writes
exactly the same bytes (tests/transport/rest/test_templates.py compares them with
hypothesis). An event whose constants differ from the template's (another id, another
set of outputs) rebuilds the template; an event the template cannot express (output
names that collide with the document's own keys) is encoded by the plain encoder.

A template also renders a :class:`~actorserve.rawevents.RawEvent` (``template.raw``): a
front's response whose data is still in the engine link's raw layout, so that no
response object is built per event; the bytes are the same as for the response it
stands for (tested with hypothesis too).

No I/O: bytes in, bytes out. One template serves one stream, in one task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import orjson

from ...jsonbytes import BYTES_FRAGMENT_ELEMENTS, bytes_json
from ...rawevents import RAW_DTYPES, RawEvent, response_of
from ...textgen import element_text
from ...types import InferenceResponse, Tensor
from .generate import encode_event_source, encode_generate, generate_value, usage_fields
from .wire import encode_oip

_NUMPY: Final = orjson.OPT_SERIALIZE_NUMPY
_PARAMETERS: Final = b',"parameters":'
_OUTPUTS: Final = b',"outputs":['


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=_NUMPY)


_UNBUILT: Final = object()


class _OipOutput:
    """One output's constant bytes (with the comma before it, after the first), and the
    bytes from its shape to its data for the last shape seen."""

    __slots__ = ("datatype", "head", "mid", "name", "shape", "shape_mid")

    def __init__(self, tensor: Tensor, position: int) -> None:
        self.name = tensor.name
        self.datatype = tensor.datatype
        self.head = (b',{"name":' if position else b'{"name":') + _dumps(tensor.name) + b',"shape":'
        self.mid = b',"datatype":' + _dumps(tensor.datatype) + b',"data":'
        self.shape = tensor.shape
        self.shape_mid = _dumps(list(tensor.shape)) + self.mid

    def reshape(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.shape_mid = _dumps(list(shape)) + self.mid


class OipEvents:
    """:func:`~.wire.encode_oip` for one stream (an ``infer_stream`` event, or a
    ``generate_stream`` event of an OIP body)."""

    __slots__ = ("_head", "_id", "_name", "_outputs", "_raw_head", "_raw_key", "_raw_outputs", "_version")

    def __init__(self) -> None:
        self._name: object = _UNBUILT  # never equal to a response's
        self._version: str | None = None
        self._id: str | None = None
        self._head = b""
        self._outputs: list[_OipOutput] = []
        # the raw events' template: (head, shapes) it was built for, compared by identity
        self._raw_key: tuple[object, object] = (_UNBUILT, _UNBUILT)
        self._raw_head = b""
        self._raw_outputs: list[tuple[bytes, Callable[[bytes], bytes], bytes]] = []

    def __call__(self, response: InferenceResponse) -> bytes:
        outputs = response.outputs
        templates = self._outputs
        if (
            response.model_name != self._name
            or response.id != self._id
            or response.model_version != self._version
            or len(outputs) != len(templates)
        ):
            self._build(response)
            templates = self._outputs
        if response.parameters:
            parts = [self._head, _PARAMETERS, _dumps(response.parameters), _OUTPUTS]
        else:
            parts = [self._head, _OUTPUTS]
        for out, tensor in zip(templates, outputs, strict=True):  # lengths checked above
            if tensor.name != out.name or tensor.datatype != out.datatype:
                self._build(response)
                return self(response)
            if tensor.shape != out.shape:
                out.reshape(tensor.shape)
            if tensor.parameters:
                parts += (
                    out.head,
                    out.shape_mid,
                    _data_json(tensor),
                    _PARAMETERS,
                    _dumps(tensor.parameters),
                    b"}",
                )
            else:
                parts += (out.head, out.shape_mid, _data_json(tensor), b"}")
        parts.append(b"]}")
        return b"".join(parts)

    def _build(self, response: InferenceResponse) -> None:
        self._name, self._version, self._id = response.model_name, response.model_version, response.id
        self._head = _oip_head(response.model_name, response.model_version, response.id)
        self._outputs = [_OipOutput(tensor, position) for position, tensor in enumerate(response.outputs)]

    def raw(self, event: RawEvent) -> bytes:
        """The event of a :class:`~actorserve.rawevents.RawEvent` (the same bytes as for
        the response it stands for)."""
        if event.head is not self._raw_key[0] or event.shapes is not self._raw_key[1]:
            self._build_raw(event)
        if event.parameters:
            parts = [self._raw_head, _PARAMETERS, _dumps(event.parameters), _OUTPUTS]
        else:
            parts = [self._raw_head, _OUTPUTS]
        for (before, data_json, after), raw in zip(self._raw_outputs, event.raws, strict=True):
            parts += (before, data_json(raw), after)
        parts.append(b"]}")
        return b"".join(parts)

    def _build_raw(self, event: RawEvent) -> None:
        head = event.head
        self._raw_key = (head, event.shapes)
        self._raw_head = _oip_head(head.model_name, head.model_version, head.id)
        self._raw_outputs = [
            (
                (b',{"name":' if position else b'{"name":')
                + _dumps(name)
                + b',"shape":'
                + _dumps(list(shape))
                + b',"datatype":'
                + _dumps(datatype)
                + b',"data":',
                _raw_data_json(datatype),
                _PARAMETERS + _dumps(parameters) + b"}" if parameters else b"}",
            )
            for position, (name, datatype, shape, parameters) in enumerate(
                zip(head.names, head.datatypes, event.shapes, head.parameters, strict=True)
            )
        ]


def _oip_head(model_name: str, model_version: str | None, response_id: str | None) -> bytes:
    """The document's first keys, in codecs.response_to_json's order."""
    head = b'{"model_name":' + _dumps(model_name)
    if model_version is not None:
        head += b',"model_version":' + _dumps(model_version)
    if response_id is not None:
        head += b',"id":' + _dumps(response_id)
    return head


#: dtypes whose elements orjson writes the same from numpy as from Python (integers,
#: bools); ``tolist()`` is several times cheaper than orjson's numpy path for small
#: arrays. Floats are not here: a float32 as a Python float has more digits.
_AS_LIST: Final = frozenset(
    np.dtype(name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)


def _data_json(tensor: Tensor) -> bytes:
    """The ``data`` of codecs.tensor_to_json, as JSON."""
    packed = tensor.packed
    if packed is not None:  # a decoder's BYTES, passed through: one buffer
        return packed.to_json()
    data = tensor.data
    if tensor.datatype == "BYTES":
        if data.size > BYTES_FRAGMENT_ELEMENTS:
            return bytes_json(data.reshape(-1))
        if data.dtype.kind == "O":  # tolist() hands back the elements themselves
            if data.size == 1:
                return _dumps([element_text(data.item())])
            return _dumps([element_text(v) for v in data.ravel().tolist()])
        return _dumps([element_text(v) for v in data.reshape(-1)])
    if data.dtype in _AS_LIST:
        return orjson.dumps(data.ravel().tolist())
    return _dumps(np.ascontiguousarray(data).reshape(-1))


def _raw_data_json(datatype: str) -> Callable[[bytes], bytes]:
    """:func:`_data_json` of an output's raw data (numbers, or one BYTES element)."""
    if datatype == "BYTES":
        return lambda raw: _dumps([raw[4:].decode("utf-8", "replace")])  # element_text
    dtype = RAW_DTYPES[datatype]
    if dtype in _AS_LIST:
        return lambda raw: orjson.dumps(np.frombuffer(raw, dtype).tolist())
    return lambda raw: _dumps(np.frombuffer(raw, dtype))


def _raw_generate_json(datatype: str, shape: tuple[int, ...]) -> Callable[[bytes], bytes]:
    """:func:`_generate_json` of an output's raw data (numbers, or one BYTES element)."""
    if datatype == "BYTES":  # one element: a scalar
        return lambda raw: _dumps(raw[4:].decode("utf-8", "replace"))
    dtype = RAW_DTYPES[datatype]
    if math.prod(shape) == 1 and len(shape) <= 1:
        return lambda raw: _dumps(np.frombuffer(raw, dtype).item())
    return lambda raw: _dumps(np.frombuffer(raw, dtype).reshape(shape).tolist())


def _generate_json(tensor: Tensor) -> bytes:
    """:func:`~.generate.generate_value` as JSON, one-element outputs without the lists."""
    data = tensor.data
    if data.size == 1 and len(tensor.shape) <= 1:
        if tensor.datatype == "BYTES":
            if data.dtype.kind == "O":
                return _dumps(element_text(data.item()))
        else:
            return _dumps(data.item())
    return _dumps(generate_value(tensor))


#: keys of a generate document that an output of the same name would overwrite in place
_GENERATE_KEYS: Final = frozenset({"id", "model_name", "model_version", "sequence_id"})


class GenerateEvents:
    """:func:`~.generate.encode_generate` for one stream, or with ``event_source``
    :func:`~.generate.encode_event_source` (a GET stream's events)."""

    __slots__ = ("_event_source", "_head", "_key", "_names", "_raw_head", "_raw_key", "_raw_outputs", "_slow")

    def __init__(self, *, event_source: bool = False) -> None:
        self._event_source = event_source
        self._slow: Callable[[InferenceResponse], bytes] = (
            encode_event_source if event_source else encode_generate
        )
        self._key: tuple[str | None, str, str | None] | None = None
        self._head = b""
        #: (output name, its key's bytes) in the order of the template's outputs
        self._names: list[tuple[str, bytes]] = []
        # the raw events' template: (head, shapes) it was built for, compared by identity;
        # None: those outputs cannot be spliced
        self._raw_key: tuple[object, object] = (_UNBUILT, _UNBUILT)
        self._raw_head = b""
        self._raw_outputs: list[tuple[bytes, Callable[[bytes], bytes]]] | None = []

    def __call__(self, response: InferenceResponse) -> bytes:
        outputs = response.outputs
        names = self._names
        if (response.id, response.model_name, response.model_version) != self._key or len(outputs) != len(
            names
        ):
            if not self._build(response):
                return self._slow(response)
            names = self._names
        parts = [self._head]
        for position, tensor in enumerate(outputs):
            name, key = names[position]
            if tensor.name != name:
                if not self._build(response):
                    return self._slow(response)
                return self(response)
            parts += (key, _generate_json(tensor))
        if "completion_tokens" in response.parameters:
            parts += _usage(response.parameters)
        if self._event_source and "sequence_id" in response.parameters:
            parts += (b',"sequence_id":', _dumps(response.parameters["sequence_id"]))
        parts.append(b"}")
        return b"".join(parts)

    def _build(self, response: InferenceResponse) -> bool:
        """Render the constants of ``response``; False (and no template) when its outputs
        cannot be spliced: a repeated name, or one that is also a key of the document."""
        names = [tensor.name for tensor in response.outputs]
        if not _spliceable(names):
            self._key = None
            return False
        self._key = (response.id, response.model_name, response.model_version)
        self._head = _generate_head(response.id, response.model_name, response.model_version)
        self._names = [(name, b"," + _dumps(name) + b":") for name in names]
        return True

    def raw(self, event: RawEvent) -> bytes:
        """The event of a :class:`~actorserve.rawevents.RawEvent` (the same bytes as for
        the response it stands for)."""
        if event.head is not self._raw_key[0] or event.shapes is not self._raw_key[1]:
            head = event.head
            self._raw_key = (head, event.shapes)
            if not _spliceable(head.names):
                self._raw_outputs = None
            else:
                self._raw_head = _generate_head(head.id, head.model_name, head.model_version)
                self._raw_outputs = [
                    (b"," + _dumps(name) + b":", _raw_generate_json(datatype, shape))
                    for name, datatype, shape in zip(head.names, head.datatypes, event.shapes, strict=True)
                ]
        if self._raw_outputs is None:
            return self._slow(response_of(event))
        parts = [self._raw_head]
        for (key, data_json), raw in zip(self._raw_outputs, event.raws, strict=True):
            parts += (key, data_json(raw))
        if "completion_tokens" in event.parameters:
            parts += _usage(event.parameters)
        if self._event_source and "sequence_id" in event.parameters:
            parts += (b',"sequence_id":', _dumps(event.parameters["sequence_id"]))
        parts.append(b"}")
        return b"".join(parts)


def _usage(parameters: Mapping[str, Any]) -> list[bytes]:
    """The usage keys of a generate document (generate.usage_fields), as bytes."""
    return [b"," + _dumps(key) + b":" + _dumps(value) for key, value in usage_fields(parameters)]


def _spliceable(names: Sequence[str]) -> bool:
    """Whether outputs of these names can be spliced into a generate document: no name
    twice, none that is also a key of the document."""
    return len(set(names)) == len(names) and _GENERATE_KEYS.isdisjoint(names)


def _generate_head(response_id: str | None, model_name: str, model_version: str | None) -> bytes:
    """The document's first keys, in generate.generate_response_to_json's order."""
    head = b"{"
    if response_id is not None:
        head += b'"id":' + _dumps(response_id) + b","
    head += b'"model_name":' + _dumps(model_name)
    return head + b',"model_version":' + _dumps(model_version)


def for_stream(encode: Callable[[InferenceResponse], bytes]) -> Callable[[InferenceResponse], bytes]:
    """The template for one stream of what ``encode`` writes (``encode`` itself when it
    has none)."""
    if encode is encode_oip:
        return OipEvents()
    if encode is encode_generate:
        return GenerateEvents()
    if encode is encode_event_source:
        return GenerateEvents(event_source=True)
    return encode


__all__ = ["GenerateEvents", "OipEvents", "for_stream"]
