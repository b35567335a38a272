"""Conversions between the gRPC messages of :mod:`actorserve.proto.inference` and
actorserve's domain types (:mod:`actorserve.types`).

Tensor data goes through numpy in bulk: raw contents with ``numpy.frombuffer`` (no
copy) and ``ndarray.tobytes()``, typed contents with one ``numpy.array`` call per
tensor. Only BYTES tensors loop per element (each element is a separate bytes object).

Protocol rules enforced here, as Triton does:

- raw contents are all-or-nothing: when ``raw_input_contents`` is present it has one
  entry per input, and no input may also carry typed ``contents``;
- typed contents must be in the field for the datatype (``int_contents`` for
  INT8/16/32, ``uint_contents`` for UINT8/16/32, ...); FP16 has no typed field and
  must be sent raw.

Every violation raises :class:`~actorserve.errors.BadInput` naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import betterproto2
import numpy as np

from ..codecs import check_shape
from ..errors import BadInput
from ..limits import MAX_INPUTS, BytesElements, check_count
from ..raw import tensor_from_raw, tensor_to_raw
from ..types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor, numpy_dtype
from .inference import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferRequestInferRequestedOutputTensor,
    ModelInferResponse,
    ModelInferResponseInferOutputTensor,
)

__all__ = [
    "params_from_pb",
    "params_to_pb",
    "request_from_pb",
    "request_to_pb",
    "response_from_pb",
    "response_to_pb",
    "tensor_contents_from_pb",
    "tensor_contents_to_pb",
]

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_UINT64_MAX: Final = 2**64 - 1

#: OIP datatype -> (InferTensorContents field, numpy dtype of that field's wire type).
_CONTENTS_FIELD: Final[dict[str, tuple[str, np.dtype[Any]]]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
    "BYTES": ("bytes_contents", np.dtype(object)),
}
_ALL_CONTENTS_FIELDS: Final = tuple(dict.fromkeys(field for field, _ in _CONTENTS_FIELD.values()))


# --------------------------------------------------------------------------- parameters


def params_from_pb(params: Mapping[str, InferParameter], *, where: str = "request") -> dict[str, Any]:
    """``map<string, InferParameter>`` -> ``{name: bool | int | str | float}``.

    ``int64_param`` and ``uint64_param`` both become ``int``; a parameter with no value
    set is rejected.
    """
    out: dict[str, Any] = {}
    for key, param in params.items():
        if not isinstance(param, InferParameter):  # betterproto2 lets None or an int through
            raise BadInput(f"{where}: parameter {key!r} has no value")
        # Written out rather than betterproto2.which_one_of: this runs for every parameter.
        if param.bool_param is not None:
            out[key] = param.bool_param
        elif param.int64_param is not None:
            out[key] = param.int64_param
        elif param.string_param is not None:
            out[key] = param.string_param
        elif param.double_param is not None:
            out[key] = param.double_param
        elif param.uint64_param is not None:
            out[key] = param.uint64_param
        else:
            raise BadInput(f"{where}: parameter {key!r} has no value (parameter_choice is unset)")
    return out


def params_to_pb(params: Mapping[str, Any], *, where: str = "parameters") -> dict[str, InferParameter]:
    """``{name: value}`` -> ``map<string, InferParameter>``.

    bool -> ``bool_param``; int -> ``int64_param`` (``uint64_param`` above 2**63-1);
    float -> ``double_param``; str -> ``string_param``. numpy scalars count as their
    Python type. Anything else (None, lists, dicts, bytes) has no InferParameter form
    and raises :class:`BadInput`.
    """
    return {key: _param_to_pb(key, value, where) for key, value in params.items()}


def _param_to_pb(key: str, value: Any, where: str) -> InferParameter:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return InferParameter(bool_param=value)
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            return InferParameter(int64_param=value)
        if 0 <= value <= _UINT64_MAX:
            return InferParameter(uint64_param=value)
        raise BadInput(f"{where}: parameter {key!r} = {value} does not fit in int64 or uint64")
    if isinstance(value, float):
        return InferParameter(double_param=value)
    if isinstance(value, str):
        return InferParameter(string_param=value)
    raise BadInput(
        f"{where}: parameter {key!r} is a {type(value).__name__}; gRPC parameters can only be "
        "bool, int, float or str"
    )


# --------------------------------------------------------------------------- tensors


def tensor_contents_from_pb(
    name: str,
    datatype: str,
    shape: Sequence[int],
    contents: InferTensorContents | None,
    parameters: Mapping[str, Any] | None = None,
    *,
    what: str = "input",
) -> Tensor:
    """Build a tensor from typed ``InferTensorContents`` (checked against datatype and shape)."""
    dims = check_shape(name, list(shape))
    dtype = numpy_dtype(datatype)
    count = math.prod(dims)
    if contents is None:
        contents = InferTensorContents()
    try:
        field, wire_dtype = _CONTENTS_FIELD[datatype]
    except KeyError:
        raise BadInput(
            f"{what} {name!r}: {datatype} has no typed contents field; send it in raw contents"
        ) from None
    values: list[Any] = getattr(contents, field)
    if len(values) != count:
        others = [f for f in _ALL_CONTENTS_FIELDS if f != field and getattr(contents, f)]
        if not values and others:
            raise BadInput(
                f"{what} {name!r}: {datatype} data must be in contents.{field}, got {', '.join(others)}"
            )
        raise BadInput(
            f"{what} {name!r}: shape {list(dims)} needs {count} elements, contents.{field} has {len(values)}"
        )
    if datatype == "BYTES":
        if not all(type(v) is bytes for v in values):  # betterproto2 lets a varint in
            raise BadInput(f"{what} {name!r}: an element of contents.{field} is not bytes")
        array = np.empty(count, dtype=object)
        array[:] = values
        return Tensor(name, dims, datatype, array.reshape(dims), dict(parameters or {}))
    # betterproto2 already decoded the values into the wire type's range, so this cannot
    # overflow; only narrower datatypes (INT8/16, UINT8/16) need a range check.
    try:
        array = np.array(values, dtype=wire_dtype)
    except (TypeError, ValueError):  # bytes where numbers belong (wire types unchecked)
        raise BadInput(f"{what} {name!r}: contents.{field} holds values that are not numbers") from None
    if dtype != wire_dtype:
        info = np.iinfo(dtype)
        if count and (int(array.min()) < info.min or int(array.max()) > info.max):
            raise BadInput(f"{what} {name!r}: a value in contents.{field} is out of range for {datatype}")
        array = array.astype(dtype)
    return Tensor(name, dims, datatype, array.reshape(dims), dict(parameters or {}))


def tensor_contents_to_pb(tensor: Tensor) -> InferTensorContents:
    """Typed contents for a tensor; :class:`BadInput` for FP16 (only raw contents carry it)."""
    try:
        field, wire_dtype = _CONTENTS_FIELD[tensor.datatype]
    except KeyError:
        raise BadInput(
            f"tensor {tensor.name!r}: {tensor.datatype} has no typed contents field; use raw contents"
        ) from None
    flat = tensor.data.reshape(-1)
    values: list[Any]
    if tensor.datatype == "BYTES":
        values = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
    else:
        # betterproto2 wants a list of Python scalars; tolist() builds it in C.
        values = flat.astype(wire_dtype, copy=False).tolist()
    return InferTensorContents(**{field: values})


class _PbTensor(Protocol):
    """What ``InferInputTensor`` and ``InferOutputTensor`` have in common."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, InferParameter]
    contents: InferTensorContents | None


