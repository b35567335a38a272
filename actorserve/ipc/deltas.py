"""A stream's responses as deltas on the engine link: what is constant crosses once.

Every response of a stream repeats its model name, version, request id, output names,
datatypes and tensor parameters; usually its output shapes too. :class:`DeltaEncoder`
(the engine's end, one per stream) sends them in the stream's first **event** and again
only when they change; :class:`DeltaDecoder` (the front's end, one per call) remembers
them and builds each :class:`~actorserve.types.InferenceResponse` from them and the
event. An event is a plain list (no I/O, no msgpack here):

- ``[parameters, raws]``: the response's parameters and each output's raw bytes
  (Triton's raw layout, as :func:`~actorserve.ipc.values.tensor_to_plain`), with the
  shapes and constants of the event before;
- ``[parameters, raws, shapes]``: new shapes (one list per output);
- ``[parameters, raws, shapes, head]``: new constants too, ``head`` being
  ``[model_name, model_version, id, names, datatypes, tensor_parameters]``.

The first event of a stream always has a head. Decoders trust nothing: a malformed
event raises :class:`~actorserve.ipc.values.WireError`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from .. import errors
from ..codecs import MAX_DIMS
from ..raw import tensor_to_raw
from ..rawevents import RAW_DTYPES, RawEvent, StreamHead
from ..types import InferenceResponse, Tensor
from .values import Plain, WireError, tensor_from_plain

_LEN: Final = struct.Struct("<I")

#: the constants of a stream: model name, version, id, then per output name, datatype
#: and parameters
_Head = tuple[str, str | None, str | None, tuple[str, ...], tuple[str, ...], tuple[dict[str, Any], ...]]


def _raw(tensor: Tensor) -> bytes:
    """``tensor``'s data in Triton's raw layout; :class:`BadInput` if it does not fit its
    shape (as :func:`~actorserve.ipc.values.tensor_to_plain`)."""
    count = math.prod(tensor.shape)
    if tensor.size != count:
        raise errors.BadInput(
            f"tensor {tensor.name!r}: shape {list(tensor.shape)} needs {count} elements, data has {tensor.size}"
        )
    dtype = RAW_DTYPES.get(tensor.datatype)
    if tensor.packed is not None:  # a decoder's BYTES: raw as they are
        return tensor_to_raw(tensor)
    data = tensor.data
    if dtype is None:  # BYTES
        if count == 1:  # one string: a streamed text piece, the common case
            value = data.reshape(-1)[0]
            item = value if isinstance(value, bytes) else str(value).encode()
            return _LEN.pack(len(item)) + item
        return tensor_to_raw(tensor)
    if data.dtype != dtype:  # raw bytes are little-endian and the declared width
        data = data.astype(dtype)
    return data.tobytes()  # C order, whatever the array's strides


class DeltaEncoder:
    """The engine's end of one stream: each response as an event (see the module)."""

    __slots__ = ("_head", "_shapes")

    def __init__(self) -> None:
        self._head: _Head | None = None
        self._shapes: list[list[int]] | None = None

    def event(self, response: InferenceResponse) -> list[Any]:
        """``response`` as an event; :class:`BadInput` if a tensor's data does not fit
        its shape (nothing is remembered then)."""
        outputs = response.outputs
        raws = [_raw(t) for t in outputs]
        shapes = [list(t.shape) for t in outputs]
        head = self._head
        if head is None or not _same_head(response, head):
            head = (
                response.model_name,
                response.model_version,
                response.id,
                tuple(t.name for t in outputs),
                tuple(t.datatype for t in outputs),
                # copies: a model may change a dict it hands out again
                tuple(dict(t.parameters) for t in outputs),
            )
            self._head, self._shapes = head, shapes
            return [response.parameters, raws, shapes, [*head[:3], *map(list, head[3:])]]
        if shapes != self._shapes:
            self._shapes = shapes
            return [response.parameters, raws, shapes]
        return [response.parameters, raws]


