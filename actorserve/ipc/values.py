"""Plain forms of the engine's values, for msgpack: tensors, requests, responses, and
(from :mod:`.failures`) errors; the unary calls and the :mod:`actorserve.api` records
they answer with are in :mod:`.unary_values`. No I/O, no msgpack import.

A plain form is built only of msgpack's own types (None, bool, int, float, str, bytes,
lists, str-keyed maps); nothing is ever pickled. Tensor data travels as raw
little-endian bytes (Triton's raw layout, see :func:`actorserve.raw.tensor_to_raw`).

Encoders raise :class:`~actorserve.errors.BadInput` when a value cannot cross (a tensor
whose data does not fit its shape). Decoders trust nothing: any malformed plain form
raises :class:`WireError`, which the link treats as a broken peer.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs
import numpy as np

from .. import errors
from ..codecs import MAX_DIMS
from ..controls import NO_CONTROL, SEQUENCE_ID_CHARACTERS, RequestControl
from ..raw import tensor_from_raw, tensor_to_raw
from ..types import DATATYPES, InferenceRequest, InferenceResponse, RequestedOutput, Tensor, numpy_dtype
from .failures import DOMAIN_ERRORS, EngineInternalError, WireError, error_from_plain, error_to_plain

Plain = Any  # a msgpack-able value; kept loose on purpose (decoders check shapes)


# -- tensors, requests (with their controls), responses --------------------------------------


#: numeric OIP datatype -> little-endian numpy dtype (BYTES takes the general decoder)
_RAW_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items() if name != "BYTES"
}


def tensor_to_plain(tensor: Tensor) -> Plain:
    """``[name, datatype, shape, raw bytes, parameters]``; :class:`BadInput` if the data
    does not match the datatype's element count for ``shape``."""
    count = math.prod(tensor.shape)
    if tensor.size != count:
        raise errors.BadInput(
            f"tensor {tensor.name!r}: shape {list(tensor.shape)} needs {count} elements, data has {tensor.size}"
        )
    if tensor.datatype != "BYTES":
        data = tensor.data
        dtype = numpy_dtype(tensor.datatype)
        if data.dtype != dtype:  # raw bytes must be the declared width
            tensor = Tensor(
                tensor.name, tensor.shape, tensor.datatype, np.asarray(data, dtype=dtype), tensor.parameters
            )
    raw: bytes | memoryview
    if tensor.datatype == "BYTES":
        raw = tensor_to_raw(tensor)
    else:  # msgpack copies the array's own bytes: no copy of them first
        data = tensor.data
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        data = np.ascontiguousarray(data)
        raw = data.reshape(-1).data.cast("B") if data.size else b""
    return [tensor.name, tensor.datatype, list(tensor.shape), raw, tensor.parameters]


def tensor_from_plain(plain: Plain) -> Tensor:
    name, datatype, shape, raw, parameters = _fields(plain, 5, "tensor")
    if not isinstance(name, str) or not isinstance(raw, bytes) or not isinstance(shape, list):
        raise WireError(f"malformed tensor {_short(plain)}")
    dtype = _RAW_DTYPES.get(datatype) if isinstance(datatype, str) else None
    # The fast path takes only data-bearing shapes numpy can reshape to; an empty or odd
    # one goes through tensor_from_raw's full shape check (a ValueError is never raised).
    if dtype is not None and raw and len(shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in shape):
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise WireError(f"malformed tensor {name!r}: {len(raw)} bytes for {datatype} {shape}")
        return Tensor(
            name, tuple(shape), datatype, np.frombuffer(raw, dtype).reshape(shape), _map(parameters)
        )
    if datatype == "BYTES" and shape == [1] and int.from_bytes(raw[:4], "little") == len(raw) - 4 >= 0:
        one = np.empty(1, dtype=object)  # one string: a streamed text piece, the common case
        one[0] = raw[4:]
        return Tensor(name, (1,), datatype, one, _map(parameters))
    try:
        return tensor_from_raw(name, datatype, shape, raw, _map(parameters))
    except errors.BadInput as exc:
        raise WireError(f"malformed tensor: {exc}") from None


def request_to_plain(request: InferenceRequest) -> Plain:
    return [
        request.id,
        request.model_name,
        request.model_version,
        request.parameters,
        [tensor_to_plain(t) for t in request.inputs],
        [[o.name, o.parameters] for o in request.outputs],
        control_to_plain(request.control),
    ]


def request_from_plain(plain: Plain) -> InferenceRequest:
    request_id, model_name, model_version, parameters, inputs, outputs, control = _fields(plain, 7, "request")
    return InferenceRequest(
        inputs=[tensor_from_plain(t) for t in _list(inputs)],
        id=_optional_str(request_id),
        parameters=_map(parameters),
        outputs=[
            RequestedOutput(_str(n), _map(p)) for n, p in (_fields(o, 2, "output") for o in _list(outputs))
        ],
        model_name=_optional_str(model_name),
        model_version=_optional_str(model_version),
        control=control_from_plain(control),
    )