def _has_typed(datatype: str) -> bool:
    return datatype in _CONTENTS_FIELD


def _decode_tensors(
    entries: Sequence[_PbTensor],
    raw: Sequence[bytes],
    *,
    what: str,
    raw_field: str,
) -> list[Tensor]:
    tensors = []
    _no_missing(entries, what)
    if raw:
        if len(raw) != len(entries):
            raise BadInput(
                f"{raw_field} has {len(raw)} entries but there are {len(entries)} {what}s; "
                f"raw contents need exactly one entry per {what}, in order"
            )
        budget = BytesElements()
        for entry, data in zip(entries, raw, strict=True):
            if not isinstance(data, bytes):
                raise BadInput(f"{raw_field}: an entry is not bytes")
            if entry.contents:
                raise BadInput(f"{what} {entry.name!r}: contents must not be given when {raw_field} is used")
            params = params_from_pb(entry.parameters, where=f"{what} {entry.name!r}")
            tensors.append(tensor_from_raw(entry.name, entry.datatype, entry.shape, data, params, budget))
    else:
        for entry in entries:
            params = params_from_pb(entry.parameters, where=f"{what} {entry.name!r}")
            tensors.append(
                tensor_contents_from_pb(
                    entry.name, entry.datatype, entry.shape, entry.contents, params, what=what
                )
            )
    return tensors


def _no_missing(entries: Sequence[Any], what: str) -> None:
    """betterproto2 does not check wire types: a group or a varint where a message
    belongs decodes to None or an int, a varint where a string belongs to an int. Such an
    entry is a :class:`BadInput` here, not an AttributeError later."""
    for position, entry in enumerate(entries):
        if not isinstance(entry, betterproto2.Message):
            raise BadInput(f"{what} {position} is malformed (not a tensor message)")
        for field in ("name", "datatype"):
            if type(getattr(entry, field, "")) is not str:
                raise BadInput(f"{what} {position}: {field} is not a string")
        contents = getattr(entry, "contents", None)
        if contents is not None and not isinstance(contents, InferTensorContents):
            raise BadInput(f"{what} {position}: contents is malformed (not an InferTensorContents message)")