def _same_head(response: InferenceResponse, head: _Head) -> bool:
    outputs = response.outputs
    if (
        response.model_name != head[0]
        or response.model_version != head[1]
        or response.id != head[2]
        or len(outputs) != len(head[3])
    ):
        return False
    for tensor, name, datatype, parameters in zip(outputs, head[3], head[4], head[5], strict=True):
        if tensor.name != name or tensor.datatype != datatype or tensor.parameters != parameters:
            return False
    return True


#: raw bytes -> an output's data, for one output of known name, datatype and shape
_Build = Callable[[bytes], np.ndarray[Any, Any]]


class DeltaDecoder:
    """The front's end of one stream: events back into responses (see the module), or
    into :class:`~actorserve.rawevents.RawEvent` s for a transport that writes raw data."""

    __slots__ = ("_builds", "_head", "_raw_head", "_raw_shapes", "_shapes", "_sizes")

    def __init__(self) -> None:
        self._head: _Head | None = None
        self._shapes: list[tuple[int, ...]] = []
        self._builds: list[_Build] = []
        #: the head and shapes as the raw events carry them (new objects on each change)
        self._raw_head: StreamHead | None = None
        self._raw_shapes: tuple[tuple[int, ...], ...] = ()
        #: per output, its raw data's size in bytes (-1: one length-prefixed string);
        #: None when an output is neither (its events are built as responses)
        self._sizes: list[int] | None = None

    def raw_events(self, events: Sequence[Plain]) -> list[RawEvent | InferenceResponse]:
        """The events as :class:`RawEvent` s where every output is numbers or one string,
        else as responses; :class:`WireError` if one is malformed (checked as
        :meth:`responses` checks it)."""
        if not isinstance(events, list):
            raise WireError(f"expected a list of stream events, got {events!r:.100}")
        out: list[RawEvent | InferenceResponse] = []
        for event in events:
            if not isinstance(event, list) or not 2 <= len(event) <= 4:
                raise WireError(f"malformed stream event {event!r:.100}")
            if len(event) > 2:
                self._change(event)
            sizes, head = self._sizes, self._raw_head
            parameters, raws = event[0], event[1]
            if sizes is None or head is None:
                out.append(self._response([parameters, raws]))
                continue
            if not isinstance(parameters, dict) or not isinstance(raws, list) or len(raws) != len(sizes):
                raise WireError(f"malformed stream event {event!r:.100}")
            for raw, size, name in zip(raws, sizes, head.names, strict=True):
                if not isinstance(raw, bytes):
                    raise WireError(f"malformed tensor {name!r}: its data is not bytes")
                if size >= 0:
                    if len(raw) != size:
                        raise WireError(f"malformed tensor {name!r}: {len(raw)} bytes, expected {size}")
                elif len(raw) < 4 or int.from_bytes(raw[:4], "little") != len(raw) - 4:
                    raise WireError(f"malformed tensor {name!r}: not one length-prefixed string")
            out.append(RawEvent(head, self._raw_shapes, parameters, raws))
        return out

    def _change(self, event: list[Any]) -> None:
        """Take an event's new constants and/or shapes (then its data is as any event's)."""
        if len(event) == 4:
            self._head = _head(event[3])
        self._set_shapes(event[2])
        head = self._head
        assert head is not None  # _set_shapes checked it
        self._raw_head = StreamHead(*head)
        self._raw_shapes = tuple(self._shapes)
        sizes: list[int] = []
        for datatype, shape in zip(head[4], self._shapes, strict=True):
            dtype = RAW_DTYPES.get(datatype)
            count = math.prod(shape)
            if dtype is not None and count:
                sizes.append(count * dtype.itemsize)
            elif datatype == "BYTES" and shape == (1,):
                sizes.append(-1)
            else:
                self._sizes = None
                return
        self._sizes = sizes

    def responses(self, events: Sequence[Plain]) -> list[InferenceResponse]:
        """The responses of ``events``, in order; :class:`WireError` if one is malformed."""
        if not isinstance(events, list):
            raise WireError(f"expected a list of stream events, got {events!r:.100}")
        return [self._response(event) for event in events]

    def _response(self, event: Plain) -> InferenceResponse:
        if not isinstance(event, list) or not 2 <= len(event) <= 4:
            raise WireError(f"malformed stream event {event!r:.100}")
        if len(event) >= 3:
            self._change(event)
        head = self._head
        parameters, raws = event[0], event[1]
        if head is None:
            raise WireError("a stream's first event must carry its constants")
        if not isinstance(parameters, dict) or not isinstance(raws, list) or len(raws) != len(head[3]):
            raise WireError(f"malformed stream event {event!r:.100}")
        outputs = []
        for build, raw, name, datatype, shape, tensor_parameters in zip(
            self._builds, raws, head[3], head[4], self._shapes, head[5], strict=True
        ):
            if not isinstance(raw, bytes):
                raise WireError(f"malformed tensor {name!r}: its data is not bytes")
            data = build(raw)
            outputs.append(Tensor(name, shape, datatype, data, dict(tensor_parameters)))
        return InferenceResponse(head[0], outputs, head[1], head[2], parameters)

    def _set_shapes(self, plain: Plain) -> None:
        head = self._head
        if head is None:
            raise WireError("a stream's first event must carry its constants")
        if not isinstance(plain, list) or len(plain) != len(head[3]):
            raise WireError(f"malformed shapes {plain!r:.100}")
        shapes = []
        for shape in plain:
            if (
                not isinstance(shape, list)
                or len(shape) > MAX_DIMS
                or not all(type(d) is int and d >= 0 for d in shape)
            ):
                raise WireError(f"malformed shape {shape!r:.100}")
            shapes.append(tuple(shape))
        self._shapes = shapes
        self._builds = [
            _builder(n, d, s, p) for n, d, s, p in zip(head[3], head[4], shapes, head[5], strict=True)
        ]