def control_to_plain(control: RequestControl | None) -> Plain:
    """A request's controls as one field: None (not read yet: the engine reads them from
    the parameters) or the record's fields in declaration order (``[sequence_id, start,
    end, cancel, owner, priority, timeout, trace]`` today)."""
    if control is None:
        return None
    return list(attrs.astuple(control, recurse=False))


def control_from_plain(plain: Plain) -> RequestControl | None:
    """The record back, each field checked by its declared type: a field added to
    :class:`RequestControl` crosses the link with no change here (its type must be one of
    :data:`_CONTROL_FIELD_TYPES`; a test fails otherwise)."""
    if plain is None:
        return None
    fields: tuple[attrs.Attribute[Any], ...] = attrs.fields(RequestControl)
    values = _fields(plain, len(fields), "request control")
    kwargs = {
        field.name: _CONTROL_FIELD_TYPES[str(field.type)](value)
        for field, value in zip(fields, values, strict=True)
    }
    sequence_id = kwargs["sequence_id"]
    # a door reads no other characters: anything else is a broken peer
    if sequence_id is not None and not SEQUENCE_ID_CHARACTERS.issuperset(sequence_id):
        raise WireError(f"malformed request control: sequence id {_short(sequence_id)}")
    control = RequestControl(**kwargs)
    return NO_CONTROL if control == NO_CONTROL else control


def response_to_plain(response: InferenceResponse) -> Plain:
    return [
        response.model_name,
        response.model_version,
        response.id,
        response.parameters,
        [tensor_to_plain(t) for t in response.outputs],
    ]


def raw_bytes(plain: Plain) -> int:
    """The tensor bytes a plain response holds (0 if it is not one): decoding takes time
    in proportion (a BYTES element is a Python object each)."""
    if not isinstance(plain, list) or len(plain) != 5 or not isinstance(plain[4], list):
        return 0
    return sum(len(t[3]) for t in plain[4] if isinstance(t, list) and len(t) > 3 and isinstance(t[3], bytes))


def response_from_plain(plain: Plain) -> InferenceResponse:
    model_name, model_version, response_id, parameters, outputs = _fields(plain, 5, "response")
    return InferenceResponse(
        model_name=_str(model_name),
        outputs=[tensor_from_plain(t) for t in _list(outputs)],
        model_version=_optional_str(model_version),
        id=_optional_str(response_id),
        parameters=_map(parameters),
    )


# -- checks -----------------------------------------------------------------------------


def _short(plain: Plain) -> str:
    text = repr(plain)
    return text if len(text) < 100 else text[:97] + "..."


def _fields(plain: Plain, count: int, what: str) -> list[Any]:
    if not isinstance(plain, list) or len(plain) != count:
        raise WireError(f"malformed {what}: {_short(plain)}")
    return plain


def _list(plain: Plain) -> list[Any]:
    if not isinstance(plain, list):
        raise WireError(f"expected a list, got {_short(plain)}")
    return plain


def _map(plain: Plain) -> dict[str, Any]:
    if not isinstance(plain, dict):
        raise WireError(f"expected a map, got {_short(plain)}")
    return plain


def _str(plain: Plain) -> str:
    if not isinstance(plain, str):
        raise WireError(f"expected a string, got {_short(plain)}")
    return plain


def _optional_str(plain: Plain) -> str | None:
    return None if plain is None else _str(plain)


def _int(plain: Plain) -> int:
    if isinstance(plain, bool) or not isinstance(plain, int):
        raise WireError(f"expected an integer, got {_short(plain)}")
    return plain


def _bool(plain: Plain) -> bool:
    if not isinstance(plain, bool):
        raise WireError(f"expected a boolean, got {_short(plain)}")
    return plain


#: how a :class:`RequestControl` field of each declared type is read off the link
_CONTROL_FIELD_TYPES: Final[dict[str, Any]] = {
    "bool": _bool,
    "str | None": _optional_str,
    "int | None": lambda plain: None if plain is None else _int(plain),
}


def plain_default(value: object) -> Plain:
    """msgpack's ``default``: numpy scalars (a model's ``np.int64`` parameter) become
    Python numbers, arrays and sets lists; anything else cannot cross."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} cannot be sent to the other process")


__all__ = [
    "DOMAIN_ERRORS",
    "EngineInternalError",
    "Plain",
    "control_from_plain",
    "control_to_plain",
    "WireError",
    "error_from_plain",
    "error_to_plain",
    "plain_default",
    "request_from_plain",
    "raw_bytes",
    "request_to_plain",
    "response_from_plain",
    "response_to_plain",
    "tensor_from_plain",
    "tensor_to_plain",
]