def _strings(msg: Any, *fields: str) -> None:
    for field in fields:
        if type(getattr(msg, field)) is not str:
            raise BadInput(f"{field} is not a string")


def _use_raw(tensors: Sequence[Tensor], raw: bool) -> bool:
    # Raw contents are all-or-nothing, and FP16 only exists raw: one FP16 tensor makes
    # the whole message raw.
    return raw or not all(_has_typed(t.datatype) for t in tensors)


# --------------------------------------------------------------------------- requests


def request_from_pb(msg: ModelInferRequest) -> InferenceRequest:
    """Decode a ``ModelInferRequest`` (raw or typed contents) into an :class:`InferenceRequest`."""
    _strings(msg, "model_name", "model_version", "id")
    check_count(msg.inputs, MAX_INPUTS, "inputs", "MAX_INPUTS")
    check_count(msg.outputs, MAX_INPUTS, "requested outputs", "MAX_INPUTS")
    _no_missing(msg.outputs, "requested output")
    return InferenceRequest(
        inputs=_decode_tensors(
            msg.inputs, msg.raw_input_contents, what="input", raw_field="raw_input_contents"
        ),
        id=msg.id or None,
        parameters=params_from_pb(msg.parameters),
        outputs=[
            RequestedOutput(out.name, params_from_pb(out.parameters, where=f"output {out.name!r}"))
            for out in msg.outputs
        ],
        model_name=msg.model_name or None,
        model_version=msg.model_version or None,
    )


def request_to_pb(
    request: InferenceRequest,
    *,
    raw: bool = True,
    model_name: str | None = None,
    model_version: str | None = None,
) -> ModelInferRequest:
    """Encode a request (for clients and tests).

    ``raw=True`` puts the tensors in ``raw_input_contents``; ``raw=False`` uses typed
    contents unless a tensor is FP16. ``model_name`` / ``model_version`` override the
    request's.
    """
    use_raw = _use_raw(request.inputs, raw)
    inputs = []
    for t in request.inputs:
        entry = ModelInferRequestInferInputTensor(
            name=t.name,
            datatype=t.datatype,
            shape=list(t.shape),
            parameters=params_to_pb(t.parameters, where=f"input {t.name!r}"),
        )
        if not use_raw:
            entry.contents = tensor_contents_to_pb(t)
        inputs.append(entry)
    return ModelInferRequest(
        model_name=model_name or request.model_name or "",
        model_version=model_version or request.model_version or "",
        id=request.id or "",
        parameters=params_to_pb(request.parameters),
        inputs=inputs,
        outputs=[
            ModelInferRequestInferRequestedOutputTensor(
                name=o.name, parameters=params_to_pb(o.parameters, where=f"output {o.name!r}")
            )
            for o in request.outputs
        ],
        raw_input_contents=[tensor_to_raw(t) for t in request.inputs] if use_raw else [],
    )


# --------------------------------------------------------------------------- responses


def response_to_pb(response: InferenceResponse, *, raw: bool = True) -> ModelInferResponse:
    """Encode a response.

    ``raw=True`` (the default, and what Triton sends) puts each output's bytes, straight
    from ``ndarray.tobytes()``, in ``raw_output_contents``. ``raw=False`` uses typed
    contents unless an output is FP16.
    """
    use_raw = _use_raw(response.outputs, raw)
    outputs = []
    for t in response.outputs:
        entry = ModelInferResponseInferOutputTensor(
            name=t.name,
            datatype=t.datatype,
            shape=list(t.shape),
            parameters=params_to_pb(t.parameters, where=f"output {t.name!r}"),
        )
        if not use_raw:
            entry.contents = tensor_contents_to_pb(t)
        outputs.append(entry)
    return ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version or "",
        id=response.id or "",
        parameters=params_to_pb(response.parameters, where="response"),
        outputs=outputs,
        raw_output_contents=[tensor_to_raw(t) for t in response.outputs] if use_raw else [],
    )


def response_from_pb(msg: ModelInferResponse) -> InferenceResponse:
    """Decode a ``ModelInferResponse`` (raw or typed contents; for clients and tests)."""
    return InferenceResponse(
        model_name=msg.model_name,
        outputs=_decode_tensors(
            msg.outputs, msg.raw_output_contents, what="output", raw_field="raw_output_contents"
        ),
        model_version=msg.model_version or None,
        id=msg.id or None,
        parameters=params_from_pb(msg.parameters, where="response"),
    )