def _head(plain: Plain) -> _Head:
    if not isinstance(plain, list) or len(plain) != 6:
        raise WireError(f"malformed stream constants {plain!r:.100}")
    model_name, model_version, response_id, names, datatypes, parameters = plain
    if (
        not isinstance(model_name, str)
        or not isinstance(model_version, str | None)
        or not isinstance(response_id, str | None)
        or not isinstance(names, list)
        or not isinstance(datatypes, list)
        or not isinstance(parameters, list)
        or not len(names) == len(datatypes) == len(parameters)
        or not all(isinstance(n, str) for n in names)
        or not all(isinstance(d, str) for d in datatypes)
        or not all(isinstance(p, dict) for p in parameters)
    ):
        raise WireError(f"malformed stream constants {plain!r:.100}")
    return model_name, model_version, response_id, tuple(names), tuple(datatypes), tuple(parameters)


def _builder(name: str, datatype: str, shape: tuple[int, ...], parameters: dict[str, Any]) -> _Build:
    """How to build the data of one output from its raw bytes: a numpy view on them for
    numeric data, one object array for a single string, else the general decoder."""
    dtype = RAW_DTYPES.get(datatype)
    count: int = math.prod(shape)
    if dtype is not None and shape and count:
        size, typed = count * dtype.itemsize, dtype

        def numeric(raw: bytes) -> np.ndarray[Any, Any]:
            if len(raw) != size:
                raise WireError(f"malformed tensor {name!r}: {len(raw)} bytes for {datatype} {list(shape)}")
            return np.frombuffer(raw, typed).reshape(shape)

        return numeric
    if datatype == "BYTES" and shape == (1,):

        def one_string(raw: bytes) -> np.ndarray[Any, Any]:
            if int.from_bytes(raw[:4], "little") != len(raw) - 4 or len(raw) < 4:
                raise WireError(f"malformed tensor {name!r}: not one length-prefixed string")
            one = np.empty(1, dtype=object)
            one[0] = raw[4:]
            return one

        return one_string

    def general(raw: bytes) -> np.ndarray[Any, Any]:
        return tensor_from_plain([name, datatype, list(shape), raw, parameters]).data

    return general
